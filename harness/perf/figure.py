"""The bench table as one figure (``bench.png`` / ``bench.pdf`` next to ``bench.md``): every row with a goal
as a bar of how far it is from its goal, with the bound the same run measured for it."""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from harness.perf.report import BenchRow

LABEL_CHARS = 60
"""Labels are wrapped at this width (never cut)."""
AXIS_FLOOR = 0.05
"""The axis starts no lower than this: a bar below it ends at the edge with its value printed."""
COLORS = {"pass": "tab:green", "short": "tab:orange", "noisy": "tab:gray", "impossible": "tab:purple"}
FOOTER = ("Bars run from the goal (1) to measured / goal (for a row that must stay at or below its goal: "
          "goal / measured), so 1 or more meets the goal; green pass, orange short, grey noisy (timings not "
          "stable: shown, not judged), purple impossible (above the row's own bound: noise, not a result), "
          "a red cross: no positive finite value measured. Diamonds: the bound the same run measured for the "
          "row (roofline, free tensorized layers, FLOPs) / goal: the most the row could reach here; "
          "a diamond left of 1 puts the goal beyond it. Every ratio comes from one run (interleaved rounds); "
          "medians, settings and notes are in bench.md.")


@dataclass(frozen=True)
class Score:
    """One bar: a judged row's distance to its goal (``value`` >= 1 meets it) and its bound's."""

    label: str
    value: float | None
    bound: float | None
    verdict: str


def scores(rows: list[BenchRow]) -> list[Score]:
    """The rows that have a goal, in table order, as :class:`Score` s (info rows have no goal: left out)."""
    out = []
    for row in rows:
        if row.goal is None or row.verdict == "info":
            continue
        if row.better == ">=":
            value, bound = _positive(row.measured, row.goal), _positive(row.bound, row.goal)
        else:  # a share that must stay at or below the goal: its bound (if any) is not an upper limit
            value, bound = _positive(row.goal, row.measured), None
        label = textwrap.fill(f"[{row.target}] {row.what}", LABEL_CHARS)
        out.append(Score(label, value, bound, row.verdict))
    return out


def _positive(a: float | None, b: float | None) -> float | None:
    """a / b when it is a finite positive number (a log axis can draw it), else None."""
    if a is None or not b:
        return None
    value = a / b
    return value if math.isfinite(value) and value > 0 else None


def title_of(prov: dict) -> str:
    """The figure's title: the machine, threads, torch, commit and start time of the run."""
    commit = str(prov.get("git_commit") or "?")[:7] + ("+dirty" if prov.get("git_dirty") else "")
    return (f"comera-bench bench: {prov.get('device_name')} ({prov.get('device')}), "
            f"{prov.get('num_threads')} threads, torch {prov.get('torch_version')}, commit {commit}, "
            f"{prov.get('started_at')}")


def draw(rows: list[BenchRow], out: Path, title: str) -> list[Path]:
    """``out`` with the suffixes .png and .pdf: :func:`scores` as horizontal bars on a log axis, the goal
    at 1. Returns the files written (none when no row has a goal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    bars = scores(rows)
    if not bars:
        return []
    lines = sum(b.label.count("\n") + 1 for b in bars)
    height = 1.2 + 0.22 * lines + 0.12 * len(bars)
    fig, ax = plt.subplots(figsize=(11, height + 1.0))
    values = [b.value for b in bars if b.value] + [b.bound for b in bars if b.bound]
    low, high = max(min(values + [1.0]) / 1.5, AXIS_FLOOR), max(values + [1.0]) * 1.5
    for y, bar in enumerate(bars):
        if bar.value:  # from the goal (1) to the measured value: left of 1 is short of the goal
            end = max(bar.value, low)
            ax.barh(y, end - 1.0, left=1.0, color=COLORS.get(bar.verdict, "grey"), height=0.6)
            text = f"{bar.value:.2g}" if bar.value < low else f"{bar.value:.2f}"
            text += " impossible" if bar.verdict == "impossible" else ""
            ax.annotate(text, (end, y), textcoords="offset points", xytext=(3, -3), fontsize=7)
        else:
            ax.plot([low * 1.1], [y], marker="x", color="red", markersize=8)
        if bar.bound:
            ax.plot([bar.bound], [y], marker="D", color="black", markersize=5)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ticks = [t for t in (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low <= t <= high]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks(range(len(bars)), [b.label for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("measured / goal (log scale; 1 = goal)")
    fig.suptitle(title, fontsize=10)
    footer = textwrap.wrap(FOOTER, 160)
    fig.text(0.01, 0.01, "\n".join(footer), fontsize=7, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.02 + len(footer) * 7 * 1.5 / 72 / fig.get_figheight(), 1, 0.96))
    written = []
    for ext in ("png", "pdf"):
        path = out.with_suffix(f".{ext}")
        fig.savefig(path, dpi=130)
        written.append(path)
    plt.close(fig)
    return written
