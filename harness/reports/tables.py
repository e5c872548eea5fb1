"""Tables of one device's results (Markdown + HTML + CSV), rendered from harness.results.analysis.

``python -m harness.reports.tables --results results/<device> --device-label <device> --out figures/``:
the overview, Table 1 (ranks), Table 2 (DLRM), the MNLI size table, every run (docs/pipeline.md).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from harness.reports import feeds, reference
from harness.reports.html import cell_text, markdown_table, write_html
from harness.reports.judging import VARIANT_NAMES
from harness.reports.shared import (GIB, MB, late_stage_missing, method_label, quality_order, report_args,
                                    size_matched, status_note, target_reached, target_shortfall)
from harness.results.analysis import (LEARNING_RISE, LEARNING_TAIL, QUALITY, Results, extra_of, purpose_of,
                                      ranks_of, settings_of, stable, timing_cells)
from harness.results.execution import paper_execution

BYTES_PER_PARAM = 4  # sizes in MB assume float32 parameters (the runs' dtype)


# ---------------------------------------------------------------------------------------------- tables

_RANK_ENTRY = re.compile(r"(.+)\[(\d+)\]")
_BLOCK = re.compile(r"(?:^|\.)(?:layers|layer|blocks|block|h|encoder)\.(\d+)\.")


def _block_index(name: str) -> int | None:
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def ranks_by_step(curves: pd.DataFrame, run_id: str) -> dict[int, dict[str, list[int]]]:
    """step -> {layer: rank list} from a run's ``ranks`` curve rows (metric_name "<layer>[<k>]"),
    recorded by the runner before training, at each stage change and at the end."""
    rows = curves[(curves.run_id == run_id) & (curves.split == "ranks")]
    out: dict[int, dict[str, dict[int, int]]] = {}
    for r in rows.itertuples():
        m = _RANK_ENTRY.fullmatch(r.metric_name)
        if m:
            out.setdefault(int(r.step), {}).setdefault(m.group(1), {})[int(m.group(2))] = int(r.value)
    return {step: {layer: [k[i] for i in sorted(k)] for layer, k in layers.items()}
            for step, layers in sorted(out.items())}


PROJECT_VARIANTS = ("default", "reach")
"""The CoMERA variants of the project's rules Table 1 shows: the library's defaults and reach_target."""


def table1_ranks(res: Results, workload: str = "transformer") -> tuple[pd.DataFrame, str]:
    """Internal TT ranks of the 5th encoder block (the last one when the model has fewer) before
    training, after the early stage (at the stage switch) and after the late stage for each target and
    project variant (:data:`PROJECT_VARIANTS`; a reach_target column says so), from
    the runner's rank records (curves split "ranks": before training, at the switch, at the end), plus
    a last row with the TT size of the whole model in each column. One seed's runs (the smallest seed
    with a finished CoMERA run), named in the note with the seeds left out."""
    runs, source = res.quality_runs(workload)
    comera = quality_order(runs[(runs.method == "comera") & runs.variant.isin(PROJECT_VARIANTS)
                                & paper_execution(runs)])
    finished = comera[comera.status == "ok"]
    if not len(finished):
        return pd.DataFrame(), f"no finished CoMERA run of the {workload} among the {source}"
    seed = finished.seed.min()
    df, comera = finished[finished.seed == seed], comera[comera.seed == seed]
    others = sorted(int(x) for x in set(finished.seed) - {seed})
    columns, notes = _rank_columns(res, df)
    names = sorted({n for ranks, _ in columns.values() for n in ranks})
    blocks = sorted({b for n in names if (b := _block_index(n)) is not None})
    if not blocks:
        return pd.DataFrame(), "no encoder-block layer names found in the runs' ranks"
    block = 4 if 4 in blocks else blocks[-1]
    notes[:0] = ["5th encoder block (index 4)" if block == 4 else
                 f"the model has {len(blocks)} encoder block(s): the last one (index {block}) is shown "
                 "instead of the 5th", f"from the {source} of seed {seed}"
                 + (f" (also run: seed{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}; their "
                    "ranks: table_runs and the curves)" if others else "")]
    early = next((ranks for col, (ranks, _) in columns.items() if col.startswith("after early stage")), None)
    if early is not None and "before training" in columns and early == columns["before training"][0]:
        notes.append("the early stage pruned no rank: by default it trains the TT model on the task loss "
                     "alone and prunes only ranks whose share of their bond fell to the threshold (why: "
                     "docs/recipe.md, \"The early stage\")")
    missing = [f"{_target(r)}: {why}" for r in comera.itertuples() if (why := late_stage_missing(r))]
    if missing:
        notes.append("not measured here: " + "; ".join(missing))
    short = [f"{_target(r)}: {why.removeprefix('target not reached: ')}"
             for r in comera.itertuples() if (why := target_shortfall(r))]
    if short:
        notes.append("targets not reached (the late stage's ranks where it stopped): " + "; ".join(short))
    rows = [{"layer": name, **{col: _ranks_text(ranks.get(name)) for col, (ranks, _) in columns.items()}}
            for name in names if _block_index(name) == block]
    rows.append({"layer": "TT size of the model (scalars)",
                 **{col: "" if size is None else f"{size:.0f}" for col, (_, size) in columns.items()}})
    return (pd.DataFrame(rows), "; ".join(notes) + "; ranks are the internal TT bonds r1-...-r(d-1); the TT "
            "size counts every core and gate of every tensorized layer (before training: after the first "
            "step; after early stage: right after the switch's pruning)")


def _rank_columns(res: Results, df: pd.DataFrame
                  ) -> tuple[dict[str, tuple[dict[str, list[int]], float | None]], list[str]]:
    """Table 1's columns, name -> (layer -> ranks, TT size), and where they come from: before training,
    after the early stage (at the first recorded switch, else at the end of an early-stage-only run) and
    one per target whose late stage ran, in ``df``'s order."""
    records = {rid: ranks_by_step(res.curves, rid) for rid in df.run_id}
    columns, notes = {}, []
    first = next((rid for rid, steps in records.items() if steps), None)
    if first:
        columns["before training"] = (records[first][min(records[first])], res.tt_size(first, first=True))
    targets = [(r, res.switch(r)) for r in df[df.target_ratio.notna()].itertuples()]
    targets = [(r, info) for r, info in targets if info]
    at_switch = next(((r, info) for r, info in targets if info["step"] in records[r.run_id]), None)
    early = df[df.target_ratio.isna()]
    if at_switch:
        r, info = at_switch
        columns["after early stage"] = (records[r.run_id][info["step"]], info["size"])
        notes.append(f"after early stage = ranks at the stage switch (step {info['step']}) of the target-"
                     f"{r.target_ratio:g} run")
    elif len(early):
        columns["after early stage (no switch: end of early-stage-only run)"] = (
            ranks_of(early.iloc[0]), res.tt_size(early.run_id.iloc[0]))
    for r, info in targets:
        columns[f"late stage, {_target(r)}"] = (ranks_of(r), info["size_end"])
    return columns, notes


