"""Timing the cells that are compared together in interleaved rounds, each cell in its own process.

:func:`run_group` runs the group (start turns, then one cell's timed steps at a time), :class:`RoundGate`
is a cell's side, :func:`run_alone` times one cell by itself. How and why: docs/measurement.md,
"Interleaved rounds"; the socket protocol: docs/design-notes.md.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from harness import settings
from harness.core import stops
from harness.core.clock import clock

ENV = "COMERA_BENCH_ROUNDS"
POLL_S = 0.5
ALONE_ENV = "COMERA_BENCH_ALONE"
"""Set for a cell of a timing group that :func:`run_alone` runs by itself: why it is timed alone."""
EXIT_GROUP_LOST = 76
"""A cell's exit status when its coordinator vanished mid-rounds (no row: its times were not taken in
its group's rounds; the cell's supervisor treats it as interrupted)."""


class GroupLost(SystemExit):
    """The round coordinator closed the connection while this cell waited for it: end the process
    (a SystemExit, so no ``except Exception`` turns it into a row)."""

    def __init__(self) -> None:
        super().__init__(EXIT_GROUP_LOST)


class RoundGate:
    """The cell's side: :meth:`wait` before each round's steps (a no-op without a coordinator)."""

    def __init__(self, path: str, run_id: str):
        self.group_start_s: float | None = None
        """The group's seconds from its start to its first round (from the first ``go``)."""
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb", buffering=0)
        self._send(f"hello {run_id}")

    def start_turn(self) -> float:
        """Wait for this cell's turn to start (build, warm up, run its warm-up steps; held until its first
        :meth:`wait`); return the seconds waited."""
        if self._sock is None:
            return 0.0
        started = time.perf_counter()
        self._ask("start")
        return time.perf_counter() - started

    @classmethod
    def from_env(cls, run_id: str) -> "RoundGate | None":
        path = settings.read(ENV)
        if not path:
            return None
        try:
            return cls(path, run_id)
        except OSError as exc:
            print(f"comera-bench: warning: cannot reach the round coordinator at {path} ({exc}); "
                  "timing this cell without rounds", file=sys.stderr)
            return None

    def _send(self, line: str) -> None:
        self._file.write(line.encode() + b"\n")

    def wait(self, round_index: int, phases: dict[str, float] | None = None) -> float:
        """Tell the coordinator this cell is at round ``round_index`` (with ``phases``: where its time before
        the first round went, phase -> seconds) and block until it says go; return the seconds waited."""
        if self._sock is None:
            return 0.0
        started = time.perf_counter()
        info = f" {json.dumps({k: round(v, 3) for k, v in phases.items()}, separators=(',', ':'))}" \
            if phases else ""
        self._ask(f"ready {round_index}{info}")
        return time.perf_counter() - started

    def done(self) -> float:
        """This cell's rounds are over: wait until the coordinator lets every cell finish; return the
        seconds waited."""
        if self._sock is None:
            return 0.0
        started = time.perf_counter()
        self._ask("done")
        self.close()
        return time.perf_counter() - started

    def _ask(self, line: str) -> None:
        """Send ``line`` and wait for ``go``; GroupLost when the coordinator is gone."""
        try:
            self._send(line)
            answer = self._file.readline()
        except OSError:
            answer = b""
        word, _, seconds = answer.strip().partition(b" ")
        if word == b"go":
            if seconds and self.group_start_s is None:
                self.group_start_s = float(seconds)
            return
        self.close()
        print("comera-bench: the round coordinator is gone; this cell stops without a row",
              file=sys.stderr, flush=True)
        raise GroupLost()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            finally:
                self._sock = None


