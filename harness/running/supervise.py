"""A cell in a child process, so that a cell killed by a signal still becomes a row.

:func:`supervise` (``comera-bench run --isolate``) writes the row of a child that died without one
(:func:`failure_row`: ``oom`` or ``error``) and an empty curves file (docs/usage.md).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.core import interleave, stops

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""Signals passed on to the child (a stopped pipeline, a scheduler stopping the job, ``timeout``, a
closed session, Ctrl-C). A cell stopped by one of them is interrupted, not failed: it gets no row, the
process exits 128 + the signal, and the next pipeline run runs it again. So is a cell whose timing
group's coordinator vanished (exit status ``interleave.EXIT_GROUP_LOST``). The child dies with this
process (harness.core.stops), so a killed supervisor leaves no cell running on."""
INTERRUPTS = FORWARDED
LOG_TAIL_LINES = 20

EXIT_ENVIRONMENT_FAULT = 75
"""The child's status for a row it could not write for a fault of the machine (harness.running.run)."""


def _process_started_at() -> str:
    """This process's start, seconds since the epoch (now where /proc cannot tell)."""
    try:
        import psutil

        return repr(psutil.Process().create_time())
    except Exception:  # noqa: BLE001
        return repr(time.time())


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (cgroup v2
    ``memory.events`` or v1 ``memory.oom_control``), or None where that cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "":
            candidates += [Path("/sys/fs/cgroup", path, "memory.events"),
                           Path("/sys/fs/cgroup/unified", path, "memory.events")]
        elif "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory", path, "memory.oom_control"))
    for candidate in candidates:
        try:
            found = re.search(r"^oom_kill (\d+)$", candidate.read_text(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def kernel_log_oom(pid: int) -> bool:
    """Whether the kernel log (``/dev/kmsg``, where readable) says the OOM killer killed ``pid``."""
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid},)")
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                record = os.read(fd, 16384).decode(errors="replace")
            except BlockingIOError:  # the end of the buffer
                return False
            except OSError:
                return False
            if not record:
                return False
            if pattern.search(record):
                return True
    finally:
        os.close(fd)


def describe_exit(returncode: int) -> tuple[str | None, str]:
    """(signal name or None, words) for a child's return code (negative: killed by that signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return name, f"killed by signal {-returncode} ({name})"
    return None, f"exited with code {returncode} without writing its row"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _open_log(log: str | os.PathLike | None, spec_path: str) -> tuple[Any, str | None]:
    """The log file for the child (None: inherit stderr) and why it could not be written (or None)."""
    if log is None:
        return None, None
    try:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "wb", buffering=0)  # noqa: SIM115 -- handed to the child, closed by the caller
    except OSError as exc:
        return None, f"cannot open log {log}: {exc}"
    try:  # unbuffered: a full disk shows here, and close() has nothing left to flush
        fh.write(f"comera-bench run --isolate: {spec_path} in a child process\n".encode())
    except OSError as exc:
        fh.close()
        return None, f"cannot write log {log}: {exc}"
    return fh, None


def _log_tail(log: str | os.PathLike) -> list[str]:
    """The last lines of the log (from its last 16 KiB at most)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            return fh.read(16384).decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return []


def failure_row(spec: dict[str, Any], status: str, error: str, extra: dict[str, Any],
                started_at: str) -> dict[str, Any]:
    """The runs row of a cell whose process died: the runner's row of a run that got nowhere (identity,
    settings and provenance from the spec's JSON, its params as written: the pipeline's and ``comera-bench
    run``'s spec files hold them resolved; the runner's own row builder, so both agree), with the start
    time, thread count and ``extra`` of the failed run."""
    from harness import spec as specs
    from harness.core import measure  # torch: only once a row has to be written here
    from harness.running import cell

    st = cell.CellState(specs.make(spec, specs.AS_WRITTEN))
    try:
        st.device = measure.resolve_device(st.spec.execution.device)
    except RuntimeError:  # CUDA asked for but not visible here: the row says cpu
        pass
    row = cell.build_row(st, status, error)
    row.update(started_at=started_at, num_threads=st.spec.execution.num_threads,
               extra=json.dumps({**json.loads(row["extra"]), **extra}, sort_keys=True, default=str))
    return row


