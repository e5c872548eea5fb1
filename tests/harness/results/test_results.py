import json
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from harness import results

DESIGN_RUNS = """run_id workload method variant batch_size seq_len rank target_ratio seed cell_hash
execution_hash status error
step_time_ms step_time_ms_iqr steps_timed epoch_time_s epoch_time_kind samples_per_s peak_mem_bytes
peak_mem_kind cuda_reserved_bytes state_bytes metric_name metric_value final_train_loss epochs
params_total params_factorized_layers compression_total compression_layers ranks""".split()
DESIGN_PROVENANCE = """device device_name num_threads torch_version cuda_version python_version
comera_bench_version git_commit git_dirty hostname started_at matmul_precision""".split()
DESIGN_CURVES = "run_id step epoch split metric_name value".split()
DESIGN_MICROBENCH = """op variant shape tokens rank direction time_ms time_ms_iqr round_time_ms timing_quality
peak_mem_bytes param_bytes output_bytes flops""".split()


def runs_row(**values):
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(results.provenance(torch.device("cpu")))
    row.update(run_id="r1", workload="toy", method="dense", variant="", batch_size=4, seed=0, cell_hash="c",
               execution_hash="e",
               status="ok", error="", metric_value=0.5)
    row.update(values)
    return row


def test_columns_follow_design():
    assert results.PROVENANCE_COLUMNS == DESIGN_PROVENANCE
    assert results.RUNS_COLUMNS[:len(DESIGN_RUNS)] == DESIGN_RUNS
    assert set(DESIGN_PROVENANCE) <= set(results.RUNS_COLUMNS)
    assert results.CURVES_COLUMNS == DESIGN_CURVES
    assert results.MICROBENCH_COLUMNS == DESIGN_MICROBENCH + DESIGN_PROVENANCE


def test_provenance_is_complete():
    prov = results.provenance(torch.device("cpu"))
    assert list(prov) == results.PROVENANCE_COLUMNS
    assert prov["device"] == "cpu"
    assert prov["num_threads"] == torch.get_num_threads()
    assert prov["torch_version"] == torch.__version__
    assert prov["started_at"].endswith("Z") and "T" in prov["started_at"]
    assert prov["matmul_precision"] == torch.get_float32_matmul_precision()


def test_round_trip_keeps_types_and_metadata(tmp_path):
    df = results.to_frame([runs_row(), runs_row(run_id="r2", seq_len=128, hostname="other")], "runs")
    path = results.write_parquet_atomic(df, tmp_path / "a.runs.parquet", kind="runs")
    back = results.read_parquet(path, "runs")
    assert list(back.columns) == results.RUNS_COLUMNS
    assert str(back["batch_size"].dtype) == "Int64" and back["seq_len"].isna()[0]
    assert back["seq_len"][1] == 128
    meta = results.file_metadata(path)
    assert meta["kind"] == "runs"
    assert meta["provenance"] == {}  # hostname differs between the rows
    single = results.write_parquet_atomic(df.iloc[:1], tmp_path / "b.runs.parquet", kind="runs")
    assert results.file_metadata(single)["provenance"]["hostname"] == runs_row()["hostname"]
    assert pd.read_parquet(single)["batch_size"].dtype == "Int64"  # plain pandas sees the same types


@pytest.mark.parametrize("kind", results.KINDS)
def test_empty_tables_have_all_columns(tmp_path, kind):
    path = results.write_parquet_atomic(results.empty_frame(kind), tmp_path / "e.parquet", kind=kind)
    assert list(results.read_parquet(path, kind).columns) == list(results.TYPES[kind])