@dataclass
class Cell:
    """A cell of a group: its spec and output files, and while running its process and connection."""

    spec: str
    runs: str
    curves: str
    log: str | None = None
    run_id: str = ""
    proc: subprocess.Popen | None = None
    conn: socket.socket | None = None
    buffer: bytes = b""
    state: str = "starting"
    """starting (no connection yet) | running (steps under way; before its first round: starting, without
    a start turn) | queued (waits for a start turn) | warming (has its start turn) | ready (waits for the
    round in ``at_round``) | done (its rounds are over; waits to be released) | gone (left the rounds)"""
    at_round: int | None = None
    ready_s: float | None = None
    """Seconds from the group's start to this cell's first ``ready``."""
    start_phases: dict[str, float] | None = None
    """What the cell sent with its first ``ready``: where its time before the first round went."""


class _Coordinator:
    def __init__(self, cells: list[Cell], server: socket.socket, deadline: float | None = None,
                 slots: int | None = None):
        self.cells, self.deadline = cells, deadline
        self.slots = slots
        """How many cells may hold a start turn at once (None: all)."""
        self.queue: list[Cell] = []
        self.first_round_s = 0.0
        self.started = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.sel.register(server, selectors.EVENT_READ, None)

    def close(self) -> None:
        self.sel.close()

    def _drop(self, cell: Cell) -> None:
        if cell.conn is not None:
            self.sel.unregister(cell.conn)
            cell.conn.close()
            cell.conn = None
        cell.state = "gone"

    def _read(self, key: selectors.SelectorKey) -> None:
        """Read what a connection sent. Its first line (``hello <run_id>``) binds it to its cell; a
        connection that closes drops its cell out of the rounds."""
        conn, cell = key.fileobj, key.data
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            if isinstance(cell, Cell):
                self._drop(cell)
            else:
                self.sel.unregister(conn)
                conn.close()
            return
        buffer = (cell.buffer if isinstance(cell, Cell) else cell["buffer"]) + data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, _, arg = line.decode(errors="replace").strip().partition(" ")
            if not isinstance(cell, Cell):  # an unbound connection: expect hello
                cell = self._bind(conn, arg) if word == "hello" else None
                if cell is None:
                    self.sel.unregister(conn)
                    conn.close()
                    return
            elif word == "ready":
                index, _, info = arg.partition(" ")
                cell.state, cell.at_round = "ready", int(index)
                if cell.ready_s is None:
                    cell.ready_s = time.monotonic() - self.started
                    cell.start_phases = _phases(info)
            elif word == "done":
                cell.state, cell.at_round = "done", None
            elif word == "start":
                cell.state = "queued"
                self.queue.append(cell)
        if isinstance(cell, Cell):
            cell.buffer = buffer
        else:
            cell["buffer"] = buffer

    def _bind(self, conn: socket.socket, run_id: str) -> Cell | None:
        for cell in self.cells:
            if cell.run_id == run_id and cell.state == "starting":
                cell.conn, cell.state = conn, "running"
                self.sel.modify(conn, selectors.EVENT_READ, cell)
                return cell
        return None  # not one of ours

    def pump(self, timeout: float = POLL_S) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError("the timing group ran past its time limit")
        for key, _ in self.sel.select(timeout):
            if key.data is None:
                conn, _ = key.fileobj.accept()
                self.sel.register(conn, selectors.EVENT_READ, {"buffer": b""})
            else:
                self._read(key)
        for cell in self.cells:  # a process that ended before it connected
            if cell.state == "starting" and cell.proc is not None and cell.proc.poll() is not None:
                cell.state = "gone"
        self._grant()

    def _grant(self) -> None:
        """Give start turns to queued cells, first asked first served, while fewer than ``slots`` hold one."""
        self.queue = [c for c in self.queue if c.state == "queued"]
        while self.queue and (self.slots is None
                              or sum(c.state == "warming" for c in self.cells) < self.slots):
            cell = self.queue.pop(0)
            cell.state = "warming"
            try:
                cell.conn.sendall(b"go\n")
            except OSError:
                self._drop(cell)

    def wait_until(self, round_index: int) -> None:
        """Until no cell is starting or running (each waits at ``round_index``, is done or gone)."""
        while any(c.state in ("starting", "running", "queued", "warming") for c in self.cells):
            self.pump()

    def run_round(self, cell: Cell, round_index: int) -> bool:
        """Let ``cell`` run its steps of ``round_index``; return when it waits again or has left
        (False when it was not waiting for this round)."""
        if cell.state != "ready" or cell.at_round != round_index:
            return False
        cell.state = "running"
        try:
            cell.conn.sendall(f"go {self.first_round_s:.3f}\n".encode())
        except OSError:
            self._drop(cell)
        while cell.state == "running":
            self.pump()
        return True

    def release(self) -> None:
        """Let every cell finish (final evaluation, rows) at once."""
        for cell in self.cells:
            if cell.conn is not None:
                try:
                    cell.conn.sendall(b"go\n")
                except OSError:
                    pass
                self._drop(cell)


