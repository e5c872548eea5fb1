"""Result files of an older schema (a column missing) are merged and shown with the missing columns as
nulls and a warning naming the file and the columns; a foreign file (unknown columns) still fails."""
from __future__ import annotations

import pandas as pd
import pytest

from harness import cli, results


def runs_file(path, run_id, drop=()):
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(run_id=run_id, workload="toy", method="dense", status="ok", error="", batch_size=8,
               step_time_ms=2.0, flops_per_step=1e6, settings="{}")
    df = results.to_frame([row], "runs").drop(columns=list(drop))
    df.to_parquet(path, index=False)
    return path


def test_merge_and_show_fill_missing_columns(tmp_path, capsys):
    old = runs_file(tmp_path / "old.runs.parquet", "old", drop=("flops_per_step", "settings"))
    new = runs_file(tmp_path / "new.runs.parquet", "new")
    out = tmp_path / "merged.parquet"
    assert cli.main(["merge", "--kind", "runs", "--out", str(out), str(old), str(new)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {old}" in err and "['flops_per_step', 'settings']" in err and str(new) not in err
    merged = results.read_parquet(out, "runs").set_index("run_id")
    assert pd.isna(merged.at["old", "flops_per_step"]) and merged.at["new", "flops_per_step"] == 1e6
    assert merged.at["old", "settings"] is None and merged.at["old", "step_time_ms"] == 2.0
    assert cli.main(["show", str(old)]) == 0
    captured = capsys.readouterr()
    assert f"warning: {old}" in captured.err and "old" in captured.out


def test_foreign_file_still_refused(tmp_path, capsys):
    path = runs_file(tmp_path / "x.runs.parquet", "x")
    pd.read_parquet(path).assign(colour="red").to_parquet(path, index=False)
    assert cli.main(["merge", "--kind", "runs", "--out", str(tmp_path / "m.parquet"), str(path)]) == 1
    assert "unknown columns ['colour']" in capsys.readouterr().err
    with pytest.raises(results.ResultsError, match="missing columns"):
        results.read_parquet(runs_file(tmp_path / "y.runs.parquet", "y", drop=("settings",)), "runs")


def test_reports_read_a_merged_table_of_an_older_schema(tmp_path, capsys):
    """A runs.parquet written before the timing columns existed: tables, figures, claims and compare read
    it as merge does (nulls, a warning); its timings have no verdict, so no time ratio uses them."""
    from harness.reports import claims, compare, figures, tables
    from harness.results import analysis

    folder = tmp_path / "old-device"
    folder.mkdir()
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(run_id="old", workload="transformer", method="dense", variant="default", status="ok", error="",
               batch_size=8, seed=0, step_time_ms=2.0, epoch_time_s=1.0, settings="{}")
    timing_cols = ["timing_quality", "load_avg_1m", "cpu_pressure", "run_queue_frac", "cpu_time_ratio",
                   "timing_group", "round_step_ms", "round_step_mean_ms"]
    results.to_frame([row], "runs").drop(columns=timing_cols).to_parquet(folder / "runs.parquet", index=False)
    res = analysis.load(folder)
    assert res.runs.timing_quality.isna().all()
    assert "older schema" in capsys.readouterr().err
    out = tmp_path / "out"
    assert tables.main(["--results", str(folder), "--out", str(out)]) == 0
    assert figures.main(["--results", str(folder), "--out", str(out)]) == 0
    assert claims.main(["--results", str(folder), "--out", str(out / "claims.md")]) == 0
    assert "old: no timing verdict" in (out / "claims.md").read_text()
    assert compare.cli([str(folder), "--out", str(out / "cmp")]) == 0


def test_show_into_a_closed_pipe_is_quiet(tmp_path):
    import subprocess
    import sys

    path = runs_file(tmp_path / "a.runs.parquet", "a")
    script = ("import sys; from harness.entry import main; sys.argv = ['comera-bench', 'show', sys.argv[1]]; "
              "sys.exit(main())")
    proc = subprocess.run(f"{sys.executable} -c \"{script}\" {path} | head -c 1", shell=True, capture_output=True,
                          text=True)
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr
