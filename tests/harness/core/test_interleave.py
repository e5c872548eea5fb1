"""Interleaved timing rounds (harness/core/interleave.py): one process per cell, exactly one cell's steps
at a time, the order reversed every other round, cells that fail or never connect dropped."""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness.core import interleave, stops

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


def _run(tmp_path, names, rounds=3, die=None, never=()):
    log = tmp_path / "log.txt"
    die = die or {}

    def command(cell):
        if cell.run_id in never:
            return [sys.executable, "-c", "raise SystemExit(2)"]
        return [sys.executable, "-c", TOY, cell.run_id, str(log), str(rounds), str(die.get(cell.run_id, -1))]

    failed = interleave.run_group(_cells(tmp_path, names), rounds, command=command, log=lambda m: None)
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
    failed, events = _run(tmp_path, ["a", "b", "c", "d"], die={"b": 1}, never={"d"})
    assert failed == 2
    done = {rid for _, rid, what in events if what == "finish"}
    assert done == {"a", "c"}
    assert [w for _, rid, w in events if rid == "b"] == ["start 0", "end 0"]


def test_gate_without_coordinator(monkeypatch, capsys):
    monkeypatch.delenv(interleave.ENV, raising=False)
    assert interleave.RoundGate.from_env("x") is None
    monkeypatch.setenv(interleave.ENV, "/nonexistent/rounds.sock")
    assert interleave.RoundGate.from_env("x") is None
    assert "cannot reach the round coordinator" in capsys.readouterr().err


@pytest.mark.parametrize("rounds", [0, -1])
def test_cli_refuses_no_rounds(rounds, capsys):
    with pytest.raises(SystemExit) as exc:
        interleave.main(["--rounds", str(rounds), "--cell", "s", "r", "c", "l"])
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
from harness.core import interleave, stops
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
