"""The cell's watchdog: a daemon thread that ends a cell whose step or evaluation hangs.

:class:`Watchdog` fires past the stall limit (:func:`stall_limit_s`) or a deadline set with
:meth:`Watchdog.limit`; a wait for a timing round is a pause. What firing does: harness.running.run.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

from harness import settings

STALL_ENV = "COMERA_BENCH_STALL_LIMIT_S"
STALL_LIMIT_S = settings.SETTINGS[STALL_ENV].default
"""How long the warm-up, a training step or an evaluation may run before the watchdog ends the cell."""


def stall_limit_s() -> float | None:
    """The stall limit in seconds: STALL_ENV when set (0: none), else STALL_LIMIT_S; a value that is not a
    number >= 0 raises ValueError naming the variable."""
    return settings.read(STALL_ENV)



class Watchdog:
    """Calls ``fire(stalled)`` from a daemon thread, unless disarmed first, when the activity under way
    has run ``stall_s`` seconds since :meth:`resume` (None: never; ``stalled`` True) or the deadline of
    :meth:`limit` has passed (``stalled`` False); between :meth:`pause` and :meth:`resume` neither runs.
    ``fire`` must end the process (should it block, the process exits with status 1 after BACKSTOP_S).
    ``disarm`` after ``fire`` has begun blocks until the process ends, so the main thread never writes a
    second row."""

    BACKSTOP_S = 120.0
    POLL_S = 1.0
    """The longest sleep between two looks at the deadlines (they move while the thread sleeps)."""

    def __init__(self, fire: Callable[[bool], None], stall_s: float | None):
        self._disarmed = threading.Event()
        self._lock = threading.Lock()
        self._stall_s = stall_s
        self._limit_at = math.inf
        self._progress_at = time.monotonic()
        self._paused_at: float | None = None
        self._thread = threading.Thread(target=self._watch, args=(fire,), name="cell-watchdog",
                                        daemon=True)
        self._thread.start()

    def limit(self, after_s: float) -> None:
        """Fire ``after_s`` seconds from now (the time spent paused added)."""
        self._limit_at = time.monotonic() + after_s

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        """An activity starts (its stall clock with it); a pause ends, moving the limit by its length."""
        now = time.monotonic()
        self._progress_at = now
        if self._paused_at is not None:
            self._limit_at += now - self._paused_at
            self._paused_at = None

    def _due(self) -> tuple[float, bool]:
        """(when to fire, whether for a stall)"""
        if self._paused_at is not None:
            return math.inf, False
        stall_at = self._progress_at + self._stall_s if self._stall_s else math.inf
        return (stall_at, True) if stall_at < self._limit_at else (self._limit_at, False)

    def _watch(self, fire: Callable[[bool], None]) -> None:
        while True:
            due, stalled = self._due()
            remaining = due - time.monotonic()
            if remaining <= 0:
                break
            if self._disarmed.wait(min(remaining, self.POLL_S)):
                return
        with self._lock:
            if not self._disarmed.is_set():
                backstop = threading.Timer(self.BACKSTOP_S, os._exit, args=(1,))
                backstop.daemon = True
                backstop.start()
                fire(stalled)

    def disarm(self) -> None:
        self._disarmed.set()
        with self._lock:  # waits for a fire already under way (it ends the process)
            pass
        self._thread.join()

