"""How a claim is judged: which rows are in a claim's setting, the verdict words, and the comparisons
the claims share (ratios against a method, kept accuracy, the TTM lookups of C6); the claims themselves
and claims.md are harness.reports.claims. The ratios, stability and device matching are
harness.results.analysis's; the rules in words: docs/measurement.md and claims.md's "How claims are judged".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

import pandas as pd

from harness.core.timing import STABLE
from harness.reports.shared import matched_name, size_matched
from harness.results.analysis import (CALL_TIME, MEMORY, QUALITY, Ratio, Results, gpu_rows, is_stable,
                                      is_timing, model_size, pair_ratio, purpose_of, ratio, settings_of,
                                      stable_only, timing_cells, unstable_timing_cells)
from harness.results.execution import paper_execution

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"
"""The verdicts of a claim judged in its setting: its ratios' confidence intervals all reach the paper's
number, one lies wholly on the other side, or else (:func:`reaches`)."""
NOT_COMPARABLE, NOT_MEASURED = "not comparable here", "not measured here"
NOT_STABLE = "not judged: timing not stable"

ACCURACY_KEPT = 0.05   # a compressed model kept its accuracy: at most 5 points below the uncompressed one

Judgement = Union[bool, str, None]
"""A part of a claim: True (holds), False (does not hold), :data:`NOISE` or None (not judged here)."""


@dataclass
class Finding:
    """A comparison made on some rows; ``holds`` is None when the rows judge only part of the claim,
    :data:`NOISE` when a ratio's confidence interval straddles the paper's number (:func:`reaches`);
    ``unstable``: a time half was left out because its timing was not stable (its text says so)."""

    text: str
    holds: Judgement
    unstable: bool = False


@dataclass
class Verdict:
    measured: str
    verdict: str
    elsewhere: str
    device: str
    settings: str


@dataclass
class Context:
    """What a claim is judged with: this device's results, the claim's values and GPU, other devices."""

    res: Results
    values: dict[str, Any]
    gpu: str
    others: Sequence[Results] = ()


# ------------------------------------------------------------------------------------ row settings

def dataset(settings: dict[str, Any]) -> str | None:
    return settings.get("workload_info", {}).get("data") or settings.get("workload_params", {}).get("data")


def full_schedule(row: Any, settings: dict[str, Any]) -> bool:
    """Status ok, every budgeted epoch done, and no epoch cut below the workload's steps_per_epoch."""
    steps, per_epoch = settings.get("steps_in_epoch"), settings.get("steps_per_epoch")
    epochs = settings.get("budget", {}).get("epochs", 1)
    return (row.status == "ok" and bool(steps) and steps == per_epoch and pd.notna(row.epochs)
            and row.epochs >= epochs - 1e-9)


def late_stage_done(row: Any, settings: dict[str, Any]) -> bool:
    """A target was set and the late stage started within the steps the run did (``late_start_step``)."""
    start = settings.get("method", {}).get("late_start_step")
    done = row.epochs * (settings.get("steps_in_epoch") or 0) if pd.notna(row.epochs) else 0
    return pd.notna(row.target_ratio) and start is not None and start < done


def schedule_label(row: Any, settings: dict[str, Any]) -> str:
    if full_schedule(row, settings):
        return "full schedule"
    if (settings.get("steps_in_epoch") or 0) < (settings.get("steps_per_epoch") or 0):
        return f"epochs cut to {settings['steps_in_epoch']} steps"
    return "schedule not completed"


