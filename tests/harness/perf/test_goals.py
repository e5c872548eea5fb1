"""harness.perf.goals: goals.yaml is read and checked; a bad file is named with its key."""
from __future__ import annotations

import pytest

from harness.perf import goals


def test_the_shipped_goals_are_the_issue_goals():
    g = goals.load()
    assert [(c["out_shape"], c["tokens"], c["goal"]) for c in g["linear"]] == [
        ([8, 8, 12], 128, 4.0), ([8, 8, 12], 4096, 6.5), ([12, 16, 16], 4096, 8.5)]
    assert [c["vs_official"] for c in g["linear"]] == [1.2, 1.2, 1.2]
    assert g["step"]["paper"]["speedup_vs_dense_b32"] == 4.0
    assert (g["step"]["paper"]["speedup_vs_galore_b1"],
            g["step"]["paper"]["memory_saving_vs_galore_b1"]) == (5.0, 12.0)
    assert g["step"]["small"] == {"speedup_vs_dense_b32": 1.0, "speedup_vs_dense_b1": 0.667}
    assert g["halving"] == {"layers_speedup": 2.5, "amdahl_fraction": 0.9}
    assert g["linear_ops"] == {"tokens": [1, 128, 4096], "goal": 48}
    assert [(c["out_shape"], c["tokens"], c["graph"], c.get("eager"), c["vs_official"])
            for c in g["cuda_linear"]] == [
        ([12, 16, 16], 4096, 3.0, 1.0, 1.5), ([8, 8, 12], 4096, 1.5, None, 1.5)]


@pytest.mark.parametrize("old, new, message", [
    ("layers_speedup: 2.5", "layers_speedup: fast",
     "key halving.layers_speedup: 'fast' is not of type 'number'"),
    ("layers_speedup: 2.5", "layers_speedup: 0", "key halving.layers_speedup: 0 is less than or equal to"),
    ("  amdahl_fraction: 0.9", "  amdahl_fraction: 0.9\n  amdahl_fractoin: 0.9", "amdahl_fractoin"),
    ("    speedup_vs_dense_b1: 0.667", "", "key step.small: 'speedup_vs_dense_b1' is a required property"),
    ("tokens: 128,", "tokens: 12.5,", "key linear[0].tokens: 12.5 is not of type 'integer'"),
    ("goal: 4.0, vs_official: 1.2", "goal: 4.0", "key linear[0]: 'vs_official' is a required property"),
    ("  flops_vs_optimal: 1.0", "  flops_vs_optimal: 1.0\n  flops_vs_optimal: 2.0", "flops_vs_optimal"),
    ("  speedup: 5.0", "  speedup: .nan", "key lookup.speedup: nan is not a finite number"),
])
def test_a_bad_goals_file_is_named_with_its_key(tmp_path, old, new, message):
    text = goals.DEFAULT_PATH.read_text()
    assert old in text
    path = tmp_path / "bench.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match="bench goals .*bench.yaml") as info:
        goals.load(path)
    assert message in str(info.value)


def test_a_missing_goals_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="bench goals .*nope.yaml: cannot read"):
        goals.load(tmp_path / "nope.yaml")


def test_the_goals_and_their_schema_are_package_data():
    """The installed package reads them: both lie in its folder and pyproject ships them."""
    import fnmatch
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    data = (root / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1]
    patterns = re.findall(r'"([^"]+)"', re.search(r"^harness = \[(.*)\]", data, re.M)[1])
    for path in (goals.DEFAULT_PATH, goals.SCHEMA):
        inside = path.resolve().relative_to(root / "harness").as_posix()  # ValueError outside the package
        assert path.is_file() and any(fnmatch.fnmatch(inside, p) for p in patterns), inside
