"""A cell's state and the ``runs`` row it becomes.

:class:`CellState` holds what a run of one cell has found so far; :func:`build_row` turns it, partial or
complete, into the row, for the runner and the supervisor alike.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import torch

from harness import results
from harness.core import interleave, measure, timing
from harness.spec import PURPOSES, Spec
from harness.running import compiled

if TYPE_CHECKING:
    from harness.core.interleave import RoundGate
    from harness.running.cudagraph import GraphedStep
    from harness.running.watchdog import Watchdog


@dataclass(frozen=True)
class AfterSteps:
    """What run_cell's ``after_steps`` gets: the trained cell, after its last training step."""

    prepared: Any
    workload: Any
    device: torch.device
    batch: Any
    """The first training batch."""
    steps_done: int
    run_id: str


@dataclass
class StartUp:
    """What a cell did before its first timing round (the row's diagnostics)."""

    allocator: str = ""
    """What the allocator policy did (harness.core.allocator.policy)."""
    warm_up: str | None = None
    """The warm-up's outcome ("ok", or why not; harness.running.warmup)."""
    warm_up_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    """Where the time before the first timing round went: phase -> seconds
    (harness.running.run.START_PHASES)."""
    phase_mark: float | None = None
    """perf_counter at the end of the last recorded phase (None: the first round has begun)."""
    alone: str | None = field(default_factory=interleave.alone_reason)
    """Why this cell of a timing group is timed by itself after its group (harness.core.interleave.run_alone),
    or None."""


@dataclass
class TimedRounds:
    """The timed steps: their timer, the timing rounds and the machine's state while they ran."""

    timer: measure.StepTimer | None = None
    machine: timing.MachineState | None = None
    gate: RoundGate | None = None
    rounds: timing.Rounds | None = None
    """where the timing rounds start and whether they hold whole periods of the method's periodic work"""
    round_starts: dict[int, int] = field(default_factory=dict)
    """step index (0-based) -> the timing round that starts before it"""
    waited_s: float = 0.0
    """seconds spent waiting for the timing group (outside every clock and the time limit)"""
    group_start_s: float | None = None
    """seconds from the timing group's start to its first round (None: not timed in a group's rounds)"""
    first_step: int = 0
    """the index (0-based, among all the cell's steps) of this process's first step (> 0 when resumed)"""
    periodic: dict[str, timing.PeriodicPlan] = field(default_factory=dict)
    """how each periodic work of the method is timed (harness.core.timing.plan_periodic)"""
    force_at: dict[int, str] = field(default_factory=dict)
    """step index -> the periodic work the method is made to do at that step (a forced plan's step)"""


@dataclass
class CellState:
    """Everything a run of one cell has found so far (partial on failure).

    Args:
        spec: the cell. Every other field starts empty; harness.running.run fills them while it trains.
            A state with only the spec gives the row of a run that got nowhere.
    """

    spec: Spec
    start: StartUp = field(default_factory=StartUp)
    timed: TimedRounds = field(default_factory=TimedRounds)
    device: torch.device | None = None
    workload: Any = None
    method: Any = None
    prepared: Any = None
    monitor: measure.MemoryMonitor | None = None
    memory: measure.MemoryReading | None = None
    epoch_clock: measure.Stopwatch | None = None
    full_epochs_s: list[float] = field(default_factory=list)
    steps_done: int = 0
    steps_in_epoch: int = 0
    losses: list[float] = field(default_factory=list)
    last_eval: dict[str, Any] = field(default_factory=dict)
    last_eval_step: int = -1
    curves: list[dict[str, Any]] = field(default_factory=list)
    flops_initial: int | None = None
    flops_tokens: dict[str, int] = field(default_factory=dict)
    flops_basis: dict[str, Any] = field(default_factory=dict)
    graphed: GraphedStep | None = None
    train_model: Any = None
    """The model the steps run (prepared.model, or its torch.compile wrapper: :func:`model_to_train`)."""
    compile_counters: compiled.Counts | None = None
    """Dynamo's counters when the compile wrapper was made (None: the cell has none)."""
    after_steps: Callable[[AfterSteps], None] | None = None
    stage: Any = None
    stage_switch_step: int | None = None
    epoch: int = 0
    activity: str = ""
    watchdog: Watchdog | None = None
    checkpoint: Any = None
    """Where and how often this run writes its checkpoint (harness.running.checkpoint.Checkpointing; None:
    never)."""
    stop: Any = None
    """The process's stop policy (harness.core.stops.CellStop; None: none installed)."""
    resumed: list[dict[str, Any]] = field(default_factory=list)
    """One entry per checkpoint this cell resumed from, oldest first: its step and when it was written."""
    train_s_before: float = 0.0
    """Seconds of training (against the time limit) that earlier processes spent, up to the checkpoint."""
    training_started: float | None = None
    """perf_counter when this process's first training step began."""
    checkpoint_s: float = 0.0
    """Seconds this process spent writing checkpoints (outside every clock and the time limit)."""
    checkpoints_written: int = 0
    last_checkpoint_step: int | None = None
    checkpoint_error: str = ""
    """The last checkpoint that could not be written: after which step, and why."""
    last_checkpoint: float | None = None
    """perf_counter after the last checkpoint written (or at the first training step)."""


