"""The pipeline's progress after each finished job: cells done of the grid's, and a rough time left.

:func:`pipeline_line` reads :data:`STARTED_ENV` and :data:`CELLS_ENV` and, given bad values, names the
variable instead of failing a job (docs/pipeline.md, "Outputs").
"""
from __future__ import annotations

import time
from pathlib import Path

from harness import settings
from harness.core.clock import clock

STARTED_ENV = "COMERA_BENCH_PIPELINE_STARTED"
CELLS_ENV = "COMERA_BENCH_PIPELINE_CELLS"


def cells_progress(folder: str | Path, total: int, started: float | None, now: float) -> str:
    """``cells N of TOTAL done`` with, when some finished in this run (runs files written since
    ``started``, and not after ``now``: a file from the future was copied), its elapsed time and the time
    left at its rate (cells done per second of this run, so jobs run side by side count as they ran)."""
    from harness.results.mtimes import FUTURE_SLACK_S  # lazily: a group's coordinator starts without pyarrow

    written = [p.stat().st_mtime for p in Path(folder).glob("*.runs.parquet")]
    done = len(written)
    line = f"comera-bench: cells {done} of {total} done"
    this_run = [t for t in written if started is not None and started <= t <= now + FUTURE_SLACK_S]
    if not this_run or started is None:
        return line
    elapsed = now - started
    left = max(total - done, 0) * elapsed / len(this_run)
    return (f"{line} ({len(this_run)} in this run, {clock(elapsed)}); about {clock(left)} left at this run's "
            "rate (cells differ: a rough guide)")


def pipeline_env() -> tuple[float, int] | None:
    """(the pipeline's start, seconds since the epoch; the grid's cell count) from STARTED_ENV and
    CELLS_ENV, or None outside a pipeline run (either unset).

    Raises:
        harness.settings.SettingError: a value that is not a time in seconds since the epoch, or not a
            whole number of cells, naming the variable (:data:`harness.settings.SETTINGS`).
    """
    start, total = settings.read(STARTED_ENV), settings.read(CELLS_ENV)
    if start is None or total is None:
        return None
    return start, total


def pipeline_line(folder: str | Path) -> str:
    """The progress line for a pipeline cell in ``folder`` ('' outside a pipeline run: no STARTED_ENV);
    one naming the variable when :func:`pipeline_env` refuses its values (never an error: the cell's row
    is written by then)."""
    try:
        found = pipeline_env()
    except ValueError as exc:
        return f"comera-bench: no progress line: {exc}"
    if found is None:
        return ""
    started, total = found
    return cells_progress(folder, total, started, time.time())