def _target(row: Any) -> str:
    """"target 0.2", with the variant's name unless it is the library's default rules."""
    variant = "" if row.variant == "default" else f" ({VARIANT_NAMES.get(row.variant, row.variant)})"
    return f"target {row.target_ratio:g}{variant}"


def _ranks_text(r: list[int] | None) -> str:
    return "" if r is None else "-".join(map(str, r[1:-1])) + (" (removed: rank 0)" if 0 in r else "")


QUALITY_CELLS, TIMING_CELLS = "quality cells", "timing cells"
"""Where a Table 2 column comes from (its header names it)."""
KEYS = ["method", "batch_size", "seed"]


def table2_dlrm(res: Results) -> tuple[pd.DataFrame, str]:
    """DLRM: accuracy and normalized cross-entropy from the cells trained to learn, time, size and memory
    from the timing cells.

    Args:
        res: one device's results.

    Returns:
        (table, note): one row per method configuration, batch size and seed of either kind of cell, each
        column headed with the cells it comes from -- "accuracy [quality cells]" and "nce [quality cells]"
        from the DLRM quality cells (:meth:`Results.quality_runs`; the timing cells' where the grid has no
        quality cell, said in the header), "epoch_time_s [timing cells]", "model_MB [timing cells]",
        "compression_total [timing cells]", "peak_mem_MB [timing cells]" from the timing cells (20 steps
        or so: their accuracy stays at the base rate); an empty table and "no DLRM run in this grid"
        without any DLRM row.
    """
    timed = res.main_runs("dlrm")
    trained, source = res.quality_runs("dlrm")
    if not len(timed) and not len(trained):
        return pd.DataFrame(), "no DLRM run in this grid"
    learned = QUALITY_CELLS if source == QUALITY_CELLS else TIMING_CELLS

    def rows_of(df: pd.DataFrame, columns: dict[str, Any]) -> pd.DataFrame:
        out = [{"method": method_label(r), "batch_size": r.batch_size, "seed": r.seed,
                **{name: get(r) for name, get in columns.items()}}
               for _, r in df.sort_values(["method", "variant", "batch_size", "seed"]).iterrows()]
        return pd.DataFrame(out, columns=[*KEYS, *columns])

    def metric(name: str) -> Any:
        def get(r: Any) -> Any:
            value = extra_of(r).get("eval", {}).get(name)  # every metric of the last evaluation
            return r.metric_value if value is None and r.metric_name == name else value
        return get

    quality = rows_of(trained, {f"accuracy [{learned}]": metric("accuracy"),
                                f"nce [{learned}]": metric("nce"), f"status [{learned}]": lambda r: r.status})
    timing = rows_of(timed, {
        f"epoch_time_s [{TIMING_CELLS}]": lambda r: r.epoch_time_s,
        f"model_MB [{TIMING_CELLS}]": lambda r: _mb(r.params_total),
        f"compression_total [{TIMING_CELLS}]": lambda r: r.compression_total,
        f"peak_mem_MB [{TIMING_CELLS}]": lambda r: _mb_bytes(r.peak_mem_bytes),
        f"peak_mem_kind [{TIMING_CELLS}]": lambda r: r.peak_mem_kind,
        f"status [{TIMING_CELLS}]": lambda r: r.status,
        "note": status_note})
    if learned == TIMING_CELLS:  # one kind of cell: one row each
        quality = quality.drop(columns=[f"status [{TIMING_CELLS}]"])
    table = quality.merge(timing, on=KEYS, how="outer").sort_values(KEYS, kind="stable")
    return table.reset_index(drop=True), (
        f"accuracy and nce: the DLRM {learned} (the last evaluation"
        + ("; the timing cells' few steps leave the model at the base rate" if learned == QUALITY_CELLS
           else "; this grid has no DLRM quality cell, so they may stay at the base rate")
        + "); epoch time, size and memory: the timing cells; a row per seed of either; model size = "
        "parameters x 4 bytes (float32), MB = 10^6 bytes")


def table_mnli_size(res: Results) -> tuple[pd.DataFrame, str]:
    """Transformer quality cells (dense, the size-matched dense model, CoMERA per target 0.8, 0.5, 0.2,
    GaLore, LTE): accuracy, eval loss, parameters, total size and tensorized-layer size (MB), compression;
    for CoMERA also the accuracy and TT size at the stage switch and the TT size at the end relative to it.
    The paper's dense size is the last row."""
    runs, source = res.quality_runs("transformer")
    rows = [_size_row(res, r) for r in quality_order(runs).itertuples()]
    data = sorted({str(settings_of(r).get("workload_info", {}).get("data") or "") for r in runs.itertuples()}
                  - {""})
    paper = reference.load()["models"]["transformer_paper"]
    rows.append({"source": "paper (RTX 3090)", "method": "dense (paper shapes)",
                 "total_MB": _mb(paper["params_dense"]),
                 "note": "the paper's model, source below"})
    on_data = (f"data: {', '.join(data)}" + (" (the synthetic NLI task, not MNLI: its accuracies are not "
                                             "the paper's)" if "mnli" not in data else "")
               + "; ") if data else ""
    df = pd.DataFrame(rows)
    return (df,
            f"{on_data}rows from the {source}; accuracy = the last evaluation, eval_loss = its cross-entropy "
            "(it still separates models whose accuracies have saturated), accuracy_at_switch = the one right "
            "after the stage switch; sizes = parameters x 4 bytes (float32), MB = 10^6 bytes; "
            "TT size = scalars in every core and gate (at the switch: after its pruning); end/switch = TT "
            "size at the end / at the switch, to be read against the target; a note \"target reached\" or "
            "\"target not reached\": the run's target_reached (its TT size ends at most 5% above the target, "
            "or within one rank's saving of it: the library's rule); params = parameters of the "
            "trained model; the size-matched models match the parameters a CoMERA cell of the same seed "
            "reached at its target: the dense one is the best on held-out training data of its shapes "
            "(narrower, shallower, a word table over the task's tokens) x three rates, the fixed-rank one "
            "the TT model at the uniform rank nearest that count, trained without rank adaptation (their "
            "notes give the count, the shape and rate, the rank); the paper row is its model at full size "
            "(source: "
            f"{reference.source_text(paper['source'])}); a note \"still "
            f"learning\": its accuracy rose by more than {LEARNING_RISE:g} over its last "
            f"{LEARNING_TAIL:.0%} of steps to less than 1, so it is not a settled result")


