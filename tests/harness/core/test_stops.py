"""harness/core/stops.py: a child tied to its parent gets SIGTERM when the parent dies (also when it died
before the child could arm), and a stop signal to the Snakemake process reaches every process below it
and then runs Snakemake's own handler."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.core import stops

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

CHILD = """
import sys, time
from harness.core import stops
time.sleep(float(sys.argv[2]))  # the parent may die before the child arms
stops.die_with_parent()
time.sleep(30)
open(sys.argv[1], "w").write("outlived its parent")
"""

PARENT = """
import subprocess, sys, time
from harness.core import stops
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], env=stops.child_env())
print(child.pid, flush=True)
time.sleep(float(sys.argv[4]))
"""


def _orphan(tmp_path: Path, arm_after_s: float, parent_lives_s: float) -> tuple[int, Path]:
    """A parent that starts a tied child, then lives ``parent_lives_s`` (then SIGKILLed if still there)."""
    marker = tmp_path / "marker"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker), str(arm_after_s),
                               str(parent_lives_s)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    if parent_lives_s > 5:
        time.sleep(arm_after_s + 3)  # the child has armed (its import included)
        parent.kill()
    parent.wait(timeout=30)
    return child, marker


@pytest.mark.parametrize("arm_after_s, parent_lives_s", [(0, 60), (1.5, 0)],
                         ids=["parent SIGKILLed", "parent gone before the child armed"])
def test_a_tied_child_dies_with_its_parent(tmp_path, arm_after_s, parent_lives_s):
    child, marker = _orphan(tmp_path, arm_after_s, parent_lives_s)
    assert _ends(child, within_s=15), "the child outlived its parent"
    assert not marker.exists()


def _ends(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` (not necessarily our child) ends within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_an_untied_process_is_left_alone(monkeypatch):
    monkeypatch.delenv(stops.PARENT_ENV, raising=False)
    assert stops.die_with_parent() is False


FORWARDER = """
import os, signal, subprocess, sys, time
from harness.core import stops
signal.signal(signal.SIGTERM, lambda s, f: print("own handler", s, flush=True))  # Snakemake's, in onstart
stops.forward_stops()
job = subprocess.Popen([sys.executable, "-c",
    "import signal, subprocess, sys, time; "
    "signal.signal(signal.SIGTERM, lambda s, f: (print('job got', s, flush=True), sys.exit(0))); "
    "sub = subprocess.Popen(['sleep', '60']); print(sub.pid, flush=True); time.sleep(60)"])
time.sleep(float(sys.argv[1]))
os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` sends it: to this process alone
job.wait(timeout=30)
print("job ended", job.returncode, flush=True)
"""


def test_a_stop_reaches_every_process_below_and_then_the_own_handler():
    out = subprocess.run([sys.executable, "-c", FORWARDER, "3"], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    sleeper = int(lines[0])
    assert "own handler 15" in lines and "job got 15" in lines and "job ended 0" in lines, out
    assert _ends(sleeper, within_s=5)


def test_an_ignored_stop_signal_stays_ignored():
    out = subprocess.run([sys.executable, "-c", "import signal; from harness.core import stops; "
                          "signal.signal(signal.SIGHUP, signal.SIG_IGN); stops.forward_stops(); "
                          "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "
                          "signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out


def test_a_cell_stop_decides_copies_second_stops_and_stops_outside_the_steps():
    """CellStop's policy, by its clock: a stop in the steps waits for the step (until the grace), its
    copies within SAME_STOP_S are one stop, a later one ends at once; so does a stop outside the steps or
    of a cell without checkpoints."""
    stop = stops.CellStop(defer=True)
    assert stop.on_signal(signal.SIGHUP, now=100.0) == 100.0 and stop.asked is None  # before the steps
    stop.at_steps = True
    assert stop.on_signal(signal.SIGTERM, now=200.0) == 200.0 + stops.STOP_GRACE_S
    assert stop.asked == signal.SIGTERM
    assert stop.on_signal(signal.SIGTERM, now=200.0 + stops.SAME_STOP_S / 2) is None  # the supervisor's copy
    assert stop.on_signal(signal.SIGINT, now=200.0 + stops.SAME_STOP_S) == 200.0 + stops.SAME_STOP_S
    never = stops.CellStop(defer=False)
    never.at_steps = True
    assert never.on_signal(signal.SIGTERM, now=5.0) == 5.0 and never.asked is None


HUNG_CELL = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with it ignored
from harness.running import run as runner
from tests.harness.running import run_toys
real_sleep = time.sleep
def sleep(seconds):
    if seconds >= run_toys.HANG_S:
        print("hung", flush=True)
    real_sleep(seconds)
time.sleep = sleep
spec = run_toys.toy_spec(method_params={"hang_at": 3}, budget={"eval_every_steps": None})
runner.run_to_files(spec, sys.argv[1], sys.argv[2], registry=run_toys.TOY_REGISTRY)
"""


@pytest.mark.parametrize("checkpoints, signum", [("0.000001", signal.SIGTERM), ("0", signal.SIGINT)],
                         ids=["checkpointing cell, SIGTERM", "cell without checkpoints, SIGINT"])
def test_a_stop_ends_a_cell_whose_step_hangs(tmp_path, checkpoints, signum):
    """A step that hangs (an hour) in ``comera-bench run``'s process: one stop ends the process by that
    signal, after the grace for the step when the cell writes checkpoints (its last checkpoint, after the
    step before, kept), at once when it does not. No bound is asserted on the time beyond a minute: the
    policy before ended neither."""
    from harness.running import checkpoint

    runs = tmp_path / "cell.runs.parquet"
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, checkpoint.CHECKPOINT_ENV: checkpoints,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    curves = tmp_path / "cell.curves.parquet"
    child = subprocess.Popen([sys.executable, "-c", HUNG_CELL, str(runs), str(curves)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "hung\n"
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == -signum, err
    assert not runs.exists()
    if checkpoints != "0":
        ckpt = checkpoint.path_for(runs)
        assert _steps_done(ckpt) == 3 and f"did not end within {stops.STOP_GRACE_S:g} s of SIGTERM" in err


def _steps_done(path: Path) -> int:
    import torch

    return torch.load(path, weights_only=False)["cell"]["steps_done"]  # the test's own file
