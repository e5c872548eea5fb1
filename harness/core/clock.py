"""Durations as people read them in progress lines (``1h02m``, ``3m05s``, ``42s``)."""
from __future__ import annotations


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