def training_s(st: CellState) -> float:
    """Seconds of training so far against ``budget.time_limit_s``: from this process's first training step,
    less its waits for the timing group and its checkpoint writes, plus earlier processes' (a resumed
    cell)."""
    return st.train_s_before + time.perf_counter() - st.training_started - st.timed.waited_s - st.checkpoint_s


def model_to_train(st: CellState, model: torch.nn.Module) -> Any:
    """The model a cell's steps run: ``model`` itself, or for a compiled cell (``execution.compile``) its
    ``torch.compile`` wrapper, with Dynamo's counters at that moment kept in ``st.compile_counters`` (the
    row's ``extra["compile"]`` counts from there).

    Args:
        st: the cell's state (its normalized spec).
        model: the prepared model.

    Returns:
        The model or its compile wrapper.
    """
    if not st.spec.execution.compile:
        return model
    st.compile_counters = compiled.snapshot()
    return torch.compile(model)


def build_row(st: CellState, status: str, error: str, tb: str = "") -> dict[str, Any]:
    """The runs row of ``st``: every ``harness.results.RUNS_COLUMNS`` key, None where nothing was found.

    Args:
        st: the cell's state, partial or complete.
        status: ok | oom | diverged | error | timeout.
        error: the message of a failed run ("" for ok).
        tb: the tail of the traceback, kept in ``extra`` ("" for none).
    """
    spec, ex = st.spec, st.spec.execution
    if st.start.alone and status == "oom":
        error = f"{error} (alone too: this cell does not fit the machine's memory by itself)"
    device = st.device or torch.device("cpu")
    row: dict[str, Any] = {c: None for c in results.RUNS_COLUMNS}
    row.update(results.provenance(device))
    row.update(cell_hash=spec.cell_hash, execution_hash=spec.execution_hash,  # what the cell ran with
               matmul_precision=ex.matmul_precision, cuda_graph=ex.cuda_graph, compile=ex.compile)
    prepared, workload = st.prepared, st.workload
    settings = dict(prepared.settings) if prepared is not None else {}
    row.update(run_id=spec.run_id, purpose=spec.purpose, workload=spec.workload, method=spec.method,
               variant=spec.variant, batch_size=spec.batch_size, target_ratio=spec.target_ratio,
               seed=spec.seed,
               seq_len=getattr(workload, "seq_len", None),
               rank=_rank_setting(settings, spec.method_params, prepared, workload), status=status,
               error=error)
    extra: dict[str, Any] = {}
    if st.start.alone:
        extra["timed_alone"] = st.start.alone
    if tb:
        extra["traceback"] = tb
    if st.start.warm_up_s is not None:
        extra["warm_up_s"] = st.start.warm_up_s
    if st.start.phases:
        extra["start_phases_s"] = {k: round(v, 3) for k, v in st.start.phases.items()}
    timer = st.timed.timer
    if timer is not None:
        summary = timer.summary(window=settings.get("time_window_steps"))
        weighted = _weighted(st)
        if weighted is not None:  # periodic work timed apart: added at its rate
            summary["step_time_ms_mean"] = weighted.mean_ms
            summary["step_time_mean_basis"] = ("ordinary timed steps + each periodic work's extra time over "
                                               "its period (extra.periodic)")
        row.update(step_time_ms=summary["step_time_ms"], step_time_ms_iqr=summary["step_time_ms_iqr"],
                   steps_timed=summary["steps_timed"])
        row.update(_timing_columns(st, summary, weighted))
        if summary["steps_timed"]:
            row["samples_per_s"] = spec.batch_size * 1e3 / summary["step_time_ms"]
            row["epoch_time_s"], row["epoch_time_kind"] = measure.epoch_time(
                st.full_epochs_s, mean_step_ms=summary["step_time_ms_mean"],
                steps_per_epoch=workload.steps_per_epoch)
        rounds = st.timed.rounds
        extra.update(step_ms=[round(ms, 4) for ms in timer.all_ms], step_round=timer.all_rounds,
                     step_time_ms_mean=summary["step_time_ms_mean"],
                     step_time_mean_basis=summary["step_time_mean_basis"], full_epochs_s=st.full_epochs_s,
                     round_alignment=rounds.alignment if rounds is not None else None,
                     steps_done=st.steps_done, warmup_steps=timer.warmup_steps)
        if st.timed.periodic:
            extra["periodic"] = _periodic_record(st, weighted)
    if st.memory is not None:
        row.update(peak_mem_bytes=st.memory.peak_mem_bytes, peak_mem_kind=st.memory.peak_mem_kind,
                   cuda_reserved_bytes=st.memory.cuda_reserved_bytes)
        extra["memory"] = st.memory.details
    if prepared is not None:
        row["state_bytes"] = _state_bytes(prepared)
        row.update(_size_columns(prepared))
        row["ranks"] = json.dumps(prepared.ranks() or {})
        reached = (settings.get("outcome") or {}).get("reached")  # a method with a size target: its verdict
        row["target_reached"] = None if reached is None else bool(reached)
        if st.flops_tokens:
            row["flops_per_step"], _ = measure.flops_per_step(prepared.model, st.flops_tokens)
            extra.update(flops_per_step_initial=st.flops_initial, **st.flops_basis)
    if workload is not None:
        row["metric_name"] = st.last_eval.get("metric_name", workload.metric_name)
        row["metric_value"] = st.last_eval.get("metric_value")
        if st.steps_in_epoch:
            row["epochs"] = st.steps_done / st.steps_in_epoch
    if st.losses:
        window = st.losses[-results.FINAL_LOSS_WINDOW:]
        row["final_train_loss"] = float(np.mean(window))
        extra["final_train_loss_window"] = len(window)
    if st.last_eval:
        extra["eval"] = {k: v for k, v in st.last_eval.items() if isinstance(v, (int, float, str))}
        extra["eval_step"] = st.last_eval_step
    if st.graphed is not None:
        extra["cuda_graph"] = st.graphed.stats()
    if st.compile_counters is not None:
        extra["compile"] = compiled.report(st.compile_counters)
    if st.resumed:
        extra["resumed"] = st.resumed
    if st.checkpoints_written or st.checkpoint_error:
        extra["checkpoints"] = {"written": st.checkpoints_written, "seconds": round(st.checkpoint_s, 3)}
        if st.checkpoint_error:
            extra["checkpoints"]["last_error"] = st.checkpoint_error
    row["settings"] = json.dumps({
        "method": settings, "method_params": spec.method_params, "workload_params": spec.workload_params,
        "workload_info": getattr(workload, "info", {}), "steps_per_epoch":
            getattr(workload, "steps_per_epoch", None), "steps_in_epoch": st.steps_in_epoch,
        "budget": spec.budget.as_dict(), "execution": ex.as_dict(),
        "allocator": st.start.allocator, "warm_up": st.start.warm_up},
        sort_keys=True, default=str)
    row["extra"] = json.dumps(extra, sort_keys=True, default=str)
    return _integral(row)