def _phases(info: str) -> dict[str, float] | None:
    """The start phases a cell sent with ``ready`` (None when it sent none or they cannot be read)."""
    try:
        phases = json.loads(info) if info else None
    except ValueError:
        return None
    return phases if isinstance(phases, dict) else None


def slowest_line(cells: Sequence[Cell]) -> str | None:
    """The log line of the cell that was ready last for the first round, with its start phases."""
    ready = [c for c in cells if c.ready_s is not None]
    if not ready:
        return None
    cell = max(ready, key=lambda c: c.ready_s)
    line = f"  slowest to start: {cell.run_id}, ready after {cell.ready_s:.1f} s"
    if cell.start_phases:
        line += ": " + ", ".join(f"{name.replace('_', ' ')} {float(s):.1f}"
                                 for name, s in cell.start_phases.items()
                                 if isinstance(s, (int, float))) + " s"
    return line


def round_line(r: int, rounds: int, ran: int, elapsed_s: float, first_round_s: float) -> str:
    """The line after round ``r`` (0-based) of ``rounds``: the group's seconds so far and, before the last
    round, the time its other rounds take at the rate of those so far (the final evaluation not counted)."""
    line = f"  round {r + 1}/{rounds}: {ran} cells ({elapsed_s:.0f} s)"
    if r + 1 < rounds:
        per_round = max(elapsed_s - first_round_s, 0.0) / (r + 1)
        line += f"; about {clock(per_round * (rounds - r - 1))} left in this group's rounds"
    return line


