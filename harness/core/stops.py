"""Stopping a pipeline promptly, a cell's one stop policy, and no process of a job outliving its parent.

:func:`forward_stops` (the Snakefile's ``onstart``) passes a stop on to every job's processes,
:func:`die_with_parent` ties a child to its parent, :class:`CellStop` is a cell's policy. What a user sees:
docs/pipeline.md, "Stopping, resuming, unlocking"; why: docs/design-notes.md.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

from harness import settings

PARENT_ENV = "COMERA_BENCH_PARENT_PID"
"""The pid of the process a child should die with (set by :func:`child_env`)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0
"""How long a cell stopped in its training steps may take to finish its step and write its checkpoint;
past it the process ends without one (:class:`CellStop`)."""
SAME_STOP_S = 1.0
"""Stop signals within this many seconds of the first are copies of it, not a second stop: a pipeline's
stop reaches a cell from Snakemake and again from the cell's supervisor."""


CELL_STARTED_ENV = "COMERA_BENCH_CELL_STARTED"
"""Set by a cell's supervisor (harness.running.supervise) for its child: the wall-clock time (seconds since
the epoch) the supervisor's process started, where the cell's ``start`` phase begins (harness.running.run)."""


def cell_started_at() -> float:
    """When this cell's processes started (seconds since the epoch): its supervisor's start when it has one
    (CELL_STARTED_ENV), else this process's."""
    try:
        started = settings.read(CELL_STARTED_ENV)
    except settings.SettingError:
        started = None
    if started is not None:
        return started
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
    expected = settings.read(PARENT_ENV, {PARENT_ENV: os.environ.pop(PARENT_ENV, "")})
    if not expected or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != expected and _gone(expected):  # it died before the line above
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


class Stopped(BaseException):
    """Raised by :meth:`CellStop.end` after the step and its checkpoint: :meth:`CellStop.guard` ends the
    process by ``signum``. A BaseException: the runner does not turn it into a failure row."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class CellStop:
    """The stop policy of one cell's process (docs/pipeline.md, "Stopping, resuming, unlocking").

    Args:
        defer: whether a stop in the training steps waits for the end of the step (the cell writes
            checkpoints); False: every stop ends the process at once.

    Example::

        stop = CellStop(defer=True)
        with stop.guard():             # in the main thread
            stop.at_steps = True       # the training steps begin
            ...                        # after each step:
            if stop.asked is not None:
                write_the_checkpoint()
                stop.end("stopped after step 7")
    """

    def __init__(self, defer: bool):
        self.defer = defer
        self.at_steps = False
        """Whether the cell is in its training steps (set by the runner)."""
        self.asked: int | None = None
        """The stop signal that waits for the end of the step, or None."""
        self._received_at = 0.0
        self._lock = threading.Lock()

    def on_signal(self, signum: int, now: float | None = None) -> float | None:
        """Decide on the stop signal ``signum`` (received at ``now``, time.monotonic()): returns when to end
        the process without waiting any longer (a time.monotonic() value; ``now`` itself to end at once),
        or None to go on (a copy of the stop already received)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self.asked is not None:
                return None if now - self._received_at < SAME_STOP_S else now
            if not (self.defer and self.at_steps):
                return now
            self.asked, self._received_at = signum, now
            return now + STOP_GRACE_S

    def end(self, message: str) -> None:
        """After the step and its checkpoint, in the main thread: raise :class:`Stopped` (``message`` is
        printed and the process ends by the signal when it reaches :meth:`guard`)."""
        raise Stopped(message, self.asked)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """While the block runs the cell: this policy for SIGTERM, SIGINT and SIGHUP (a signal the process
        ignores stays ignored). Outside the main thread, nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        handled = [sig for sig, handler in previous.items() if handler != signal.SIG_IGN]
        old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(read_fd, done, set(handled)), daemon=True,
                                   name="cell-stop")
        watcher.start()
        for sig in handled:  # from here the thread acts on them: the main thread may be stuck in C code
            signal.signal(sig, _noted)
        try:
            yield
        except Stopped as stop:
            print(stop, file=sys.stderr, flush=True)
            end_by(stop.signum)
        finally:  # a stop in the last step: the row follows, the process ends as it would anyway
            for sig in handled:
                signal.signal(sig, previous[sig])
            signal.set_wakeup_fd(old_wakeup)
            done.set()
            with contextlib.suppress(BlockingIOError):
                os.write(write_fd, b"\0")  # wakes the thread up
            watcher.join()
            os.close(read_fd)
            os.close(write_fd)

    def _watch(self, read_fd: int, done: threading.Event, handled: set[int]) -> None:
        """The daemon thread: reads the signal numbers Python writes to its wakeup descriptor and applies
        :meth:`on_signal`; ends the process when a deadline passes."""
        deadline, signum = None, 0
        while not done.is_set():
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([read_fd], [], [], timeout)
            if not ready:  # the step did not end within the grace
                if done.is_set():
                    return
                print(f"comera-bench: the step under way did not end within {STOP_GRACE_S:g} s of "
                      f"{signal.Signals(signum).name}; ending without a checkpoint", file=sys.stderr,
                      flush=True)
                end_by(signum)
            for byte in os.read(read_fd, 64):
                if byte not in handled or done.is_set():
                    continue
                end_at = self.on_signal(byte)
                if end_at is not None and end_at <= time.monotonic():
                    end_by(byte)
                if end_at is not None:
                    deadline, signum = end_at, byte


def _noted(signum: int, frame: object) -> None:
    """The Python-level handler of a stop signal under :meth:`CellStop.guard`: nothing (its thread acts)."""


def end_by(signum: int) -> None:
    """End this process as ``signum``'s default action would, from any thread (outside the main thread
    the default action is restored through the C library, never ``signal.signal``); exit status 128 +
    ``signum`` where that fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
            libc.signal(signum, None)  # SIG_DFL
        except (OSError, AttributeError):
            os._exit(128 + signum)
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # the signal is delivered to some thread; should none take it, end here
    os._exit(128 + signum)