def _weighted(st: CellState) -> timing.Weighted | None:
    """The cell's step times with the periodic work timed apart at its rate (harness.core.timing
    .weigh_periodic), None when none was timed apart."""
    timer = st.timed.timer
    index = [st.timed.first_step + i for i in timer.timed_index]
    return timing.weigh_periodic(timer.timed_ms, index, timer.timed_rounds, st.timed.periodic)


def _periodic_record(st: CellState, weighted: timing.Weighted | None) -> dict[str, Any]:
    """``extra.periodic``: name -> every, how (harness.core.timing.PeriodicPlan), the steps that did it,
    their times, the extra time over an ordinary step (its median) and the sentence ``timed``."""
    timer, first = st.timed.timer, st.timed.first_step
    times = dict(zip((first + i for i in timer.timed_index), timer.timed_ms))
    out = {}
    for name, plan in st.timed.periodic.items():
        entry = {"every": plan.every, "how": plan.how, "steps": list(plan.steps),
                 "step_ms": [round(times[s], 4) for s in plan.steps if s in times], "timed": plan.text(name)}
        if weighted is not None and name in weighted.extra_ms:
            entry["extra_ms"] = round(weighted.extra_ms[name], 4)
        out[name] = entry
    return out


def _timing_columns(st: CellState, summary: dict[str, Any], weighted: timing.Weighted | None = None
                    ) -> dict[str, Any]:
    """The machine's state while the steps ran, the per-round medians and means (with periodic work timed
    apart: ``weighted``'s), and the stability verdict (with periodic work timed apart: of the ordinary
    steps, plus a periodic work that could not be timed)."""
    ex, timed, alone = st.spec.execution, st.timed, st.start.alone
    timer = timed.timer
    state = timed.machine.columns() if timed.machine is not None else {}
    medians = timing.round_medians(timer.timed_ms, timer.timed_rounds)
    means = weighted.round_means if weighted is not None else timing.round_means(timer.timed_ms,
                                                                                 timer.timed_rounds)
    steps = weighted.ordinary_ms if weighted is not None else timer.timed_ms
    median, iqr = measure.median_iqr(steps)
    cols = {**state, "timing_group": None if alone else ex.timing_group or None,
            "group_start_s": timed.group_start_s,
            "cpu_time_ratio": timing.cpu_time_ratio(timer.timed_cpu_ms, timer.timed_ms, ex.num_threads),
            "round_step_ms": json.dumps(medians) if medians else None,
            "round_step_mean_ms": json.dumps(means) if means else None}
    cols["timing_quality"] = timing.judge(
        step_time_ms=median, step_time_ms_iqr=iqr, steps_timed=summary["steps_timed"],
        step_time_ms_mean=(statistics.fmean(steps) if weighted is not None and steps
                           else summary["step_time_ms_mean"]),
        run_queue_frac=state.get("run_queue_frac"), cpu_pressure=state.get("cpu_pressure"),
        outside_rounds=bool(ex.timing_group) and not alone and timed.group_start_s is None,
        period=timed.rounds.period if timed.rounds is not None else None, round_means=means,
        step_ms=timer.timed_ms, step_index=timer.timed_index,
        untimed=[plan.text(name) for name, plan in timed.periodic.items()
                 if plan.how == timing.NOT_TIMED and st.spec.purpose != PURPOSES[1]])
    return cols