def _reached(r: Any) -> str:
    """"target reached" for a CoMERA run with a target that reached it (:func:`target_reached`), else ""
    (a miss is :func:`target_shortfall`'s note)."""
    return "target reached" if target_reached(r) else ""


def _count(value: Any) -> int | None:
    """A number of scalars as an integer (printed 59360, not 5.936e+04), None when unknown."""
    return None if value is None or pd.isna(value) else int(round(float(value)))


def _size_row(res: Results, r: Any) -> dict[str, Any]:
    info = res.switch(r) if r.method == "comera" else {}
    size_end = res.tt_size(r.run_id) if r.method == "comera" else None
    return {"source": f"ours ({res.label})", "method": method_label(r), "batch_size": r.batch_size,
            "seed": r.seed, "accuracy": r.metric_value if r.metric_name == "accuracy" else None,
            "eval_loss": extra_of(r).get("eval", {}).get("loss"),
            "accuracy_at_switch": info.get("accuracy"), "tt_size_at_switch": _count(info.get("size")),
            "tt_size_end": _count(size_end),
            "end/switch": size_end / info["size"] if size_end and info.get("size") else None,
            "target": r.target_ratio, "params": _count(r.params_total), "total_MB": _mb(r.params_total),
            "tensorized_layers_MB": _mb(r.params_factorized_layers),
            "compression_total": r.compression_total, "compression_layers": r.compression_layers,
            "note": "; ".join(filter(None, (status_note(r) or late_stage_missing(r), target_shortfall(r),
                                            _reached(r),
                                            matched_note(r), res.still_learning(r))))}


def matched_note(row: Any) -> str:
    """What a size-matched row matches and what it is: "matches CoMERA target 0.2 (reached): 70123
    parameters; chosen on held-out training data of 9: task-vocabulary (d_model 48, d_ff 192, num_layers
    2, task_vocabulary 102), lr 0.001" (the dense model; "(held-out accuracy tied for 9: chosen by held-out
    loss)" after it where the choice's scores tied) or "...; rank 6 (TTM 12)" (the fixed-rank TT
    model); "" for other rows."""
    m = size_matched(row)
    if not m:
        return ""
    reached = {True: " (reached)", False: " (not reached)"}.get(m.get("target_reached"), "")
    target = f" target {m['target']:g}{reached}" if m.get("target") is not None else ""
    text = f"matches CoMERA{target}: {m['params']} parameters"
    chosen = settings_of(row).get("method", {}).get("selection") or {}
    if chosen:
        dims = ", ".join(f"{k} {v}" for k, v in chosen["dims"].items())
        text += (f"; chosen on held-out training data of {len(chosen['candidates'])}: {chosen['shape']} "
                 f"({dims}), lr {chosen['lr']:.3g}")
        if (chosen.get("tied") or 1) > 1:
            text += f" (held-out {chosen['metric']} tied for {chosen['tied']}: chosen by held-out loss)"
    if m.get("rank") is not None:
        ttm = f" (TTM {m['embedding_rank']})" if m.get("embedding_rank") is not None else ""
        text += f"; rank {m['rank']}{ttm}"
    return text


