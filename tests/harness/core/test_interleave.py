"""Interleaved timing rounds (harness/core/interleave.py): one process per cell, exactly one cell's steps
at a time, the order reversed every other round, cells that fail or never connect dropped."""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness.core import interleave, stops
from harness.running import group

TOY = r"""
import os, sys, time
from harness.core.interleave import RoundGate
run_id, log, rounds, die_in = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
gate = RoundGate.from_env(run_id)
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{time.monotonic():.6f} {run_id} {what}\n")
for r in range(rounds):
    gate.wait(r)
    if r == die_in:
        sys.exit(3)
    note(f"start {r}")
    time.sleep(0.03)
    note(f"end {r}")
gate.done()
note("finish")
"""


def _cells(tmp_path, names):
    cells = []
    for name in names:
        spec = tmp_path / f"{name}.spec.json"
        spec.write_text(json.dumps({"run_id": name}))
        cells.append(interleave.Cell(str(spec), "", ""))
    return cells


def _run(tmp_path, names, rounds=3, die=None, never=(), said=None):
    log = tmp_path / "log.txt"
    die = die or {}

    def command(cell):
        if cell.run_id in never:
            return [sys.executable, "-c", "raise SystemExit(2)"]
        return [sys.executable, "-c", TOY, cell.run_id, str(log), str(rounds), str(die.get(cell.run_id, -1))]

    failed = interleave.run_group(_cells(tmp_path, names), rounds, command=command,
                                  log=(said.append if said is not None else lambda m: None))
    events = [line.split(maxsplit=2) for line in log.read_text().splitlines()]
    return failed, [(float(t), rid, what) for t, rid, what in events]


def test_one_cell_at_a_time_in_alternating_order(tmp_path):
    failed, events = _run(tmp_path, ["a", "b", "c"])
    assert failed == 0
    starts = [(rid, what) for _, rid, what in events if what.startswith("start")]
    assert starts == [("a", "start 0"), ("b", "start 0"), ("c", "start 0"),
                      ("c", "start 1"), ("b", "start 1"), ("a", "start 1"),
                      ("a", "start 2"), ("b", "start 2"), ("c", "start 2")]
    # a step's start and end are adjacent: no other cell ran in between
    timed = [(rid, what) for _, rid, what in events if not what.startswith("finish")]
    for (rid1, w1), (rid2, w2) in zip(timed[::2], timed[1::2]):
        assert rid1 == rid2 and w1.replace("start", "end") == w2
    # nothing after its rounds runs before every cell has finished its rounds
    last_end = max(t for t, _, what in events if what.startswith("end"))
    assert all(t > last_end for t, _, what in events if what == "finish")


def test_a_cell_that_dies_or_never_connects_leaves_the_others_running(tmp_path):
    said = []
    failed, events = _run(tmp_path, ["a", "b", "c", "d"], die={"b": 1}, never={"d"}, said=said)
    assert failed == 2
    assert "  not in the rounds (ended before them): d" in said  # b left in round 1
    assert any(line.startswith("  first round after ") for line in said)
    done = {rid for _, rid, what in events if what == "finish"}
    assert done == {"a", "c"}
    assert [w for _, rid, w in events if rid == "b"] == ["start 0", "end 0"]


TURNS = r"""
import sys, time
from harness.core.interleave import RoundGate
run_id, log = sys.argv[1], sys.argv[2]
gate = RoundGate.from_env(run_id)
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{time.monotonic():.6f} {run_id} {what}\n")
gate.start_turn()
note("turn")
time.sleep(0.1)
note("turn end")
gate.wait(0, {"build": 0.1, "warmup_steps": 0.25})
gate.done()
"""


@pytest.mark.parametrize("slots", [1, 2])
def test_start_turns_let_a_few_cells_start_at_a_time(tmp_path, slots):
    """A cell that asks for a start turn holds it until its first ready: never more than ``slots`` at
    once, first asked first served; the slowest cell's start phases are logged."""
    log, said = tmp_path / "log.txt", []
    failed = interleave.run_group(_cells(tmp_path, ["a", "b", "c"]), 1, log=said.append, slots=slots,
                                  command=lambda c: [sys.executable, "-c", TURNS, c.run_id, str(log)])
    assert failed == 0
    holding, most = 0, 0
    for line in sorted(log.read_text().splitlines(), key=lambda line: float(line.split()[0])):
        holding += 1 if line.endswith(" turn") else -1
        most = max(most, holding)
    assert most == slots
    assert any(line.startswith("  slowest to start: ") and line.endswith(": build 0.1, warmup steps 0.2 s")
               for line in said), said


