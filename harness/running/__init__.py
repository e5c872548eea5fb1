"""Running one grid cell: a spec (harness.spec) in, one ``runs`` row and its ``curves`` out."""
from __future__ import annotations


def check_environment() -> None:
    """ValueError naming the variable when COMERA_BENCH_STALL_LIMIT_S or COMERA_BENCH_CHECKPOINT_S is not a
    number of seconds >= 0. Every cell reads them: the pipeline (workflow/rules/common.smk) and
    ``comera-bench run`` check them before the first cell."""
    from harness.running import checkpoint, watchdog

    watchdog.stall_limit_s()
    checkpoint.every_s()
