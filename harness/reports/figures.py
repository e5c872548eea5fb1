"""The paper's figures from one device's results (PNG + PDF, matplotlib Agg).

``python -m harness.reports.figures --results results/<device> --device-label <device> --out figures/``;
what each figure shows: docs/pipeline.md, "Outputs". Why one module of ~800 lines: one function per figure
over shared drawing helpers (markers, spread bars, failed-cell crosses, footers, notes) that a reader
checks against each other.
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.reports import reference  # noqa: E402
from harness.reports.html import write_html  # noqa: E402
from harness.reports.shared import (MB, late_stage_missing, method_label, quality_order,  # noqa: E402
                                    report_args)
from harness.results.analysis import (QUALITY, Results, model_size, pair_ratio, purpose_of,  # noqa: E402
                                      settings_of, step_time_spread, stable, timing_cells)

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


def _figure(ncols: int = 2, width: float = 5.2) -> tuple[plt.Figure, list[plt.Axes]]:
    """A row of ``ncols`` panels, each ``width`` inches wide."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.2), squeeze=False)
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


def _finish(fig: plt.Figure, title: str, footer: str, out: Path, name: str, notes: str = "") -> None:
    """Title; under the plots the footer's leading sentences (:func:`short_footer`: FOOTER_LINES lines at
    most, then the name of the notes file); the figure (:func:`save`) and its notes, ``<name>.md`` and
    ``.html``: the title, the whole footer and ``notes`` (model, settings, how it was measured)."""
    fig.suptitle(title, fontsize=11)
    width = int(fig.get_figwidth() * FOOTER_CHARS_PER_INCH)
    lines = textwrap.wrap(short_footer(footer, f"Notes: {name}.md.", width), width)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=FOOTER_POINTS, va="bottom", ha="left")
    bottom = (6 + len(lines) * FOOTER_POINTS * 1.3) / 72 / fig.get_figheight()  # the footer's share
    fig.tight_layout(pad=0.6, rect=(0, bottom, 1, 0.95))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(f"# {title}\n\n{' '.join(footer.split())}\n\n{notes.strip()}\n")
    write_html(out / f"{name}.md")
    save(fig, out, name)


def save(fig: plt.Figure, out: Path, name: str) -> None:
    """``<name>.png`` and ``.pdf`` in ``out``; the figure is closed."""
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{name}.{ext}", dpi=DPI)
    plt.close(fig)


def _empty(out: Path, name: str, title: str, why: str, footer: str) -> None:
    fig, (ax,) = _figure(1)
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(f"Not measured in this grid: {why}", 60), ha="center", va="center")
    _finish(fig, title, footer, out, name, f"Not measured in this grid: {why}.")


def device_text(res: Results, runs: pd.DataFrame) -> str:
    """"device cpu (AMD EPYC 7B13, 2 threads)": the device label, name and torch threads of ``runs``."""
    if not len(runs):
        return f"device {res.label}"
    threads = _values_text(runs.num_threads)
    names = "/".join(sorted({str(n) for n in runs.device_name.dropna()})) or "?"
    return f"device {res.label} ({names}, {threads} thread{'' if threads == '1' else 's'})"


def _mark_failed(ax: plt.Axes, x: float, status: str) -> None:
    ax.plot([x], [0], marker="x", color="red", markersize=9, clip_on=False, zorder=5)
    ax.annotate(status, (x, 0), textcoords="offset points", xytext=(3, 6), color="red", fontsize=7)


def display_label(row: pd.Series) -> str:
    """A method configuration as a reader knows it ("uncompressed" for dense training)."""
    label = method_label(row)
    return "uncompressed" + label[len("dense"):] if label.startswith("dense") else label


def _with_spread(ax: plt.Axes, ok: pd.DataFrame, x: pd.Series, y: pd.Series, **style) -> Any:
    """Points with their step-time IQR bars; a black ring marks each timing that is not stable."""
    drawn = ax.errorbar(x, y, yerr=y * step_time_spread(ok).fillna(0.0) / 2, capsize=3, **style)
    noisy = ~stable(ok)
    if noisy.any():
        ax.plot(x[noisy], y[noisy], **NOISY_RING)
    return drawn


def _steps_axis(ax: plt.Axes) -> None:
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


def _log_if_spread(ax: plt.Axes, values: pd.Series) -> None:
    """A log y axis where the positive values span more than a decade, else linear from 0."""
    values = values[values > 0].dropna()
    if len(values) and values.max() / values.min() > 10:
        ax.set_yscale("log")
    else:  # from 0, with room above the highest marker (autoscaling's margin is a share of the data's range)
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * 1.06 if top > 0 else None)