def test_start_slots_divide_the_cpus_by_the_threads():
    assert interleave.start_slots(2, cpus=2) == 1
    assert interleave.start_slots(2, cpus=16) == 8
    assert interleave.start_slots(4, cpus=2) == 1
    assert interleave.start_slots(1, cpus=3) == 3


def test_gate_without_coordinator(monkeypatch, capsys):
    monkeypatch.delenv(interleave.ENV, raising=False)
    assert interleave.RoundGate.from_env("x") is None
    monkeypatch.setenv(interleave.ENV, "/nonexistent/rounds.sock")
    assert interleave.RoundGate.from_env("x") is None
    assert "cannot reach the round coordinator" in capsys.readouterr().err


@pytest.mark.parametrize("rounds", [0, -1])
def test_cli_refuses_no_rounds(rounds, capsys):
    with pytest.raises(SystemExit) as exc:
        group.main(["--rounds", str(rounds), "--cell", "s", "r", "c", "l"])
    assert exc.value.code == 2
    assert "need at least 1" in capsys.readouterr().err


def test_sigterm_ends_the_group_and_its_cells(tmp_path):
    """The coordinator stopped by SIGTERM terminates every cell process and removes its socket folder."""
    import signal
    import subprocess
    import time

    import psutil

    script = f"""
import json, sys, tempfile
from pathlib import Path
from harness.core import interleave
cells = []
for name in "ab":
    spec = Path({str(tmp_path)!r}) / (name + ".json")
    spec.write_text(json.dumps({{"run_id": name}}))
    cells.append(interleave.Cell(str(spec), "", ""))
interleave.stop_on_signals()
interleave.run_group(cells, 3, command=lambda c: [sys.executable, "-c", "import time; time.sleep(60)"],
                     log=lambda m: None)
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = psutil.Process(proc.pid).children()
    assert len(kids) == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(kids, timeout=30)
    assert not alive


def test_a_stop_signal_while_a_cell_starts_still_ends_that_cell(tmp_path, monkeypatch):
    """SIGTERM delivered inside Popen (after the fork, before run_group holds the process) used to leave
    that child running; it now takes effect once the process is recorded, and the cleanup ends it."""
    import signal
    import subprocess

    from harness.core import interleave

    started, real_popen = [], subprocess.Popen

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        signal.raise_signal(signal.SIGTERM)  # its handler runs here, before Popen returns
        return proc

    spec = tmp_path / "a.json"
    spec.write_text(json.dumps({"run_id": "a"}))
    monkeypatch.setattr(interleave.subprocess, "Popen", popen)
    saved = {sig: signal.getsignal(sig) for sig in stops.STOP_SIGNALS}
    try:
        interleave.stop_on_signals()
        with pytest.raises(SystemExit) as stopped:
            interleave.run_group([interleave.Cell(str(spec), "", "")], 1, log=lambda m: None,
                                 command=lambda c: [sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert len(started) == 1 and started[0].poll() is not None  # terminated by run_group's cleanup
    assert interleave._deferred is None


def test_a_cell_whose_coordinator_closes_the_connection_stops_without_a_row(tmp_path, monkeypatch):
    """A coordinator that vanishes while the cell waits for its go ends the cell (GroupLost, exit status
    EXIT_GROUP_LOST), instead of letting it time itself without rounds and write a row later."""
    import socket
    import threading

    path = str(tmp_path / "rounds.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def vanish():  # read hello and ready 0, then close without go
        conn, _ = server.accept()
        lines = conn.makefile("rb")
        lines.readline()
        lines.readline()
        lines.close()
        conn.close()

    threading.Thread(target=vanish, daemon=True).start()
    monkeypatch.setenv(interleave.ENV, path)
    gate = interleave.RoundGate.from_env("a")
    with pytest.raises(SystemExit) as lost:
        gate.wait(0)
    assert isinstance(lost.value, interleave.GroupLost) and lost.value.code == interleave.EXIT_GROUP_LOST
    server.close()


def _tiny_spec(tmp_path, method: str) -> str:
    spec = {"run_id": f"t_{method}", "workload": "transformer", "method": method, "batch_size": 4, "seed": 0,
            "variant": "default", "target_ratio": None, "workload_params": {"size": "tiny"},
            "method_params": {},
            "budget": {"epochs": 1, "eval_every_steps": 1000, "max_steps_per_epoch": 400,
                       "time_limit_s": None, "warmup_steps": 1},
            "execution": {"device": "cpu", "num_threads": 1, "rounds": 3, "timing_group": "t",
                          "compile": False, "cuda_graph": False}}
    path = tmp_path / f"t_{method}.spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.slow
def test_cells_die_with_a_sigkilled_coordinator(tmp_path):
    """SIGKILL of `python -m harness.running.group`: its cells (`comera-bench run
    --isolate` and their workers) end within seconds and write no row."""
    import signal
    import subprocess
    import time

    import psutil

    args = []
    for method in ("dense", "comera"):
        spec = _tiny_spec(tmp_path, method)
        base = spec.removesuffix(".spec.json")
        args += ["--cell", spec, f"{base}.runs.parquet", f"{base}.curves.parquet", f"{base}.log"]
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    coordinator = subprocess.Popen([sys.executable, "-m", "harness.running.group", "--rounds", "3", *args],
                                   env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    below: list[psutil.Process] = []
    while time.monotonic() < deadline and len(below) < 4:  # two supervisors and their workers
        below = psutil.Process(coordinator.pid).children(recursive=True)
        time.sleep(0.1)
    assert len(below) == 4, "the cells never started"
    time.sleep(2)  # the workers import torch and build their models (rounds begin ~10 s in)
    coordinator.send_signal(signal.SIGKILL)
    coordinator.wait()
    gone, alive = psutil.wait_procs(below, timeout=5)  # at once, not when a worker next meets the gate
    assert not alive, [p.cmdline() for p in alive]
    assert not list(tmp_path.glob("*.parquet"))  # and no process is left to write one later


def test_the_pipeline_group_runs_each_cell_isolated(tmp_path):
    """harness.running.group builds the cell's command (core/ knows nothing of the CLI)."""
    cell = interleave.Cell("s.json", "r.parquet", "c.parquet", "l.log")
    cmd = group.isolated_command(cell)
    assert cmd[-10:] == ["run", "--isolate", "--spec", "s.json", "--runs-out", "r.parquet",
                         "--curves-out", "c.parquet", "--log", "l.log"]


def test_round_lines_say_how_long_the_groups_other_rounds_take():
    """After each round but the last: the time left at the rate of the rounds so far (the seconds before
    the first round -- starting, building, warming up -- not counted)."""
    assert interleave.round_line(0, 5, 4, 70.0, 10.0) == (
        "  round 1/5: 4 cells (70 s); about 4m00s left in this group's rounds")  # 60 s a round
    assert interleave.round_line(3, 5, 4, 250.0, 10.0).endswith("about 1m00s left in this group's rounds")
    assert interleave.round_line(4, 5, 3, 310.0, 10.0) == "  round 5/5: 3 cells (310 s)"


def test_a_groups_cells_leave_the_pipeline_line_to_the_coordinator(tmp_path, monkeypatch):
    """``main`` prints "cells N of M done" once for the group (its cells, which see the coordinator's
    socket in the environment, print none)."""
    from harness.running import eta

    calls = []
    monkeypatch.setattr(interleave, "run_group", lambda cells, rounds, command: calls.append(len(cells)))
    monkeypatch.setattr(eta, "pipeline_line", lambda folder: f"comera-bench: cells in {folder}")
    cell = [str(tmp_path / name) for name in ("a.spec.json", "a.runs.parquet", "a.curves.parquet", "a.log")]
    for path in cell[1:3]:
        open(path, "w").close()
    monkeypatch.setattr(group.stops, "die_with_parent", lambda: None)
    monkeypatch.setattr(interleave, "stop_on_signals", lambda: None)
    import io

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert group.main(["--rounds", "2", "--cell", *cell]) == 0
    assert calls == [1] and err.getvalue() == f"comera-bench: cells in {tmp_path}\n"
