"""A timing group's cells share the machine's memory (one GPU's, on a GPU): a cell whose row says ``oom``
is timed again by itself after its group (harness/running/group.py ``retry_alone``, harness/core/interleave.py
``run_alone``), and its row then belongs to no timing group and says why."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import results
from harness.core import interleave, stops, timing
from harness.running import group, supervise
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec

REASON = "it ran out of memory beside its group (toy)"


@pytest.fixture
def quiet_machine(monkeypatch):
    """The machine-state readings left out: these tests judge the rows, not the shared test machine."""
    monkeypatch.setattr(timing.MachineState, "columns",
                        lambda self: {"load_avg_1m": None, "cpu_pressure": None, "run_queue_frac": None})


def _group_spec(**method_params):
    return toy_spec(method_params=method_params, workload_params={"samples": 512},
                    budget={"epochs": 1, "max_steps_per_epoch": 13, "warmup_steps": 1,
                            "eval_every_steps": None},
                    execution={"rounds": 3, "timing_group": "toy_b16_s0"})


def test_a_cell_timed_alone_belongs_to_no_group_and_says_why(quiet_machine, monkeypatch):
    outside, _ = runner.run_cell(_group_spec(), registry=TOY_REGISTRY)  # no coordinator, no reason: flagged
    assert outside["timing_group"] == "toy_b16_s0"
    assert "not timed in its group's interleaved rounds" in outside["timing_quality"]
    monkeypatch.setenv(interleave.ALONE_ENV, REASON)
    row, _ = runner.run_cell(_group_spec(), registry=TOY_REGISTRY)
    assert row["status"] == "ok", row["error"]
    assert row["timing_group"] is None and row["group_start_s"] is None
    assert "not timed in its group's interleaved rounds" not in row["timing_quality"]
    assert json.loads(row["extra"])["timed_alone"] == REASON
    # its rounds, for the spread of a ratio timed apart
    assert len(json.loads(row["round_step_mean_ms"])) == 3


def test_a_cell_out_of_memory_alone_too_says_so(monkeypatch):
    monkeypatch.setenv(interleave.ALONE_ENV, REASON)
    row, _ = runner.run_cell(_group_spec(fail="oom", fail_at=2), registry=TOY_REGISTRY)
    assert row["status"] == "oom"
    assert row["error"].endswith("(alone too: this cell does not fit the machine's memory by itself)")
    assert json.loads(row["extra"])["timed_alone"] == REASON


def test_the_row_of_a_cell_killed_alone_says_why(monkeypatch):
    """The supervisor's row of a process killed by the OOM killer while timed alone keeps the reason."""
    monkeypatch.setenv(interleave.ALONE_ENV, REASON)
    row = supervise.failure_row(_group_spec(), "oom", "killed by the kernel's OOM killer",
                                {"signal": "SIGKILL"}, "2026-12-05T10:00:00Z")
    assert json.loads(row["extra"]) == {"signal": "SIGKILL", "timed_alone": REASON}
    assert row["error"] == ("killed by the kernel's OOM killer (alone too: this cell does not fit the "
                            "machine's memory by itself)")


def _cell(tmp_path: Path, run_id: str, status: str) -> interleave.Cell:
    spec = toy_spec(run_id=run_id, execution={"timing_group": "g"})
    paths = {kind: tmp_path / f"{run_id}.{kind}"
             for kind in ("spec.json", "runs.parquet", "curves.parquet", "log")}
    paths["spec.json"].write_text(json.dumps(spec))
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(run_id=run_id, status=status,
               error="CUDA out of memory. Tried to allocate 2.00 GiB" if status == "oom" else "")
    results.write_parquet_atomic(results.to_frame([row], "runs"), paths["runs.parquet"], kind="runs")
    paths["log"].write_text(f"{run_id}: its first attempt\n")
    return interleave.Cell(str(paths["spec.json"]), str(paths["runs.parquet"]), str(paths["curves.parquet"]),
                           str(paths["log"]), run_id=run_id)


def test_only_the_cells_out_of_memory_are_run_again_each_alone(tmp_path, monkeypatch):
    cells = [_cell(tmp_path, "a", "ok"), _cell(tmp_path, "b", "oom"), _cell(tmp_path, "c", "error"),
             _cell(tmp_path, "d", "oom")]
    calls = []
    monkeypatch.setattr(interleave, "run_alone",
                        lambda cell, command, reason: calls.append((cell.run_id, command(cell), reason)) or 0)
    lines = []
    assert group.retry_alone(cells, log=lines.append) == ["b", "d"]
    assert [c[0] for c in calls] == ["b", "d"]
    run_id, command, reason = calls[0]
    assert command == group.isolated_command(cells[1])  # the pipeline's own command for the cell
    assert reason.startswith("it ran out of memory while the 4 cells of its timing group shared the memory")
    assert ("CUDA out of memory. Tried to allocate 2.00 GiB" in reason
            and reason.endswith("timed alone after the group"))
    assert lines == ["  b ran out of memory beside its timing group: timing it alone",
                     "  d ran out of memory beside its timing group: timing it alone"]
    assert Path(f"{cells[1].log}.in-group").read_text() == "b: its first attempt\n"  # its first log kept
    assert not Path(cells[1].log).exists() and Path(cells[0].log).exists()


def test_a_group_of_one_cell_is_not_run_again(tmp_path, monkeypatch):
    monkeypatch.setattr(interleave, "run_alone",
                        lambda *a, **k: pytest.fail("a cell alone in its group ran again"))
    assert group.retry_alone([_cell(tmp_path, "b", "oom")], log=lambda line: None) == []


def test_run_alone_gives_the_reason_and_no_coordinator(tmp_path, monkeypatch):
    """The process sees the reason, no round coordinator's socket, and is tied to this process."""
    monkeypatch.setenv(interleave.ENV, "/no/such/socket")
    seen = tmp_path / "env.json"
    script = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[2:]}, "
              "open(sys.argv[1], 'w')); sys.exit(3)")
    cell = interleave.Cell("s.json", "r.parquet", "c.parquet")
    keys = [interleave.ALONE_ENV, interleave.ENV, stops.PARENT_ENV]
    status = interleave.run_alone(cell, command=lambda c: [sys.executable, "-c", script, str(seen), *keys],
                                  reason=REASON)
    assert status == 3 and cell.proc.returncode == 3
    assert json.loads(seen.read_text()) == {interleave.ALONE_ENV: REASON, interleave.ENV: None,
                                            stops.PARENT_ENV: str(os.getpid())}


def test_a_stop_during_the_run_alone_ends_the_cell_at_once(tmp_path):
    """SIGTERM to the group process while a cell runs alone ends that cell's process too, within seconds
    (stops are prompt, as in the group's rounds)."""
    script = """
import sys
from harness.core import interleave
interleave.stop_on_signals()
cell = interleave.Cell("s.json", "r.parquet", "c.parquet")
interleave.run_alone(cell, command=lambda c: [sys.executable, "-c", "import time; time.sleep(120)"],
                     reason="test")
"""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[3])
    deadline = time.monotonic() + 30
    children: list = []
    while not children and time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        time.sleep(0.1)
    assert children, "the cell never started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive
