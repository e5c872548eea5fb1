"""figures/claims.md: the paper's claims C1-C10 (DESIGN.md 5) next to what this device measured.

``python -m harness.claims --results results/<device> --device-label <device> --out figures/claims.md``

Every ratio comes from rows of the same results folder (one pipeline run on one device). A claim that
this grid cannot test (other GPU, real dataset, model not in the grid, paper-size model needed) is
"not measured here", with whatever related number we have shown as context, never as a verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from harness import reference
from harness.tables import MB, Results, report_args

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured here"


@dataclass
class Verdict:
    ours: str
    verdict: str
    settings: str


def _ok(res: Results, workload: str, method: str, variant: str = "default") -> pd.DataFrame:
    df = res.main_runs(workload)
    return df[(df.method == method) & (df.variant == variant) & (df.status == "ok") & df.target_ratio.isna()]


def _ratios(res: Results, workload: str, other: str, column: str, other_variant: str = "default") -> dict:
    """batch size -> median(column of ``other``) / median(column of CoMERA), over seeds, ok cells only."""
    a = _ok(res, workload, other, other_variant).groupby("batch_size")[column].median()
    b = _ok(res, workload, "comera").groupby("batch_size")[column].median()
    both = a.index.intersection(b.index)
    return {int(k): float(a[k] / b[k]) for k in both if b[k] > 0 and pd.notna(a[k]) and pd.notna(b[k])}


def _fmt(ratios: dict) -> str:
    return ", ".join(f"{v:.2f}x @ batch {k}" for k, v in sorted(ratios.items())) or "no pair of ok cells"


def _size(res: Results, workload: str) -> str | None:
    for spec in res.cells.values():
        if spec["workload"] == workload:
            return spec["workload_params"].get("size")
    return None


def _settings(res: Results, workload: str, extra: str = "") -> str:
    df = res.runs[res.runs.workload == workload]
    kinds = "/".join(sorted(df.peak_mem_kind.dropna().unique())) or "-"
    return (f"{workload} size={_size(res, workload) or 'default'}, batches "
            f"{sorted(df.batch_size.unique().tolist())}, memory={kinds}{extra}")


def c1(res: Results, ref: dict) -> Verdict:
    r = _ratios(res, "transformer", "dense", "epoch_time_s")
    if not r:
        return Verdict(_fmt(r), NOT_MEASURED, _settings(res, "transformer"))
    best = r[max(r)]
    ok = best >= ref["speedup_vs_dense_min"]
    return Verdict(f"dense/CoMERA epoch time {_fmt(r)}", HOLDS if ok else FAILS,
                   _settings(res, "transformer", f"; verdict at the largest batch ({max(r)}): >= 2x"))


def c2(res: Results, ref: dict) -> Verdict:
    t = _ratios(res, "transformer", "galore", "epoch_time_s")
    m = _ratios(res, "transformer", "galore", "peak_mem_bytes")
    b = ref["batch_size"]
    if b not in t or b not in m:
        return Verdict("no ok CoMERA and GaLore cells at batch 1", NOT_MEASURED, _settings(res, "transformer"))
    ok = t[b] >= ref["speedup_vs_galore"] and m[b] >= ref["memory_vs_galore"]
    return Verdict(f"batch 1: {t[b]:.2f}x faster, {m[b]:.2f}x less peak memory than GaLore",
                   HOLDS if ok else FAILS, _settings(res, "transformer", "; needs >= 2x time and >= 9x memory"))


def c3(res: Results, ref: dict) -> Verdict:
    t = _ratios(res, "transformer", "galore", "epoch_time_s")
    ours = f"batch 1 speedup vs GaLore here: {t[1]:.2f}x" if 1 in t else "no batch-1 pair here"
    names = " ".join(res.runs.device_name.dropna().unique())
    if "4090" not in names or 1 not in t:
        return Verdict(ours, NOT_MEASURED, f"needs an RTX 4090 (this device: {names or res.label})")
    return Verdict(ours, HOLDS if t[1] > 1.0 else FAILS, _settings(res, "transformer"))


def c4(res: Results, ref: dict) -> Verdict:
    acc = {}
    for method, variant in (("comera", "default"), ("galore", "default"), ("lte", "default"), ("lte", "tuned")):
        rows = _ok(res, "transformer", method, variant)
        if len(rows):
            acc[f"{method}-{variant}"] = rows.metric_value.max()
    ours = ", ".join(f"{k} {v:.3f}" for k, v in acc.items()) or "no transformer accuracy"
    data = next((s["workload_params"].get("data") for s in res.cells.values()
                 if s["workload"] == "transformer"), None)
    if data != "mnli" or "comera-default" not in acc or "galore-default" not in acc:
        return Verdict(ours, NOT_MEASURED, f"needs real MNLI data (data={data or 'default synthetic'}) "
                       "and a full training budget")
    ok = all(abs(acc[k] - ref[f"accuracy_{k.split('-')[0]}"]) <= 0.03 for k in ("comera-default", "galore-default"))
    return Verdict(ours, HOLDS if ok else FAILS, _settings(res, "transformer", "; within 3 points of 64%"))


def c5(res: Results, ref: dict) -> Verdict:
    parts, verdicts = [], []
    for workload, key in (("transformer", "compression_transformer"), ("dlrm", "compression_dlrm")):
        df = res.runs[(res.runs.workload == workload) & (res.runs.method == "comera") & (res.runs.status == "ok")]
        if not len(df):
            continue
        best = df.compression_total.max()
        parts.append(f"{workload} {best:.1f}x (size {_size(res, workload) or 'default'})")
        if _size(res, workload) == "paper":
            verdicts.append(best >= ref[key])
    ours = ", ".join(parts) or "no CoMERA run"
    if not verdicts:
        return Verdict(ours, NOT_MEASURED, "compression depends on model size: needs size=paper models")
    return Verdict(ours, HOLDS if all(verdicts) else FAILS, "paper-size models, best target")


def c6(res: Results, ref: dict) -> Verdict:
    mb = res.microbench
    mb = mb[(mb.op == "embedding") & (mb.direction == "fwd_bwd")]
    pairs = mb[mb.variant == "ttm_naive"].merge(mb[mb.variant == "ttm_optimized"], on=["shape", "tokens"],
                                                suffixes=("_naive", "_opt"))
    if not len(pairs):
        return Verdict("no naive/optimized TTM lookup pair in the microbenchmarks", NOT_MEASURED,
                       f"device {res.label}")
    speed = (pairs.time_ms_naive / pairs.time_ms_opt).min()
    mem = (pairs.peak_mem_bytes_naive / pairs.peak_mem_bytes_opt).min()
    ok = speed >= ref["lookup_speedup_min"] and mem >= ref["lookup_memory_min"]
    return Verdict(f"optimized vs naive lookup: >= {speed:.2f}x faster, >= {mem:.2f}x less memory "
                   f"(worst over {sorted(pairs.tokens.unique().tolist())} indices)", HOLDS if ok else FAILS,
                   f"device {res.label}, microbench fwd+bwd; needs >= 4x time and >= 2x memory")


def c7(res: Results, ref: dict) -> Verdict:
    t = _ratios(res, "dlrm", "dense", "epoch_time_s")
    m = _ratios(res, "dlrm", "dense", "peak_mem_bytes")
    if not t or not m:
        return Verdict("no ok dense/CoMERA DLRM pair", NOT_MEASURED, _settings(res, "dlrm"))
    ok = all(v < 1.0 for v in t.values()) and all(v > 1.0 for v in m.values())
    return Verdict(f"dense/CoMERA time {_fmt(t)}; memory {_fmt(m)}", HOLDS if ok else FAILS,
                   _settings(res, "dlrm", "; needs dense faster and CoMERA lighter at every batch"))


def c8(res: Results, ref: dict) -> Verdict:
    t = _ratios(res, "mlm", "dense", "epoch_time_s")
    comera = _ok(res, "mlm", "comera")
    dense = _ok(res, "mlm", "dense")
    parts = [f"speedup {_fmt(t)}"]
    if len(comera):
        parts.append(f"compression {comera.compression_total.max():.2f}x total, "
                     f"{comera.compression_layers.max():.2f}x layers")
    if len(comera) and len(dense):
        parts.append(f"final loss {comera.final_train_loss.median():.3f} vs {dense.final_train_loss.median():.3f}")
    if _size(res, "mlm") != "paper" or not t:
        return Verdict("; ".join(parts), NOT_MEASURED, "needs the CodeBERT-large-size MLM (size=paper)")
    ok = max(t.values()) >= ref["speedup_seq512"]
    return Verdict("; ".join(parts), HOLDS if ok else FAILS, _settings(res, "mlm", "; needs >= 1.9x"))


def c9(res: Results, ref: dict) -> Verdict:
    return Verdict("-", NOT_MEASURED, "BERT-large on WikiText/SQuAD is not a workload of this harness")


def c10(res: Results, ref: dict) -> Verdict:
    sweep = res.runs[res.runs.run_id.isin(list(res.sweeps)) & (res.runs.status == "ok")]
    points = []
    for _, r in sweep.iterrows():
        dense = _ok(res, r.workload, "dense")
        dense = dense[dense.batch_size == r.batch_size]
        if len(dense) and r.compression_layers > 1:
            points.append((r.compression_layers, dense.epoch_time_s.median() / r.epoch_time_s, r.batch_size))
    if not points:
        return Verdict("no compression sweep with a dense cell at the same batch", NOT_MEASURED,
                       f"device {res.label}")
    points.sort()
    ours = ", ".join(f"{s:.2f}x @ compression {c:.1f} (batch {b})" for c, s, b in points)
    ok = all(s > 1.0 for _, s, _ in points)
    return Verdict(ours, HOLDS if ok else FAILS,
                   _settings(res, sweep.workload.iloc[0], "; needs a speedup at every compression > 1"))


CLAIMS: dict[str, Callable[[Results, dict], Verdict]] = {
    "C1": c1, "C2": c2, "C3": c3, "C4": c4, "C5": c5, "C6": c6, "C7": c7, "C8": c8, "C9": c9, "C10": c10,
}


def evaluate(res: Results) -> pd.DataFrame:
    """One row per claim: claim, paper (value, device, source), ours, device, settings, verdict."""
    rows = []
    for cid, judge in CLAIMS.items():
        ref = reference.claim(cid)
        v = judge(res, ref["values"])
        rows.append({"claim": cid, "paper": f"{ref['text']} [{ref['device']}; {ref['source']}]",
                     "ours": v.ours, "device": res.label, "settings": v.settings, "verdict": v.verdict})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    args, res = report_args("python -m harness.claims", __doc__.splitlines()[0], argv, "claims.md path")
    table = evaluate(res)
    sources = "\n".join(f"- {k}: {v}" for k, v in reference.load()["sources"].items())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# Claims of the CoMERA paper vs this device ({res.label})\n\n"
                   f"{table.to_markdown(index=False)}\n\nRatios use only rows of {args.results} (same "
                   f"pipeline run, same device). Memory is the runs' peak_mem_bytes (its kind is in the "
                   f"settings column; MB = {MB:.0e} bytes).\n\nSources:\n{sources}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
