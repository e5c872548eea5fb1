"""A cell run in a child process (`comera-bench run --isolate`): a child killed by a signal still gets
its row (status oom when the OOM killer did it, else error naming the signal), a row the child wrote is
kept, and the failure survives a log that cannot be written."""
from __future__ import annotations

import json
import sys

import pytest

from harness import cli, results
from harness.core import interleave
from harness.running import supervise
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec

SIGKILL_SELF = [sys.executable, "-c", "import os, signal; print('started', flush=True); "
                                      "os.kill(os.getpid(), signal.SIGKILL)"]


@pytest.fixture
def cell(tmp_path, monkeypatch):
    """A spec file and output paths; no OOM kill seen unless a test says so."""
    monkeypatch.setattr(supervise, "oom_kill_count", lambda: 0)
    monkeypatch.setattr(supervise, "kernel_log_oom", lambda pid: False)
    spec = tmp_path / "cell.spec.json"
    spec.write_text(json.dumps(toy_spec(run_id="cell-1", variant="v", target_ratio=0.5, seed=3,
                                        execution={"cuda_graph": False})))
    return spec, tmp_path / "out" / "cell.runs.parquet", tmp_path / "out" / "cell.curves.parquet"


def test_killed_child_becomes_an_error_row(cell, capsys):
    spec, runs, curves = cell
    log = runs.parent / "logs" / "cell.log"
    assert supervise.supervise(SIGKILL_SELF, spec, runs, curves, log=log) == (0, "error")
    row = results.read_parquet(runs, "runs").iloc[0]
    assert row["status"] == "error" and row["error"] == "killed by signal 9 (SIGKILL)"
    assert (row["run_id"], row["workload"], row["method"], row["variant"], row["batch_size"],
            row["target_ratio"], row["seed"]) == ("cell-1", "toy", "toy", "v", 16, 0.5, 3)
    for col in ("device", "hostname", "python_version", "torch_version", "started_at", "cell_hash",
                "execution_hash"):
        assert row[col], col
    assert row["num_threads"] == 1
    extra = json.loads(row["extra"])
    assert extra["signal"] == "SIGKILL" and extra["exit_code"] == -9 and "started" in extra["log_tail"]
    assert json.loads(row["settings"])["budget"]["epochs"] == 2
    assert len(results.read_parquet(curves, "curves")) == 0
    assert "killed by signal 9 (SIGKILL)" in log.read_text()
    assert "killed by signal 9 (SIGKILL)" in capsys.readouterr().err


def test_oom_killer_is_told_apart(cell, monkeypatch):
    spec, runs, curves = cell
    counts = iter([3, 4])
    monkeypatch.setattr(supervise, "oom_kill_count", lambda: next(counts))
    assert supervise.supervise(SIGKILL_SELF, spec, runs, curves) == (0, "oom")
    row = results.read_parquet(runs, "runs").iloc[0]
    assert row["status"] == "oom"
    assert "OOM killer" in row["error"] and "oom_kill count 3 -> 4" in row["error"]


def test_exit_without_row_is_an_error_row(cell):
    spec, runs, curves = cell
    code, status = supervise.supervise([sys.executable, "-c", "raise SystemExit(3)"], spec, runs, curves)
    assert (code, status) == (0, "error")
    assert results.read_parquet(runs, "runs").at[0, "error"] == "exited with code 3 without writing its row"


def test_log_on_a_full_disk(cell, capsys):
    """/dev/full answers every write with ENOSPC, as a full disk does."""
    spec, runs, curves = cell
    assert supervise.supervise(SIGKILL_SELF, spec, runs, curves, log="/dev/full") == (0, "error")
    row = results.read_parquet(runs, "runs").iloc[0]
    assert row["error"] == "killed by signal 9 (SIGKILL)"
    assert "No space left on device" in json.loads(row["extra"])["log_error"]
    err = capsys.readouterr().err
    assert "killed by signal 9 (SIGKILL)" in err and "No space left on device" in err


def test_row_written_by_the_child_is_kept(cell, tmp_path):
    spec, runs, curves = cell
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(run_id="cell-1", workload="toy", method="toy", status="ok", error="")
    ready = results.write_parquet_atomic(results.to_frame([row], "runs"),
                                         tmp_path / "ready.parquet", kind="runs")
    writes_row = [sys.executable, "-c", f"import os, shutil; shutil.copy({str(ready)!r}, {str(runs)!r}); "
                                        "os._exit(1)"]  # e.g. its last message could not be printed
    runs.parent.mkdir()
    assert supervise.supervise(writes_row, spec, runs, curves) == (0, "ok")
    assert results.read_parquet(runs, "runs").at[0, "error"] == "" and not curves.exists()


def test_invalid_spec_writes_no_row(cell):
    spec, runs, curves = cell
    spec.write_text(json.dumps({**toy_spec(), "colour": "red"}))
    assert supervise.supervise(SIGKILL_SELF, spec, runs, curves)[0] == 2
    assert not runs.exists() and not curves.exists()


def test_cli_isolate_options(cell, monkeypatch, capsys):
    """The child is `python -m harness.cli run` on the same files (the pipeline tests run real ones)."""
    spec, runs, _ = cell
    seen = {}

    def fake(command, *args, **kw):
        seen.update(command=command, args=args, kw=kw)
        return 0, "error"

    monkeypatch.setattr(supervise, "supervise", fake)
    argv = ["run", "--isolate", "--spec", str(spec), "--runs-out", str(runs), "--log", "l.log"]
    assert cli.main(argv) == 0 and cli.main([*argv, "--fail-on-error"]) == 1
    assert seen["command"] == [sys.executable, "-m", "harness.cli", "run", "--spec", str(spec), "--runs-out",
                               str(runs), "--curves-out", str(runs.with_name("cell.curves.parquet"))]
    assert seen["kw"] == {"log": "l.log"}
    assert cli.main(["run", "--isolate", "--spec", str(spec)]) == 2
    assert cli.main(["run", "--spec", str(spec), "--log", "l.log"]) == 2
    err = capsys.readouterr().err
    assert "--isolate needs --spec and --runs-out" in err and "--log needs --isolate" in err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_cell_stopped_from_outside_gets_no_row(cell, capsys, signame):
    """timeout, scancel, a job's time limit or a closed session stop the cell: it is interrupted, not
    failed, so no row is written and the pipeline runs it again."""
    spec, runs, curves = cell
    # the default action first: under nohup or `cmd &` the test's own process may ignore SIGHUP / SIGINT
    stop = [sys.executable, "-c", f"import os, signal; signal.signal(signal.{signame}, signal.SIG_DFL); "
                                  f"os.kill(os.getpid(), signal.{signame})"]
    code, status = supervise.supervise(stop, spec, runs, curves)
    import signal
    assert (code, status) == (128 + getattr(signal, signame), "interrupted")
    assert not runs.exists() and not curves.exists()
    assert f"interrupted by {signame}" in capsys.readouterr().err


def test_a_signal_to_the_supervisor_is_forwarded_and_leaves_no_row(cell, tmp_path):
    import os
    import signal
    import subprocess
    import time

    spec, runs, curves = cell
    script = (f"from harness.running import supervise; import sys; "
              f"code, _ = supervise.supervise([sys.executable, '-c', 'import time; time.sleep(60)'], "
              f"{str(spec)!r}, {str(runs)!r}, {str(curves)!r}); sys.exit(code)")
    proc = subprocess.Popen([sys.executable, "-c", script])
    time.sleep(2)  # the child sleeps
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not runs.exists()


def test_an_environment_fault_leaves_no_row_so_the_cell_runs_again(cell, capsys):
    """A full disk is the machine's fault: no failure row that a rerun would keep."""
    spec, runs, curves = cell
    code, status = supervise.supervise([sys.executable, "-c", "raise SystemExit(75)"], spec, runs, curves)
    assert (code, status) == (75, "environment fault") and not runs.exists()
    assert "runs again next time" in capsys.readouterr().err


def test_run_turns_a_full_disk_into_the_environment_fault_status(tmp_path, monkeypatch, capsys):
    import errno

    from harness.running import run as runner

    monkeypatch.setattr(runner, "default_registry", lambda: TOY_REGISTRY)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r.runs.parquet"))

    monkeypatch.setattr(results, "write_parquet_atomic", full)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(budget={"epochs": 1, "max_steps_per_epoch": 3})))
    assert cli.main(["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.runs.parquet")]) == 75
    err = capsys.readouterr().err
    assert "environment fault: cannot write the row" in err and "No space left on device" in err


def test_a_cell_whose_timing_group_vanished_is_interrupted_without_a_row(cell, capsys):
    """The child's EXIT_GROUP_LOST (its round coordinator closed the connection) is not a failure: no row,
    so that the next pipeline run times the cell again, with its group."""
    spec, runs, curves = cell
    child = [sys.executable, "-c", f"raise SystemExit({interleave.EXIT_GROUP_LOST})"]
    assert supervise.supervise(child, spec, runs, curves) == (interleave.EXIT_GROUP_LOST, "interrupted")
    assert not runs.exists() and not curves.exists()
    assert "coordinator is gone; no row written" in capsys.readouterr().err
