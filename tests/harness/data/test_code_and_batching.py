import gzip
import json

import pytest
import torch

from harness.data import batching, code_corpus
from harness.data.masking import IGNORE_INDEX, mask_tokens


def test_stdlib_files_are_spread_and_deterministic():
    files = code_corpus.stdlib_files(10)
    assert len(files) == 10 and files == code_corpus.stdlib_files(10)
    assert all(f.suffix == ".py" and "site-packages" not in f.parts for f in files)
    assert len({f.parent for f in files}) > 1  # evenly spaced over the library, not one folder


@pytest.mark.parametrize("gz, field", [(False, "code"), (True, "original_string")])
def test_jsonl_corpus(tmp_path, gz, field):
    lines = [json.dumps({field: f"def f{i}():\n    return {i}\n", "language": "python"}) for i in range(5)]
    path = tmp_path / ("python_train_0.jsonl" + (".gz" if gz else ""))
    opener = gzip.open if gz else open
    with opener(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n\n")
    docs, files = code_corpus.read_jsonl(tmp_path)
    assert files == [path] and len(docs) == 5 and docs[3].startswith("def f3")
    assert len(code_corpus.read_jsonl(path, max_documents=2)[0]) == 2


@pytest.mark.parametrize("line, message", [
    ('{"func_name": "f"}', r"x.jsonl:2: no field code or original_string"),
    ("{not json", r"x.jsonl:2: not valid JSON"),
    ('{"code": null}', r"x.jsonl:2: field 'code' must be a string, got null"),
    ('{"code": 3}', r"x.jsonl:2: field 'code' must be a string, got 3")])
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    (tmp_path / "x.jsonl").write_text('{"code": "pass"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        code_corpus.read_jsonl(tmp_path / "x.jsonl")


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", b'{"code": "pass"}\n{"code": "\xff"}\n', r"bad.jsonl:2: not valid UTF-8"),
    ("bad.jsonl.gz", gzip.compress(b'{"code": "\xff"}\n', mtime=0), r"bad.jsonl.gz:1: not valid UTF-8"),
    ("cut.jsonl.gz", gzip.compress(b'{"code": "pass"}\n' * 2000, mtime=0)[:-20],
     r"cut.jsonl.gz: cannot read after line"),
    ("plain.jsonl.gz", b'{"code": "pass"}\n',
     r"plain.jsonl.gz: cannot read after line 0: Not a gzipped file"),
])
def test_jsonl_decode_errors_name_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        code_corpus.read_jsonl(tmp_path / name)


def test_an_empty_corpus_is_named(tmp_path):
    from harness.workloads import build_workload

    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"0 document\(s\) in .*empty.jsonl, too few"):
        build_workload("mlm", {"size": "tiny", "data": "jsonl", "data_path": str(tmp_path / "empty.jsonl"),
                               "cache_dir": str(tmp_path)}, batch_size=2, seed=0, device="cpu")


def test_missing_corpus_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="code corpus not found: .*missing"):
        code_corpus.jsonl_files(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no .jsonl or .jsonl.gz files under"):
        code_corpus.jsonl_files(tmp_path)


def test_masking_rates_and_labels():
    ids = torch.randint(5, 1000, (64, 128))
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    masked, labels = mask_tokens(ids, torch.Generator().manual_seed(0), vocab_size=1000, mask_id=4,
                                 special_ids=(0, 2, 3), first_regular_id=5)
    chosen = labels != IGNORE_INDEX
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(masked[~chosen], ids[~chosen])
    rate = chosen[:, 1:-1].float().mean().item()
    assert 0.13 < rate < 0.17
    frac_mask = (masked[chosen] == 4).float().mean().item()
    frac_same = (masked[chosen] == ids[chosen]).float().mean().item()
    assert 0.76 < frac_mask < 0.84 and 0.07 < frac_same < 0.14
    again = mask_tokens(ids, torch.Generator().manual_seed(0), vocab_size=1000, mask_id=4,
                        special_ids=(0, 2, 3), first_regular_id=5)
    assert torch.equal(again[0], masked)


def test_train_batches_are_full_shuffled_per_epoch_and_cover_the_data():
    data = {"x": torch.arange(10), "y": torch.arange(10) * 2}
    epoch0 = list(batching.train_batches(data, 3, seed=1, epoch=0, device=torch.device("cpu")))
    assert len(epoch0) == batching.train_steps(10, 3) == 3 and all(b["x"].shape == (3,) for b in epoch0)
    assert all(torch.equal(b["y"], b["x"] * 2) for b in epoch0)
    assert len(set(torch.cat([b["x"] for b in epoch0]).tolist())) == 9
    same = list(batching.train_batches(data, 3, seed=1, epoch=0, device=torch.device("cpu")))
    other = list(batching.train_batches(data, 3, seed=1, epoch=1, device=torch.device("cpu")))
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(epoch0, same))
    assert not all(torch.equal(a["x"], b["x"]) for a, b in zip(epoch0, other))
    small = list(batching.train_batches(data, 25, seed=0, epoch=0, device=torch.device("cpu")))
    assert len(small) == 1 and small[0]["x"].shape == (25,)  # a data set smaller than a batch is cycled


def test_eval_batches_cover_everything_in_order():
    data = {"x": torch.arange(10)}
    batches = list(batching.eval_batches(data, 4, torch.device("cpu")))
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match="differ in length"):
        batching.num_rows({"a": torch.zeros(3), "b": torch.zeros(4)})