def supervise(command: list[str], spec_path: str | os.PathLike, runs_out: str | os.PathLike,
              curves_out: str | os.PathLike, *, log: str | os.PathLike | None = None) -> tuple[int, str]:
    """Run ``command`` (the cell's child process) and make sure the cell has a row: (exit code for
    this process, the row's status). Exit code 0 once a row exists (the child's or the one written
    here), 2 for a spec that cannot be read, 1 when no row could be written, 128 + N (status
    "interrupted", no row) when the cell was stopped by SIGTERM, SIGHUP or SIGINT, and the child's
    ``interleave.EXIT_GROUP_LOST`` (also "interrupted", no row) when its timing group's coordinator
    vanished."""
    runs_out, curves_out = Path(runs_out), Path(curves_out)
    before = _identity(runs_out)
    oom_before = oom_kill_count()
    started_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    started = time.monotonic()
    log_fh, log_error = _open_log(log, str(spec_path))
    child = subprocess.Popen(command, stdout=log_fh, stderr=subprocess.STDOUT if log_fh else None,
                             env=stops.child_env({**os.environ,
                                                  stops.CELL_STARTED_ENV: _process_started_at()}))
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        child.send_signal(signum)

    handlers = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if log_fh is not None:
            log_fh.close()
    if _identity(runs_out) not in (None, before):
        from harness import results  # pyarrow only once a row is there: a quick start, a quick stop

        return 0, results.read_parquet(runs_out, "runs").at[0, "status"]
    stopped = received[0] if received else -returncode if -returncode in INTERRUPTS else None
    if stopped is not None:  # stopped from outside: no row, so that the cell runs again
        name = signal.Signals(stopped).name
        print(f"comera-bench run: {spec_path}: interrupted by {name}; no row written, the cell runs again "
              "next time", file=sys.stderr)
        return 128 + stopped, "interrupted"
    if returncode == interleave.EXIT_GROUP_LOST:
        print(f"comera-bench run: {spec_path}: its timing group's coordinator is gone; no row written, "
              "the cell runs again next time", file=sys.stderr)
        return returncode, "interrupted"
    if returncode == EXIT_ENVIRONMENT_FAULT:  # the child said why (its log, the job's stderr)
        print(f"comera-bench run: {spec_path}: environment fault (e.g. a full disk); no row written, "
              "the cell runs again next time", file=sys.stderr)
        return returncode, "environment fault"
    sig, error = describe_exit(returncode)
    oom_after = oom_kill_count()
    evidence = []
    if sig == "SIGKILL" and oom_before is not None and oom_after is not None and oom_after > oom_before:
        evidence.append(f"memory cgroup oom_kill count {oom_before} -> {oom_after} during the run")
    if sig == "SIGKILL" and kernel_log_oom(child.pid):
        evidence.append(f"kernel log: OOM killer killed pid {child.pid}")
    status = "oom" if evidence else "error"
    if evidence:
        error = f"killed by the kernel's OOM killer (signal 9, SIGKILL): {'; '.join(evidence)}"
    extra = {"exit_code": returncode, "signal": sig, "pid": child.pid, "wall_s": time.monotonic() - started,
             "log": None if log is None else str(log)}
    from harness.running import checkpoint  # after the child: its import (pyarrow) costs no start time

    kept = checkpoint.path_for(runs_out)
    if kept.exists():  # the row ends the cell; the checkpoint stays for a rerun (delete the row to resume)
        extra["checkpoint"] = str(kept)
        error += f"; its checkpoint {kept} is kept: delete {runs_out.name} to run the cell again from it"
    if log is not None and log_error is None:
        extra["log_tail"] = _log_tail(log)
    if log_error:
        extra["log_error"] = log_error
    print(f"comera-bench run: {spec_path}: {error}" + (f" ({log_error})" if log_error else ""),
          file=sys.stderr)
    try:
        spec = json.loads(Path(spec_path).read_text())
        row = failure_row(spec, status, error, extra, started_at)
    except Exception as exc:  # noqa: BLE001 -- an unreadable or invalid spec: nothing to build a row from
        print(f"comera-bench run: no row written, the spec cannot be used: {exc}", file=sys.stderr)
        return 2, status
    from harness import results

    prov = {c: row[c] for c in results.FILE_PROVENANCE}
    try:
        results.write_parquet_atomic(results.empty_frame("curves"), curves_out, kind="curves",
                                     provenance=prov)
        results.write_parquet_atomic(results.to_frame([row], "runs"), runs_out, kind="runs",
                                     provenance=prov)
    except OSError as exc:
        print(f"comera-bench run: cannot write the row of {row['run_id']} ({status}: {error}): {exc}",
              file=sys.stderr)
        return 1, status
    if log_error is None and log is not None:
        try:
            with open(log, "a") as fh:
                fh.write(f"comera-bench run --isolate: {error}; row written to {runs_out}\n")
        except OSError:
            pass
    return 0, status
