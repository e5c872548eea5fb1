"""harness.configs.merge_cells: the pipeline's merge names each cell once and stops at the first failure."""
from __future__ import annotations

import pytest

from harness import results
from harness.configs import grid
from harness.configs import merge_cells


def test_each_step_reads_the_named_cells_files(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(grid, "main", lambda argv: calls.append(("grid", argv)) or 0)
    monkeypatch.setattr(results, "cli_merge", lambda argv: calls.append((argv[1], argv)) or 0)
    assert merge_cells.main(["--cells", str(tmp_path), "--grid-out", "g.json", "--runs-out", "r.parquet",
                             "--curves-out", "c.parquet", "a", "b"]) == 0
    assert [name for name, _ in calls] == ["grid", "runs", "curves"]
    assert calls[0][1][-2:] == [str(tmp_path / "a.spec.json"), str(tmp_path / "b.spec.json")]
    assert calls[1][1][-2:] == [str(tmp_path / "a.runs.parquet"), str(tmp_path / "b.runs.parquet")]
    assert calls[2][1][-2:] == [str(tmp_path / "a.curves.parquet"), str(tmp_path / "b.curves.parquet")]
    assert "--allow-empty" not in calls[1][1] and calls[1][1][calls[1][1].index("--grid") + 1] == "g.json"


@pytest.mark.parametrize("failing, code", [("runs", 1), ("curves", 2)])
def test_the_first_failing_step_stops_the_merge_and_is_named(tmp_path, monkeypatch, capsys, failing, code):
    ran = []
    monkeypatch.setattr(grid, "main", lambda argv: 0)

    def merge(argv):
        ran.append(argv[1])
        return code if argv[1] == failing else 0

    monkeypatch.setattr(results, "cli_merge", merge)
    assert merge_cells.main(["--cells", str(tmp_path), "--allow-empty", "--grid-out", "g", "--runs-out", "r",
                             "--curves-out", "c"]) == code
    assert ran == ["runs", "curves"][:ran.index(failing) + 1]
    assert f"the {failing} step failed (exit status {code})" in capsys.readouterr().err
