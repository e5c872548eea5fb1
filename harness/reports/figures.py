"""The paper's figures from one device's results (PNG + PDF, matplotlib Agg).

``python -m harness.reports.figures --results results/<device> --device-label <device> --out figures/``

Every figure is written except those named by --not-drawn (the pipeline names the figures its grid
cannot feed, harness.reports.feeds); a figure whose cells gave nothing to draw says what it would need
(never an invented point). A failed cell (oom | diverged | error | timeout) is drawn as a red cross at
the bottom of its panel, labelled with its status. The paper's stated values (harness/reference) are
drawn beside ours, labelled "paper (RTX 3090)". Every number a figure states about two cells (Fig 1 and
8's uncompressed / CoMERA time, Fig 12's) is harness.results.analysis's ratio, the one claims.md and
`comera-bench compare` show.

Drawing helpers: harness.reports.drawing; the quality cells' figures (6, 13, 14):
harness.reports.quality_figures. Under each figure a footer of at most FOOTER_LINES lines says the device
and the numbers the figure states; everything else (model, settings, how it was measured, notes) is in the
figure's notes file beside it, ``<name>.md`` (and ``.html`` for the report), which the footer names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.reports import drawing, quality_figures, reference  # noqa: E402
from harness.reports.drawing import (NOISY_RING, PAPER, SPREAD_NOTE, device_text, display_label,  # noqa: E402
                                     empty, log_if_spread, mark_failed, methods_text, model_line, panels,
                                     plain_log_ticks, steps_axis, with_spread)
from harness.reports.shared import MB, method_label, report_args  # noqa: E402
from harness.results.analysis import (QUALITY, Results, model_size, pair_ratio, purpose_of,  # noqa: E402
                                      ratio, settings_of, stable, timing_cells)
from harness.results.execution import graphed, paper_execution  # noqa: E402

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
            with_spread(ax, ok, x, y, **style)
        else:  # one point per batch size: the median of its cells (seeds), bars from their min to max
            by_batch = y.groupby(x)
            mid = by_batch.median()
            ax.errorbar(mid.index, mid.values, yerr=[mid - by_batch.min(), by_batch.max() - mid], capsize=3,
                        **style)
        for _, r in group[group.status != "ok"].iterrows():
            mark_failed(ax, r.batch_size * dodge, r.status)
    ax.set_xscale("log", base=2)
    batches = sorted(int(b) for b in df.batch_size.dropna().unique())
    ax.set_xticks(batches, [str(b) for b in batches])
    if batches:
        ax.set_xlim(batches[0] / 1.5, batches[-1] * 1.5)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("batch size (samples)")
    ax.set_ylabel(ylabel)
    log_if_spread(
        ax, df[df.status == "ok"][column].astype(float) / scale if len(df) else pd.Series(dtype=float))
    ax.grid(alpha=0.3)


def paired_times(df: pd.DataFrame) -> pd.Series:
    """The epoch time Fig 1 and Fig 8 plot for each row of ``df``, so that dividing two plotted points
    gives the ratio their footer and the claims show (harness.results.analysis.ratio, the median of the
    per-round ratios where timed together, not the quotient of two mean-based epoch times).

    Args:
        df: timing rows of one workload (batch sizes, seeds, methods).

    Returns:
        Per row: a default eager FP32 CoMERA cell without a target (the reference) its own
        ``epoch_time_s``; another row that has a ratio to the reference of its batch size and seed (both
        stable) the reference's ``epoch_time_s`` x that ratio; any other row (not stable, no reference) its
        own ``epoch_time_s``.
    """
    ref = df[(df.method == "comera") & (df.variant == "default") & df.target_ratio.isna()
             & (df.status == "ok") & paper_execution(df)]
    out = df.epoch_time_s.astype(float).copy()
    for i, row in df.iterrows():
        mine = ref[(ref.batch_size == row.batch_size) & (ref.seed == row.seed)] if pd.notna(row.seed) else \
            ref[(ref.batch_size == row.batch_size) & ref.seed.isna()]
        if row.status != "ok" or not len(mine) or i in mine.index:
            continue
        r = ratio(row, mine.iloc[0])
        if r is not None:
            out[i] = float(mine.iloc[0].epoch_time_s) * r.value
    return out


PAIRED_NOTE = ("Time points: each default CoMERA cell at its mean-based epoch time, every other cell at "
               "that time x its ratio to CoMERA (the footer's and the claims' statistic: the median of the "
               "per-round ratios where timed together), so that dividing two points gives the footer's "
               "ratio; a cell without a stable ratio to CoMERA at its own epoch time (table_runs).")


def speedups(df: pd.DataFrame) -> dict[int, Any]:
    """batch -> uncompressed / CoMERA (no target) time of the eager FP32 cells
    (harness.results.execution.paper_execution), harness.results.analysis.pair_ratio: the ratio claims C1 and
    `comera-bench compare` show for the same pair (stable cells only)."""
    ok = df[(df.status == "ok") & df.target_ratio.isna() & paper_execution(df)]
    out = {}
    for batch, cells in ok.groupby("batch_size"):
        dense, comera = (cells[cells.method == "dense"],
                         cells[(cells.method == "comera") & (cells.variant == "default")])
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
        cells = df[(df.batch_size == b) & (df.status == "ok") & df.target_ratio.isna() & paper_execution(df)]
        d, c = (cells[cells.method == "dense"].iloc[0],
                cells[(cells.method == "comera") & (cells.variant == "default")].iloc[0])
        if r.value < 1 and c.flops_per_step > 0 and d.flops_per_step > 0:
            slower.append(f"batch {b}: {d.flops_per_step / c.flops_per_step:.1f}x fewer FLOPs, "
                          f"{1 / r.value:.2f}x the time")
    if slower:
        text += ("CoMERA slower than uncompressed at " + "; ".join(slower)
                 + ": with few tokens per call the TT layers' fixed cost per call (several small products "
                 "and their autograd nodes) outweighs their FLOP saving. ")
    return text


def _time_memory(res: Results, workload: str, df: pd.DataFrame, out: Path, name: str, title: str,
                 paper_note: str) -> None:
    fig, (ax_t, ax_m) = panels(2)
    _per_batch(ax_t, df.assign(plotted_time_s=paired_times(df)), "plotted_time_s", 1.0, "time per epoch (s)",
               spread=True)
    _per_batch(ax_m, df, "peak_mem_bytes", MB, "peak memory (MB)")
    ax_t.legend(fontsize=7)
    drawing.finish(fig, title, time_memory_footer(res, workload, df, paper_note), out, name,
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
    measured = ("Uncompressed / CoMERA time "
                + ", ".join(f"{r.text()} @ batch {b}" for b, r in sorted(ratios.items()))
                + ". ") if ratios else ""
    return (f"{device_text(res, df)}. {measured}Bars: step-time IQR; ringed: not stable (in no verdict); "
            f"{memory_spread_text(df)}. {PAPER}: {paper_note}")




def time_memory_details(res: Results, workload: str, df: pd.DataFrame) -> str:
    """The notes of Fig 1/8 beyond its footer (:func:`drawing.notes`): model, settings, methods, how the
    epoch time and memory were measured, where CoMERA was slower and why."""
    kinds = "/".join(sorted(df.epoch_time_kind.dropna().unique()))
    return drawing.notes(
        model=model_line(res, df), settings=res.settings_line(workload), methods=methods_text(df),
        measured=f"epoch time {kinds} (mean step time x steps per epoch when extrapolated); "
                 f"{memory_spread_text(df)}. {PAIRED_NOTE} {speedup_note(df)}{SPREAD_NOTE}")


def fig1_time_memory(res: Results, out: Path) -> None:
    name, title = "fig1_time_memory", "Fig 1: transformer training time and memory per batch size"
    df = res.main_runs("transformer")
    df = df[df.target_ratio.isna()]
    if not len(df):
        return empty(out, name, title, "transformer runs without a target", res.settings_line())
    c2 = reference.claim("C2")["values"]
    _time_memory(res, "transformer", df, out, name, title,
                 f"at batch 1 CoMERA {c2['speedup_vs_galore']:g}x faster and {c2['memory_vs_galore']:g}x "
                 "less memory than GaLore (abstract).")


def fig8_dlrm_time_memory(res: Results, out: Path) -> None:
    name, title = "fig8_dlrm_time_memory", "Fig 8: DLRM training time and memory per batch size"
    df = res.main_runs("dlrm")
    if not len(df):
        return empty(out, name, title, "DLRM runs", res.settings_line())
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
        return empty(out, name, title, f"{split} curves ({'/'.join(metrics)}) of {workload} runs ({source})",
                      res.settings_line())
    fig, (ax,) = panels(1)
    banded, windows = False, set()
    for i, (label, group) in enumerate(df.groupby("label", sort=True)):
        seeds = sorted(int(seed) for seed in group.seed.dropna().unique())
        by_seed = group.groupby(["step", "seed"], dropna=False).value.mean().unstack()
        mean = by_seed.mean(axis=1)
        window = smoothing_window(len(mean))
        if window > 1:  # each step faint behind the rolling mean
            ax.plot(mean.index, mean.values, color=f"C{i}", alpha=0.25, lw=0.6)
            windows.add(window)
        by_seed = by_seed.rolling(window, center=True, min_periods=1).mean()
        if len(seeds) > 1:
            label += f", mean of seeds {', '.join(map(str, seeds))}"
            ax.fill_between(by_seed.index, by_seed.min(axis=1).values, by_seed.max(axis=1).values,
                            color=f"C{i}", alpha=0.2, lw=0)
            banded = True
        mean = by_seed.mean(axis=1)
        ax.plot(mean.index, mean.values, marker="." if len(mean) < 30 else None, color=f"C{i}", label=label)
    if paper is not None:
        ax.axhline(paper[0], color="gray", ls="--", lw=1, label=f"{PAPER}: {paper[1]}")
    if level is not None:
        ax.axhline(level[0], color="black", ls=":", lw=1, label=level[1])
    steps_axis(ax)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    failed = [f"{r.run_id} ({r.status})" for r in runs.itertuples() if r.status != "ok"]
    smoothed = (f"; {'/'.join(map(str, sorted(windows)))}-step rolling means (each step faint)" if windows
                else "")
    footer = [f"{device_text(res, runs)}; {source}{smoothed}"
              + ("; shaded: the range over the seeds." if banded else "."),
              f"Failed: {', '.join(failed)}." if failed else "", note(df, source) if note else ""]
    drawing.finish(fig, title, " ".join(filter(None, footer)), out, name, drawing.notes(
        model=model_line(res, runs), settings=res.settings_line(workload, runs), methods=methods_text(runs),
        measured=f"{ylabel}: the {split} curves ({'/'.join(metrics)}) the runs recorded, one line per method "
                 "configuration (the mean of its seeds per step where it has several); a curve of more than "
                 f"{SMOOTH_ABOVE} steps is drawn as a centred rolling mean of each seed over "
                 f"{SMOOTH_SHARE:.0%} of its steps (the shaded range too), with the step-by-step mean faint"))


SMOOTH_ABOVE, SMOOTH_SHARE = 100, 1 / 30
"""A curve of more points than SMOOTH_ABOVE (per-step training losses) is drawn as a centred rolling mean
over SMOOTH_SHARE of its points (:func:`smoothing_window`)."""


def smoothing_window(points: int) -> int:
    """The rolling window of a curve of ``points`` points: 1 (none) up to :data:`SMOOTH_ABOVE` points,
    then ``SMOOTH_SHARE`` of them, at least 5."""
    return max(5, round(points * SMOOTH_SHARE)) if points > SMOOTH_ABOVE else 1


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
    """The MLM runs' training loss over training; the paper's final loss (CodeBERT-large, another model
    and vocabulary) is stated in the footer, not drawn on this model's axis."""
    c8 = reference.claim("C8")["values"]

    def paper(df: pd.DataFrame, source: str) -> str:
        return (f"{PAPER}: CoMERA's final loss {c8['loss_comera']:g} on CodeBERT-large (another model and "
                "vocabulary: not comparable with these losses, not drawn).")

    _curve_figure(res, out, "fig10_mlm_loss", "Fig 10: MLM pretraining loss", "mlm", "train",
                  ("loss", "train_loss", "mlm_loss"), "training loss (cross-entropy, nats)", None, paper)


