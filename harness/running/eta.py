"""The pipeline's progress after each finished job: cells done of the grid's, and a rough time left at
this run's own rate (its wall time so far / the cells it finished). The pipeline's first Snakemake
process records its start time and the grid's size in the environment (STARTED_ENV, CELLS_ENV); every
job inherits them, and ``comera-bench run --isolate`` prints the line when its cell is done."""
from __future__ import annotations

import os
import time
from pathlib import Path

from harness.core.clock import clock

STARTED_ENV = "COMERA_BENCH_PIPELINE_STARTED"
CELLS_ENV = "COMERA_BENCH_PIPELINE_CELLS"


def cells_progress(folder: str | Path, total: int, started: float | None, now: float) -> str:
    """``cells N of TOTAL done`` with, when some finished in this run (runs files written since
    ``started``), its elapsed time and the time left at its rate."""
    written = [p.stat().st_mtime for p in Path(folder).glob("*.runs.parquet")]
    done = len(written)
    line = f"comera-bench: cells {done} of {total} done"
    this_run = [t for t in written if started is not None and t >= started]
    if not this_run or started is None:
        return line
    elapsed = now - started
    left = max(total - done, 0) * elapsed / len(this_run)
    return (f"{line} ({len(this_run)} in this run, {clock(elapsed)}); about {clock(left)} left at this run's "
            "rate (cells differ: a rough guide)")


def pipeline_line(folder: str | Path) -> str:
    """The progress line for a pipeline cell in ``folder`` ('' outside a pipeline run: no STARTED_ENV)."""
    started, total = os.environ.get(STARTED_ENV), os.environ.get(CELLS_ENV)
    if not started or not total:
        return ""
    return cells_progress(folder, int(total), float(started), time.time())
