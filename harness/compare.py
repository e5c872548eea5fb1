"""The same grid on several devices side by side: `comera-bench compare DIR... [--out DIR] [--names A,B]`.

Each DIR is a results/<device> folder (this machine's, or one copied from another machine). Writes
compare.md / compare.csv (one row per cell with each device's epoch time and peak memory, and the
ratio of every device to the first), and compare_time_memory.png/.pdf. Within each device, CoMERA's
speedup and memory saving over the other methods are set beside the paper's RTX 3090 and RTX 4090
ratios (harness/reference/paper.yaml, with sources) as two more "devices".
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness import reference  # noqa: E402
from harness.results import ResultsError  # noqa: E402
from harness.tables import MB, load, timing_cells  # noqa: E402

CELL = ["workload", "method", "variant", "batch_size", "target_ratio", "seed"]
QUANTITIES = {"epoch_time": "epoch_time_s", "peak_mem": "peak_mem_bytes"}


def side_by_side(folders: list[str | Path], names: list[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per cell; columns <quantity>@<device> and <quantity> ratio <device>/<first device>.
    A device is named by its folder unless ``names`` are given."""
    labels, frames = [], []
    for i, folder in enumerate(folders):
        res = load(folder, names[i] if names else None)
        if res.label in labels:
            raise ValueError(f"two result folders named {res.label!r}: give each device its own name")
        labels.append(res.label)
        df = res.runs[res.runs.status == "ok"].copy()
        df["cuda_graph"] = df.run_id.map(res.cuda_graph)
        df["purpose"] = df.purpose.fillna("timing")  # a quality cell is never pooled with a timing cell
        df = df.groupby(CELL + ["cuda_graph", "purpose"], dropna=False)[list(QUANTITIES.values())]
        df = df.median().astype(float)
        frames.append(df.rename(columns={c: f"{q}@{res.label}" for q, c in QUANTITIES.items()}))
    table = pd.concat(frames, axis=1, join="outer").reset_index()
    for label in labels[1:]:
        for q in QUANTITIES:
            table[f"{q} ratio {label}/{labels[0]}"] = table[f"{q}@{label}"] / table[f"{q}@{labels[0]}"]
    return table, labels


def method_ratios(folders: list[str | Path], names: list[str] | None = None) -> pd.DataFrame:
    """CoMERA vs each other method on every device (other / CoMERA, same workload and batch), plus
    the paper's stated ratios as devices "paper (RTX 3090)" and "paper (RTX 4090)"."""
    rows = []
    for i, folder in enumerate(folders):
        res = load(folder, names[i] if names else None)
        runs = timing_cells(res.runs)  # time and memory ratios of the timing cells only
        runs = runs[(runs.status == "ok") & runs.target_ratio.isna() & ~runs.run_id.isin(list(res.sweeps))
                    & ~runs.run_id.map(res.cuda_graph).astype(bool)]
        med = runs.groupby(["workload", "method", "variant", "batch_size"])[list(QUANTITIES.values())].median()
        med = med.astype(float)
        for (workload, method, variant, batch), values in med.iterrows():
            if method == "comera" or (workload, "comera", "default", batch) not in med.index:
                continue
            base = med.loc[(workload, "comera", "default", batch)]
            for q, col in QUANTITIES.items():
                rows.append({"device": res.label, "workload": workload, "batch_size": batch,
                             "versus": f"{method}-{variant}", "quantity": q,
                             "ratio": values[col] / base[col] if base[col] else float("nan"), "source": "measured"})
    for device in reference.paper_devices().values():
        for r in device["ratios"]:
            rows.append({"device": device["label"], "workload": r["workload"], "batch_size": r["batch_size"],
                         "versus": f"{r['method']}-default", "quantity": r["quantity"], "ratio": r["ratio"],
                         "source": f"{r['claim']}: {reference.source_text(r['source'])}"})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, labels: list[str], ratios: pd.DataFrame, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    cells = table.apply(lambda r: f"{r.workload}/{r.method}-{r.variant}/b{r.batch_size}"
                        + ("" if pd.isna(r.target_ratio) else f"/t{r.target_ratio:g}")
                        + ("/quality" if r.purpose == "quality" else ""), axis=1)
    width = 0.8 / len(labels)
    for ax, (q, unit, scale) in zip(axes, (("epoch_time", "time per epoch (s)", 1.0),
                                           ("peak_mem", "peak memory (MB)", MB))):
        for i, label in enumerate(labels):
            ax.barh([y + i * width for y in range(len(table))], table[f"{q}@{label}"] / scale,
                    height=width, label=label)
        ax.set_yticks([y + 0.4 - width / 2 for y in range(len(table))], cells, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel(unit + ", log scale")
        ax.legend(fontsize=7)
    ax = axes[2]
    r = ratios[ratios.quantity == "epoch_time"]
    keys = r.apply(lambda x: f"{x.workload}/b{x.batch_size}: {x.versus}", axis=1)
    for i, (device, group) in enumerate(r.assign(key=keys).groupby("device", sort=False)):
        order = sorted(keys.unique())
        ys = [order.index(k) + i * 0.8 / max(1, r.device.nunique()) for k in group.key]
        ax.barh(ys, group.ratio, height=0.8 / max(1, r.device.nunique()), label=device)
        ax.set_yticks(range(len(order)), order, fontsize=6)
    ax.axvline(1.0, color="gray", lw=1)
    ax.set_xlabel("CoMERA speedup per epoch (other method time / CoMERA time)")
    ax.legend(fontsize=7)
    fig.suptitle("Devices compared: " + ", ".join(labels) + " + the paper's stated ratios")
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(out / f"compare_time_memory.{ext}", dpi=130)
    plt.close(fig)


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
        table, labels = side_by_side(args.folders, names)
        ratios = method_ratios(args.folders, names)
    except (ValueError, ResultsError, FileNotFoundError) as err:
        print(f"comera-bench compare: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    ratios.to_csv(out / "compare_ratios.csv", index=False)
    (out / "compare.md").write_text(
        f"# Devices compared: {', '.join(labels)}\n\nPer cell (ok cells, median over seeds; time in s, "
        f"memory in bytes of each device's own peak_mem_kind):\n\n{table.to_markdown(index=False, floatfmt='.4g')}"
        f"\n\n## CoMERA vs the other methods on each device (other / CoMERA)\n\n"
        f"{ratios.to_markdown(index=False, floatfmt='.3g')}\n")
    plot(table, labels, ratios, out)
    print(f"compared {len(table)} cells over {labels} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