def fig7_cuda_graph(res: Results, out: Path) -> None:
    name, title = "fig7_cuda_graph", "Fig 7: epoch time with and without CUDA graph"
    df = timing_cells(res.runs[res.runs.workload == "transformer"])
    df = df[~df.run_id.isin(list(res.sweeps)) & df.target_ratio.isna()]
    if not graphed(df).any():
        return empty(out, name, title, "cells with execution.cuda_graph true (needs CUDA; set "
                      "execution.cuda_graph: [false, true])", res.settings_line())
    fig, (ax,) = panels(1)  # the labels tell graphed from eager (shared.method_label)
    _per_batch(ax, df, "epoch_time_s", 1.0, "time per epoch (s)", spread=True)
    ax.legend(fontsize=7)
    drawing.finish(fig, title,
                   f"{device_text(res, df)}. Bars: step-time IQR; ringed: not stable (in no verdict).",
            out, name, drawing.notes(model=model_line(res, df), settings=res.settings_line("transformer"),
                                     methods=methods_text(df), measured="epoch time = mean step time x steps "
                                     f"per epoch, with and without CUDA graph capture. {SPREAD_NOTE}"))


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
        return empty(out, name, title, "a CoMERA sweep (methods.<name>.sweep, e.g. rank)",
                      res.settings_line())
    main = res.main_runs(sweep.workload.iloc[0])
    main = main[main.batch_size.isin(sweep.batch_size) & main.target_ratio.isna()]
    df = pd.concat([sweep, main[(main.method == "comera") & (main.variant == "default")
                                & paper_execution(main)]])
    dense = main[(main.method == "dense") & (main.status == "ok")]
    fig, (ax,) = panels(1)
    slower = []
    for batch, group in df.groupby("batch_size"):
        ok = group[group.status == "ok"].sort_values("compression_layers")
        d = dense[dense.batch_size == batch]
        found = {p.run_id: pair_ratio(ok[ok.run_id == p.run_id], d) if len(d) else None
                 for p in ok.itertuples()}  # point / uncompressed, the one statistic
        y = pd.Series([float(d.epoch_time_s.iloc[0]) * found[p.run_id].value if found[p.run_id] is not None
                       else float(p.epoch_time_s) for p in ok.itertuples()], index=ok.index)
        line = with_spread(ax, ok, ok.compression_layers, y, marker="o", label=f"CoMERA, batch {int(batch)}")
        for _, r in group[group.status != "ok"].iterrows():
            mark_failed(ax, 1.0, r.status)
        if len(d):
            ax.axhline(d.epoch_time_s.iloc[0], ls=":", lw=1, color=line[0].get_color(),
                       label=f"uncompressed, batch {int(batch)}")
            for point in ok.itertuples():
                r = found[point.run_id]
                raw = point.epoch_time_s / d.epoch_time_s.iloc[0]  # its value where a timing was not stable
                if (r.value if r is not None else raw) > 1:
                    what = f"{_point_name(res, point.run_id)}, batch {int(batch)}"
                    said = f"{r.text()} the time" if r is not None else (f"{raw:.2f}x the time (timing not "
                                                                          "stable: in no verdict)")
                    slower.append(f"{what} ({point.compression_layers:.2f}x compression): {said}")
                    rightmost = point.compression_layers >= ok.compression_layers.max()  # text to its left
                    note = ax.annotate(
                        f"{what}: {(r.value if r is not None else raw):.2f}x uncompressed"
                        + ("" if r is not None else " (not stable)"),
                        (point.compression_layers, y[point.Index]),
                        xytext=(-10 if rightmost else 10, 8 + 11 * (len(slower) - 1)),
                        textcoords="offset points",
                        fontsize=7, color="darkred", va="bottom", ha="right" if rightmost else "left",
                        arrowprops={"arrowstyle": "-", "color": "darkred", "lw": 0.8})
                    note.set_in_layout(False)  # a note never squeezes the axes
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    drawing.tick_near(ax.xaxis, float(df[df.status == "ok"].compression_layers.min()))
    ax.set_xlabel("compression of the tensorized layers (dense / TT parameters)")
    ax.set_ylabel("time per epoch (s)")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * (1.1 + 0.06 * len(slower)))  # room for the notes above
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    note = ("" if not slower else "Slower than uncompressed at " + "; ".join(slower) + ". ")
    drawing.finish(fig, title,
                   f"{device_text(res, df)}. {note}{PAPER}: a speedup whenever the compression ratio is "
            "above 1 (review discussion, C10).", out, name,
            drawing.notes(
                model=model_line(res, df), settings=res.settings_line(df.workload.iloc[0]),
                methods="CoMERA: the rank sweep's points and the default CoMERA cell; the uncompressed cell "
                        "at the same batch (dotted)",
                measured="epoch time = mean step time x steps per epoch against the tensorized layers' "
                         "compression (dense / TT parameters). Points: the rank sweep and the default "
                         "CoMERA cell, each at the uncompressed cell's epoch time (the dotted line) x its "
                         "ratio to it (the footer's and the claims' statistic: the median of the per-round "
                         "ratios where timed together), so that a point over the line is the footer's "
                         "ratio; a point without a stable ratio at its own epoch time. "
                         + ("Near 1x compression the TT cores hold about as many scalars as the dense "
                            "weights, and a chain of contractions costs more than one dense product. "
                            if slower else "") + SPREAD_NOTE))