NOT_TIMED = "not a timing result (quality cell)"
"""table_runs' ``timing_quality`` of a quality cell, whatever its own verdict."""


def table_runs(res: Results) -> tuple[pd.DataFrame, str]:
    """Every run: status, step/epoch time, peak memory, quality and compression; a quality cell's
    ``timing_quality`` is :data:`NOT_TIMED` (its times are not speed results)."""
    cols = ["run_id", "purpose", "seed", "status", "step_time_ms", "step_time_ms_iqr", "timing_quality",
            "run_queue_frac", "epoch_time_s", "epoch_time_kind", "peak_mem_bytes", "peak_mem_kind",
            "metric_name", "metric_value", "compression_total", "error"]
    df = res.runs[cols].copy()
    df["peak_mem_MB"] = df.pop("peak_mem_bytes").map(_mb_bytes)
    df.insert(df.columns.get_loc("error"), "resumed_at", [resumed_at(row) for row in res.runs.itertuples()])
    df.insert(df.columns.get_loc("error"), "timed_alone",
              ["yes" if timed_alone(row) else "" for row in res.runs.itertuples()])
    df.insert(df.columns.get_loc("error"), "compiled", [compiled(row) for row in res.runs.itertuples()])
    df.insert(df.columns.get_loc("error"), "periodic_work",
              [periodic_work(row) for row in res.runs.itertuples()])
    df["error"] = df["error"].fillna("").str.slice(0, 80)
    df["purpose"] = purpose_of(df)
    df.loc[df.purpose == QUALITY, "timing_quality"] = NOT_TIMED
    return df.sort_values("run_id").reset_index(drop=True), (
        "peak_mem_MB = peak_mem_bytes / 10^6; timing_quality: 'stable' or 'noisy: <reasons>' "
        f"(docs/measurement.md), or '{NOT_TIMED}': a quality cell's step_time_ms, epoch_time_s and "
        "run_queue_frac are no speed result (trained for accuracy, it runs beside other cells where the "
        "pipeline's --cores allows; speed comes from the timing cells, which run alone); run_queue_frac: "
        "share of its runnable time the cell's threads waited for a CPU; resumed_at: the steps a stopped "
        "cell resumed at from its checkpoint (its step times and memory: its last process's); "
        "timed_alone: a timing cell that ran out of memory beside the other cells of its timing group and"
        " was timed by itself after them (its time ratios are of cells timed apart); compiled: a compiled"
        " cell's graphs and graph breaks under torch.compile, and its eager fallbacks (code Dynamo left "
        "to run eagerly, e.g. past its recompile limit); with a break or a fallback its steps were timed "
        "partly eager; periodic_work: how the method's periodic work entered its step times "
        "(docs/measurement.md, \"Periodic work\")")


def periodic_work(row: Any) -> str:
    """How each periodic work of a row's method entered its step times (``extra.periodic``), e.g.
    "galore projection every 20: forced (step 9, +41.2 ms)"; "" for a method without any."""
    parts = []
    for name, entry in extra_of(row).get("periodic", {}).items():
        steps = ", ".join(map(str, entry.get("steps", [])))
        cost = f", {entry['extra_ms']:+.1f} ms" if isinstance(entry.get("extra_ms"), (int, float)) else ""
        parts.append(f"{name} every {entry.get('every')}: {entry.get('how')}"
                     + (f" (step {steps}{cost})" if steps else ""))
    return "; ".join(parts)


def resumed_at(row: Any) -> str:
    """The steps at which a cell resumed from its checkpoint (``extra.resumed``), "" when it never did."""
    return ", ".join(str(entry["step"]) for entry in extra_of(row).get("resumed", []))


