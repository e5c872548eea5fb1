"""Durations as people read them in progress lines (``1h02m``, ``3m05s``, ``42s``), and as they set them
in environment variables (:func:`env_seconds`)."""
from __future__ import annotations

import math
import os


def clock(seconds: float) -> str:
    """``seconds`` as ``1h02m``, ``3m05s`` or ``42s``.

    Example::

        >>> clock(185)
        '3m05s'
    """
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def env_seconds(variable: str, default: float, what: str, zero: str) -> float | None:
    """Seconds from the environment variable ``variable``: ``default`` when unset or empty, None for 0; a
    value that is not a number >= 0 raises ValueError naming the variable, ``what`` it sets and what
    ``zero`` means.

    Example::

        >>> env_seconds("COMERA_BENCH_STALL_LIMIT_S", 3600.0, "the stall limit", "no stall limit")
        3600.0
    """
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"environment variable {variable}={raw!r}: {what} must be a number of seconds >= 0 "
                         f"(0: {zero})")
    return value or None
