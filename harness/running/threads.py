"""The torch threads of a pipeline's cells when the config says ``execution.threads: auto``.

:func:`resolve` keeps a results folder's finished cells' threads, else :func:`choose` picks them from the
CPUs and the load, leaving one CPU to the rest of the machine (at most :data:`AUTO_MOST`); they reach the
jobs in :data:`THREADS_ENV`. Why: docs/pipeline.md, "Busy machine"; docs/design-notes.md.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from harness import settings
from harness.spec import MAX_THREADS

AUTO = "auto"
AUTO_MOST = 4
"""The most threads ``auto`` gives a cell (the default grid's models gain little beyond)."""
THREADS_ENV = "COMERA_BENCH_THREADS"


def cpus_here() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose(cpus: int, load: float | None) -> int:
    """The threads a cell gets on ``cpus`` CPUs while ``load`` tasks are runnable (the 1-minute load
    average; None: unknown, taken as 0): the CPUs free less one, left to the rest of the machine (Snakemake,
    the system, whatever starts later), rounded; at least 1, at most :data:`AUTO_MOST`. So 1 on a 2-CPU
    machine, busy or not: a cell whose threads take every CPU waits for all of them at each parallel step
    whenever anything else runs (docs/changelog.md, "2026-12-06: the default grid on a busy machine")."""
    free = cpus - (load or 0.0)
    return max(1, min(AUTO_MOST, round(free - 1)))


def finished_threads(cells_dir: str | Path) -> tuple[int | None, int]:
    """(the threads most finished cells of ``cells_dir`` ran with, how many finished cells there are): a
    cell is finished when its runs file exists; its threads are its spec's ``execution.num_threads``, a
    whole number from 1 to :data:`harness.spec.MAX_THREADS` (a spec holding anything else is not
    counted)."""
    counts: Counter[int] = Counter()
    for spec in Path(cells_dir).glob("*.spec.json"):
        if not spec.with_name(spec.name.replace(".spec.json", ".runs.parquet")).exists():
            continue
        try:
            threads = json.loads(spec.read_text())["execution"]["num_threads"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= MAX_THREADS:
            counts[threads] += 1
    return (counts.most_common(1)[0][0], sum(counts.values())) if counts else (None, 0)


def resolve(setting: int | str, cells_dir: str | Path | None, load: float | None, cpus: int | None = None
            ) -> tuple[int, str]:
    """The threads per cell for the config's ``execution.threads`` and why ("" for a number given).

    Args:
        setting: a number of threads, or ``"auto"``.
        cells_dir: the run's per-cell folder (results/runs/<device>; None: none yet).
        load: the 1-minute load average now (None: unknown).
        cpus: the CPUs (default: this process's).

    Returns:
        (threads, the reason in words).

    Raises:
        harness.settings.SettingError: :data:`THREADS_ENV` is set to anything but a whole number from 1 to
            :data:`harness.spec.MAX_THREADS`, naming it and its value.
    """
    if setting != AUTO:
        return int(setting), ""
    given = settings.read(THREADS_ENV)
    if given is not None:
        return int(given), f"auto: {given}, chosen by this run's first Snakemake process"
    kept, finished = finished_threads(cells_dir) if cells_dir else (None, 0)
    if kept is not None:
        return kept, (f"auto: {kept}, the threads of the {finished} finished cell(s) in {cells_dir} (kept, "
                      "so none of them runs again)")
    cpus = cpus or cpus_here()
    threads = choose(cpus, load)
    state = "load unknown" if load is None else f"1-minute load average {load:.1f}"
    return threads, f"auto: {threads} ({state} on {cpus} CPUs; at most {AUTO_MOST})"