def timed_alone(row: Any) -> str:
    """Why a cell of a timing group was timed by itself after its group (``extra.timed_alone``), "" when
    not."""
    return str(extra_of(row).get("timed_alone") or "")


def compiled(row: Any) -> str:
    """What torch.compile made of a compiled cell's model (``extra.compile``, harness.running.compiled):
    "2 graphs, 1 break", with "; eager fallback: <reason>" where Dynamo left code to run eagerly; "" for
    an eager cell."""
    report = extra_of(row).get("compile")
    if report is None:
        return ""
    graphs, breaks = report.get("graphs", 0), report.get("graph_breaks", 0)
    text = f"{graphs} graph{'' if graphs == 1 else 's'}, {breaks} break{'' if breaks == 1 else 's'}"
    fallbacks = report.get("eager_fallbacks") or []
    return text + (f"; eager fallback: {', '.join(fallbacks)}" if fallbacks else "")


def compile_trouble(row: Any) -> str:
    """The :func:`compiled` text of a compiled cell whose graph broke or that fell back to eager, else ""."""
    report = extra_of(row).get("compile") or {}
    return compiled(row) if report.get("graph_breaks") or report.get("eager_fallbacks") else ""


def group_gpu_memory(runs: pd.DataFrame) -> str:
    """Per timing group, the most GPU memory in use by every process when one of its cells' steps ended
    (``extra.memory.device_in_use_bytes``): about what the group needs at once; "" without such readings."""
    found: dict[str, tuple[int, int]] = {}
    for row in runs.itertuples():
        memory = extra_of(row).get("memory") or {}
        used, total = memory.get("device_in_use_bytes"), memory.get("device_total_bytes")
        group = row.timing_group if isinstance(row.timing_group, str) and row.timing_group else None
        if group and used and total and used > found.get(group, (0, 0))[0]:
            found[group] = (int(used), int(total))
    return "; ".join(f"{group} {used / GIB:.1f} of {total / GIB:.1f} GiB"
                     for group, (used, total) in sorted(found.items()))


def _values(series: pd.Series) -> str:
    values = sorted({str(v) for v in series.dropna() if str(v)})
    return ", ".join(values) if values else "-"


def overview(res: Results) -> tuple[pd.DataFrame, str]:
    """What the run was: device, software, machine, when, and its cells by purpose and outcome."""
    runs = res.runs
    timed = timing_cells(runs)
    ok_timed = timed[timed.status == "ok"]
    started = runs.started_at.dropna().sort_values()
    counts = runs.assign(purpose=purpose_of(runs)).groupby(["purpose", "status"]).size()
    rows = [("device", f"{res.label}: {_values(runs.device_name)} ({_values(runs.device)})"),
            ("torch / CUDA / Python", f"{_values(runs.torch_version)} / {_values(runs.cuda_version)} / "
                                      f"{_values(runs.python_version)}"),
            ("torch threads per cell", _values(runs.num_threads)),
            ("comera-bench version, git commit", f"{_values(runs.comera_bench_version)}, "
                                                 f"{_values(runs.git_commit.str.slice(0, 12))}"
                                                 + (" (uncommitted changes)"
                                                    if runs.git_dirty.fillna(False).any() else "")),
            ("host", _values(runs.hostname)),
            ("cells started", f"{started.iloc[0]} to {started.iloc[-1]}" if len(started) else "-"),
            ("cells", ", ".join(f"{n} {purpose} {status}"
                                for (purpose, status), n in counts.items()) or "none"),
            ("timing cells stable", f"{int(stable(ok_timed).sum())} of {len(ok_timed)} ok timing cells "
                                    "(the others are left out of every time ratio)")]
    for label, named_by, where in (
            ("cells resumed from a checkpoint", resumed_at, "table_runs: resumed_at"),
            ("cells timed alone after running out of memory beside their timing group", timed_alone,
             "table_runs: timed_alone; their ratios are of cells timed apart"),
            ("compiled cells with graph breaks or an eager fallback", compile_trouble,
             "table_runs: compiled; their steps ran partly or wholly outside compiled graphs"),
            ("quality cells still learning at their end (accuracy not settled: train longer)",
             res.still_learning, "table_mnli_size: note")):
        named = sorted(row.run_id for row in runs.itertuples() if named_by(row))
        if named:
            rows.append((label, f"{len(named)} ({where}): " + ", ".join(named)))
    footprint = group_gpu_memory(runs)
    if footprint:
        rows.append(("GPU memory in use by each timing group (every process on the GPU, read when a cell's "
                     "steps ended; the largest reading of the group)", footprint))
    return pd.DataFrame(rows, columns=["", "this run"]), (
        "Figures: figures/*.png; the paper's claims judged: claims.md; every run: table_runs; the measuring "
        "method: docs/measurement.md")


