"""The paper's figures from one device's results (PNG + PDF, matplotlib Agg).

``python -m harness.reports.figures --results results/<device> --device-label <device> --out figures/``

Every figure is written except those named by --not-drawn (the pipeline names the figures its grid
cannot feed, harness.reports.feeds); a figure whose cells gave nothing to draw says what it would need
(never an invented point). A failed cell (oom | diverged | error | timeout) is drawn as a red cross at
the bottom of its panel, labelled with its status. The paper's stated values (harness/reference) are
drawn beside ours, labelled "paper (RTX 3090)". Every number a figure states about two cells (Fig 1 and
8's uncompressed / CoMERA time, Fig 12's) is harness.results.analysis's ratio, the one claims.md and
`comera-bench compare` show.

Why one module of ~530 lines: one function per paper figure (nine) over the shared drawing helpers
(markers per batch, spread bars, failed-cell crosses, footers), which a reader checks against each other.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.reports import reference  # noqa: E402
from harness.reports.shared import (MB, late_stage_missing, method_label, quality_order,  # noqa: E402
                                    report_args)
from harness.results.analysis import (Results, model_size, pair_ratio, settings_of, step_time_spread,  # noqa: E402
                                      stable, timing_cells)

PAPER = "paper (RTX 3090)"
FOOTER_POINTS = 8
FOOTER_CHARS_PER_INCH = 15  # characters of the 8-point footer per inch of figure width
NOISY_RING = {"marker": "o", "ls": "none", "markersize": 12, "markerfacecolor": "white",
              "markeredgecolor": "black", "markeredgewidth": 2, "zorder": 1}  # a timing not stable
SPREAD_NOTE = ("Bars: IQR of the cell's step times (scaled to the epoch); black-ringed markers: "
               "timing not stable (timing_quality, table_runs), left out of every verdict.")


def _figure(ncols: int = 2, width: float = 5.2) -> tuple[plt.Figure, list[plt.Axes]]:
    """A row of ``ncols`` panels, each ``width`` inches wide."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.2), squeeze=False)
    return fig, list(axes[0])


def _finish(fig: plt.Figure, title: str, footer: str, out: Path, name: str) -> None:
    """Title, footer (wrapped to the figure's width, the plots moved up to make room), PNG + PDF."""
    fig.suptitle(title, fontsize=11)
    lines = textwrap.wrap(footer, int(fig.get_figwidth() * FOOTER_CHARS_PER_INCH))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=FOOTER_POINTS, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.03 + len(lines) * FOOTER_POINTS * 1.45 / 72 / fig.get_figheight(), 1, 0.95))
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{name}.{ext}", dpi=130)
    plt.close(fig)


def _empty(out: Path, name: str, title: str, why: str, footer: str) -> None:
    fig, (ax,) = _figure(1)
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(f"Not measured in this grid: {why}", 60), ha="center", va="center")
    _finish(fig, title, footer, out, name)


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