def test_a_runs_file_from_before_the_execution_columns_reads_with_them(tmp_path):
    """A runs file written before ``cuda_graph`` and ``compile`` were columns had the execution as tags on
    the variant: it reads (and merges beside a current file) with the columns from the tags and the
    config's variant; a file with only one of the two columns is refused, naming the other."""
    old = [runs_row(run_id="a", variant="default+cudagraph"),
           runs_row(run_id="b", variant="paper+compile+matmul-high", matmul_precision="high"),
           runs_row(run_id="c", variant="default")]
    frame = results.to_frame(old, "runs").drop(columns=["cuda_graph", "compile"])
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "old.runs.parquet")
    current = results.to_frame([runs_row(run_id="d", variant="default", cuda_graph=True, compile=False)], "runs")
    results.write_parquet_atomic(current, tmp_path / "new.runs.parquet", kind="runs")
    merged = results.merge([tmp_path], None, "runs").sort_values("run_id")
    assert list(merged.columns) == results.RUNS_COLUMNS
    assert merged.variant.tolist() == ["default", "paper", "default", "default"]
    assert merged.cuda_graph.tolist() == [True, False, False, True]
    assert merged["compile"].tolist() == [False, True, False, False]
    assert merged.matmul_precision.tolist()[1] == "high"
    half = results.to_frame(old, "runs").drop(columns=["compile"])
    pq.write_table(pa.Table.from_pandas(half, preserve_index=False), tmp_path / "half.runs.parquet")
    with pytest.raises(results.ResultsError, match=r"half.runs.parquet is not a runs table: missing columns "
                                                   r"\['compile'\]"):
        results.read_parquet(tmp_path / "half.runs.parquet", "runs")


def test_row_with_missing_or_unknown_column_is_refused():
    row = runs_row()
    del row["ranks"]
    with pytest.raises(results.ResultsError, match="ranks"):
        results.to_frame([row], "runs")
    with pytest.raises(results.ResultsError, match="bogus"):
        results.to_frame([runs_row(bogus=1)], "runs")


def test_failed_write_leaves_neither_file_nor_temp(tmp_path, monkeypatch):
    def broken(table, where, **kw):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        results.write_parquet_atomic(results.empty_frame("curves"), tmp_path / "c.parquet", kind="curves")
    assert list(tmp_path.iterdir()) == []


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import pyarrow.parquet as pq
    from harness import results

    def slow(table, where, **kw):
        where.write(b"PAR1 half a file")
        where.flush()
        print("writing", flush=True)
        time.sleep(60)

    pq.write_table = slow
    results.write_parquet_atomic(results.empty_frame("curves"), sys.argv[1], kind="curves")
