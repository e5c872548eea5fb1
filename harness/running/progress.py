"""A cell's training progress on stderr: a tqdm bar on a terminal, else a line every LOG_EVERY_S seconds.

A background thread writes the line too, so a long step leaves no silent log (docs/usage.md); why:
docs/design-notes.md.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

from harness.core.clock import clock

LOG_EVERY_S = 15.0


def eta_s(done: int, total: int, elapsed_s: float, since_first_s: float | None = None) -> float | None:
    """Seconds left at the rate so far (None before the first step): from the ``since_first_s`` seconds
    since the first step finished when two or more steps did, else from the whole ``elapsed_s``."""
    if not done:
        return None
    if done > 1 and since_first_s is not None:
        return since_first_s / (done - 1) * (total - done)
    return elapsed_s / done * (total - done)


class StepLog:
    """Progress lines every ``every_s`` seconds on ``stream``; ``update``/``close`` like a tqdm bar.
    ``heartbeat``: a daemon thread also writes the line whenever ``every_s`` seconds passed without
    one (a long step, an evaluation, a wait for the timing group's other cells), until ``close``."""

    def __init__(self, total: int, name: str, stream: TextIO, every_s: float = LOG_EVERY_S,
                 now: Callable[[], float] = time.monotonic, heartbeat: bool = False, start: int = 0):
        self.total, self.name, self.stream, self.every_s, self.now = total, name, stream, every_s, now
        self.done = self.start = start
        self.started = self.last = self.last_step = now()
        self.first_step: float | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name=f"progress-{name}", daemon=True)
            self._thread.start()

    def update(self, n: int = 1) -> None:
        self.done += n
        self.last_step = self.now()
        if self.first_step is None:
            self.first_step = self.last_step
        if self.done >= self.total or self.last_step - self.last >= self.every_s:
            self.write()

    def write(self) -> None:
        with self._lock:
            self.last = self.now()
            elapsed = self.last - self.started
            stalled = self.last - self.last_step
            if stalled >= self.every_s:
                state = f", no step finished for {clock(stalled)}"
            else:
                since_first = None if self.first_step is None else self.last - self.first_step
                left = eta_s(self.done - self.start, self.total - self.start, elapsed, since_first)
                state = "" if left is None else f", ETA {clock(left)}"
            print(f"{self.name}: step {self.done} of {self.total}, elapsed {clock(elapsed)}{state}",
                  file=self.stream, flush=True)

    def _beat(self) -> None:
        """The heartbeat: wake up every ``every_s`` / 4 and write when the last line is ``every_s`` old."""
        while not self._closed.wait(self.every_s / 4):
            if self.now() - self.last >= self.every_s:
                try:
                    self.write()
                except (OSError, ValueError):  # the stream was closed under us: nothing more to say
                    return

    def close(self) -> None:
        """Stop the heartbeat (the last step wrote its line)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()


def progress(total: int, name: str, bar: bool | None, start: int = 0):
    """A tqdm bar when ``bar`` (default: stderr is a terminal), else a :class:`StepLog` on stderr;
    ``start`` steps are done already (a resumed cell): the rate and ETA count only the steps after them."""
    if bar is None:
        bar = sys.stderr.isatty()
    if not bar:
        return StepLog(total, name, sys.stderr, heartbeat=True, start=start)
    from tqdm import tqdm

    return tqdm(total=total, desc=name, file=sys.stderr, mininterval=1.0, leave=False, initial=start)
