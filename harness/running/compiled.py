"""What ``torch.compile`` did with a compiled cell's model: its graphs, graph breaks and eager fallbacks.

A cell takes a :func:`snapshot` when it makes its compile wrapper; :func:`report` gives what was counted
since (``extra.compile``).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

Counts = dict[str, dict[str, int]]

MOST_FREQUENT_BREAKS = 3


def snapshot() -> Counts:
    """A copy of Dynamo's counters now.

    Returns:
        counter group (e.g. ``frames``, ``graph_break``) -> key -> count.
    """
    return {group: dict(keys) for group, keys in list(_counters().items())}


def report(since: Counts) -> dict[str, Any]:
    """What Dynamo counted since ``since``.

    Args:
        since: a :func:`snapshot` taken when the compile wrapper was made.

    Returns:
        A JSON-able dict: ``frames`` (frames Dynamo tried to compile) and ``frames_ok`` (those it
        compiled), ``graphs`` (graphs captured), ``graph_breaks`` (their count), ``break_reasons`` (the
        first line of each of the most frequent break reasons, most frequent first) and ``eager_fallbacks``
        (the first line of each reason Dynamo left code to eager execution without a graph break, e.g.
        "Dynamo recompile limit exceeded"). A counter Dynamo never wrote counts as zero.
    """
    frames, stats = _since(since, "frames"), _since(since, "stats")
    breaks = _by_first_line(_since(since, "graph_break"))
    return {"frames": frames["total"], "frames_ok": frames["ok"], "graphs": stats["unique_graphs"],
            "graph_breaks": sum(breaks.values()),
            "break_reasons": [reason for reason, _ in breaks.most_common(MOST_FREQUENT_BREAKS)],
            "eager_fallbacks": list(_by_first_line(_since(since, "unimplemented")))}


def _since(before: Counts, group: str) -> Counter[str]:
    """The counts of one counter group added since ``before`` (only those that grew)."""
    now, then = _counters().get(group, {}), before.get(group, {})
    return Counter({key: n - then.get(key, 0) for key, n in list(now.items()) if n > then.get(key, 0)})


def _counters() -> Any:
    """Dynamo's counter table, imported on first use: importing torch._dynamo takes about a second, which
    the processes of eager cells need not pay."""
    from torch._dynamo.utils import counters

    return counters


def _by_first_line(reasons: Counter[str]) -> Counter[str]:
    """Counts keyed by the first line of each reason (Dynamo's reasons go on with explanations and hints)."""
    found: Counter[str] = Counter()
    for reason, n in reasons.items():
        found[(reason.strip().splitlines() or [""])[0]] += n
    return found