def annotate(res: Results, runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with the columns a setting is judged by: model_size, dataset, full_schedule, late_stage
    and ``setting`` (a label of where the row was measured)."""
    settings = [settings_of(r) for r in runs.itertuples()]
    specs = [res.cells.get(rid, {}) for rid in runs.run_id]
    rows = list(runs.itertuples())
    out = runs.assign(
        model_size=[model_size(s, spec) for s, spec in zip(settings, specs)],
        dataset=[dataset(s) for s in settings],
        full_schedule=[full_schedule(r, s) for r, s in zip(rows, settings)],
        late_stage=[late_stage_done(r, s) for r, s in zip(rows, settings)],
        schedule=[schedule_label(r, s) for r, s in zip(rows, settings)])
    out["setting"] = [f"{r.device_name} ({r.device}), size {r.model_size}"
                      + (f", {r.dataset} data" if r.dataset else "") + f", {r.schedule}"
                      for r in out.itertuples()]
    return out


def runs_of(res: Results, workloads: Iterable[str], *, sweeps: bool = False, timing: bool = False,
            quality: bool = False, graphs: bool = False) -> pd.DataFrame:
    """Annotated runs of some workloads run as the paper's (harness.results.execution.paper_execution:
    eagerly, not compiled, FP32 matmuls; with ``graphs`` also in a CUDA graph); rank-sweep rows only with
    ``sweeps``; with ``timing`` only timing cells (speed and memory claims: a quality cell is trained for
    accuracy); with ``quality`` only the quality cells of a workload that has any (accuracy and compression
    claims)."""
    df = res.runs[res.runs.workload.isin(list(workloads))]
    df = df[paper_execution(df, graphs=graphs)]
    if timing:
        df = timing_cells(df)
    if quality:
        trained = purpose_of(df) == QUALITY
        df = df[trained | ~df.workload.isin(df[trained].workload)]
    return annotate(res, df if sweeps else df[~df.run_id.isin(list(res.sweeps))])


def in_setting(df: pd.DataFrame, gpu: str) -> pd.Series:
    """Annotated runs of the paper-size model on the claim's GPU after their full schedule (accuracy,
    loss and compression claims)."""
    return (df.model_size == "paper") & gpu_rows(df, gpu) & df.full_schedule.astype(bool)


def in_timing_setting(df: pd.DataFrame, gpu: str) -> pd.Series:
    """Annotated timing cells of the paper-size model on the claim's GPU (time and memory claims: the
    steady-state step time of a short run; time ratios then use its stable rows only)."""
    return (df.model_size == "paper") & gpu_rows(df, gpu) & is_timing(df) & (df.status == "ok")


# ------------------------------------------------------------------------------------- judging

def all_of(parts: Iterable[Judgement]) -> Judgement:
    """False if any part fails; else None if some part is not judged (or there is none); else
    :data:`NOISE` if some part is within noise; else True."""
    parts = list(parts)
    if any(p is False for p in parts):
        return False
    if not parts or any(p is None for p in parts):
        return None
    return NOISE if any(p == NOISE for p in parts) else True


def reaches(r: Ratio, least: float, *, below: bool = False) -> Judgement:
    """Whether a measured ratio reaches the paper's number, given its confidence interval
    (harness.results.analysis.interval; a ratio without rounds: its value).

    Args:
        r: the ratio.
        least: the paper's number (a stated speedup or saving; 1 for "faster" or "same direction").
        below: the claim is that the ratio is below ``least`` (e.g. dense faster than CoMERA: < 1).

    Returns:
        True when the whole interval is on the claim's side of ``least`` (at or above it; with ``below``,
        under it), False when the whole interval is on the other side, else :data:`NOISE`.

    Example:
        >>> reaches(Ratio(2.2, 2.1, 2.3, 5, True, ci_low=2.05, ci_high=2.35), 2.0)
        True
        >>> reaches(Ratio(2.2, 2.1, 2.3, 5, True, ci_low=1.9, ci_high=2.5), 2.0)
        'within noise'
    """
    low, high = r.ci_low, r.ci_high
    if below:
        return True if high < least else False if low >= least else NOISE
    return True if low >= least else False if high < least else NOISE


def judge(df: pd.DataFrame, scope: pd.Series,
          measure: Callable[[pd.DataFrame], Finding | None]) -> tuple[Finding | None, list[str]]:
    """The comparison on the rows in the setting, and on each other setting's rows (labelled)."""
    inside = measure(df[scope]) if scope.any() else None
    outside = [f"{found.text} [{label}]" for label, group in df[~scope].groupby("setting", sort=True)
               if (found := measure(group)) is not None]
    return inside, outside


def verdict_of(inside: Finding | None, outside: list[str]) -> str:
    if inside is not None and inside.holds is not None:
        return NOISE if inside.holds == NOISE else HOLDS if inside.holds else FAILS
    return NOT_COMPARABLE if inside is not None or outside else NOT_MEASURED


def make_verdict(inside: Finding | None, outside: list[str], devices: str, settings: str) -> Verdict:
    return Verdict(inside.text if inside else "-", verdict_of(inside, outside), "; ".join(outside) or "-",
                   devices, settings)


def devices_text(df: pd.DataFrame) -> str:
    names = sorted({f"{n} ({d})" for d, n in zip(df.device, df.device_name) if pd.notna(d)})
    return ", ".join(names) or "-"


def judged(ctx: Context, df: pd.DataFrame, measure: Callable[[pd.DataFrame], Finding | None],
            settings: str, scope: pd.Series | None = None) -> Verdict:
    """The verdict on ``scope`` (default: the timing setting, for time and memory claims). "Not measured
    here" becomes "not judged: timing not stable" only when the comparison would have been made had the
    unstable timing rows counted: a claim whose measure uses no time ratio (accuracy, compression, loss)
    is never held back by a noisy timing."""
    scope = in_timing_setting(df, ctx.gpu) if scope is None else scope
    inside, outside = judge(df, scope, measure)
    verdict = make_verdict(inside, outside, devices_text(df), settings)
    unstable = unstable_timing_cells(df) if len(df) else df
    if inside is not None and inside.holds is None and inside.unstable:  # the rest measured, the time not
        verdict.verdict = NOT_STABLE
    if verdict.verdict == NOT_MEASURED and len(unstable):
        trusted = judge(df.assign(timing_quality=STABLE), scope, measure)  # every timing taken as stable
        if trusted[0] is not None or trusted[1]:  # measured, but no stable timing to compare
            verdict.verdict = NOT_STABLE
            verdict.elsewhere = (f"{len(unstable)} timing row(s) measured but not stable, left out (listed "
                                 "below the table)")
    return verdict


# ------------------------------------------------------------------------------------ comparisons

def cells_of(df: pd.DataFrame, method: str, variant: str = "default") -> pd.DataFrame:
    """Ok rows of one method configuration without a target (CoMERA: early stage only)."""
    return df[(df.method == method) & (df.variant == variant) & (df.status == "ok") & df.target_ratio.isna()]


RULES_OF_VARIANT = {
    "paper": "paper rules: gate penalty 0.01, threshold pruning, fixed 2/3 split, two-branch late stage",
    "reach": ("project rules, target as a deadline (reach_target): as below, and the ranks of smallest "
              "share pruned down to a ceiling falling to the target"),
    "default": ("project rules: no early penalty, pruning by a rank's share of its bond, switch once the "
                "loss converged, guarded late stage with a ramped target")}
"""The rank-adaptation rules of the CoMERA variants that the accuracy and compression claims read, in the
order they are read (docs/library-reference.md, "The paper's rules"; docs/recipe.md, "The target as a
deadline")."""
VARIANT_NAMES = {"paper": "paper rules", "reach": "project rules with reach_target",
                 "default": "project rules"}
"""How a report names each of those variants."""


def comera_variants(rows: pd.DataFrame) -> list[str]:
    """The CoMERA variants of :data:`RULES_OF_VARIANT` with ok rows among ``rows``, in its order (the
    first is judged, the others shown beside it); ``["default"]`` where none has."""
    ok = rows[(rows.method == "comera") & (rows.status == "ok")]
    return [v for v in RULES_OF_VARIANT if (ok.variant == v).any()] or ["default"]


def accuracy_cells(df: pd.DataFrame, method: str, variant: str = "default") -> pd.DataFrame:
    """:func:`cells_of`, or for CoMERA without an early-stage-only row its runs with a target (the quality
    cells of config/paper.yaml: the accuracy after the late stage)."""
    cells = cells_of(df, method, variant)
    if len(cells) or method != "comera":
        return cells
    return df[(df.method == method) & (df.variant == variant) & (df.status == "ok")]


def ratios_vs(df: pd.DataFrame, other: str, column: str, keys: Sequence[str] = ("batch_size",),
            other_variant: str = "default") -> dict[Any, Ratio]:
    """key -> ``other``'s column / CoMERA's (harness.results.analysis.pair_ratio: the one time statistic,
    stable rows only, median over seeds), for keys both have."""
    a, b = cells_of(df, other, other_variant), cells_of(df, "comera")
    by_key = dict(iter(b.groupby(list(keys))))
    out = {}
    for key, ra in a.groupby(list(keys)):
        r = pair_ratio(ra, by_key[key], column) if key in by_key else None
        if r is not None and r.value > 0:
            out[key[0] if len(keys) == 1 else key] = r
    return out