def start_slots(threads: int, cpus: int | None = None) -> int:
    """How many cells of a group start at once: the CPUs (this process's affinity) over the torch threads
    of a cell, at least 1."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, threads))


def _threads(spec: dict) -> int:
    execution = spec.get("execution") if isinstance(spec, dict) else None
    threads = execution.get("num_threads") if isinstance(execution, dict) else None
    return threads if isinstance(threads, int) and threads > 0 else 1


def run_group(cells: Sequence[Cell], rounds: int, *, command: Callable[[Cell], list[str]], log=None,
              timeout_s: float | None = None, slots: int | None = None) -> int:
    """Run ``cells`` in interleaved rounds (docs/measurement.md); returns the number of cells whose
    process exited with a non-zero status (each cell's ``proc`` keeps its return code). ``command``: a
    cell's command line, built by the caller (the pipeline runs each cell isolated, the performance bench
    its step workers); the process takes its turns through :class:`RoundGate`. ``timeout_s``:
    TimeoutError past it, every process of the group terminated. ``slots``: how many cells may hold a
    start turn at once (default :func:`start_slots` for the most threads a cell's spec names)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cells = list(cells)
    threads = 1
    for cell in cells:
        spec = json.loads(Path(cell.spec).read_text())
        cell.run_id = spec["run_id"]
        threads = max(threads, _threads(spec))
    slots = start_slots(threads) if slots is None else slots
    with tempfile.TemporaryDirectory(prefix="comera-rounds-") as tmp:
        path = os.path.join(tmp, "rounds.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(len(cells))
        coord = _Coordinator(cells, server, None if timeout_s is None else time.monotonic() + timeout_s,
                             slots)
        env = stops.child_env({**os.environ, ENV: path})  # each cell dies with this process
        started = coord.started = time.monotonic()
        try:
            for cell in cells:
                with _signals_deferred():  # a stop signal inside Popen would orphan the started child
                    cell.proc = subprocess.Popen(command(cell), env=env)
            log(f"timing group of {len(cells)} cells, {rounds} interleaved rounds, {slots} starting at a "
                "time: " + ", ".join(c.run_id for c in cells))
            for r in range(rounds):
                coord.wait_until(r)
                if r == 0:
                    coord.first_round_s = time.monotonic() - started
                    log(f"  first round after {coord.first_round_s:.1f} s (the cells started, built, "
                        "warmed up)")
                    slowest = slowest_line(cells)
                    if slowest:
                        log(slowest)
                    left = [c.run_id for c in cells if c.state == "gone"]
                    if left:  # their rows say why (a failure row, or a skipped method)
                        log(f"  not in the rounds (ended before them): {', '.join(left)}")
                ran = [coord.run_round(cell, r) for cell in (cells if r % 2 == 0 else cells[::-1])]
                if any(ran):
                    log(round_line(r, rounds, sum(ran), time.monotonic() - started, coord.first_round_s))
            coord.wait_until(rounds)
            coord.release()
            for cell in cells:
                left = None if coord.deadline is None else max(coord.deadline - time.monotonic(), 0.1)
                try:
                    cell.proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    raise TimeoutError("the timing group ran past its time limit") from None
            failed = sum(1 for cell in cells if cell.proc.returncode != 0)
        finally:
            _end_all([cell.proc for cell in cells if cell.proc is not None])
            coord.close()
            server.close()
    return failed


def alone_reason() -> str | None:
    """Why this cell of a timing group is timed alone (:func:`run_alone`), or None in its group's rounds."""
    return settings.read(ALONE_ENV)


def run_alone(cell: Cell, *, command: Callable[[Cell], list[str]], reason: str) -> int:
    """Run ``cell`` by itself, with no round coordinator: its process sees ``reason`` in :data:`ALONE_ENV`
    and dies with this one; a stop signal (:func:`stop_on_signals`) ends it. Returns its exit status."""
    env = stops.child_env({k: v for k, v in os.environ.items() if k != ENV})
    env[ALONE_ENV] = reason
    cell.proc = None
    try:
        with _signals_deferred():
            cell.proc = subprocess.Popen(command(cell), env=env)
        return cell.proc.wait()
    finally:
        if cell.proc is not None:
            _end_all([cell.proc])


def _end_all(procs: list[subprocess.Popen], grace_s: float = 30) -> None:
    """Terminate every process still running, all at once, and wait for them (SIGKILL past ``grace_s``)."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_deferred: list[int] | None = None
"""While a cell's process starts: the stop signals that arrived (raised once it is recorded), else None."""


class _signals_deferred:
    """Holds back :func:`stop_on_signals`' exit while a cell's process is being started (the child exists
    from ``fork`` on, its Popen object only once Popen returns), then exits with the first signal held."""

    def __enter__(self) -> None:
        global _deferred
        _deferred = []

    def __exit__(self, *exc: object) -> None:
        global _deferred
        held, _deferred = _deferred, None
        if held:
            raise SystemExit(128 + held[0])


def stop_on_signals() -> None:
    """SIGTERM / SIGINT / SIGHUP (a stopped pipeline, a job's time limit, scancel, a closed session) end
    :func:`run_group` through its cleanup: every cell's process is terminated and the socket folder
    removed; exit status 128 + N. Later stop signals are ignored, so that they cannot cut the cleanup
    short. A signal that arrives while a cell's process starts takes effect once the process is
    recorded."""
    def stop(signum: int, _frame: object) -> None:
        for sig in stops.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if _deferred is not None:
            _deferred.append(signum)
            return
        raise SystemExit(128 + signum)

    for sig in stops.STOP_SIGNALS:
        signal.signal(sig, stop)