""")


def test_writer_killed_mid_write_leaves_no_output(tmp_path):
    target = tmp_path / "cell.curves.parquet"
    old = results.write_parquet_atomic(results.empty_frame("curves"), tmp_path / "old.curves.parquet",
                                       kind="curves")
    for path in (target, old):  # a new file, and an overwrite of a complete older one
        before = path.read_bytes() if path.exists() else None
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout.readline().strip() == "writing"
            temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            assert temps, "the writer should be writing a temporary file"
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        if before is None:
            assert not path.exists()
        else:
            assert path.read_bytes() == before
            results.read_parquet(path, "curves")
    assert len(list(tmp_path.glob("*.tmp"))) == 2  # a SIGKILLed writer cleans nothing up ...
    for path in (target, old):  # ... the next write of the same target removes its temporary
        results.write_parquet_atomic(results.empty_frame("curves"), path, kind="curves")
    assert not list(tmp_path.glob("*.tmp"))


def curves_file(path, run_id, n):
    rows = [{"run_id": run_id, "step": i, "epoch": 0, "split": "train", "metric_name": "loss",
             "value": float(i)} for i in range(n)]
    return results.write_parquet_atomic(results.to_frame(rows, "curves"), path, kind="curves")


def test_merge_keeps_every_row(tmp_path):
    cells = tmp_path / "runs" / "cpu"
    curves_file(cells / "a.curves.parquet", "a", 3)
    curves_file(cells / "b.curves.parquet", "b", 2)
    curves_file(cells / "c.curves.parquet", "a", 3)  # a repeated run_id is kept, not deduplicated
    out = tmp_path / "cpu" / "curves.parquet"
    df = results.merge([cells], out, "curves")
    assert len(df) == 8
    assert len(results.read_parquet(out, "curves")) == 8
    # a file named twice (directly and through its folder) is read once
    assert len(results.merge([cells / "a.curves.parquet", cells], None, "curves")) == 8


def test_merge_of_nothing_writes_empty_table(tmp_path):
    df = results.merge([], tmp_path / "runs.parquet", "runs")
    assert df.empty and list(df.columns) == results.RUNS_COLUMNS
    assert (tmp_path / "runs.parquet").exists()


def test_merge_refuses_truncated_file_naming_it(tmp_path):
    good = curves_file(tmp_path / "a.curves.parquet", "a", 50)
    bad = tmp_path / "b.curves.parquet"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    out = tmp_path / "merged.parquet"
    with pytest.raises(results.ResultsError, match=str(bad)):
        results.merge([good, bad], out, "curves")
    assert not out.exists()


def test_merge_refuses_foreign_file_naming_it(tmp_path):
    foreign = tmp_path / "x.runs.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(foreign)
    with pytest.raises(results.ResultsError, match=f"{foreign}.*missing columns"):
        results.merge([foreign], None, "runs")
    curves = curves_file(tmp_path / "y.curves.parquet", "y", 1)
    with pytest.raises(results.ResultsError, match=str(curves)):
        results.merge([curves], None, "runs")


def test_cli_merge(tmp_path, capsys):
    curves_file(tmp_path / "a.curves.parquet", "a", 4)
    out = tmp_path / "m.parquet"
    assert results.cli_merge(["--kind", "curves", "--out", str(out), str(tmp_path)]) == 0
    assert len(results.read_parquet(out, "curves")) == 4
    (tmp_path / "t.curves.parquet").write_bytes(b"PAR1 not really")
    assert results.cli_merge(["--kind", "curves", "--out", str(out), str(tmp_path)]) == 1
    assert "t.curves.parquet" in capsys.readouterr().err


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="'bogus'"):
        results.empty_frame("bogus")


def test_metadata_is_json(tmp_path):
    path = curves_file(tmp_path / "a.curves.parquet", "a", 1)
    raw = pq.read_schema(path).metadata[results.METADATA_KEY]
    assert json.loads(raw)["kind"] == "curves"


def _grid(tmp_path, names="abc"):
    grid = tmp_path / "grid.json"
    cells = {c: {"run_id": c, "cell_hash": f"c-{c}", "execution_hash": f"e-{c}"} for c in names}
    grid.write_text(json.dumps({"cells": cells, "sweeps": {}}))
    return grid


def test_merge_refuses_a_timing_group_row_from_another_machine(tmp_path, capsys):
    """The same config run on another machine: its runs file has the grid's hashes, but its host and
    device are not those of the timing group it would join (a time ratio across machines)."""
    grid, cells = _grid(tmp_path), tmp_path / "runs" / "cpu"
    cells.mkdir(parents=True)
    for name, host in (("a", "here"), ("b", "here"), ("c", "elsewhere")):
        row = runs_row(run_id=name, cell_hash=f"c-{name}", execution_hash=f"e-{name}", timing_group="g",
                       hostname=host, device_name="cpu x")
        results.write_parquet_atomic(results.to_frame([row], "runs"), cells / f"{name}.runs.parquet",
                                     kind="runs")
    out = tmp_path / "runs.parquet"
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 1
    err = capsys.readouterr().err
    assert (f"timing group g: its cells ran on host here, device cpu x, but {cells / 'c.runs.parquet'} (host "
            "elsewhere, device cpu x) ran elsewhere") in err and not out.exists()
    (cells / "c.runs.parquet").unlink()
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 0


@pytest.mark.parametrize("name, run_id, cell_hash, message", [
    ("a", "b", "c-a", "{path} holds curves of cell(s) 'b', not only of cell a"),
    ("z", "z", "c-z", "{path}: cell z is not in the grid"),
    ("a", "a", "other", "{path}: its curves of cell a were run from another spec (cell_hash other"),
])
def test_merge_refuses_curves_that_are_not_the_grids(tmp_path, capsys, name, run_id, cell_hash, message):
    grid, cells = _grid(tmp_path), tmp_path / "runs" / "cpu"
    rows = [{"run_id": run_id, "step": 1, "epoch": 0, "split": "train", "metric_name": "loss", "value": 1.0}]
    path = cells / f"{name}.curves.parquet"
    results.write_parquet_atomic(results.to_frame(rows, "curves"), path, kind="curves",
                                 provenance={"cell_hash": cell_hash})
    curves_file(cells / "b.curves.parquet", "b", 2)
    out = tmp_path / "curves.parquet"
    assert results.cli_merge(["--kind", "curves", "--grid", str(grid), "--out", str(out), str(cells)]) == 1
    assert message.format(path=path) in capsys.readouterr().err and not out.exists()
    path.unlink()
    assert results.cli_merge(["--kind", "curves", "--grid", str(grid), "--out", str(out), str(cells)]) == 0


@pytest.mark.parametrize("name, row, message", [
    ("a", {"run_id": "a", "cell_hash": "other"}, "{path}: its row of cell a was run from another spec "
                                                 "(cell_hash other; the grid's is c-a"),
    ("a", {"run_id": "a", "cell_hash": "c-a", "execution_hash": "other"},
     "{path}: its row of cell a was run from another spec (execution_hash other; the grid's is e-a"),
    ("a", {"run_id": "b", "cell_hash": "c-b", "execution_hash": "e-b"},
     "{path} holds the row of cell b, not of cell a"),
    ("z", {"run_id": "z", "cell_hash": "c-z"}, "{path}: cell z is not in the grid"),
])
def test_merge_refuses_a_row_that_is_not_the_grids(tmp_path, capsys, name, row, message):
    """A per-cell file of another config (copied in, or left from an earlier grid) is named, not merged."""
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"cells": {c: {"run_id": c, "cell_hash": f"c-{c}", "execution_hash": f"e-{c}"}
                                          for c in "ab"}, "sweeps": {}}))
    cells = tmp_path / "runs" / "cpu"
    cells.mkdir(parents=True)
    b_row = runs_row(run_id="b", cell_hash="c-b", execution_hash="e-b")
    results.write_parquet_atomic(results.to_frame([b_row], "runs"),
                                 cells / "b.runs.parquet", kind="runs")
    path = cells / f"{name}.runs.parquet"
    results.write_parquet_atomic(results.to_frame([runs_row(**row)], "runs"), path, kind="runs")
    out = tmp_path / "runs.parquet"
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 1
    err = capsys.readouterr().err
    assert message.format(path=path) in err and f"{grid}" in err and "run the pipeline again" in err
    assert not out.exists()
    path.unlink()
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 0


@pytest.mark.parametrize("column, value", [("device_name", 5), ("run_id", 3), ("status", True),
                                           ("ranks", [1, 2]), ("extra", {"a": 1})])
def test_merge_refuses_a_wrongly_typed_text_column_naming_the_file_and_column(tmp_path, capsys, column, value):
    """A runs file (edited, or written by another tool) whose text column holds numbers, booleans or lists:
    the merge names the file and the column instead of failing in pyarrow."""
    cells = tmp_path / "runs" / "cpu"
    cells.mkdir(parents=True)
    results.write_parquet_atomic(results.to_frame([runs_row(run_id="a")], "runs"), cells / "a.runs.parquet",
                                 kind="runs")
    bad = cells / "r1.runs.parquet"
    pd.DataFrame([runs_row(**{column: value})]).to_parquet(bad)
    out = tmp_path / "cpu" / "runs.parquet"
    with pytest.raises(results.ResultsError, match=f"{bad}: column '{column}' cannot be read as string"):
        results.merge([cells], out, "runs")
    assert not out.exists()
    assert results.cli_merge(["--kind", "runs", "--out", str(out), str(cells)]) == 1
    assert f"{bad}: column '{column}'" in capsys.readouterr().err


@pytest.mark.parametrize("copies, message", [
    (0, "{path} holds no row: cell a has no result"),
    (3, "{path} holds 3 rows of cell a, not one"),
])
def test_merge_holds_one_row_per_grid_cell(tmp_path, capsys, copies, message):
    """A per-cell runs file with no row (the cell would vanish from every table) or with its row repeated
    (merged three times) is refused, named, with how to run the cell again."""
    grid = _grid(tmp_path, "ab")
    cells = tmp_path / "runs" / "cpu"
    cells.mkdir(parents=True)
    for name in "ab":
        row = runs_row(run_id=name, cell_hash=f"c-{name}", execution_hash=f"e-{name}")
        results.write_parquet_atomic(results.to_frame([row] * (copies if name == "a" else 1), "runs"),
                                     cells / f"{name}.runs.parquet", kind="runs")
    path, out = cells / "a.runs.parquet", tmp_path / "runs.parquet"
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 1
    err = capsys.readouterr().err
    assert message.format(path=path) in err and "run the pipeline again (the cell runs again)" in err
    assert not out.exists()
    path.unlink()
    assert results.cli_merge(["--kind", "runs", "--grid", str(grid), "--out", str(out), str(cells)]) == 0
    assert results.read_parquet(out, "runs").run_id.tolist() == ["b"]
