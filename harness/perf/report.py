"""Rows of the bench table: verdicts, the printed table and the written files (Markdown and Parquet)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.atomic import atomic_write

TARGET_NAMES = {1: "TTLinear vs nn.Linear", 2: "transformer step", 3: "TTM lookup",
                4: "step after halving ranks", 5: "plan FLOPs vs opt_einsum"}
VERDICTS = ("pass", "short", "noisy", "impossible", "error", "info")
"""impossible: a ratio above the bound the same run measured for it (noise, never a pass); noisy: a ratio
of timings that are not stable (the row's ``stability``; shown, not judged against its goal); info: a row
without a goal (context for another row; no verdict)."""
BOUND_SLACK = 0.10
"""A ratio more than this fraction above its bound is impossible (the bound is measured too)."""


@dataclass
class BenchRow:
    """One line of the bench table."""

    target: int
    what: str
    goal: float | None
    """None for an informational row (verdict "info")."""
    better: str
    """">=": measured must reach goal; "<=": measured must stay at or below it."""
    measured: float | None
    verdict: str
    goal_key: str = ""
    """Where the goal is in the goals file (harness/perf/goals.yaml), e.g.
    ``step.paper.speedup_vs_dense_b32``."""
    flop_ratio: float | None = None
    traffic_ratio: float | None = None
    bound: float | None = None
    """The most the ratio can be, measured in the same run (its basis in ``bound_basis``)."""
    bound_basis: str = ""
    """"roofline" (peak matmul rate and copy bandwidth vs the ops' FLOPs and traffic), "free tensorized
    layers" (the rest of the CoMERA step alone) or "Amdahl" (the layers' share and speedup)."""
    medians: str = ""
    settings: str = ""
    note: str = ""
    stability: str = ""
    """The timings' verdict: "stable", or "noisy: <reasons>" (the cells' ``timing_quality`` for step
    targets, harness.results.analysis.verdict_of; the spread of per-round times for micro-benchmarks,
    analysis.rounds_verdict); empty for a row that divides no times (memory, op counts, FLOPs)."""


def above_bound(measured: float | None, bound: float | None) -> bool:
    """Whether a ratio lies more than BOUND_SLACK above the most it can be."""
    return (measured is not None and bound is not None and math.isfinite(bound) and bound > 0
            and measured > bound * (1 + BOUND_SLACK))


def verdict(measured: float | None, goal: float | None, better: str, bound: float | None = None,
            stability: str = "") -> str:
    """pass / short, impossible for a ratio (``>=``) above its bound, error when nothing was measured,
    info for a row without a goal, noisy (instead of pass / short) when ``stability`` is not stable."""
    if measured is None or not math.isfinite(measured):
        return "error"
    if better == ">=" and above_bound(measured, bound):
        return "impossible"
    if goal is None:
        return "info"
    if stability.startswith("noisy"):
        return "noisy"
    return "pass" if (measured >= goal if better == ">=" else measured <= goal) else "short"


def make_row(target: int, what: str, goal: float | None, measured: float | None, *, better: str = ">=",
             **fields: Any) -> BenchRow:
    """A row with its verdict; an impossible one says why in its note."""
    row = BenchRow(target, what, goal, better, measured,
                   verdict(measured, goal, better, fields.get("bound"), fields.get("stability", "")),
                   **fields)
    if row.verdict == "noisy":
        row.note = "; ".join(filter(None, [
            f"timing not stable ({row.stability.removeprefix('noisy: ')}): shown, not judged against its "
            "goal; run again on a quiet machine", row.note]))
    if row.verdict == "impossible":
        row.note = "; ".join(filter(None, [
            f"above its own bound {row.bound:.2f} ({row.bound_basis}): the timing was noisy (a busy "
            "machine?), not a result; run again on a quiet machine", row.note]))
    return row


def quotient(a: float | None, b: float | None) -> float | None:
    """a / b of two counts (FLOPs, bytes), None when either is missing or b is zero. A ratio of two
    timings is harness.results.analysis.Ratio, with its spread."""
    return a / b if a is not None and b else None


def value_of(r: Any) -> float | None:
    """A harness.results.analysis.Ratio's value (None for no ratio)."""
    return r.value if r is not None else None


def per_round_text(r: Any) -> str:
    """``"; per round a, b, ..."`` for a harness.results.analysis.Ratio of several rounds, else ""."""
    rounds = getattr(r, "per_round", ())
    return f"; per round {', '.join(f'{x:.2f}' for x in rounds)}" if len(rounds) > 1 else ""


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "" if x is None or not math.isfinite(x) else fmt.format(x)


def format_row(row: BenchRow) -> str:
    goal = "no goal" if row.goal is None else f"goal {row.better} {_num(row.goal)}"
    bound = f", bound {_num(row.bound)} {row.bound_basis}" if row.bound is not None else ""
    return (f"[{row.target}] {row.what}: {_num(row.measured)} ({goal}{bound}) -> {row.verdict}  "
            f"{row.medians} {row.note}")


TABLE_COLUMNS = ["target", "what", "measured", "goal", "bound", "verdict", "stability", "flop_ratio",
                 "traffic_ratio", "medians", "settings", "note"]


def to_markdown(rows: list[BenchRow]) -> str:
    head = "| " + " | ".join(TABLE_COLUMNS) + " |\n|" + "---|" * len(TABLE_COLUMNS) + "\n"
    lines = []
    for r in rows:
        bound = f"{_num(r.bound)} ({r.bound_basis})" if r.bound is not None else ""
        cells = [str(r.target), r.what, _num(r.measured),
                 "" if r.goal is None else f"{r.better} {_num(r.goal)}",
                 bound, r.verdict, r.stability, _num(r.flop_ratio), _num(r.traffic_ratio), r.medians,
                 r.settings, r.note]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


def write(rows: list[BenchRow], path: str | Path, prov: dict[str, Any], allocator: str,
          load: str = "") -> tuple[Path, Path]:
    """``path`` (a ``bench`` table, docs/schema.md: one row per table row, with the provenance columns of
    the pipeline's rows) and the Markdown table next to it (``.md``, with ``load``: a warning that the
    machine was busy), both written atomically; the provenance and the allocator applied also go to the
    Parquet file's metadata."""
    from harness.results import to_frame, write_parquet_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = path.with_suffix(".md")
    title = f"{prov['device_name']}, {prov['num_threads']} threads, {prov['started_at']}"
    text = (f"# comera-bench bench ({title})\n\n"
            + (f"Allocator: {allocator}\n\n" if allocator else "")
            + (f"**Warning:** {load}\n\n" if load else "") + to_markdown(rows))
    frame = to_frame([{**asdict(r), **prov} for r in rows], "bench")
    pq = write_parquet_atomic(frame, path, kind="bench", provenance={**prov, "allocator": allocator})
    atomic_write(md, lambda tmp: tmp.write_text(text))
    return md, pq