EMBEDDING_VARIANTS = {
    "dense_grad": "nn.Embedding with a dense gradient",
    "sparse_grad": "nn.Embedding with a sparse gradient",
    "ttm_naive": "TTM, neither level: each index's chain of core slices",
    "ttm_order": "TTM, tensor-index level only: rows from two half tables",
    "ttm_unique": "TTM, unique-rows level only: each distinct index computed once",
    "ttm_optimized": "TTM, both levels (the paper's optimized lookup)",
}
"""Fig 5's ops (its legend's names) and what each is, in its notes: harness.perf.microbench's embedding
variants; the TTM levels are comera.ttm.TTMEmbedding's ``tensor_index_level`` and ``unique_rows``."""


def table_text(mb: pd.DataFrame) -> str:
    """The embedding tables of Fig 5's rows: "100000x16 (TTM row modes 50x40x50, column modes 2x2x4, rank
    16)" from their ``shape`` ("rows x dim [row modes|column modes]") and ``rank``."""
    tables: dict[str, list[str]] = {}
    for shape, group in mb.groupby("shape", sort=True):
        table, _, modes = str(shape).partition(" ")
        found = tables.setdefault(table, [])
        if modes:
            rows, _, cols = modes.strip("[]").partition("|")
            ranks = "/".join(str(int(r)) for r in sorted(group["rank"].dropna().unique()))
            found.append(f"TTM row modes {rows.replace(',', 'x')}, column modes {cols.replace(',', 'x')}"
                         + (f", rank {ranks}" if ranks else ""))
    return "; ".join(table + (f" ({'; '.join(modes)})" if modes else "") for table, modes in tables.items())