def _per_batch(ax: plt.Axes, df: pd.DataFrame, column: str, scale: float, ylabel: str,
               spread: bool = False) -> None:
    """Markers per method configuration at each batch size (no line joins two batch sizes: they are
    separate measurements), dodged sideways so that they do not hide each other; failed cells as red
    crosses. With ``spread`` (a time column) each point carries its IQR bar and an unstable timing is
    drawn with a black ring."""
    labels = df.apply(display_label, axis=1) if len(df) else pd.Series(dtype=object)
    groups = list(df.groupby(labels, sort=True))
    for i, (label, group) in enumerate(groups):
        dodge = 2 ** ((i - (len(groups) - 1) / 2) * 0.06)
        group = group.sort_values("batch_size")
        ok = group[group.status == "ok"]
        x, y = ok.batch_size.astype(float) * dodge, ok[column].astype(float) / scale
        style = dict(marker="o", ls="none", label=label, color=f"C{i}", zorder=2)
        if spread:
            _with_spread(ax, ok, x, y, **style)
        else:  # one point per batch size: the median of its cells (seeds), bars from their min to max
            by_batch = y.groupby(x)
            mid = by_batch.median()
            ax.errorbar(mid.index, mid.values, yerr=[mid - by_batch.min(), by_batch.max() - mid], capsize=3,
                        **style)
        for _, r in group[group.status != "ok"].iterrows():
            _mark_failed(ax, r.batch_size * dodge, r.status)
    ax.set_xscale("log", base=2)
    batches = sorted(int(b) for b in df.batch_size.dropna().unique())
    ax.set_xticks(batches, [str(b) for b in batches])
    if batches:
        ax.set_xlim(batches[0] / 1.5, batches[-1] * 1.5)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("batch size (samples)")
    ax.set_ylabel(ylabel)
    _log_if_spread(ax, df[df.status == "ok"][column].astype(float) / scale if len(df) else pd.Series(dtype=float))
    ax.grid(alpha=0.3)


def speedups(df: pd.DataFrame) -> dict[int, Any]:
    """batch -> uncompressed / CoMERA (no target) time, harness.results.analysis.pair_ratio: the ratio
    claims C1 and `comera-bench compare` show for the same pair (stable cells only)."""
    ok = df[(df.status == "ok") & df.target_ratio.isna()]
    out = {}
    for batch, cells in ok.groupby("batch_size"):
        dense, comera = cells[cells.method == "dense"], cells[(cells.method == "comera") & (cells.variant == "default")]
        r = pair_ratio(dense, comera) if len(dense) and len(comera) else None
        if r is not None:
            out[int(batch)] = r
    return out


def speedup_note(df: pd.DataFrame) -> str:
    """The uncompressed / CoMERA time ratio at each batch size ('' when there is none); where CoMERA took
    longer, its FLOP saving and why."""
    ratios = speedups(df)
    if not ratios:
        return ""
    text = ("Uncompressed / CoMERA time (stable cells; median over rounds of per-round mean step time "
            "ratios where timed together, with their IQR; else of mean-based epoch times, with each side's "
            "round-mean quartiles): "
            + ", ".join(f"{r.text()} @ batch {b}" for b, r in sorted(ratios.items())) + ". ")
    slower = []
    for b, r in sorted(ratios.items()):
        cells = df[(df.batch_size == b) & (df.status == "ok") & df.target_ratio.isna()]
        d, c = cells[cells.method == "dense"].iloc[0], cells[(cells.method == "comera") & (cells.variant == "default")].iloc[0]
        if r.value < 1 and c.flops_per_step > 0 and d.flops_per_step > 0:
            slower.append(f"batch {b}: {d.flops_per_step / c.flops_per_step:.1f}x fewer FLOPs, "
                          f"{1 / r.value:.2f}x the time")
    if slower:
        text += ("CoMERA slower than uncompressed at " + "; ".join(slower) + ": with few tokens per call the TT "
                 "layers' fixed cost per call (several small products and their autograd nodes) outweighs "
                 "their FLOP saving. ")
    return text


def _time_memory(res: Results, workload: str, df: pd.DataFrame, out: Path, name: str, title: str,
                 paper_note: str) -> None:
    fig, (ax_t, ax_m) = _figure(2)
    _per_batch(ax_t, df, "epoch_time_s", 1.0, "time per epoch (s)", spread=True)
    _per_batch(ax_m, df, "peak_mem_bytes", MB, "peak memory (MB)")
    ax_t.legend(fontsize=7)
    _finish(fig, title, time_memory_footer(res, workload, df, paper_note), out, name,
            time_memory_details(res, workload, df))


def memory_spread_text(df: pd.DataFrame) -> str:
    """What a memory point is: one cell's peak, or the median of a batch size's cells with their range."""
    ok = df[(df.status == "ok") & df.peak_mem_bytes.notna()]
    kinds = "/".join(sorted(ok.peak_mem_kind.dropna().unique())) or "peak"
    labels = ok.apply(display_label, axis=1) if len(ok) else pd.Series(dtype=object)
    several = len(ok) and ok.groupby([labels, ok.batch_size]).size().max() > 1
    seeds = ok.seed.nunique() if "seed" in ok else 1
    if several:
        return f"memory: {kinds}, median and min-max bar over {seeds} seeds"
    return f"memory: {kinds} of one cell (one seed: no spread)"


def time_memory_footer(res: Results, workload: str, df: pd.DataFrame, paper_note: str) -> str:
    """Fig 1/8's footer: device, the uncompressed / CoMERA time ratios, what a bar and a ring mean, what a
    memory point is, the paper's values; the model, budget, epoch-time kind and notes are in its notes
    (:func:`time_memory_details`)."""
    ratios = speedups(df)
    measured = ("Uncompressed / CoMERA time " + ", ".join(f"{r.text()} @ batch {b}" for b, r in sorted(ratios.items()))
                + ". ") if ratios else ""
    return (f"{device_text(res, df)}. {measured}Bars: step-time IQR; ringed: not stable (in no verdict); "
            f"{memory_spread_text(df)}. {PAPER}: {paper_note}")


