"""The same grid on several devices side by side: `comera-bench compare DIR... [--out DIR] [--names A,B]`.

Cells match by cell hash and variant; every ratio is harness.results.analysis.ratio. Writes compare.md,
compare.csv, compare_ratios.csv and compare_time_memory.png/.pdf (docs/measurement.md, "What is refused").
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import matplotlib
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.reports import reference  # noqa: E402
from harness.reports.drawing import plain_log_ticks  # noqa: E402
from harness.reports.html import cell_text, markdown_table, write_html  # noqa: E402
from harness.reports.shared import MB  # noqa: E402
from harness.results import ResultsError  # noqa: E402
from harness.results.analysis import (MEMORY, QUALITY, TIME, Results, is_stable, json_column, load,  # noqa: E402
                                      noisy_reason, pair_ratio, purpose_of, ratio, same_memory_kind,
                                      settings_of, stable_only, timing_cells)
from harness.results.execution import execution_label, graphed, paper_execution  # noqa: E402

CELL = ["cell_hash", "variant", "cuda_graph", "compile", "matmul_precision"]
"""A cell's identity across devices: its spec's cell hash, its variant and how it ran (CUDA graph, compile,
matmul precision)."""
SHOWN = ["workload", "workload_params", "method_params", "method", "batch_size", "seq_len", "rank",
         "target_ratio", "seed", "purpose", "budget"]
"""Columns that describe a cell in the table (its identity is :data:`CELL`)."""
QUANTITIES = {"epoch_time": TIME, "peak_mem": MEMORY}
CHECKED = {"num_threads": "torch threads", "torch_version": "torch version", "peak_mem_kind": "memory kind",
           "rounds": "timing rounds", "allocator": "allocator policy"}
"""Columns that should agree between two devices' runs of one cell; a difference is flagged."""
STABLE_COLUMN = "timing_stable"
"""compare.csv's ``timing_stable@<device>``: whether the cell's timing on that device was stable."""
TIMES = (TIME, "step_time_ms")
"""Time columns of an ok row that ratios divide: a finite number > 0 where the row has one (so is each of
its round means, ``round_step_mean_ms``), else the folder is refused (:func:`load_checked`)."""
QUALITY_TIME = ("quality cell: no time shown (trained for accuracy, beside other cells where --cores allows: "
                "not a timing result)")
"""The differences of a quality cell's row: its epoch time is left out of the table, its bars and ratios."""
DEVICE_SPREAD = ("bars: each device's round-mean quartiles over its median, combined the widest way\n"
                 "(low: Q1 of the later device against Q3 of the first)")
"""What the spread of a time ratio between two devices is (harness.results.analysis.apart_ratio)."""


def load_checked(folder: str | Path, label: str | None = None) -> Results:
    """:func:`harness.results.analysis.load` of ``folder``, refused (ResultsError naming its runs file, the
    cell and the column) when an ok row's time (:data:`TIMES`, or one of its round means) is not a finite
    number > 0: a ratio of it would be negative or infinite (a table edited, or written by another tool)."""
    res = load(folder, label)
    path = Path(folder) / "runs.parquet"
    for row in res.runs[res.runs.status == "ok"].itertuples():
        found = [(col, getattr(row, col)) for col in TIMES if pd.notna(getattr(row, col))]
        means = json_column(row.round_step_mean_ms, [])
        found += [("round_step_mean_ms", m) for m in (means if isinstance(means, list) else [means])
                  if m is not None]
        for col, value in found:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ResultsError(f"{path}: cell {row.run_id}: column {col!r} holds {value!r}; a time must "
                                   "be a finite number > 0 (was the table edited?): merge the folder's cells "
                                   "again, or delete the cell's files and run it again")
    return res


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def cells_of(res: Results) -> pd.DataFrame:
    """One row per cell (ok runs; of several rows with the same :data:`CELL` identity, the last in the runs
    table's order, not pooled) with the identity columns :data:`CELL`, :data:`SHOWN`, the quantities, the
    timing verdict and :data:`CHECKED`, and each cell's round means (``round_step_mean_ms``, the spread of a
    ratio between devices). No timing group is kept: cells of two folders were never timed together (even
    under one group name on one machine), so a ratio between them divides their mean-based epoch times. A
    quality cell's time is not a timing result (it may run beside other jobs): its :data:`TIME` is null."""
    df = res.runs[res.runs.status == "ok"].copy()
    settings = [settings_of(r) for r in df.itertuples()]
    for col in ("cuda_graph", "compile"):  # null (a hand-made row) reads as no
        df[col] = df[col].fillna(False).astype(bool)
    df["matmul_precision"] = df.matmul_precision.fillna("highest")
    df["purpose"] = purpose_of(df)  # a quality cell is never pooled with a timing cell
    df["workload_params"] = [_canonical(s.get("workload_params",
                                              res.cells.get(rid, {}).get("workload_params")))
                             for s, rid in zip(settings, df.run_id)]
    df["budget"] = [_canonical(s.get("budget", res.cells.get(rid, {}).get("budget"))) for s, rid in
                    zip(settings, df.run_id)]
    df["method_params"] = [_canonical(s.get("method_params")) for s in settings]
    df["rounds"] = [s.get("execution", {}).get("rounds") for s in settings]
    df["allocator"] = [s.get("execution", {}).get("allocator") for s in settings]
    for col in QUANTITIES.values():
        df[col] = df[col].astype(float)
    df.loc[df.purpose == QUALITY, TIME] = float("nan")
    keep = ["run_id", *SHOWN, *QUANTITIES.values(), "timing_quality", "round_step_mean_ms", *CHECKED]
    return df[CELL + keep].drop_duplicates(CELL, keep="last").reset_index(drop=True)