def _integral(row: dict[str, Any]) -> dict[str, Any]:
    """Integer columns hold ints (a method may count parameters as floats)."""
    for col, typ in results.RUNS_TYPES.items():
        value = row[col]
        if typ == pa.int64() and isinstance(value, float):
            row[col] = int(round(value)) if math.isfinite(value) else None
    return row


def _state_bytes(prepared: Any) -> int:
    """The method's own count when it has one (``prepared.state_bytes()``, e.g. layer-wise optimizers
    that Prepared.optimizers does not list), else baselines.base.state_bytes."""
    own = getattr(prepared, "state_bytes", None)
    if callable(own):
        return int(own())
    from baselines.base import state_bytes

    return state_bytes(prepared.model, prepared.optimizers)


def _size_columns(prepared: Any) -> dict[str, Any]:
    size = dict(prepared.size() or {})
    if not size:
        total = sum(p.numel() for p in prepared.model.parameters())
        size = {"params_total": total, "params_factorized_layers": None, "compression_total": 1.0,
                "compression_layers": None}
    keys = ("params_total", "params_factorized_layers", "compression_total", "compression_layers")
    return {k: size.get(k) for k in keys}


def _as_rank(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return None


def _rank_setting(settings: dict, method_params: dict, prepared: Any, workload: Any) -> int | None:
    """The run's rank. For a TT method, the largest internal TT rank of the model as built (its
    conversion report in the settings, else the workload's tt_spec): a requested rank the shapes cannot
    hold is clipped there, and the row says what was built (the request stays in the settings).
    Otherwise the method's ``rank`` setting."""
    built = settings.get("conversion", {}).get("layers") if prepared is not None else None
    if built:
        return _largest_rank(built.values(), "ranks")
    rank = _as_rank(settings.get("rank", method_params.get("rank")))
    if rank is not None or prepared is None or not prepared.ranks() or workload is None:
        return rank
    return _largest_rank(workload.tt_spec.values(), "rank")


def _largest_rank(entries: Any, key: str) -> int | None:
    """The largest internal bond of the linear entries' ranks (all entries when none is linear)."""
    entries = list(entries)
    linear = [e for e in entries if e.get("kind") == "linear"] or entries
    internal = [r[1:-1] if isinstance(r, (list, tuple)) and len(r) > 2 else r
                for r in (e.get(key) for e in linear)]
    found = [r for r in map(_as_rank, internal) if r is not None]
    return max(found) if found else None