def _values_text(series: pd.Series) -> str:
    values = sorted({str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in series.dropna()})
    return "/".join(values) or "?"


def time_memory_details(res: Results, workload: str, df: pd.DataFrame) -> str:
    """The notes of Fig 1/8 beyond its footer: model, settings, epoch-time kind, where CoMERA was slower
    and why."""
    kinds = "/".join(sorted(df.epoch_time_kind.dropna().unique()))
    return (f"{model_line(res, df)}. {res.settings_line(workload)}. Epoch time: {kinds} (mean step time x "
            f"steps per epoch when extrapolated). {speedup_note(df)}{SPREAD_NOTE}").strip()


MODELS = {("transformer", "paper"): "the paper's six-encoder transformer (hidden 768, FFN 3072, 12 heads, "
                                    "seq 128, the paper's TT/TTM shapes)",
          ("dlrm", "paper"): "DLRM at the Kaggle table sizes"}


def model_line(res: Results, df: pd.DataFrame) -> str:
    """"Model: ..." for the workload/size presets of ``df``'s cells (from their grid specs)."""
    found = []
    for r in df.itertuples():
        size = model_size(settings_of(r), res.cells.get(r.run_id, {}))
        text = MODELS.get((r.workload, size), f"{r.workload}, size preset {size!r}")
        if text not in found:
            found.append(text)
    return "Model: " + "; ".join(found) if found else "Model: -"


def fig1_time_memory(res: Results, out: Path) -> None:
    name, title = "fig1_time_memory", "Fig 1: transformer training time and memory per batch size"
    df = res.main_runs("transformer")
    df = df[df.target_ratio.isna()]
    if not len(df):
        return _empty(out, name, title, "transformer runs without a target", res.settings_line())
    c2 = reference.claim("C2")["values"]
    _time_memory(res, "transformer", df, out, name, title,
                 f"at batch 1 CoMERA {c2['speedup_vs_galore']:g}x faster and {c2['memory_vs_galore']:g}x "
                 "less memory than GaLore (abstract).")


def fig8_dlrm_time_memory(res: Results, out: Path) -> None:
    name, title = "fig8_dlrm_time_memory", "Fig 8: DLRM training time and memory per batch size"
    df = res.main_runs("dlrm")
    if not len(df):
        return _empty(out, name, title, "DLRM runs", res.settings_line())
    mem = reference.claim("C7")["values"]["memory_vs_dense"]
    _time_memory(res, "dlrm", df, out, name, title,
                 "uncompressed faster than CoMERA; CoMERA memory "
                 + ", ".join(f"{v:g}x less at batch {k}" for k, v in mem.items()) + " (review discussion). "
                 + base_rate_note(_curves(res, df, "eval", ("nce",)), "timing cells"))


def curve_runs(res: Results, workload: str) -> tuple[pd.DataFrame, str]:
    """(runs, source) of a workload's curve figure (Fig 9, Fig 10): its quality cells (trained long enough
    to learn), else its timing runs without a target (said in ``source``)."""
    runs, source = res.quality_runs(workload)
    if not (purpose_of(runs) == QUALITY).any():
        runs = runs[runs.target_ratio.isna()]
    return runs, source