def _flags(a: pd.Series, b: pd.Series, label_a: str, label_b: str) -> list[str]:
    out = []
    for col, what in CHECKED.items():
        x, y = a.get(col), b.get(col)
        if pd.notna(x) and pd.notna(y) and str(x) != str(y):
            out.append(f"{what} differs ({label_a} {x} vs {label_b} {y})")
    for label, row in ((label_a, a), (label_b, b)):
        if row.get("purpose") != QUALITY and not is_stable(row):  # a quality cell's time: not shown
            out.append(f"timing not stable on {label}: {brief_reason(row)}")
    return out


def brief_reason(row: pd.Series) -> str:
    """Why a timing is not stable in a few words: each reason up to its first measured number ("IQR 94%,
    CPU pressure 100%"); the whole reasons are the row's timing_quality (table_runs)."""
    heads = []
    for reason in re.split(r";\s+(?![^()]*\))", noisy_reason(row)):  # "; " outside parentheses
        head = reason.split(" (")[0]
        found = re.match(r".*?\d+(?:\.\d+)?[%x]", head)
        heads.append(found.group(0) if found else head)
    return ", ".join(heads)


def side_by_side(folders: list[str | Path], names: list[str] | None = None
                 ) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(table, device labels, warnings): one row per cell; columns <quantity>@<device>, and per later
    device <quantity> ratio <device>/<first> with its " low" and " high" (a time ratio: the spread from each
    side's round-mean quartiles, harness.results.analysis.apart_ratio; a memory ratio: none), plus flags.
    A device is named by its folder unless ``names`` are given."""
    labels, frames, warnings = [], [], []
    for i, folder in enumerate(folders):
        res = load_checked(folder, names[i] if names else None)
        if res.label in labels:
            raise ValueError(f"two result folders named {res.label!r}: give each device its own name")
        labels.append(res.label)
        frames.append(cells_of(res))
    base = frames[0].set_index(CELL)
    table = base[SHOWN + list(QUANTITIES.values())].rename(
        columns={c: f"{q}@{labels[0]}" for q, c in QUANTITIES.items()})
    table[f"{STABLE_COLUMN}@{labels[0]}"] = [is_stable(r) for _, r in base.iterrows()]
    table["differences"] = ""
    for label, frame in zip(labels[1:], frames[1:]):
        other = frame.set_index(CELL)
        both = base.index.intersection(other.index)
        if not len(both):
            warnings.append(f"{label} and {labels[0]} have no cell in common (no cell hash, variant and "
                            "execution in both): " + _why_apart(frames[0], frame, labels[0], label))
        table = table.join(other[list(QUANTITIES.values())].rename(
            columns={c: f"{q}@{label}" for q, c in QUANTITIES.items()}).assign(
            **{f"{STABLE_COLUMN}@{label}": [is_stable(r) for _, r in other.iterrows()]}), how="outer")
        missing = table[SHOWN[0]].isna()  # a cell only this device ran: described from its own row
        if missing.any():
            table.loc[missing, SHOWN] = other.loc[table.index[missing], SHOWN].to_numpy()
        table["differences"] = table["differences"].fillna("")
        for q, col in QUANTITIES.items():
            value, low, high = (pd.Series(float("nan"), index=table.index) for _ in range(3))
            for key in both:
                a, b = base.loc[key], other.loc[key]
                flags = _flags(a, b, labels[0], label)
                # refused across memory kinds and for unstable timings (quality cells too)
                found = ratio(b, a, col)
                if found is not None:
                    value[key], low[key], high[key] = found.value, found.low, found.high
                if flags:
                    prior = table.at[key, "differences"]
                    new = [f for f in flags if f not in prior]
                    table.at[key, "differences"] = "; ".join(filter(None, [prior, *new]))
            table[f"{q} ratio {label}/{labels[0]}"] = value
            table[f"{q} ratio {label}/{labels[0]} low"] = low
            table[f"{q} ratio {label}/{labels[0]} high"] = high
    quality = table.purpose == QUALITY
    table.loc[quality, "differences"] = [QUALITY_TIME + ("; " + d if d else "")
                                         for d in table.loc[quality, "differences"]]
    return table.reset_index(), labels, warnings


def _why_apart(a: pd.DataFrame, b: pd.DataFrame, label_a: str, label_b: str) -> str:
    """Which columns of the cell hash keep two folders' cells apart (their distinct values)."""
    reasons = []
    for col in ("workload_params", "method_params", "budget", "batch_size", "method"):
        va, vb = set(a[col].astype(str)), set(b[col].astype(str))
        if va != vb and not va & vb:
            reasons.append(f"{col}: {label_a} {sorted(va)[:3]} vs {label_b} {sorted(vb)[:3]}")
    return "; ".join(reasons) or ("they differ in variant, execution, target, seed, purpose or several "
                                  "columns at once")


def _left_out(other: pd.DataFrame, base: pd.DataFrame, column: str) -> str:
    """Why :func:`harness.results.analysis.pair_ratio` gave no ratio of ``column`` for these rows."""
    if column == TIME and not (len(stable_only(other)) and len(stable_only(base))):
        return "left out: timing not stable"
    if column == MEMORY and not any(same_memory_kind(a, b) for _, a in other.iterrows()
                                    for _, b in base.iterrows()):
        return "memory kinds differ"
    return "not measured"


def method_ratios(folders: list[str | Path], names: list[str] | None = None) -> pd.DataFrame:
    """CoMERA vs each other method on every device (other / CoMERA, same workload, its parameters and
    batch: harness.results.analysis.pair_ratio, the median over seeds of the one ratio statistic), plus
    the paper's stated ratios as devices "paper (RTX 3090)" and "paper (RTX 4090)". CoMERA is its default
    eager FP32 cell; each other method's execution other than that is named in ``versus`` ("dense-default
    TF32 (high)"); cells in a CUDA graph are left out."""
    rows = []
    for i, folder in enumerate(folders):
        res = load_checked(folder, names[i] if names else None)
        runs = timing_cells(res.runs)  # time and memory ratios of the timing cells only
        runs = runs[(runs.status == "ok") & runs.target_ratio.isna() & ~runs.run_id.isin(list(res.sweeps))
                    & ~graphed(runs)]
        runs = runs.assign(workload_params=[_canonical(settings_of(r).get("workload_params"))
                                            for r in runs.itertuples()])
        for (workload, params, batch), group in runs.groupby(["workload", "workload_params", "batch_size"]):
            base = group[(group.method == "comera") & (group.variant == "default") & paper_execution(group)]
            if not len(base):
                continue
            others = group[group.method != "comera"]
            ran = others.apply(execution_label, axis=1) if len(others) else pd.Series(dtype=object)
            for (method, variant, how), other in others.groupby(["method", "variant", ran]):
                for q, col in QUANTITIES.items():
                    r = pair_ratio(other, base, col)
                    rows.append({"device": res.label, "workload": workload, "params": params,
                                 "batch_size": batch,
                                 "seeds": other.seed.nunique(dropna=False),
                                 "versus": f"{method}-{variant}{how}",
                                 "quantity": q, "ratio": r.value if r else float("nan"),
                                 "low": r.low if r else float("nan"), "high": r.high if r else float("nan"),
                                 "rounds": r.n if r else 0, "interleaved": bool(r and r.interleaved),
                                 "source": "measured", "note": "" if r else _left_out(other, base, col)})
    for device in reference.paper_devices().values():
        for r in device["ratios"]:
            rows.append({"device": device["label"], "workload": r["workload"], "params": "",
                         "batch_size": r["batch_size"],
                         "seeds": 0, "versus": f"{r['method']}-default", "quantity": r["quantity"],
                         "ratio": r["ratio"], "low": r["ratio"], "high": r["ratio"], "rounds": 0,
                         "interleaved": False,
                         "source": f"{r['claim']}: {reference.source_text(r['source'])}", "note": ""})
    return pd.DataFrame(rows)


def _batch(value: object) -> str:
    """An integer batch size as text ("all" where a paper ratio holds for every batch)."""
    return str(int(value)) if pd.notna(value) else "all"


def _batch_label(value: object) -> str:
    """``b4``, or ``every batch`` where a paper ratio holds for every batch size (not ``ball``)."""
    return f"b{int(value)}" if pd.notna(value) else "every batch"


def cell_label(r: pd.Series, seed: bool = False) -> str:
    """A cell as "transformer[size=small]/dense-default/b32/t0.5/cg/compiled/matmul-high/quality" (``seed``:
    with "/s1")."""
    params = json_column(r.workload_params, {})
    extra = ",".join(f"{k}={v}" for k, v in sorted((params or {}).items()) if k in ("size", "seq_len"))
    label = f"{r.workload}[{extra}]/{r.method}-{r.variant}/b{_batch(r.batch_size)}"
    label += "" if pd.isna(r.target_ratio) else f"/t{r.target_ratio:g}"
    label += f"/s{int(r.seed)}" if seed and pd.notna(r.seed) else ""
    label += "/cg" if pd.notna(r.cuda_graph) and bool(r.cuda_graph) else ""
    label += "/compiled" if pd.notna(r["compile"]) and bool(r["compile"]) else ""
    label += f"/matmul-{r.matmul_precision}" if r.matmul_precision not in ("highest", None) else ""
    return label + ("/quality" if r.purpose == QUALITY else "")


def _log_x_if_positive(ax: plt.Axes, columns: list[pd.Series], label: str, unstable: int = 0,
                       stable: int = 0) -> None:
    """A log x axis when some value is positive, else a linear one saying nothing was measured; with
    ``unstable`` values drawn hollow (measured, timing not stable: no ratio), the label says how many and
    whether any of the ``stable`` ones was stable."""
    values = pd.concat(columns) if columns else pd.Series(dtype=float)
    note = ""
    if unstable:
        note = (f": {unstable} measured, none stable (hollow: no ratio)" if not stable
                else f"; {unstable} more measured, not stable (hollow: no ratio)")
    if (values.astype(float) > 0).any():
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel(f"{label}, log scale{note}")
    else:
        ax.set_xlabel(f"{label} (nothing measured)")


def short_labels(table: pd.DataFrame) -> tuple[list[str], str]:
    """(cell labels, the prefix they all share): a workload and its parameters common to every cell are
    said once (in the title), not on every row; the seed is in a label where the cells have several."""
    seeds = len(table) and table.seed.nunique() > 1
    cells = list(table.apply(cell_label, axis=1, seed=seeds)) if len(table) else []
    heads = {c.split("/", 1)[0] for c in cells}
    if len(heads) != 1 or not all("/" in c for c in cells):
        return cells, ""
    return [c.split("/", 1)[1] for c in cells], heads.pop()


UNSTABLE_HATCH = "////"


def _bars(ax: plt.Axes, table: pd.DataFrame, labels: list[str], cells: list[str], q: str, unit: str,
          scale: float) -> None:
    """One bar per device and cell; a time whose timing was not stable is hatched."""
    width = 0.8 / len(labels)
    marked = False
    for i, label in enumerate(labels):
        bars = ax.barh([y + i * width for y in range(len(table))], table[f"{q}@{label}"] / scale,
                       height=width, label=label)
        if q != "epoch_time":
            continue
        for bar, stable_here in zip(bars, table[f"{STABLE_COLUMN}@{label}"]):
            if stable_here is False or stable_here == 0:
                bar.set_hatch(UNSTABLE_HATCH)
                bar.set_edgecolor("black")
                marked = True
    ax.set_yticks([y + 0.4 - width / 2 for y in range(len(table))], cells, fontsize=7)
    _log_x_if_positive(ax, [table[f"{q}@{label}"] for label in labels], unit)
    handles, names = ax.get_legend_handles_labels()
    if marked:
        handles.append(matplotlib.patches.Patch(facecolor="white", edgecolor="black", hatch=UNSTABLE_HATCH))
        names.append("timing not stable")
    ax.legend(handles, names, fontsize=8)


def _device_ratios(ax: plt.Axes, table: pd.DataFrame, labels: list[str], cells: list[str]) -> None:
    """Each later device's epoch time over the first's, per cell with a ratio, with its spread; a cell
    measured on both devices whose timing was not stable on one of them is a hollow grey marker at the
    ratio of its epoch times (no ratio: it counts nowhere)."""
    unstable = 0
    for label in labels[1:]:
        col = f"epoch_time ratio {label}/{labels[0]}"
        ok = table[col].notna()
        ys = [y for y, good in enumerate(ok) if good]
        r = table[col][ok]
        ax.errorbar(r, ys, xerr=[r - table[f"{col} low"][ok], table[f"{col} high"][ok] - r], fmt="o",
                    capsize=3, label=f"{label} / {labels[0]} (mean-based epoch times)")
        raw = table[f"epoch_time@{label}"] / table[f"epoch_time@{labels[0]}"]
        shaky = ~ok & raw.notna() & ~(table[f"{STABLE_COLUMN}@{label}"].astype(bool)
                                      & table[f"{STABLE_COLUMN}@{labels[0]}"].astype(bool))
        if shaky.any():
            unstable += int(shaky.sum())
            ax.plot(raw[shaky], [y for y, bad in enumerate(shaky) if bad], "o", markerfacecolor="none",
                    color="gray", label=f"{label} / {labels[0]}: timing not stable (no ratio)")
    ax.set_yticks(range(len(table)), cells, fontsize=7)
    ax.axvline(1.0, color="gray", lw=1)
    drawn = [table[f"epoch_time ratio {label}/{labels[0]}"] for label in labels[1:]]
    raw = [table[f"epoch_time@{label}"] / table[f"epoch_time@{labels[0]}"] for label in labels[1:]]
    _log_x_if_positive(ax, drawn + (raw if unstable else []), "epoch time ratio between devices", unstable,
                       int(sum(d.notna().sum() for d in drawn)))
    ax.set_xlabel(f"{ax.get_xlabel()}\n{DEVICE_SPREAD}", fontsize=8)
    ax.legend(fontsize=8)


def _speedups(ax: plt.Axes, ratios: pd.DataFrame) -> None:
    """CoMERA's epoch-time speedup over each other method, per device (the paper's too); says so when
    every measured ratio was left out."""
    times = ratios[ratios.quantity == "epoch_time"]
    r = times[times.ratio.notna()]
    keys = (r.apply(lambda x: f"{x.workload}/{_batch_label(x.batch_size)}: {x.versus}", axis=1) if len(r)
            else pd.Series(dtype=str))
    order = sorted(keys.unique())
    ndev = max(1, r.device.nunique())
    for i, (device, group) in enumerate(r.assign(key=keys).groupby("device", sort=False)):
        ys = [order.index(k) + (i - (ndev - 1) / 2) * 0.3 for k in group.key]  # devices dodged about the row
        ax.errorbar(group.ratio, ys, xerr=[group.ratio - group.low, group.high - group.ratio], fmt="o",
                    capsize=3, label=device)
    ax.set_yticks(range(len(order)), order, fontsize=7)
    if order:  # every row's dodged points well inside the frame
        ax.set_ylim(-0.6, len(order) - 0.4)
    ax.axvline(1.0, color="gray", lw=1)
    ax.set_xlabel("CoMERA speedup per epoch\n(other / CoMERA; bars: IQR over rounds;\ncells timed apart: "
                  "round-mean quartiles)")
    left_out = times[(times.source == "measured") & times.ratio.isna()]
    if len(left_out):
        why = "; ".join(sorted({n.removeprefix("left out: ") for n in left_out.note}))
        ax.set_title(f"not drawn: {len(left_out)} measured ratio(s) ({why})", fontsize=8)
    ax.legend(fontsize=8)


def plot(table: pd.DataFrame, labels: list[str], ratios: pd.DataFrame, out: Path) -> None:
    """Each device's time and memory per cell, the device ratio per cell with its spread (two devices or
    more), and CoMERA's speedup over the other methods on each device; two panels a row, each as tall as
    its cells need."""
    cells, common = short_labels(table)
    npanels = 4 if len(labels) > 1 else 3
    rows = (npanels + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(14, rows * max(3.5, 0.3 * len(cells) + 2)), squeeze=False)
    axes = list(axes.flat)
    _bars(axes[0], table, labels, cells, "epoch_time", "time per epoch (s)", 1.0)
    _bars(axes[1], table, labels, cells, "peak_mem", "peak memory (MB)", MB)
    axes[1].tick_params(labelleft=False)  # the same cells in the same rows as the time panel
    if len(labels) > 1:
        _device_ratios(axes[2], table, labels, cells)
    _speedups(axes[npanels - 1], ratios)
    for ax in axes[npanels:]:
        ax.axis("off")
    title = "Devices compared: " + ", ".join(labels) + " + the paper's stated ratios"
    height = fig.get_figheight()
    fig.suptitle(title + (f"\ncells of {common}" if common else ""), y=1 - 0.1 / height, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.65 if common else 0.45) / height))  # below the title
    save(fig, out)