def with_not_drawn(df: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """The overview with a row naming the figures not drawn and what each would need."""
    if not names:
        return df
    text = "; ".join(f"{name}: needs {feeds.NEEDS[name]}" for name in names)
    return pd.concat([df, pd.DataFrame([("figures not drawn (the grid cannot feed them)", text)],
                                       columns=df.columns)], ignore_index=True)


TABLES = {"overview": overview, "table1_ranks": table1_ranks, "table2_dlrm": table2_dlrm,
          "table_mnli_size": table_mnli_size, "table_runs": table_runs}
QUALITY_TABLES = ("table1_ranks", "table_mnli_size")  # from the quality cells: their settings
TITLES = {"overview": "Run overview", "table1_ranks": "Table 1: TT ranks (transformer)",
          "table2_dlrm": "Table 2: DLRM",
          "table_mnli_size": "Transformer (NLI task: MNLI or synthetic, see the note) accuracy and size, "
                             "per method and target",
          "table_runs": "All runs"}


def _mb(params: Any) -> float | None:
    return None if pd.isna(params) else round(float(params) * BYTES_PER_PARAM / MB, 3)


def _mb_bytes(n: Any) -> float | None:
    return None if pd.isna(n) else round(float(n) / MB, 3)


INTEGER_COLUMNS = ("batch_size", "seed", "seq_len", "rank", "params", "tt_size_at_switch", "tt_size_end",
                   "steps_timed")
"""Columns of whole numbers: written as such (32, not 32.0) where a row without one (the paper's) made
them float."""


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its :data:`INTEGER_COLUMNS` as nullable integers."""
    out = df.copy()
    for col in INTEGER_COLUMNS:
        if col in out and pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].round().astype("Int64")
        elif col in out and out[col].dtype == object:
            values = [None if v is None or pd.isna(v) else v for v in out[col]]
            if all(v is None or float(v).is_integer() for v in values):
                out[col] = pd.array([None if v is None else int(v) for v in values], dtype="Int64")
    return out


def write_table(df: pd.DataFrame, note: str, title: str, out: Path, name: str, settings: str) -> None:
    """``name``.md (title, note, settings, table or "not measured") and ``name``.csv; whole-number
    columns typed (:func:`typed`)."""
    out.mkdir(parents=True, exist_ok=True)
    df = typed(df)
    df.to_csv(out / f"{name}.csv", index=False)
    note, settings = cell_text(note), cell_text(settings)  # they hold values from the rows
    body = markdown_table(df, ".4g") if len(df) else f"Not measured here: {note}."
    text = f"# {title}\n\n{body}\n\n{note}.\n\nSettings: {settings}\n" if len(df) else (
        f"# {title}\n\n{body}\n\nSettings: {settings}\n")
    (out / f"{name}.md").write_text(text)
    write_html(out / f"{name}.md")


def main(argv: list[str] | None = None) -> int:
    args, res = report_args("python -m harness.reports.tables", __doc__.splitlines()[0], argv, not_drawn=True)
    quality = res.settings_line("transformer", res.quality_runs("transformer")[0])
    for name, build in TABLES.items():
        df, note = build(res)
        if name == "overview":
            df = with_not_drawn(df, args.not_drawn)
        settings = quality if name in QUALITY_TABLES else res.settings_line()
        write_table(df, note, TITLES[name], Path(args.out), name, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