def _curves(res: Results, runs: pd.DataFrame, split: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    """The curves of ``runs``, labelled by method and batch, plus the size preset, data and sequence length
    where they vary (e.g. MLM on code and on text, seq 128 and 512); the seed is not in the label: the
    seeds of one configuration are one line."""
    curves = res.curves[res.curves.run_id.isin(runs.run_id) & (res.curves.split == split)
                        & res.curves.metric_name.isin(metrics)]
    sizes = {r.run_id: model_size(settings_of(r), res.cells.get(r.run_id, {})) for r in runs.itertuples()}
    data = {r.run_id: settings_of(r).get("workload_info", {}).get("data") for r in runs.itertuples()}
    parts = {rid: [] for rid in sizes}
    for name, values in (("size", sizes), ("data", data), ("seq", dict(zip(runs.run_id, runs.seq_len)))):
        if len(set(values.values())) > 1:
            for rid, value in values.items():
                parts[rid].append(f"{name} {value}")
    labels = {r.run_id: ", ".join([f"{method_label(r)}, batch {r.batch_size}", *parts[r.run_id]])
              for r in runs.itertuples()}
    seeds = dict(zip(runs.run_id, runs.seed))
    return curves.assign(label=curves.run_id.map(labels), seed=curves.run_id.map(seeds))


def _curve_figure(res: Results, out: Path, name: str, title: str, workload: str, split: str,
                  metrics: tuple[str, ...], ylabel: str, paper: tuple[float, str] | None,
                  note: Callable[[pd.DataFrame, str], str] | None = None,
                  level: tuple[float, str] | None = None) -> None:
    """One line per method configuration (label): a cell's curve, or with several seeds their mean per step,
    the band between the seeds' lowest and highest value shaded; failed cells named in the footer;
    ``paper`` (value, what) the paper's number, dashed; ``level`` (value, what) a reference level, dotted."""
    runs, source = curve_runs(res, workload)
    df = _curves(res, runs, split, metrics)
    if not len(df):
        return _empty(out, name, title, f"{split} curves ({'/'.join(metrics)}) of {workload} runs ({source})",
                      res.settings_line())
    fig, (ax,) = _figure(1)
    banded = False
    for i, (label, group) in enumerate(df.groupby("label", sort=True)):
        seeds = sorted(int(seed) for seed in group.seed.dropna().unique())
        by_step = group.groupby("step").value
        mean = by_step.mean()
        if len(seeds) > 1:
            label += f", mean of seeds {', '.join(map(str, seeds))}"
            ax.fill_between(mean.index, by_step.min().values, by_step.max().values, color=f"C{i}", alpha=0.2,
                            lw=0)
            banded = True
        ax.plot(mean.index, mean.values, marker="." if len(mean) < 30 else None, color=f"C{i}", label=label)
    if paper is not None:
        ax.axhline(paper[0], color="gray", ls="--", lw=1, label=f"{PAPER}: {paper[1]}")
    if level is not None:
        ax.axhline(level[0], color="black", ls=":", lw=1, label=level[1])
    _steps_axis(ax)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    failed = [f"{r.run_id} ({r.status})" for r in runs.itertuples() if r.status != "ok"]
    footer = [f"{device_text(res, runs)}; {source}" + ("; shaded: the range over the seeds." if banded else "."),
              f"Failed: {', '.join(failed)}." if failed else "", note(df, source) if note else ""]
    _finish(fig, title, " ".join(filter(None, footer)), out, name, f"{res.settings_line(workload, runs)}.")


def _quality_runs(res: Results) -> tuple[pd.DataFrame, dict[str, str], str]:
    """(the transformer's quality cells in table order, run_id -> line label, source); the label names
    the batch size and seed when they vary (timing cells) and a CoMERA target without a late stage."""
    runs, source = res.quality_runs("transformer")
    runs = quality_order(runs)
    vary = [(key, col) for key, col in (("batch", "batch_size"), ("seed", "seed")) if runs[col].nunique() > 1]
    labels = {}
    for r in runs.itertuples():
        why = late_stage_missing(r) if r.status == "ok" else ""
        labels[r.run_id] = (", ".join([method_label(r)] + [f"{key} {getattr(r, col)}" for key, col in vary])
                            + (f" [{why}]" if why else ""))
    return runs, labels, source


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def distinct(i: int) -> dict[str, Any]:
    """The ``i``-th line's style: colour, dash pattern and marker all change, and earlier lines are
    wider, so that lines which coincide stay visible (a dashed line over a wider solid one)."""
    return {"color": f"C{i}", "ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)],
            "lw": max(3.5 - 0.5 * i, 1.0), "markersize": max(7.0 - 0.8 * i, 3.0)}


def on_mnli(runs: pd.DataFrame) -> bool:
    """Whether every run trained on real MNLI (data ``mnli`` in its settings): only then are its
    accuracies comparable with the paper's."""
    data = {settings_of(r).get("workload_info", {}).get("data") for r in runs.itertuples()}
    return data == {"mnli"}


def _quality_footer(res: Results, runs: pd.DataFrame, source: str) -> str:
    """Device, the cells drawn (their source, batch sizes and seeds)."""
    batches = ", ".join(map(str, sorted(runs.batch_size.unique())))
    seeds = _values_text(runs.seed)
    plural = "s" if "/" in seeds else ""
    return f"{device_text(res, runs)}. From the {source}, batch {batches}, seed{plural} {seeds}."


def _switch_line(ax: plt.Axes, res: Results, runs: pd.DataFrame) -> None:
    steps = sorted({info["step"] for r in runs.itertuples() if (info := res.switch(r))})
    for i, step in enumerate(steps):
        ax.axvline(step, color="gray", ls=":", lw=1, label="stage switch (early -> late)" if i == 0 else None)


LOG_LOSS_SPAN = 10.0
"""Fig 6 draws the validation loss on a log scale where its values span at least this factor."""


def fig6_accuracy(res: Results, out: Path) -> None:
    """Validation accuracy (left) and loss (right, on a log scale where it spans LOG_LOSS_SPAN or more: it
    still separates models whose accuracies have saturated) over training, one line per quality cell
    (CoMERA: one per target; they share the early stage, so the lines part at the stage switch); failed
    cells as red crosses."""
    name, title = "fig6_accuracy", "Fig 6: transformer validation accuracy and loss over training"
    runs, labels, source = _quality_runs(res)
    curves = {r: res.series(r, "eval", "accuracy") for r in runs.run_id}
    if not any(len(c) for c in curves.values()):
        return _empty(out, name, title, f"eval accuracy curves of transformer runs ({source})",
                      res.settings_line())
    fig, (ax, loss_ax) = _figure(2, width=6.0)
    losses = []
    for i, r in enumerate(runs.itertuples()):
        c, loss = curves[r.run_id], res.series(r.run_id, "eval", "loss")
        if len(c):
            ax.plot(c.step, c.value, label=labels[r.run_id], **distinct(i))
        if len(loss):
            loss_ax.plot(loss.step, loss.value, label=labels[r.run_id], **distinct(i))
            losses += list(loss.value)
        if r.status != "ok":
            _mark_failed(ax, c.step.max() if len(c) else 0, f"{labels[r.run_id]}: {r.status}")
    _switch_line(ax, res, runs)
    _switch_line(loss_ax, res, runs)
    acc = reference.claim("C4")["values"]["accuracy_comera"]
    if on_mnli(runs):
        ax.axhline(acc, color="gray", ls="--", lw=1, label=f"{PAPER}: final MNLI accuracy ~{acc:.0%}")
        paper = ""
    else:
        paper = f"The paper's ~{acc:.0%} (real MNLI) not drawn: another task."
    log = bool(losses) and min(losses) > 0 and max(losses) >= LOG_LOSS_SPAN * min(losses)
    for panel, ylabel in ((ax, "validation accuracy (fraction)"),
                          (loss_ax, "validation loss (cross-entropy" + (", log scale)" if log else ")"))):
        _steps_axis(panel)
        panel.set_ylabel(ylabel)
        panel.grid(alpha=0.3)
    if log:
        loss_ax.set_yscale("log")
    if losses:
        loss_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        loss_ax.text(0.5, 0.5, "no validation loss recorded by these runs", ha="center", va="center",
                     transform=loss_ax.transAxes, fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    _finish(fig, title, " ".join(filter(None, [_quality_footer(res, runs, source), paper])), out, name,
            "Validation accuracy and loss at step 0, every eval_every_steps, after the stage switch and at "
            f"the end. {res.settings_line('transformer', runs)}.")


def fig13_rank_adaptation(res: Results, out: Path) -> None:
    """Not in the paper: for each CoMERA target (0.8, 0.5, 0.2), the TT size relative to the size at the
    stage switch and the validation accuracy along training; targets without a late stage are named."""
    name, title = "fig13_rank_adaptation", "Rank adaptation along training (not a figure of the paper)"
    runs, labels, source = _quality_runs(res)
    runs = runs[(runs.method == "comera") & runs.target_ratio.notna()]
    why = pd.Series([late_stage_missing(r) for r in runs.itertuples()], index=runs.index, dtype=str)
    missing = [f"target {t:g}: {w}" for t, w in zip(runs.target_ratio, why) if w]
    shown, missed = runs[why == ""], []
    if not len(shown):
        return _empty(out, name, title, "CoMERA runs with a target whose late stage ran ("
                      + ("; ".join(missing) or f"none among the {source}") + ")", res.settings_line())
    fig, (left, right) = _figure(2)
    for i, r in enumerate(shown.itertuples()):
        size, acc = res.series(r.run_id, "method", "params_tt"), res.series(r.run_id, "eval", "accuracy")
        ratio = size.value / res.switch(r)["size"]
        style = {**distinct(i), "marker": None}
        left.plot(size.step, ratio, label=labels[r.run_id], **style)
        left.axhline(r.target_ratio, color=f"C{i}", ls="--", lw=0.8)
        if len(ratio) and ratio.iloc[-1] > r.target_ratio * (1 + TARGET_SLACK):
            missed.append(f"target {r.target_ratio:g} missed: the TT size ends at {ratio.iloc[-1]:.2f}x the "
                          "size at the switch")
        right.plot(acc.step, acc.value, label=labels[r.run_id], **distinct(i))
    left.plot([], [], color="gray", ls="--", lw=0.8, label="target (dashed, the line's colour)")
    for ax, ylabel in ((left, "TT size / size at the switch"),
                       (right, "validation accuracy (fraction)")):
        _switch_line(ax, res, shown)
        _steps_axis(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    notes = ([f"not measured here: {'; '.join(missing)}"] if missing else []) + missed
    if notes:  # above the panel, where it hides no line
        left.text(0.0, 1.02, textwrap.fill("; ".join(notes), 80), fontsize=7,
                  transform=left.transAxes, color="red", va="bottom", ha="left")
    _finish(fig, title, _quality_footer(res, shown, source), out, name,
            "TT size = scalars in every core and gate (curves method/params_tt, after every step) divided by "
            "the size right after the switch's pruning (the same divisor before the switch); "
            f"{ramp_text(shown)}; accuracy as in Fig 6. {res.settings_line('transformer', shown)}.")


TARGET_SLACK = 0.05
"""Fig 13 says a target was missed when the TT size ends more than this fraction above it."""


def ramp_text(runs: pd.DataFrame) -> str:
    """What shapes the left panel's fall: CoMERA's target_ramp (method params in the runs' settings)."""
    ramps = sorted({float(settings_of(r).get("method", {}).get("target_ramp") or 0.0) for r in runs.itertuples()})
    if ramps == [0.0]:
        return "the size target S0 is fixed at target x size at the switch from the switch on (target_ramp 0)"
    return ("the size target S0 falls linearly from the size at the switch to target x that size over "
            + "/".join(f"{x:.0%}" for x in ramps) + " of the late stage (method param target_ramp), then stays")


KNEE_DROP = 0.02
"""Fig 14's knee: the largest compression at which CoMERA's mean accuracy is at most this far below the
uncompressed model's mean (the issue's "within 0.02 of dense")."""


def knee_text(points: pd.DataFrame, reference_acc: float) -> str:
    """Where CoMERA's accuracy leaves the uncompressed model's: ``points`` are its targets' mean accuracy
    (column ``accuracy``) and compression (``compression``); e.g. "CoMERA within 0.02 of uncompressed up to
    7.7x (target 0.5); 0.120 below at 22.7x (target 0.2)"."""
    points = points.sort_values("compression")
    if not len(points):
        return ""
    gap = reference_acc - points.accuracy
    kept = points[gap <= KNEE_DROP + 1e-9]
    last_kept = kept.compression.max() if len(kept) else 0.0
    beyond = points[(gap > KNEE_DROP + 1e-9) & (points.compression > last_kept)]

    def at(r: Any) -> str:
        return f"{r.compression:.1f}x (target {r.target:g})"

    if not len(kept):
        first = points.iloc[0]
        return (f"CoMERA more than {KNEE_DROP:g} below uncompressed from its least compression, "
                f"{reference_acc - first.accuracy:.3f} below at {at(first)}")
    last = kept.iloc[-1]
    text = f"CoMERA within {KNEE_DROP:g} of uncompressed up to {at(last)}"
    if len(beyond):
        first = beyond.iloc[0]
        return text + f"; {reference_acc - first.accuracy:.3f} below at {at(first)}"
    return text + " (no knee in the targets run)"


def dodged(xs: list[float], step: float = 1.07) -> list[float]:
    """A factor per point of a log x axis that moves points at the same x (within 5%) apart, side by side
    around it (``step`` apart), so that markers of methods at one compression, e.g. 1x, do not hide each
    other; 1.0 for a point alone."""
    keys = [round(math.log(x) / math.log(1.05)) if x > 0 else 0 for x in xs]
    factors = []
    for i, key in enumerate(keys):
        same = [j for j, k in enumerate(keys) if k == key]
        factors.append(step ** (same.index(i) - (len(same) - 1) / 2))
    return factors


def fig14_accuracy_vs_compression(res: Results, out: Path) -> None:
    """Not in the paper: the final validation accuracy of every transformer quality cell against its whole-
    model compression (the uncompressed model's parameters / the trained model's), one small marker per
    seed and a large one for the mean of a method configuration; CoMERA's targets joined by a line, the
    uncompressed model's mean as a horizontal line (its seeds' range shaded), the size-matched dense model
    beside CoMERA; the footer says where the knee is (:func:`knee_text`)."""
    name, title = "fig14_accuracy_vs_compression", "Accuracy vs compression (not a figure of the paper)"
    runs, source = res.quality_runs("transformer")
    runs = quality_order(runs)
    ok = runs[(runs.status == "ok") & (runs.metric_name == "accuracy") & runs.metric_value.notna()
              & runs.compression_total.notna()]
    if not len(ok):
        return _empty(out, name, title, f"transformer cells with a final accuracy ({source})",
                      res.settings_line())
    fig, (ax,) = _figure(1, width=6.4)
    labels = ok.apply(display_label, axis=1)
    dense = ok[(ok.method == "dense") & (labels == "uncompressed")]
    if len(dense):
        mean = dense.metric_value.mean()
        ax.axhspan(dense.metric_value.min(), dense.metric_value.max(), color="gray", alpha=0.15, lw=0)
        ax.axhline(mean, color="gray", lw=1.2, label=f"uncompressed, mean {mean:.3f} (seeds' range shaded)")
    for key, style, text in (("label_ceiling", "-.", "the labels' ceiling: {:.3f} follow the task's rule"),
                             ("hypothesis_only_ceiling", ":", "hypothesis alone: {:.3f} (the plateau)")):
        found = {settings_of(r).get("workload_info", {}).get(key) for r in ok.itertuples()}
        if len(found) == 1 and None not in found:
            value = found.pop()
            ax.axhline(value, color="gray", ls=style, lw=1, label=text.format(value))
    comera, groups = [], list(ok.groupby(labels, sort=False))
    dodge = dodged([g.compression_total.mean() for _, g in groups])
    for i, (label, group) in enumerate(groups):
        style = {"color": f"C{i}", "marker": MARKERS[i % len(MARKERS)]}
        x, mean = group.compression_total.mean(), group.metric_value.mean()
        ax.plot(group.compression_total * dodge[i], group.metric_value, ls="none", ms=5, alpha=0.6,
                mfc="none", **style)
        ax.plot([x * dodge[i]], [mean], ls="none", ms=9, label=label, **style)
        if (group.method == "comera").all() and group.target_ratio.notna().all():
            comera.append({"compression": x, "accuracy": mean, "target": group.target_ratio.iloc[0],
                           "x": x * dodge[i]})
    knee = ""
    if comera:
        line = pd.DataFrame(comera).sort_values("compression")
        ax.plot(line.x, line.accuracy, color="black", lw=0.8, ls="--", zorder=0)
        knee = knee_text(line, dense.metric_value.mean()) if len(dense) else ""
    for r in runs[runs.status != "ok"].itertuples():
        _mark_failed(ax, r.compression_total if pd.notna(r.compression_total) else 1.0,
                     f"{method_label(r)}: {r.status}")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.set_xlabel("whole-model compression (uncompressed parameters / the model's)")
    ax.set_ylabel("final validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    seeds = ok.seed.nunique()
    footer = (f"{res.label}, {source}, {seeds} seed{'s' if seeds != 1 else ''} (small: each seed; large: "
              f"mean). {knee + '.' if knee else ''} More: table_mnli_size.")
    _finish(fig, title, footer, out, name)


BASE_RATE_NCE = 0.98
"""DLRM runs whose last eval NCE is at least this learned (almost) nothing beyond the click base rate."""


def base_rate_note(nce: pd.DataFrame, source: str) -> str:
    """A note when no DLRM run drawn beat the click base rate (every last eval NCE >= BASE_RATE_NCE).

    Args:
        nce: the drawn runs' NCE curves (columns run_id, step, value).
        source: where the runs come from (:func:`curve_runs`).
    """
    if not len(nce):
        return ""
    last = nce.sort_values("step").groupby("run_id").value.last()
    if last.min() < BASE_RATE_NCE:
        return ""
    steps = int(nce.step.max())
    return (f"No run learned more than the click base rate in its {steps} steps (last NCE "
            f"{last.min():.3f}-{last.max():.3f}; 1.0 = predicting the base rate; {source}): their accuracy "
            "is the share of the majority class. Train longer (budget) for a learning curve.")


def fig9_dlrm_nce(res: Results, out: Path) -> None:
    _curve_figure(res, out, "fig9_dlrm_nce", "Fig 9: DLRM validation normalized cross-entropy", "dlrm",
                  "eval", ("nce",), "normalized cross-entropy (lower is better)", None, base_rate_note,
                  (1.0, "1.0: predicting the click base rate"))


def fig10_mlm_loss(res: Results, out: Path) -> None:
    c8 = reference.claim("C8")["values"]
    _curve_figure(res, out, "fig10_mlm_loss", "Fig 10: MLM pretraining loss", "mlm", "train",
                  ("loss", "train_loss", "mlm_loss"), "training loss (cross-entropy, nats)",
                  (c8["loss_comera"], f"CoMERA final loss {c8['loss_comera']:g} (CodeBERT-large)"))


def fig7_cuda_graph(res: Results, out: Path) -> None:
    name, title = "fig7_cuda_graph", "Fig 7: epoch time with and without CUDA graph"
    df = timing_cells(res.runs[res.runs.workload == "transformer"])
    df = df[~df.run_id.isin(list(res.sweeps)) & df.target_ratio.isna()]
    graph = df.run_id.map(res.cuda_graph)
    if not graph.any():
        return _empty(out, name, title, "cells with execution.cuda_graph true (needs CUDA; set "
                      "execution.cuda_graph: [false, true])", res.settings_line())
    df = df.assign(method=df.method + graph.map({True: " + CUDA graph", False: ""}),  # the label says it,
                   variant=df.variant.str.replace("+cudagraph", "", regex=False))  # not the row's tag too
    fig, (ax,) = _figure(1)
    _per_batch(ax, df, "epoch_time_s", 1.0, "time per epoch (s)", spread=True)
    ax.legend(fontsize=7)
    _finish(fig, title, f"{device_text(res, df)}. Bars: step-time IQR; ringed: not stable (in no verdict).",
            out, name, f"{res.settings_line('transformer')}. {SPREAD_NOTE}")


def _point_name(res: Results, run_id: str) -> str:
    """A sweep point as "rank 600" (its sweep values), the default CoMERA cell as "default CoMERA"."""
    point = res.sweeps.get(run_id)
    return ", ".join(f"{k} {v}" for k, v in sorted(point.items())) if point else "default CoMERA"


def fig12_time_vs_compression(res: Results, out: Path) -> None:
    """Epoch time against the tensorized layers' compression: the sweep's points and the default CoMERA
    cell at the same batch sizes, with the uncompressed cell as a dotted line; a point slower than
    uncompressed training is annotated with its sweep point and time ratio."""
    name, title = "fig12_time_vs_compression", "Fig 12: epoch time vs compression ratio"
    sweep = timing_cells(res.runs[res.runs.run_id.isin(list(res.sweeps))])
    if not len(sweep):
        return _empty(out, name, title, "a CoMERA sweep (methods.<name>.sweep, e.g. rank)",
                      res.settings_line())
    main = res.main_runs(sweep.workload.iloc[0])
    main = main[main.batch_size.isin(sweep.batch_size) & main.target_ratio.isna()]
    df = pd.concat([sweep, main[(main.method == "comera") & (main.variant == "default")]])
    dense = main[(main.method == "dense") & (main.status == "ok")]
    fig, (ax,) = _figure(1)
    slower = []
    for batch, group in df.groupby("batch_size"):
        ok = group[group.status == "ok"].sort_values("compression_layers")
        y = ok.epoch_time_s.astype(float)
        line = _with_spread(ax, ok, ok.compression_layers, y, marker="o", label=f"CoMERA, batch {int(batch)}")
        for _, r in group[group.status != "ok"].iterrows():
            _mark_failed(ax, 1.0, r.status)
        d = dense[dense.batch_size == batch]
        if len(d):
            ax.axhline(d.epoch_time_s.iloc[0], ls=":", lw=1, color=line[0].get_color(),
                       label=f"uncompressed, batch {int(batch)}")
            for point in ok.itertuples():
                r = pair_ratio(ok[ok.run_id == point.run_id], d)  # point / uncompressed, the one statistic
                raw = point.epoch_time_s / d.epoch_time_s.iloc[0]  # its value where a timing was not stable
                if (r.value if r is not None else raw) > 1:
                    what = f"{_point_name(res, point.run_id)}, batch {int(batch)}"
                    said = f"{r.text()} the time" if r is not None else (f"{raw:.2f}x the time (timing not "
                                                                          "stable: in no verdict)")
                    slower.append(f"{what} ({point.compression_layers:.2f}x compression): {said}")
                    ax.annotate(f"{what}: {(r.value if r is not None else raw):.2f}x the uncompressed time"
                                + ("" if r is not None else " (not stable)"), (point.compression_layers,
                                point.epoch_time_s), xytext=(10, 8 + 11 * (len(slower) - 1)),
                                textcoords="offset points", fontsize=7, color="darkred", va="bottom",
                                arrowprops={"arrowstyle": "-", "color": "darkred", "lw": 0.8})
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel("compression of the tensorized layers (dense / TT parameters)")
    ax.set_ylabel("time per epoch (s)")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * (1.1 + 0.06 * len(slower)))  # room for the notes above
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    note = ("" if not slower else "Slower than uncompressed at " + "; ".join(slower) + ". ")
    _finish(fig, title, f"{device_text(res, df)}. {note}{PAPER}: a speedup whenever the compression ratio is "
            "above 1 (review discussion, C10).", out, name,
            f"Points: the rank sweep and the default CoMERA cell. {model_line(res, df)}. "
            f"{res.settings_line(df.workload.iloc[0])}. "
            + ("Near 1x compression the TT cores hold about as many scalars as the dense weights, and a "
               "chain of contractions costs more than one dense product. " if slower else "") + SPREAD_NOTE)


def fig5_ttm_lookup(res: Results, out: Path) -> None:
    name, title = "fig5_ttm_lookup", "Fig 5: embedding lookup time and memory"
    mb = res.microbench
    mb = mb[(mb.op == "embedding") & (mb.direction == "fwd_bwd")]
    if not len(mb):
        return _empty(out, name, title, "embedding microbenchmarks (config microbench.specs)",
                      res.settings_line())
    fig, (ax_t, ax_m) = _figure(2, width=6.0)  # the legend beside the right panel
    for (shape, variant), group in mb.groupby(["shape", "variant"], sort=True):
        group = group.sort_values("tokens")
        one_table = mb["shape"].str.split(" ").str[0].nunique() == 1
        label = variant if one_table else f"{variant} {shape}"
        ax_t.errorbar(group.tokens, group.time_ms, yerr=group.time_ms_iqr.fillna(0) / 2, marker="o", capsize=3,
                      label=label)
        ax_t.plot(group.tokens[~stable(group)], group.time_ms[~stable(group)], **NOISY_RING)
        ax_m.plot(group.tokens, group.peak_mem_bytes / MB, marker="o", label=label)
    tokens = sorted(int(t) for t in mb.tokens.unique())
    for ax, ylabel in ((ax_t, "forward + backward time (ms)"), (ax_m, "peak memory (MB)")):
        ax.set_xlabel("indices per batch")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        ax.set_xticks(tokens, [str(t) for t in tokens])  # ticks at the measured points only
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3)
    ax_m.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    c6 = reference.claim("C6")["values"]
    first = mb.iloc[0]
    threads = f"{first.num_threads} thread" + ("" if first.num_threads == 1 else "s")
    _finish(fig, title, f"device {res.label} ({first.device_name}, {threads}); black-ringed: timing not "
            "stable, left out of C6. "
            f"{PAPER}: optimized TTM lookup {c6['lookup_speedup_min']:g}-{c6['lookup_speedup_max']:g}x "
            f"faster and {c6['lookup_memory_min']:g}-{c6['lookup_memory_max']:g}x less memory than the "
            "unoptimized one.", out, name, "Memory = the op's allocator peak above its inputs (CPU: profiler "
            "allocations, CUDA: max allocated); time bars: IQR over the timing rounds.")


FIGURES: dict[str, Callable[[Results, Path], None]] = {
    "fig1_time_memory": fig1_time_memory, "fig5_ttm_lookup": fig5_ttm_lookup,
    "fig6_accuracy": fig6_accuracy, "fig7_cuda_graph": fig7_cuda_graph,
    "fig8_dlrm_time_memory": fig8_dlrm_time_memory, "fig9_dlrm_nce": fig9_dlrm_nce,
    "fig10_mlm_loss": fig10_mlm_loss, "fig12_time_vs_compression": fig12_time_vs_compression,
    "fig13_rank_adaptation": fig13_rank_adaptation,
    "fig14_accuracy_vs_compression": fig14_accuracy_vs_compression,
}


def main(argv: list[str] | None = None) -> int:
    args, res = report_args("python -m harness.reports.figures", __doc__.splitlines()[0], argv, not_drawn=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        if name not in args.not_drawn:
            draw(res, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
