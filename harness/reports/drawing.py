"""What every figure shares: panels, footers of at most FOOTER_LINES lines with the rest in a notes file
(``<name>.md`` and ``.html`` beside the PNG and PDF), failed-cell crosses, spread bars, step and log axes.
Every text in a figure is drawn as written: ``$`` opens no math (a device name such as ``$\frac{$`` would
stop the figure from being drawn).
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.reports.html import cell_text, write_html  # noqa: E402
from harness.reports.shared import (method_label)
from harness.results.analysis import Results, model_size, settings_of, step_time_spread, stable

LITERAL = {"parse_math": False}
"""Keyword arguments of a figure text that may hold strings from the rows (footer, notes in a panel, a
failed cell's status): drawn as text, never parsed as math (a ``$`` in a device name)."""


PAPER = "paper (RTX 3090)"
FOOTER_POINTS = 8
FOOTER_CHARS_PER_INCH = 15  # characters of the 8-point footer per inch of figure width
FOOTER_LINES = 2
DPI = 130
"""Lines of a figure's footer at most; the rest of what it would say is in its notes file."""
NOISY_RING = {"marker": "o", "ls": "none", "markersize": 12, "markerfacecolor": "white",
              "markeredgecolor": "black", "markeredgewidth": 2, "zorder": 1}  # a timing not stable
SPREAD_NOTE = ("Bars: IQR of the cell's step times (scaled to the epoch); black-ringed markers: "
               "timing not stable (timing_quality, table_runs), left out of every verdict.")


def panels(ncols: int = 2, width: float = 5.2, height: float = 4.2) -> tuple[plt.Figure, list[plt.Axes]]:
    """A row of ``ncols`` panels, each ``width`` inches wide, the figure ``height`` inches tall."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


_SENTENCE_END = re.compile(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.)\s+")


def short_footer(footer: str, pointer: str, width: int, lines: int = FOOTER_LINES) -> str:
    """The leading sentences of ``footer`` that fit in ``lines`` lines of ``width`` characters with
    ``pointer`` (where the rest is) after them; a first sentence too long is cut at a word, with "..."."""
    sentences = [x for x in _SENTENCE_END.split(" ".join(footer.split())) if x]
    shown = []
    for sentence in sentences:
        if len(textwrap.wrap(" ".join([*shown, sentence, pointer]), width)) > lines:
            break
        shown.append(sentence)
    if not shown and sentences:
        room = textwrap.wrap(sentences[0], width)[:lines]
        room[-1] = textwrap.shorten(room[-1], width - len(pointer) - 5, placeholder="")
        shown = [" ".join(room).rstrip(" .,;:") + "..."]
    return " ".join([*shown, pointer])


NOTE_PARTS = ("Model", "Settings", "Methods", "Measured")
"""What every figure's notes file states, each in a paragraph of its own that starts with its name."""


def notes(*, model: str, settings: str, methods: str, measured: str, more: str = "") -> str:
    """A figure's notes: one paragraph per :data:`NOTE_PARTS` ("Model: ...", "Settings: ...", "Methods:
    ...", "Measured: ..."), then ``more``.

    Args:
        model: the model (workload and size, or the op's table) the numbers come from.
        settings: device, threads, torch, the workload's parameters and budget (Results.settings_line).
        methods: the methods or variants drawn and what each is.
        measured: how each plotted number was measured (clock, statistic, memory kind).
        more: anything else, after them.

    Raises:
        ValueError: a part left empty.
    """
    parts = dict(zip(NOTE_PARTS, (model, settings, methods, measured)))
    blank = [part for part, text in parts.items() if not str(text).strip()]
    if blank:
        raise ValueError(f"figure notes: {', '.join(blank)} left empty")
    text = "\n\n".join(f"{part}: {' '.join(str(value).split()).rstrip('.')}."
                       for part, value in parts.items())
    return text + (f"\n\n{more.strip()}" if more.strip() else "")


def missing_note_parts(text: str) -> list[str]:
    """The :data:`NOTE_PARTS` whose paragraph ``text`` lacks."""
    return [part for part in NOTE_PARTS if not re.search(rf"(^|\n){part}: \S", text)]


MODELS = {("transformer", "paper"): "the paper's six-encoder transformer (hidden 768, FFN 3072, 12 heads, "
                                    "seq 128, the paper's TT/TTM shapes)",
          ("dlrm", "paper"): "DLRM at the Kaggle table sizes"}


def model_line(res: Results, df: pd.DataFrame) -> str:
    """The model of ``df``'s cells: their workload/size presets (from their grid specs), "-" for none."""
    found = []
    for r in df.itertuples():
        size = model_size(settings_of(r), res.cells.get(r.run_id, {}))
        text = MODELS.get((r.workload, size), f"{r.workload}, size preset {size!r}")
        if text not in found:
            found.append(text)
    return "; ".join(found) or "-"


def methods_text(runs: pd.DataFrame) -> str:
    """The method configurations of ``runs`` as a reader knows them (:func:`display_label`), each once,
    with where their parameters are."""
    labels = list(dict.fromkeys(runs.apply(display_label, axis=1))) if len(runs) else []
    return (", ".join(labels) or "none") + " (each run's parameters: table_runs, its settings column)"


def finish(fig: plt.Figure, title: str, footer: str, out: Path, name: str, notes: str = "") -> None:
    """Title; under the plots the footer's leading sentences (:func:`short_footer`: FOOTER_LINES lines at
    most, then the name of the notes file); the figure (:func:`save`) and its notes, ``<name>.md`` and
    ``.html``: the title, the whole footer and ``notes`` (:func:`notes`: model, settings, methods and how it
    was measured), each one paragraph of literal text (:func:`harness.reports.html.cell_text`: they hold
    strings from the rows).

    Raises:
        ValueError: ``notes`` lacks one of :data:`NOTE_PARTS` (the figure and the parts named).
    """
    missing = missing_note_parts(notes)
    if missing:
        plt.close(fig)
        raise ValueError(f"{name}: its notes lack {', '.join(missing)} (drawing.notes builds them)")
    fig.suptitle(title, fontsize=11, **LITERAL)
    width = int(fig.get_figwidth() * FOOTER_CHARS_PER_INCH)
    lines = textwrap.wrap(short_footer(footer, f"Notes: {name}.md.", width), width)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=FOOTER_POINTS, va="bottom", ha="left", **LITERAL)
    bottom = (6 + len(lines) * FOOTER_POINTS * 1.3) / 72 / fig.get_figheight()  # the footer's share
    fig.tight_layout(pad=0.6, rect=(0, bottom, 1, 0.95))
    out.mkdir(parents=True, exist_ok=True)
    paragraphs = [cell_text(p) for p in notes.strip().split("\n\n") if p.strip()]
    (out / f"{name}.md").write_text(f"# {title}\n\n{cell_text(' '.join(footer.split()))}\n\n"
                                    + "\n\n".join(paragraphs) + "\n")
    write_html(out / f"{name}.md")
    save(fig, out, name)


