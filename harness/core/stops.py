"""Stopping a pipeline promptly, and no process of a job outliving its parent.

Snakemake handles a stop badly for long jobs: SIGTERM makes it wait for the running jobs to finish
("Will exit after finishing currently running jobs"), SIGINT cancels its thread pool, which waits
for them too, and SIGHUP kills it outright, leaving its lock and the jobs behind. :func:`forward_stops`
(called from the Snakefile's ``onstart``, in the main Snakemake process only) makes SIGTERM, SIGINT and
SIGHUP reach every process of every job as well, so the jobs stop within seconds -- a cell stopped so writes no
row -- and Snakemake exits as it does once its jobs have ended (no new job, lock released).

:func:`child_env` and :func:`die_with_parent` tie a child process to its parent: the child, once it has
called :func:`die_with_parent`, receives SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``; a
no-op elsewhere), so a SIGKILLed timing-group coordinator or cell supervisor takes its cells with it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Mapping

PARENT_ENV = "COMERA_BENCH_PARENT_PID"
"""The pid of the process a child should die with (set by :func:`child_env`)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


CELL_STARTED_ENV = "COMERA_BENCH_CELL_STARTED"
"""Set by a cell's supervisor (harness.running.supervise) for its child: the wall-clock time (seconds since
the epoch) the supervisor's process started, where the cell's ``start`` phase begins (harness.running.run)."""


def cell_started_at() -> float:
    """When this cell's processes started (seconds since the epoch): its supervisor's start when it has one
    (CELL_STARTED_ENV), else this process's."""
    try:
        return float(os.environ[CELL_STARTED_ENV])
    except (KeyError, ValueError):
        pass
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 -- /proc unreadable: the phase starts now
        return time.time()


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) for a child that is to die with this process."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """In a child started with :func:`child_env`: receive SIGTERM when that parent dies (at once, if it
    has died already). False where this cannot be arranged (not Linux, no such parent given)."""
    expected = os.environ.pop(PARENT_ENV, None)
    if not expected or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != int(expected) and _gone(int(expected)):  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (no such process, or a zombie: Linux ``/proc``)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def forward_stops() -> None:
    """In the main Snakemake process, once its scheduler runs: SIGTERM, SIGINT and SIGHUP also go to
    every child process (the jobs), now and to any child started afterwards, then Snakemake's own
    handling runs (SIGHUP is handled as SIGTERM: finish once the running jobs have ended). A signal
    this process ignores (``nohup``, a background job) stays ignored."""
    graceful = signal.getsignal(signal.SIGTERM)
    forwarding: list[int] = []

    def on_stop(signum: int, frame: object) -> None:
        if not forwarding:
            forwarding.append(signum)
            threading.Thread(target=_keep_forwarding, args=(signum,), daemon=True,
                             name="comera-bench-stop").start()
        own = previous[signum]
        if signum == signal.SIGHUP or not callable(own):
            own = graceful
        if callable(own):
            own(signum, frame)

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        if previous[sig] != signal.SIG_IGN:
            signal.signal(sig, on_stop)


def _keep_forwarding(signum: int) -> None:
    """Send ``signum`` once to every process below this one (as a signal to a process group would reach
    them), for as long as this process lives: a job that was starting when the stop came stops too."""
    import psutil

    me, sent = psutil.Process(), set()
    while True:
        for child in me.children(recursive=True):
            if child.pid not in sent:
                sent.add(child.pid)
                try:
                    child.send_signal(signum)
                except psutil.Error:
                    pass
        time.sleep(FORWARD_POLL_S)