LEFT_OUT = "not stable (left out, listed below)"


def no_ratio(rows: pd.DataFrame, other: str, keys: Sequence[Any] | None = None,
              column: str = "batch_size") -> str:
    """Why ``other`` / CoMERA has no time ratio among ``rows`` (at ``keys`` of ``column`` when given):
    :data:`LEFT_OUT` when both ran ok there but a timing was not stable, else "not measured here" with
    what is missing."""
    a, b = cells_of(rows, other), cells_of(rows, "comera")
    if keys is not None:
        a, b = a[a[column].isin(list(keys))], b[b[column].isin(list(keys))]
    if not len(a) or not len(b):
        missing = " and ".join(m for m, x in ((other, a), ("CoMERA", b)) if not len(x))
        return f"not measured here (no ok {missing} row without a target)"
    if not len(stable_only(a)) or not len(stable_only(b)):
        return LEFT_OUT
    return "not measured here (no batch size both have)"


def ratio_value(r: Any) -> float:
    return r.value if isinstance(r, Ratio) else float(r)


def ratio_text(r: Any) -> str:
    """"2.40x [2.31-2.52] (95% CI 2.28-2.55)": the ratio, its IQR and its confidence interval where it has
    them."""
    if not isinstance(r, Ratio):
        return f"{float(r):.2f}x"
    ci = r.ci_text()
    return f"{r.text()} ({ci})" if ci else r.text()


def epoch_kind(rows: pd.DataFrame) -> str:
    """" (extrapolated)" when some epoch time of ``rows`` was not measured whole but extrapolated from
    the steady-state timed steps (mean step x steps per epoch; the rules under the claims say so)."""
    kinds = set(rows.epoch_time_kind.dropna()) if "epoch_time_kind" in rows else set()
    return " (extrapolated)" if kinds - {"measured"} else ""


def directed(ratios: dict, above_one: bool = True, label: Callable[[Any], str] = "batch {}".format) -> str:
    """"same direction, 2.40x [2.31-2.52] (95% CI 2.28-2.55) @ batch 32, ...": whether every ratio's
    confidence interval is on the paper's side of 1 (:func:`reaches`; "opposite direction" when every one
    is on the other side, "within noise of 1" when none is on either, else "mixed directions"); a ratio of
    cells timed in interleaved rounds shows the IQR of its per-round values, one of cells timed apart the
    spread from each side's round-mean quartiles (harness.results.analysis.apart_ratio), each with its
    confidence interval."""
    sides = [reaches(v, 1.0, below=not above_one) if isinstance(v, Ratio)
             else (ratio_value(v) > 1) == above_one for v in ratios.values()]
    word = ("same direction" if all(x is True for x in sides) else
            "opposite direction" if all(x is False for x in sides) else
            "within noise of 1" if all(x == NOISE for x in sides) else "mixed directions")
    return f"{word}, " + ", ".join(f"{ratio_text(v)} @ {label(k)}" for k, v in sorted(ratios.items()))


def seeds_text(rows: pd.DataFrame) -> str:
    """"seed 0" / "seeds 0, 1": the seeds of ``rows``."""
    seeds = sorted(int(x) for x in rows.seed.dropna().unique())
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds)) or '?'}"


def accuracy_text(name: str, rows: pd.DataFrame) -> str:
    """"GaLore 0.998 (seeds 0, 1: median)", with CoMERA's targets where its rows have them ("CoMERA
    targets 0.8 / 0.5 / 0.2: 0.998 / 0.997 / 0.993 (seeds 0, 1: median each)")."""
    several = rows.seed.nunique() > 1
    how = f" ({seeds_text(rows)}{': median' if several else ''}"
    if rows.target_ratio.notna().any():
        by = rows.groupby(rows.target_ratio.fillna(-1.0)).metric_value.median().sort_index(ascending=False)
        targets = " / ".join("none" if t < 0 else f"{t:g}" for t in by.index)
        values = " / ".join(f"{x:.3f}" for x in by)
        each = " each" if several else ""
        return (f"{name} target{'s' if len(by) > 1 else ''} {targets}: {values}{how}{each}, "
                f"median of all {rows.metric_value.median():.3f})")
    return f"{name} {rows.metric_value.median():.3f}{how})"