def save(fig: plt.Figure, out: Path, name: str) -> None:
    """``<name>.png`` and ``.pdf`` in ``out``; the figure is closed."""
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{name}.{ext}", dpi=DPI)
    plt.close(fig)


def empty(out: Path, name: str, title: str, why: str, footer: str) -> None:
    """A figure with nothing to draw: what it would need (``why``) in its panel and notes."""
    fig, (ax,) = panels(1)
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(f"Not measured in this grid: {why}", 60), ha="center", va="center",
            **LITERAL)
    finish(fig, title, footer, out, name, notes(
        model="none drawn", settings=footer, methods="none drawn",
        measured=f"nothing: not measured in this grid; the figure needs {why}"))


def device_text(res: Results, runs: pd.DataFrame) -> str:
    """"device cpu (AMD EPYC 7B13, 2 threads)": the device label, name and torch threads of ``runs``."""
    if not len(runs):
        return f"device {res.label}"
    threads = values_text(runs.num_threads)
    names = "/".join(sorted({str(n) for n in runs.device_name.dropna()})) or "?"
    return f"device {res.label} ({names}, {threads} thread{'' if threads == '1' else 's'})"


def mark_failed(ax: plt.Axes, x: float, status: str) -> None:
    ax.plot([x], [0], marker="x", color="red", markersize=9, clip_on=False, zorder=5)
    ax.annotate(status, (x, 0), textcoords="offset points", xytext=(3, 6), color="red", fontsize=7, **LITERAL)


def display_label(row: pd.Series) -> str:
    """A method configuration as a reader knows it ("uncompressed" for dense training)."""
    label = method_label(row)
    return "uncompressed" + label[len("dense"):] if label.startswith("dense") else label


def with_spread(ax: plt.Axes, ok: pd.DataFrame, x: pd.Series, y: pd.Series, **style) -> Any:
    """Points with their step-time IQR bars; a black ring marks each timing that is not stable."""
    drawn = ax.errorbar(x, y, yerr=y * step_time_spread(ok).fillna(0.0) / 2, capsize=3, **style)
    noisy = ~stable(ok)
    if noisy.any():
        ax.plot(x[noisy], y[noisy], **NOISY_RING)
    return drawn


def steps_axis(ax: plt.Axes) -> None:
    """An x axis of training steps: at most 6 ticks, large counts as "100k" (six digits side by side
    overlap on a 5-inch panel)."""
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(6))
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))


def plain_log_ticks(axis: Any) -> None:
    """A log axis labelled as plain numbers, its minor ticks unlabelled (the default labels a short range's
    minor ticks in exponent notation, "3x10^-1" crowding "4x10^-1"): at 1, 2 and 5 per decade over at most
    1.5 decades of its view, at 1 and 3 up to 3 decades, at the decades beyond."""
    low, high = sorted(axis.get_view_interval())
    decades = math.log10(high / low) if low > 0 and high > 0 else 0.0
    subs = (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 3 else (1.0,)
    axis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs))
    axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


NEAR_TICK = 1.3
"""A log axis' extreme point has a labelled tick within this factor of it (:func:`tick_near`)."""


def tick_near(axis: Any, x: float) -> None:
    """A labelled tick at ``x`` (two significant digits) on a log axis whose labelled ticks in view are all
    farther than :data:`NEAR_TICK` from it, so that a reader can place the point; the other ticks stay."""
    if not x > 0:
        return
    low, high = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_majorticklocs() if low <= t <= high]
    if any(x / NEAR_TICK <= t <= x * NEAR_TICK for t in ticks):
        return
    axis.set_ticks(sorted([*ticks, float(f"{x:.2g}")]))


def log_if_spread(ax: plt.Axes, values: pd.Series) -> None:
    """A log y axis labelled as plain numbers (:func:`plain_log_ticks`) where the positive values span more
    than a decade, else linear from 0."""
    values = values[values > 0].dropna()
    if len(values) and values.max() / values.min() > 10:
        ax.set_yscale("log")
        ax.autoscale_view()
        plain_log_ticks(ax.yaxis)
    else:  # from 0, with room above the highest marker (autoscaling's margin is a share of the data's range)
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * 1.06 if top > 0 else None)

def values_text(series: pd.Series) -> str:
    values = sorted({str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
                     for v in series.dropna()})
    return "/".join(values) or "?"