def fig5_ttm_lookup(res: Results, out: Path) -> None:
    """Forward + backward time and peak memory of an embedding lookup against the indices per batch, one
    line per op (:data:`EMBEDDING_VARIANTS`, the legend says what each is) and table."""
    name, title = "fig5_ttm_lookup", "Fig 5: embedding lookup time and memory"
    mb = res.microbench
    mb = mb[(mb.op == "embedding") & (mb.direction == "fwd_bwd")]
    if not len(mb):
        return empty(out, name, title, "embedding microbenchmarks (config microbench.specs)",
                      res.settings_line())
    fig, (ax_t, ax_m) = panels(2, width=6.0)  # the legend beside the right panel
    for i, ((shape, variant), group) in enumerate(mb.groupby(["shape", "variant"], sort=True)):
        group = group.sort_values("tokens")
        one_table = mb["shape"].str.split(" ").str[0].nunique() == 1
        label = variant if one_table else f"{variant} {shape}"  # what each is: the notes
        color = f"C{i % 10}"  # one colour per variant in both panels (the rings take none)
        ax_t.errorbar(group.tokens, group.time_ms, yerr=group.time_ms_iqr.fillna(0) / 2, marker="o",
                      capsize=3, label=label, color=color)
        ax_t.plot(group.tokens[~stable(group)], group.time_ms[~stable(group)], **NOISY_RING)
        ax_m.plot(group.tokens, group.peak_mem_bytes / MB, marker="o", label=label, color=color)
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
    tables = table_text(mb)
    drawing.finish(fig, title,
                   f"device {res.label} ({first.device_name}, {threads}); table {tables}; black-ringed: "
            "timing not stable, left out of C6. "
            f"{PAPER}: optimized TTM lookup {c6['lookup_speedup_min']:g}-{c6['lookup_speedup_max']:g}x "
            f"faster and {c6['lookup_memory_min']:g}-{c6['lookup_memory_max']:g}x less memory than the "
            "unoptimized one.", out, name, drawing.notes(
                model=f"one embedding table, {tables} (rows x embedding dimension; the TTM table's row and "
                      "column modes and rank)",
                settings=f"device {res.label} ({first.device_name}, {first.device}, {threads}), torch "
                         f"{first.torch_version}; indices per batch {', '.join(map(str, tokens))}, with "
                         "Zipf-like row frequencies (the config's microbench specs, zipf_exponent)",
                methods="; ".join(f"{v}: {EMBEDDING_VARIANTS.get(v, v)}" for v in sorted(
                    set(mb.variant), key=lambda v: (list(EMBEDDING_VARIANTS) + [v]).index(v)))
                        + " (TTM levels: comera.ttm.TTMEmbedding's tensor_index_level, two half tables "
                          "instead of each index's chain, and unique_rows, each distinct index once)",
                measured="forward + backward time of one lookup and its gradient, median over the timing "
                         "rounds, bars their IQR; memory = the op's allocator peak above its inputs (CPU: "
                         "profiler allocations, CUDA: max allocated)"))


FIGURES: dict[str, Callable[[Results, Path], None]] = {
    "fig1_time_memory": fig1_time_memory, "fig5_ttm_lookup": fig5_ttm_lookup,
    "fig6_accuracy": quality_figures.fig6_accuracy, "fig7_cuda_graph": fig7_cuda_graph,
    "fig8_dlrm_time_memory": fig8_dlrm_time_memory, "fig9_dlrm_nce": fig9_dlrm_nce,
    "fig10_mlm_loss": fig10_mlm_loss, "fig12_time_vs_compression": fig12_time_vs_compression,
    "fig13_rank_adaptation": quality_figures.fig13_rank_adaptation,
    "fig14_accuracy_vs_compression": quality_figures.fig14_accuracy_vs_compression,
}


def main(argv: list[str] | None = None) -> int:
    args, res = report_args("python -m harness.reports.figures", __doc__.splitlines()[0], argv,
                            not_drawn=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        if name not in args.not_drawn:
            draw(res, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
