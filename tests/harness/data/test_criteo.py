import math

import pytest
import torch

from harness.data import criteo

SIZES = [50, 7, 1000, 3] + [97] * 22


def _reference(line: str, sizes) -> tuple[float, list[float], list[int]]:
    f = line.rstrip("\n").split("\t")
    dense = [math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1:14]]
    sparse = [int(x, 16) % s if x else 0 for x, s in zip(f[14:], sizes)]
    return float(f[0]), dense, sparse


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    stats = criteo.write_synthetic(path, 600, categories=[40] * 26, seed=5, missing_rate=0.1)
    return path, stats


def test_reader_matches_a_line_by_line_reference(synthetic):
    path, _ = synthetic
    data = criteo.read(path, SIZES)
    lines = path.read_text().splitlines()
    assert data["dense"].shape == (600, 13) and data["sparse"].shape == (600, 26) and len(lines) == 600
    for i in (0, 1, 17, 599):
        label, dense, sparse = _reference(lines[i], SIZES)
        assert data["labels"][i].item() == label
        assert torch.allclose(data["dense"][i], torch.tensor(dense), atol=1e-6)
        assert data["sparse"][i].tolist() == sparse
    assert (data["sparse"] < torch.tensor(SIZES)).all()


def test_synthetic_has_a_planted_signal(synthetic):
    path, stats = synthetic
    assert 0.15 < stats["click_rate"] < 0.35
    assert stats["oracle_nce"] < 0.8 and stats["oracle_accuracy"] > 1 - stats["click_rate"] + 0.03
    lines = path.read_text().splitlines()
    assert all(len(line.split("\t")) == 40 for line in lines)
    assert sum(line.split("\t")[5] == "" for line in lines) > 20  # missing values are written as empty fields


def test_max_rows_and_negative_and_empty_fields(tmp_path):
    path = tmp_path / "t.txt"
    row = ["1", "-3", ""] + ["2"] * 11 + ["ff", ""] + ["0A"] * 24
    path.write_text("\t".join(row) + "\n" + "\t".join(["0"] + row[1:]) + "\n")
    data = criteo.read(path, SIZES, max_rows=1)
    assert data["labels"].tolist() == [1.0]
    assert data["dense"][0, :3].tolist() == [0.0, 0.0, pytest.approx(math.log(3))]
    assert data["sparse"][0, :4].tolist() == [255 % 50, 0, 10, 10 % 3]


@pytest.mark.parametrize("bad_line, message", [
    ("\t".join(["1"] + ["2"] * 13 + ["aa"] * 25), r":3: 39 tab-separated fields, expected 40"),
    ("\t".join(["1", "x2"] + ["2"] * 12 + ["aa"] * 26), r":3: I1 value 'x2' is not an integer"),
    ("\t".join(["1"] + ["2"] * 13 + ["zz"] + ["aa"] * 25), r":3: C1 value 'zz' is not hexadecimal"),
    ("\t".join(["2"] + ["2"] * 13 + ["aa"] * 26), r":3: label 2 is not 0 or 1"),
    ("", r":3: label is empty"),
])
def test_malformed_line_is_named(tmp_path, bad_line, message):
    good = "\t".join(["0"] + ["1"] * 13 + ["bb"] * 26)
    path = tmp_path / "bad.txt"
    path.write_text("\n".join([good, good, bad_line, good]) + "\n")
    with pytest.raises(ValueError, match="bad.txt" + message):
        criteo.read(path, SIZES)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        criteo.read(tmp_path / "nope.txt", SIZES)