def kept_accuracy(rows: pd.DataFrame, variant: str = "default") -> pd.DataFrame:
    """CoMERA rows of ``variant`` after the late stage whose accuracy is at most ACCURACY_KEPT below the
    uncompressed model's: dense of the same workload, batch size and seed among ``rows`` (the median over
    the dense seeds where that seed has none; ``dense_seeds`` says which)."""
    comera = rows[(rows.method == "comera") & (rows.variant == variant) & (rows.status == "ok")
                  & rows.late_stage.astype(bool) & (rows.metric_name == "accuracy")]
    dense = cells_of(rows, "dense")
    same = dense.groupby(["workload", "batch_size", "seed"]).metric_value.median()
    pooled = dense.groupby(["workload", "batch_size"])
    ref, seeds = [], []
    for w, b, s in zip(comera.workload, comera.batch_size, comera.seed):
        if (w, b, s) in same.index:
            ref.append(same[(w, b, s)])
            seeds.append(f"seed {int(s)}")
        elif (w, b) in pooled.groups:
            group = pooled.get_group((w, b))
            ref.append(group.metric_value.median())
            seeds.append(f"median of {seeds_text(group)}")
        else:
            ref.append(None)
            seeds.append("")
    keep = [r is not None and pd.notna(r) and m >= r - ACCURACY_KEPT
            for m, r in zip(comera.metric_value, ref)]
    return comera.assign(dense_accuracy=ref, dense_seeds=seeds)[keep]


def size_matched_text(rows: pd.DataFrame, late: pd.DataFrame) -> str:
    """"; at CoMERA target 0.2's reached size (70123 parameters, 7.9x): CoMERA 0.892, size-matched dense
    0.840 (67203 parameters, 8.2x; task-vocabulary, lr 0.001), fixed-rank TT 0.900 (rank 6, 71000
    parameters, 7.8x)" for each target whose reached size a cell of one workload's ``rows`` matched
    (:func:`harness.reports.shared.size_matched`), each side the median over seeds of its accuracy,
    parameters and compression; ", target not reached" where a matched CoMERA cell stopped short. Only
    cells matched to one of ``late`` (CoMERA rows after their late stage), which give the CoMERA side. ""
    without one. Not part of any verdict: the paper has no such baselines."""
    sources_run = set(late.run_id)
    has = pd.Series([size_matched(r).get("run") in sources_run for r in rows.itertuples()],
                    index=rows.index, dtype=bool)
    matched = rows[(rows.status == "ok") & has]
    targets = pd.Series([size_matched(r).get("target") for r in matched.itertuples()], index=matched.index,
                        dtype=float)
    texts = []
    for target, group in matched.groupby(targets, sort=False):
        records = [size_matched(r) for r in group.itertuples()]
        sources = late[late.run_id.isin({m["run"] for m in records})]
        counts = pd.Series([m["params"] for m in records])
        missed = any(m.get("target_reached") is False for m in records)
        name = matched_name(sources.variant.iloc[0] if len(sources) else None)
        head = (f"at {name} target {target:g}'s reached size ({counts.median():.0f} parameters"
                + (f", {sources.compression_total.median():.1f}x" if len(sources) else "")
                + (", target not reached" if missed else "") + ")")
        sides = ([f"CoMERA {sources.metric_value.median():.3f}"] if len(sources) else [])
        for name, cells in (("size-matched dense", group[group.method == "dense"]),
                            ("fixed-rank TT", group[group.method == "comera"])):
            if not len(cells):
                continue
            how = []
            for r in cells.itertuples():
                method = settings_of(r).get("method", {})
                chosen, own = method.get("selection") or {}, size_matched(r)
                how.append(f"{chosen['shape']}, lr {chosen['lr']:.3g}" if chosen else
                           f"rank {own['rank']}" if own.get("rank") is not None else "")
            shown = "/".join(dict.fromkeys(h for h in how if h))
            size = (f"{cells.params_total.median():.0f} parameters, {cells.compression_total.median():.1f}x")
            sides.append(f"{name} {cells.metric_value.median():.3f} ("
                         + (f"{shown}, {size}" if name == "fixed-rank TT" else f"{size}; {shown}") + ")")
        texts.append(f"{head}: {', '.join(sides)}")
    return "".join(f"; {t}" for t in texts)