def save(fig: plt.Figure, out: Path) -> None:
    """compare_time_memory.png and .pdf in ``out``; the figure is closed."""
    for ext in ("png", "pdf"):
        fig.savefig(out / f"compare_time_memory.{ext}", dpi=110)
    plt.close(fig)


def _markdown(table: pd.DataFrame, labels: list[str], ratios: pd.DataFrame, warnings: list[str]) -> str:
    seeds = len(table) and table.seed.nunique() > 1
    shown = table.assign(cell=table.apply(cell_label, axis=1, seed=seeds) if len(table) else [])
    # a memory ratio: no spread
    cols = ["cell"] + [c for c in table.columns if c.startswith("epoch_time")
                       or c.startswith("peak_mem") and not c.endswith(("low", "high"))]
    cols += ["differences"]
    warn = "".join(f"\n> **Warning:** {cell_text(w)}\n" for w in warnings)
    ratio_cols = ["device", "workload", "batch_size", "versus", "quantity", "ratio", "low", "high", "rounds",
                  "interleaved", "note", "source"]
    devices = ", ".join(map(cell_text, labels))
    return (f"# Devices compared: {devices}\n{warn}\nPer cell (ok cells; time in s, memory in bytes "
            "of each device's own peak_mem_kind; a quality cell's time is not shown: trained for accuracy, "
            "beside other cells where the pipeline's --cores allows, it is not a timing result). A cell is "
            "matched by its cell hash (workload and method "
            "with their resolved parameters, variant, batch, target, seed, purpose, budget) and its "
            "variant; a time ratio needs a stable timing on both devices, a memory ratio the same memory "
            "kind; flags name what differs. An epoch time ratio between devices divides mean-based epoch "
            "times (never timed together, the cells share no round); its low-high is each device's "
            "round-mean quartiles over its median, combined the widest way (low: Q1 of the later device "
            "against Q3 of the first; none "
            f"where a side has fewer than 2 rounds):\n\n{markdown_table(shown[cols], '.4g')}"
            "\n\n## CoMERA vs the other methods on each device (other / CoMERA)\n\nTime from stable rows "
            "only; cells timed together in interleaved rounds give the median of the per-round ratios of "
            "mean step times (periodic work included at its rate: rounds of whole periods, or its steps "
            "timed apart, each row's extra.periodic) and its IQR (low-high) over `rounds` rounds; "
            "other cells the ratio of their mean-based epoch times, low-high from each side's round-mean "
            "quartiles as above; the median over `seeds` seeds.\n\n"
            f"{markdown_table(ratios[ratio_cols].assign(batch_size=ratios.batch_size.map(_batch)), '.3g')}\n")


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="comera-bench compare", description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="results/<device> folders (runs.parquet inside)")
    ap.add_argument("--out", default="figures/compare", help="output folder")
    ap.add_argument("--names", help="comma-separated device names, one per folder (default: folder names)")
    args = ap.parse_args(argv)
    names = args.names.split(",") if args.names else None
    if names is not None and len(names) != len(args.folders):
        ap.error(f"--names has {len(names)} names for {len(args.folders)} folders")
    try:
        table, labels, warnings = side_by_side(args.folders, names)
        ratios = method_ratios(args.folders, names)
    except (ValueError, ResultsError, FileNotFoundError) as err:
        print(f"comera-bench compare: {err}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"comera-bench compare: warning: {w}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    ratios.to_csv(out / "compare_ratios.csv", index=False)
    (out / "compare.md").write_text(_markdown(table, labels, ratios, warnings))
    write_html(out / "compare.md")
    plot(table, labels, ratios, out)
    flagged = int((~table.differences.isin(["", QUALITY_TIME])).sum()) if len(table) else 0
    print(f"compared {len(table)} cells over {labels} ({flagged} flagged) -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
