"""The figures of the transformer's quality cells: Fig 6 (accuracy and loss over training), Fig 13 (rank
adaptation, not in the paper) and Fig 14 (accuracy against compression, not in the paper).
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

from harness.reports import drawing, reference  # noqa: E402
from harness.reports.drawing import (PAPER, device_text, display_label, empty, mark_failed,  # noqa: E402
                                     methods_text, model_line, panels, plain_log_ticks, steps_axis,
                                     values_text)
from harness.reports.shared import (configuration, late_stage_missing, method_label, quality_order,  # noqa: E402
                                    size_matched, target_missed, target_reached, target_shortfall)
from harness.results.analysis import Results, settings_of  # noqa: E402


def quality_runs(res: Results) -> tuple[pd.DataFrame, dict[str, str], str]:
    """(the transformer's quality cells in table order, run_id -> line label, source); the label names
    the batch size and seed when they vary (timing cells) and a CoMERA target without a late stage."""
    runs, source = res.quality_runs("transformer")
    runs = quality_order(runs)
    vary = [(key, col) for key, col in (("batch", "batch_size"), ("seed", "seed")) if runs[col].nunique() > 1]
    labels = {}
    for r in runs.itertuples():
        why = late_stage_missing(r) if r.status == "ok" else ""
        mark = f" [{why}]" if why else " [target not reached]" if target_missed(r) else ""
        named = [method_label(r)] + [f"{key} {getattr(r, col)}" for key, col in vary]
        labels[r.run_id] = ", ".join(named) + mark
    return runs, labels, source


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def distinct(i: int, seed: int | None = None) -> dict[str, Any]:
    """The ``i``-th line's style: its colour and marker (one per method configuration ``i``), its dash
    pattern (the ``seed``-th seed's, or the ``i``-th without), and earlier lines wider, so that lines
    which coincide stay visible (a dashed line over a wider solid one)."""
    dash = i if seed is None else seed
    return {"color": f"C{i % 10}", "ls": LINE_STYLES[dash % len(LINE_STYLES)],
            "marker": MARKERS[i % len(MARKERS)], "lw": max(3.5 - 0.5 * i, 1.0),
            "markersize": max(7.0 - 0.8 * i, 3.0)}


def line_styles(runs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """run_id -> its line's style (:func:`distinct`): one colour per method configuration (the method
    label and batch size), the seed as the dash pattern (the i-th seed of the runs, the same in every
    configuration)."""
    configs = list(dict.fromkeys((method_label(r), r.batch_size) for r in runs.itertuples()))
    seeds = sorted(runs.seed.dropna().unique())
    return {r.run_id: distinct(configs.index((method_label(r), r.batch_size)),
                               seeds.index(r.seed) if pd.notna(r.seed) else 0)
            for r in runs.itertuples()}


def seeds_text(runs: pd.DataFrame) -> str:
    """Which dash pattern is which seed ("line style: seed 0 solid, seed 1 dashed"), "" for one seed."""
    seeds = sorted(int(s) for s in runs.seed.dropna().unique())
    names = {"-": "solid", "--": "dashed", "-.": "dash-dot", ":": "dotted"}
    if len(seeds) < 2:
        return ""
    return "line style: " + ", ".join(f"seed {s} {names[LINE_STYLES[i % len(LINE_STYLES)]]}"
                                      for i, s in enumerate(seeds))


def on_mnli(runs: pd.DataFrame) -> bool:
    """Whether every run trained on real MNLI (data ``mnli`` in its settings): only then are its
    accuracies comparable with the paper's."""
    data = {settings_of(r).get("workload_info", {}).get("data") for r in runs.itertuples()}
    return data == {"mnli"}


def quality_footer(res: Results, runs: pd.DataFrame, source: str) -> str:
    """Device, the cells drawn (their source, batch sizes and seeds)."""
    batches = ", ".join(map(str, sorted(runs.batch_size.unique())))
    seeds = values_text(runs.seed)
    plural = "s" if "/" in seeds else ""
    return f"{device_text(res, runs)}. From the {source}, batch {batches}, seed{plural} {seeds}."


SWITCH_LABEL = "stage switch"
"""The legend label of :func:`switch_line`'s lines, followed by whose switch it is."""


def switch_line(ax: plt.Axes, res: Results, runs: pd.DataFrame) -> None:
    """A gray vertical line at each step where runs switched stage (early -> late), in the dash pattern of
    their seed (:func:`line_styles`), labelled with whose switch it is: "stage switch, seed 0" (every CoMERA
    target of seed 0: they share the early stage), "stage switch, target 0.2, seed 0" where the targets
    switched at different steps."""
    styles = line_styles(runs)
    at: dict[int, list[Any]] = {}
    for r in runs.itertuples():
        if info := res.switch(r):
            at.setdefault(int(info["step"]), []).append(r)
    every = {r.target_ratio for runs_at in at.values() for r in runs_at}
    for step, switched in sorted(at.items()):
        targets = {r.target_ratio for r in switched}
        seeds = "/".join(str(int(s)) for s in sorted({r.seed for r in switched if pd.notna(r.seed)}))
        whose = ([] if targets == every else  # the targets share the early stage: the seed says whose
                 [f"target{'s' if len(targets) > 1 else ''} "
                  + "/".join(f"{t:g}" for t in sorted(targets, reverse=True))])
        whose += [f"seed {seeds}"] if seeds else []
        ax.axvline(step, color="gray", ls=styles[switched[0].run_id]["ls"], lw=1,
                   label=SWITCH_LABEL + (f", {', '.join(whose)}" if whose else ""))


LOG_LOSS_SPAN = 10.0
"""Fig 6 draws the validation loss on a log scale where its values span at least this factor."""


SEED_LABEL = re.compile(r"^(?P<base>.*), seed (?P<seed>\d+)(?: \[(?P<mark>[^\]]*)\])?$")
"""A line's label as quality_runs writes it: "<method> (target t), seed s", then "[<why>]" where its
target was missed or it failed."""


def method_legend(ax: plt.Axes, runs: pd.DataFrame) -> tuple[list[Any], list[str]]:
    """(handles, labels) of ``ax``'s legend: one entry per method configuration and target (its colour;
    the seeds' entries merged, their marks kept as "[target not reached: seeds 0, 1]"), each stage-switch
    line as drawn (whose switch it is), then one entry per seed's line style (:func:`line_styles`)."""
    entries: dict[str, tuple[Any, dict[str, list[str]]]] = {}
    for handle, label in zip(*ax.get_legend_handles_labels()):
        match = None if label.startswith(SWITCH_LABEL) else SEED_LABEL.match(label)
        marks = entries.setdefault(match["base"] if match else label, (handle, {}))[1]
        if match and match["mark"]:
            marks.setdefault(match["mark"], []).append(match["seed"])
    handles = [handle for handle, _ in entries.values()]
    labels = [base + "".join(f" [{mark}: seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}]"
                             for mark, seeds in marks.items()) for base, (_, marks) in entries.items()]
    seeds = sorted(int(seed) for seed in runs.seed.dropna().unique())
    for i, seed in enumerate(seeds if len(seeds) > 1 else []):
        handles.append(matplotlib.lines.Line2D([], [], color="gray", ls=LINE_STYLES[i % len(LINE_STYLES)]))
        labels.append(f"seed {seed}")
    return handles, labels


def fig6_accuracy(res: Results, out: Path) -> None:
    """Validation accuracy (left) and loss (right, on a log scale where it spans LOG_LOSS_SPAN or more: it
    still separates models whose accuracies have saturated) over training, one line per quality cell
    (CoMERA: one per target; they share the early stage, so the lines part at the stage switch); failed
    cells as red crosses."""
    name, title = "fig6_accuracy", "Fig 6: transformer validation accuracy and loss over training"
    runs, labels, source = quality_runs(res)
    curves = {r: res.series(r, "eval", "accuracy") for r in runs.run_id}
    if not any(len(c) for c in curves.values()):
        return empty(out, name, title, f"eval accuracy curves of transformer runs ({source})",
                      res.settings_line())
    fig, (ax, loss_ax) = panels(2, width=6.6)  # room beside the legend: a line per method and target
    losses = []
    styles = line_styles(runs)
    for r in runs.itertuples():
        c, loss = curves[r.run_id], res.series(r.run_id, "eval", "loss")
        if len(c):
            ax.plot(c.step, c.value, label=labels[r.run_id], **styles[r.run_id])
        if len(loss):
            loss_ax.plot(loss.step, loss.value, label=labels[r.run_id], **styles[r.run_id])
            losses += list(loss.value)
        if r.status != "ok":
            mark_failed(ax, c.step.max() if len(c) else 0, f"{labels[r.run_id]}: {r.status}")
    switch_line(ax, res, runs)
    switch_line(loss_ax, res, runs)
    acc = reference.claim("C4")["values"]["accuracy_comera"]
    if on_mnli(runs):
        ax.axhline(acc, color="gray", ls="--", lw=1, label=f"{PAPER}: final MNLI accuracy ~{acc:.0%}")
        paper = ""
    else:
        paper = f"The paper's ~{acc:.0%} (real MNLI) not drawn: another task."
    log = bool(losses) and min(losses) > 0 and max(losses) >= LOG_LOSS_SPAN * min(losses)
    for panel, ylabel in ((ax, "validation accuracy (fraction)"),
                          (loss_ax, "validation loss (cross-entropy" + (", log scale)" if log else ")"))):
        steps_axis(panel)
        panel.set_ylabel(ylabel)
        panel.grid(alpha=0.3)
    if log:
        loss_ax.set_yscale("log")
    if losses:
        loss_ax.legend(*method_legend(loss_ax, runs), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        loss_ax.text(0.5, 0.5, "no validation loss recorded by these runs", ha="center", va="center",
                     transform=loss_ax.transAxes, fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    drawing.finish(fig, title, " ".join(filter(None, [quality_footer(res, runs, source), paper])), out, name,
                   drawing.notes(
                       model=model_line(res, runs), settings=res.settings_line("transformer", runs),
                       methods=f"{methods_text(runs)}; one colour per method configuration"
                               + (f", {seeds_text(runs)}" if seeds_text(runs) else ""),
                       measured="validation accuracy and loss (cross-entropy) on the held-out samples at "
                                "step 0, every eval_every_steps, after the stage switch and at the end"))


def fig13_rank_adaptation(res: Results, out: Path) -> None:
    """Not in the paper: for each CoMERA target (0.8, 0.5, 0.2), the TT size relative to the size at the
    stage switch and the validation accuracy along training; targets without a late stage are named."""
    name, title = ("fig13_rank_adaptation",
                   "CoMERA's rank adaptation along training (TT size, accuracy per target)")
    runs, labels, source = quality_runs(res)
    runs = runs[(runs.method == "comera") & runs.target_ratio.notna()]
    why = pd.Series([late_stage_missing(r) for r in runs.itertuples()], index=runs.index, dtype=str)
    missing = [f"target {t:g}: {w}" for t, w in zip(runs.target_ratio, why) if w]
    shown, missed = runs[why == ""], []
    if not len(shown):
        return empty(out, name, title, "CoMERA runs with a target whose late stage ran ("
                      + ("; ".join(missing) or f"none among the {source}") + ")", res.settings_line())
    fig, (left, right) = panels(2, width=6.6)  # room beside the legend, which hides no line
    styles = line_styles(shown)
    for r in shown.itertuples():
        size, acc = res.series(r.run_id, "method", "params_tt"), res.series(r.run_id, "eval", "accuracy")
        ratio = size.value / res.switch(r)["size"]
        style = {**styles[r.run_id], "marker": None}
        left.plot(size.step, ratio, label=labels[r.run_id], **style)
        left.axhline(r.target_ratio, color=style["color"], ls="--", lw=0.8)
        if target_missed(r):
            seed = "" if pd.isna(r.seed) else f" (seed {int(r.seed)})"
            end = f" ends at {ratio.iloc[-1]:.2f}x" if len(ratio) else ""
            missed.append(f"{configuration('comera', r.variant)} target {r.target_ratio:g}{seed}{end}")
        right.plot(acc.step, acc.value, label=labels[r.run_id], **styles[r.run_id])
    for ax, ylabel in ((left, "TT size / size at the switch"),
                       (right, "validation accuracy (fraction)")):
        switch_line(ax, res, shown)
        steps_axis(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles, names = method_legend(right, shown)
    right.legend([*handles, matplotlib.lines.Line2D([], [], color="gray", ls="--", lw=0.8)],
                 [*names, "target (dashed, the line's colour)"], fontsize=7, loc="upper left",
                 bbox_to_anchor=(1.01, 1))
    notes = ([f"not measured here: {'; '.join(missing)}"] if missing else []) + (
        [f"targets not reached: {', '.join(missed)}"] if missed else [])
    why_short = "; ".join(f"{labels[r.run_id]}: {w}" for r in shown.itertuples()
                          if (w := target_shortfall(r)))
    if notes:  # above the panel, where it hides no line
        left.text(0.0, 1.02, textwrap.fill("; ".join(notes), 80), fontsize=7,
                  transform=left.transAxes, color="red", va="bottom", ha="left", **drawing.LITERAL)
    drawing.finish(fig, title, quality_footer(res, shown, source), out, name, drawing.notes(
        model=model_line(res, shown), settings=res.settings_line("transformer", shown),
        methods=f"CoMERA with a size target, one line per target and seed ({methods_text(shown)}); "
                + ramp_text(shown),
        measured="TT size = scalars in every core and gate (curves method/params_tt, after every step) "
                 "divided by the size right after the switch's pruning (the same divisor before the switch); "
                 "a target is reached when the run's target_reached says so (the TT size ends at most 5% "
                 "above it, or within one rank's saving: comera.rank's rule); accuracy as in Fig 6",
        more=("No counterpart in the paper: its Fig 13 is another figure; the file keeps the pipeline's "
              "name. " + (f"{why_short}." if why_short else ""))))


def ramp_text(runs: pd.DataFrame) -> str:
    """What shapes the left panel's fall: CoMERA's target_ramp (method params in the runs' settings)."""
    ramps = sorted({float(settings_of(r).get("method", {}).get("target_ramp") or 0.0)
                    for r in runs.itertuples()})
    if ramps == [0.0]:
        return "the size target S0 is fixed at target x size at the switch from the switch on (target_ramp 0)"
    return ("the size target S0 falls linearly from the size at the switch to target x that size over "
            + "/".join(f"{x:.0%}" for x in ramps)
            + " of the late stage (method param target_ramp), then stays")


VARIANT_LINES = {"reach": "--", "paper": "-.", "default": (0, (1, 1.5))}
"""Fig 14's line through one CoMERA variant's targets (black), by variant; another variant: dashed."""


def gaps_text(points: pd.DataFrame, reference_acc: float, name: str) -> str:
    """One CoMERA variant's mean accuracy minus the uncompressed model's at each of its targets, from the
    least compression: ``points`` has columns ``accuracy`` and ``compression``; e.g. "comera-reach -0.002 /
    -0.050 at 9.9x / 18.5x" ("" without points)."""
    points = points.sort_values("compression")
    if not len(points):
        return ""
    gaps = " / ".join(f"{a - reference_acc:+.3f}" for a in points.accuracy)
    return f"{name} {gaps} at " + " / ".join(f"{c:.1f}x" for c in points.compression)


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
    """Not in the paper: the final validation accuracy of every transformer quality cell against its
    measured whole-model compression (the uncompressed model's parameters / the trained model's), one small
    marker per seed and a large one for the mean of a method configuration; a CoMERA target not reached
    hollow (each seed that missed it; the mean where any did); each CoMERA variant's targets joined by a
    black line of its own pattern (:data:`VARIANT_LINES`), the
    uncompressed model's mean as a horizontal line (its seeds' range shaded); each size-matched model (dense,
    fixed-rank TT) joined by a dotted line to the CoMERA point whose reached size it matches; the footer
    gives each CoMERA variant's accuracy gap to it per target (:func:`gaps_text`) and compares the matched
    models at equal size."""
    name, title = "fig14_accuracy_vs_compression", "Accuracy vs compression (not a figure of the paper)"
    runs, source = res.quality_runs("transformer")
    runs = quality_order(runs)
    ok = runs[(runs.status == "ok") & (runs.metric_name == "accuracy") & runs.metric_value.notna()
              & runs.compression_total.notna()]
    if not len(ok):
        return empty(out, name, title, f"transformer cells with a final accuracy ({source})",
                      res.settings_line())
    fig, (ax,) = panels(1, width=12.0, height=5.4)  # room beside the legend, which hides no point
    labels = ok.apply(display_label, axis=1)
    reached = pd.Series([target_reached(r) for r in ok.itertuples()], index=ok.index, dtype=object)
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
    comera, groups, means = [], list(ok.groupby(labels, sort=False)), {}
    dodge = dodged([g.compression_total.mean() for _, g in groups])
    for i, (label, group) in enumerate(groups):
        style = {"color": f"C{i}", "marker": MARKERS[i % len(MARKERS)]}
        x, mean = group.compression_total.mean(), group.metric_value.mean()
        missed = reached[group.index] == False  # noqa: E712 -- None (no target) is neither
        for hollow in (False, True):
            seeds = group[missed == hollow]
            ax.plot(seeds.compression_total * dodge[i], seeds.metric_value, ls="none", ms=5, alpha=0.6,
                    **style, **({"mfc": "none"} if hollow else {}))
        shown = label + (f" [target not reached: {int(missed.sum())} of {len(group)}]" if missed.any()
                         else "")
        ax.plot([x * dodge[i]], [mean], ls="none", ms=9, label=shown, **style,
                **({"mfc": "none", "mew": 1.5} if missed.any() else {}))
        for rid in group.run_id:
            means[rid] = (x * dodge[i], mean)
        if (group.method == "comera").all() and group.target_ratio.notna().all():
            comera.append({"compression": x, "accuracy": mean, "target": group.target_ratio.iloc[0],
                           "x": x * dodge[i], "variant": group.variant.iloc[0]})
    paired = [(means[r.run_id], means[m["run"]]) for r in ok.itertuples()
              if (m := size_matched(r)) and m.get("run") in means]
    for i, (point, matched) in enumerate(dict.fromkeys(paired)):
        ax.plot([point[0], matched[0]], [point[1], matched[1]], color="gray", ls=":", lw=0.9, zorder=0,
                label="size-matched: joined to the CoMERA point it matches" if i == 0 else None)
    gaps = []
    for variant, line in (pd.DataFrame(comera).groupby("variant", sort=False) if comera else ()):
        line = line.sort_values("compression")
        ax.plot(line.x, line.accuracy, color="black", lw=0.8, ls=VARIANT_LINES.get(variant, "--"), zorder=0,
                label=f"{configuration('comera', variant)}: its targets joined" if len(line) > 1 else None)
        if len(dense):
            gaps.append(gaps_text(line, dense.metric_value.mean(), configuration("comera", variant)))
    gaps_line = (f"Accuracy minus the uncompressed mean ({dense.metric_value.mean():.3f}), per target: "
                 + "; ".join(gaps) if gaps else "")
    for r in runs[runs.status != "ok"].itertuples():
        mark_failed(ax, r.compression_total if pd.notna(r.compression_total) else 1.0,
                     f"{method_label(r)}: {r.status}")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.set_xlabel("whole-model compression (uncompressed parameters / the model's)")
    ax.set_ylabel("final validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1))
    seeds = ok.seed.nunique()
    footer = (f"{gaps_line + '. ' if gaps_line else ''}{equal_size_text(ok)}{res.label}, {source}, {seeds} "
              f"seed{'s' if seeds != 1 else ''} (small: each seed; large: mean; hollow: target not "
              "reached). More: table_mnli_size.")
    drawing.finish(fig, title, footer, out, name, drawing.notes(
        model=model_line(res, ok), settings=res.settings_line("transformer", ok),
        methods=f"{methods_text(ok)}; the size-matched dense model (the best of its shapes x rates on "
                "held-out training data) and the fixed-rank TT model, each at the parameter count the CoMERA "
                "cell it matches reached, joined to it by a dotted line",
        measured="final validation accuracy (the last evaluation) against whole-model compression = the "
                 "uncompressed model's parameters / the trained model's (compression_total); markers at "
                 "the same compression are set side by side",
        more="No counterpart in the paper."))


def equal_size_text(ok: pd.DataFrame) -> str:
    """"At equal size: comera-reach target 0.2 (7.9x) 0.892, dense (8.2x) 0.840, fixed-rank TT (7.8x) 0.900. "
    for each CoMERA target a size-matched model matches (means over seeds; every point at its measured
    compression); "" without one."""
    texts = []
    rows = {r.run_id: r for r in ok.itertuples()}
    matched = [(m, r) for r in ok.itertuples() if (m := size_matched(r))]
    for target in dict.fromkeys(m.get("target") for m, _ in matched):
        pairs = [(m, r) for m, r in matched if m.get("target") == target]
        sources = pd.DataFrame([rows[m["run"]]._asdict() for m, _ in pairs if m["run"] in rows]
                               ).drop_duplicates("run_id") if pairs else pd.DataFrame()
        name = configuration("comera", sources.variant.iloc[0] if len(sources) else None)
        parts = ([f"{name} target {target:g} ({sources.compression_total.mean():.1f}x) "
                  f"{sources.metric_value.mean():.3f}"] if len(sources) else [])
        for name, method in (("dense", "dense"), ("fixed-rank TT", "comera")):
            cells = pd.DataFrame([r._asdict() for _, r in pairs if r.method == method])
            if len(cells):
                parts.append(f"{name} ({cells.compression_total.mean():.1f}x) "
                             f"{cells.metric_value.mean():.3f}")
        texts.append(", ".join(parts))
    return f"At equal size: {'; '.join(texts)}. " if texts else ""