# --------------------------------------------------------------------------------- C6 (microbench)

PAPER_TABLE = "1000000x128"
"""C6's table (rows x dim): the Criteo-sized one of the micro-benchmarks' paper preset (a test keeps them
equal)."""


def table_memory(row: Any) -> float:
    """Training memory of an embedding table at one lookup, as `comera-bench bench` target 3 counts it:
    parameters + the forward+backward peak (gradients, working memory) - the output (the bytes the row
    recorded)."""
    return row.param_bytes + row.peak_mem_bytes - row.output_bytes


def lookups(res: Results) -> pd.DataFrame:
    """Embedding fwd+bwd microbench rows with ``table`` (rows x dim), ``table_memory`` and ``setting``."""
    mb = res.microbench
    mb = mb[(mb.op == "embedding") & (mb.direction == "fwd_bwd") & mb.peak_mem_bytes.notna()]
    mb = mb.assign(table=mb["shape"].str.split(" ").str[0])
    mb = mb.assign(table_memory=[table_memory(r) for r in mb.itertuples()],
                   setting=[f"{n} ({d}), table {t}" for d, n, t in zip(mb.device, mb.device_name, mb.table)])
    return mb


def lookup_ratios(rows: pd.DataFrame, column: str, a: str, b: str) -> tuple[dict[int, Ratio], list[str]]:
    """Per index count: variant ``a``'s column over ``b``'s (harness.results.analysis.ratio: a time ratio of
    two stable rows, with the spread of each side's rounds), and the rows a time ratio left out."""
    found, left = {}, []
    for tokens, group in rows.groupby("tokens"):
        num, den = (group[group.variant == v] for v in (a, b))
        if not (len(num) and len(den)):
            continue
        r = ratio(num.iloc[0], den.iloc[0], column)
        if r is not None:
            found[int(tokens)] = r
        elif column == CALL_TIME:
            left += [f"{v} @ {tokens} indices" for v, g in ((a, num), (b, den)) if not is_stable(g.iloc[0])]
    return found, left


def lookup_finding(rows: pd.DataFrame, v: dict) -> Finding | None:
    """Optimized vs naive TTM lookup; TTM vs nn.Embedding table memory; nn.Embedding speed vs TTM."""
    if not len(rows):
        return None
    checks = [("naive/optimized TTM time", CALL_TIME, "ttm_naive", "ttm_optimized", v["lookup_speedup_min"]),
              ("naive/optimized TTM peak memory", MEMORY, "ttm_naive", "ttm_optimized",
               v["lookup_memory_min"]),
              ("sparse-grad nn.Embedding/TTM table memory", "table_memory", "sparse_grad", "ttm_optimized",
               v["table_memory_vs_sparse"]),
              ("dense-grad nn.Embedding/TTM table memory", "table_memory", "dense_grad", "ttm_optimized",
               v["table_memory_vs_dense"]),
              ("TTM/sparse-grad nn.Embedding time", CALL_TIME, "ttm_optimized", "sparse_grad", None),
              ("dense-grad nn.Embedding/TTM time", CALL_TIME, "dense_grad", "ttm_optimized", None)]
    texts, parts, left = [], [], []
    for name, column, a, b, least in checks:  # least None: the ratio must exceed 1 (a is slower)
        found, refused = lookup_ratios(rows, column, a, b)
        left += [r for r in refused if r not in left]
        if not found:
            parts.append(None)
            continue
        texts.append(f"{name}: {directed(found, label='{} indices'.format)}")
        parts.append(all_of(reaches(r, 1.0 if least is None else least) for r in found.values()))
    if left:
        texts.append(f"left out, timing not stable: {', '.join(left)}")
    return Finding("; ".join(texts), all_of(parts)) if texts else None