def _plain_log_ticks(axis: Any) -> None:
    """A log axis labelled at 1, 2 and 5 per decade as plain numbers, its minor ticks unlabelled (the
    default labels a short range's minor ticks in exponent notation, "3x10^-1" crowding "4x10^-1")."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
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
    _finish(fig, title, time_memory_footer(res, workload, df, paper_note), out, name)


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
    """Fig 1/8's footer, two lines at most: device, what a bar and a ring mean, what a memory point is,
    the paper's values; the model, budget, epoch-time kind and notes are in the overview
    (:func:`time_memory_details`)."""
    threads = _values_text(df.num_threads)
    threads += " thread" if threads == "1" else " threads"
    ratios = speedups(df)
    measured = ("Uncompressed / CoMERA time " + ", ".join(f"{r.text()} @ batch {b}" for b, r in sorted(ratios.items()))
                + ". ") if ratios else ""
    return (f"{res.label}, {threads}. {measured}Bars: step-time IQR; ringed: not stable (in no verdict); "
            f"{memory_spread_text(df)}. {PAPER}: {paper_note} More: overview.md.")


def _values_text(series: pd.Series) -> str:
    values = sorted({str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in series.dropna()})
    return "/".join(values) or "?"


def time_memory_details(res: Results, workload: str, df: pd.DataFrame) -> str:
    """The details of Fig 1/8 that its footer leaves to the overview: model, settings, epoch-time kind,
    where CoMERA was slower and why."""
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
                 + base_rate_note(res))


def _curves(res: Results, workload: str, split: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    """The curves of a workload's timing runs without a target, labelled by method and batch, plus the
    size preset, data and sequence length where they vary (e.g. MLM on code and on text, seq 128 and 512)."""
    runs = res.main_runs(workload)
    runs = runs[runs.target_ratio.isna()]
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
    return curves.assign(label=curves.run_id.map(labels))


def _curve_figure(res: Results, out: Path, name: str, title: str, workload: str, split: str,
                  metrics: tuple[str, ...], ylabel: str, paper: tuple[float, str] | None,
                  note: str = "") -> None:
    df = _curves(res, workload, split, metrics)
    if not len(df):
        return _empty(out, name, title, f"{split} curves ({'/'.join(metrics)}) of {workload} runs",
                      res.settings_line())
    fig, (ax,) = _figure(1)
    for label, group in df.groupby("label", sort=True):
        group = group.sort_values("step")
        ax.plot(group.step, group.value, marker="." if len(group) < 30 else None, label=label)
    if paper is not None:
        ax.axhline(paper[0], color="gray", ls="--", lw=1, label=f"{PAPER}: {paper[1]}")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _finish(fig, title, " ".join(filter(None, [f"{res.settings_line(workload)}.", note])), out, name)


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


def _quality_footer(res: Results, runs: pd.DataFrame, source: str, how: str) -> str:
    batches = ", ".join(map(str, sorted(runs.batch_size.unique())))
    return f"{source}, batch {batches}; {how}; {res.settings_line('transformer', runs)}"


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
        paper = f"; the paper's ~{acc:.0%} (real MNLI) not drawn: another task"
    log = bool(losses) and min(losses) > 0 and max(losses) >= LOG_LOSS_SPAN * min(losses)
    for panel, ylabel in ((ax, "validation accuracy (fraction)"),
                          (loss_ax, "validation loss (cross-entropy" + (", log scale)" if log else ")"))):
        panel.set_xlabel("training step")
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
    _finish(fig, title, _quality_footer(res, runs, source, "validation accuracy and loss at step 0, every "
                                        "eval_every_steps, after the stage switch and at the end"
                                        + paper), out, name)


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
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    notes = ([f"not measured here: {'; '.join(missing)}"] if missing else []) + missed
    if notes:  # above the panel, where it hides no line
        left.text(0.0, 1.02, textwrap.fill("; ".join(notes), 80), fontsize=7,
                  transform=left.transAxes, color="red", va="bottom", ha="left")
    _finish(fig, title, _quality_footer(
        res, shown, source, "TT size = scalars in every core and gate (curves method/params_tt, after every "
        "step) divided by the size right after the switch's pruning (the same divisor before the switch); "
        f"{ramp_text(shown)}; accuracy as in Fig 6"), out, name)


TARGET_SLACK = 0.05
"""Fig 13 says a target was missed when the TT size ends more than this fraction above it."""


def ramp_text(runs: pd.DataFrame) -> str:
    """What shapes the left panel's fall: CoMERA's target_ramp (method params in the runs' settings)."""
    ramps = sorted({float(settings_of(r).get("method", {}).get("target_ramp") or 0.0) for r in runs.itertuples()})
    if ramps == [0.0]:
        return "the size target S0 is fixed at target x size at the switch from the switch on (target_ramp 0)"
    return ("the size target S0 falls linearly from the size at the switch to target x that size over "
            + "/".join(f"{x:.0%}" for x in ramps) + " of the late stage (method param target_ramp), then stays")


BASE_RATE_NCE = 0.98
"""DLRM runs whose last eval NCE is at least this learned (almost) nothing beyond the click base rate."""


def base_rate_note(res: Results) -> str:
    """A note when no DLRM run beat the click base rate (every last eval NCE >= BASE_RATE_NCE)."""
    runs = res.main_runs("dlrm")
    curves = res.curves[res.curves.run_id.isin(runs.run_id) & (res.curves.split == "eval")
                        & (res.curves.metric_name == "nce")]
    if not len(curves):
        return ""
    last = curves.sort_values("step").groupby("run_id").value.last()
    if last.min() < BASE_RATE_NCE:
        return ""
    steps = int(curves.step.max())
    return (f"No run learned more than the click base rate in its {steps} steps (last NCE "
            f"{last.min():.3f}-{last.max():.3f}; 1.0 = predicting the base rate): these are timing cells; their "
            "accuracy is the share of the majority class. Train longer (budget) for a learning curve.")


def fig9_dlrm_nce(res: Results, out: Path) -> None:
    _curve_figure(res, out, "fig9_dlrm_nce", "Fig 9: DLRM validation normalized cross-entropy", "dlrm",
                  "eval", ("nce",), "normalized cross-entropy (lower is better)", None, base_rate_note(res))


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
    _finish(fig, title, f"{res.settings_line('transformer')}. {SPREAD_NOTE}", out, name)


def fig12_time_vs_compression(res: Results, out: Path) -> None:
    """Epoch time against the tensorized layers' compression: the sweep's points and the default CoMERA
    cell at the same batch sizes, with the uncompressed cell as a dotted line."""
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
                if r is not None and r.value > 1:
                    slower.append(f"{point.compression_layers:.2f}x (batch {int(batch)}, {r.text()} the time)")
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio of the tensorized layers (dense / TT parameters)")
    ax.set_ylabel("time per epoch (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    note = ("" if not slower else "Slower than uncompressed at compression " + ", ".join(slower) + ": near 1x "
            "the TT cores hold about as many scalars as the dense weights, and a chain of contractions costs "
            "more than one dense product. ")
    _finish(fig, title, f"{model_line(res, df)}. {res.settings_line(df.workload.iloc[0])}. Points: the rank "
            f"sweep and the default CoMERA cell. {note}{SPREAD_NOTE} {PAPER}: a speedup whenever the compression "
            "ratio is above 1 (review discussion, C10).", out, name)


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
        label = variant if mb["shape"].nunique() == 1 else f"{variant} {shape}"
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
        _plain_log_ticks(ax.yaxis)
        ax.set_xticks(tokens, [str(t) for t in tokens])  # ticks at the measured points only
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3)
    ax_m.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    c6 = reference.claim("C6")["values"]
    first = mb.iloc[0]
    threads = f"{first.num_threads} thread" + ("" if first.num_threads == 1 else "s")
    _finish(fig, title, f"device {res.label} ({first.device_name}, {threads}); memory = "
            "the op's allocator peak above its inputs (CPU: profiler allocations, CUDA: max allocated); "
            "time bars: IQR over the timing rounds; black-ringed: timing not stable, left out of C6. "
            f"{PAPER}: optimized TTM lookup {c6['lookup_speedup_min']:g}-{c6['lookup_speedup_max']:g}x "
            f"faster and {c6['lookup_memory_min']:g}-{c6['lookup_memory_max']:g}x less memory than the "
            "unoptimized one.", out, name)


FIGURES: dict[str, Callable[[Results, Path], None]] = {
    "fig1_time_memory": fig1_time_memory, "fig5_ttm_lookup": fig5_ttm_lookup,
    "fig6_accuracy": fig6_accuracy, "fig7_cuda_graph": fig7_cuda_graph,
    "fig8_dlrm_time_memory": fig8_dlrm_time_memory, "fig9_dlrm_nce": fig9_dlrm_nce,
    "fig10_mlm_loss": fig10_mlm_loss, "fig12_time_vs_compression": fig12_time_vs_compression,
    "fig13_rank_adaptation": fig13_rank_adaptation,
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
