"""Running one grid cell: a spec (harness.spec, docs/usage.md) in, one ``runs`` row and its ``curves`` out.

The training loop on one harness.running.cell.CellState. :func:`run_cell` never raises for a failure of
the run itself: the row's ``status`` (ok | oom | diverged | error | timeout) and ``error`` say what
happened; :func:`run_to_files` (``comera-bench run``) also arms the watchdog. Statuses and limits:
docs/usage.md; curves: docs/schema.md; the loop's details: docs/design-notes.md.
"""
from __future__ import annotations

import errno
import gc
import itertools
import math
import numbers
import os
import random
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from harness import results
from harness import spec as specs
from harness.core import allocator, stops
from harness.running import progress as progress_lines
from harness.running import checkpoint as checkpoints
from harness.running import warmup
from harness.core import measure, timing
from harness.running.cudagraph import GraphedStep, require_cuda, state_signature
from harness.core.interleave import RoundGate
from harness.running.cell import AfterSteps, CellState, build_row, model_to_train, training_s
from harness.running.registry import Registry, cell_spec, default_registry
from harness.running.watchdog import STALL_ENV, STALL_LIMIT_S, Watchdog, stall_limit_s  # noqa: F401 -- re-exported

START_PHASES: dict[str, str] = {
    "start": "from the cell's first process start (its supervisor's, when isolated) to the run: interpreters "
             "and imports",
    "warm_up": "the throwaway training step on the tiny instance (harness.running.warmup)",
    "start_turn": "waiting for a start turn (a timing group lets a few cells build and run their warm-up "
                  "steps at a time)",
    "build": "building the workload: its model and data",
    "prepare": "preparing the method (conversion, optimizers; CUDA graph and compile wrappers)",
    "flops": "counting the tokens for FLOPs per step (harness.core.measure.measure_flops) "
             "and the first ranks",
    "eval": "the evaluation before the first step (none in a cell of a timing group)",
    "memory_baseline": "the full garbage collection and the memory monitor's baseline",
    "warmup_steps": "the budget's warm-up training steps before the first round (CUDA graph capture "
                    "included)",
    "gate": "waiting at the first round for the timing group's other cells",
}
"""The phases of a cell's time before its first timing round, in order (``extra["start_phases_s"]``; the
timing group's log line names the slowest cell's). A phase a cell does not reach or does not have is
absent."""

WATCHDOG_GRACE_S = 30.0
"""How long a step or evaluation may run past budget.time_limit_s before the watchdog ends the cell."""

ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
EXIT_ENVIRONMENT_FAULT = 75
"""Exit status (EX_TEMPFAIL) of a cell whose row could not be written for a fault of the machine (a full
disk, a quota, a read-only file system): no row, so that a later run, after the fault is fixed, runs it."""


class EnvironmentFault(OSError):
    """The row could not be written for a fault of the machine, not of the cell."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------- the run

class _Diverged(Exception):
    pass


class _Timeout(Exception):
    pass


class _Skipped(Exception):
    pass


class _NoTimedStep(Exception):
    pass


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def _traceback_tail(exc: BaseException, lines: int = 12) -> str:
    return "\n".join("".join(traceback.format_exception(exc)).splitlines()[-lines:])


def run_cell(spec: specs.Spec | dict[str, Any], *, registry: Registry | None = None,
             progress: bool | None = None,
             on_hang: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
             stall_s: float | None = None, after_steps: Callable[[AfterSteps], None] | None = None,
             started_at: float | None = None, checkpoint: checkpoints.Checkpointing | None = None,
             stop: stops.CellStop | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one cell; returns (runs row with every RUNS_COLUMNS key, curves rows). A spec's JSON object is
    made into a :class:`harness.spec.Spec` with the registry's checks; an invalid one raises
    harness.spec.SpecError. Everything that goes wrong after that is recorded in the row.

    ``on_hang(row, curves)``: called from a watchdog thread with the partial row (status timeout) when
    a step or an evaluation is still running WATCHDOG_GRACE_S after the time limit, or when the warm-up,
    a step or an evaluation has run ``stall_s`` seconds (None: no stall limit); it must end the process
    (the main thread is stuck). Without it only the checks between steps apply.

    ``after_steps(AfterSteps)``: more measuring on the trained cell (the performance bench's profile),
    called once after the last training step, outside the memory region and the timed rounds (with a
    round coordinator in one more round of the group, alone); what it raises is the row's error.

    ``started_at``: when the cell's processes started (harness.core.stops.cell_started_at; seconds
    since the epoch), the beginning of its ``start`` phase (:data:`START_PHASES`); None: no ``start`` phase.

    ``checkpoint``: resume from it when it fits the cell, write one every ``every_s`` s of training and at
    a stop signal (harness.running.checkpoint); the caller removes it once the row is written.

    ``stop``: the process's stop policy (harness.core.stops.CellStop, installed by the caller): a stop it
    holds back for the end of a step ends the run there (its checkpoint written), raising
    harness.core.stops.Stopped."""
    registry = registry or default_registry()
    spec = cell_spec(spec, registry)
    st = CellState(spec, after_steps=after_steps, checkpoint=checkpoint, stop=stop)
    st.start.phase_mark = time.perf_counter()
    if started_at is not None:
        st.start.phases["start"] = max(time.time() - started_at, 0.0)
    status, error, tb = "ok", "", ""
    precision = torch.get_float32_matmul_precision()  # the process's own, restored at the end
    try:
        ex = spec.execution
        with allocator.policy(ex.allocator) as st.start.allocator:
            torch.set_num_threads(ex.num_threads)
            torch.set_float32_matmul_precision(ex.matmul_precision)  # before the warm-up and the model
            st.device = measure.resolve_device(ex.device)
            if ex.cuda_graph:
                require_cuda(st.device)
            seed_everything(spec.seed)
            if on_hang is not None:
                st.watchdog = Watchdog(lambda stalled: _end_hung(st, on_hang, stall_s if stalled else None),
                                        stall_s)
            _train(st, registry, progress)
            timer = st.timed.timer
            if timer is not None and not timer.timed_ms and not st.resumed:  # resumed: its quality stands
                raise _NoTimedStep(f"no timed step: {st.steps_done} step(s) ran and warmup_steps is "
                                   f"{timer.warmup_steps} (the data gives {st.steps_in_epoch} step(s) per "
                                   "epoch); step and epoch times are unknown")
    except _Diverged as exc:
        status, error = "diverged", str(exc)
    except _Timeout as exc:
        status, error = "timeout", str(exc)
    except _Skipped as exc:
        status, error = "error", f"skipped: {exc}"
    except _NoTimedStep as exc:
        status, error = "error", str(exc)
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a row
        status = "oom" if _is_oom(exc) else "error"
        error = f"{type(exc).__name__}: {exc}"
        tb = _traceback_tail(exc)
        if st.device is not None and st.device.type == "cuda":
            torch.cuda.empty_cache()
    finally:
        if st.watchdog is not None:
            st.watchdog.disarm()
        if st.timed.gate is not None:
            st.timed.gate.close()
        if st.monitor is not None and st.memory is None:
            st.memory = st.monitor.stop()
        torch.set_float32_matmul_precision(precision)
    row = build_row(st, status, error, tb)
    return row, st.curves


def _train(st: CellState, reg: Registry, progress: bool | None) -> None:
    spec, budget = st.spec, st.spec.budget
    st.timed.gate = RoundGate.from_env(spec.run_id)
    _begin(st, "the warm-up")
    _warm_up(st, reg)  # before the start turn: tiny shapes and lazy imports, alongside the others
    _phase(st, "warm_up")
    if st.timed.gate is not None:  # the group lets a few cells start at a time (harness.core.interleave)
        if st.watchdog is not None:
            st.watchdog.pause()
        st.timed.gate.start_turn()
        _phase(st, "start_turn")
    if st.watchdog is not None:  # building the data may take hours the first time: not a stall
        st.watchdog.pause()
    workload, prepared, total_steps = _build(st, reg)
    try:
        saved = checkpoints.resume(st)
    except checkpoints.Unusable as exc:  # the method holds part of it: build and prepare it again
        print(f"{spec.run_id}: starting over: the checkpoint is not used: {exc}", file=sys.stderr, flush=True)
        seed_everything(spec.seed)
        workload, prepared, total_steps = _build(st, reg)
        saved = None
    model = prepared.model
    train_model = st.train_model = model_to_train(st, model)
    if spec.execution.cuda_graph:  # captures Prepared.update, the eager part of Prepared.train_step
        st.graphed = GraphedStep(lambda batch, step: prepared.update(workload, batch, step, train_model),
                                 model, prepared.optimizers, st.device)
    _phase(st, "prepare")

    model.train()
    if saved is None:  # a resumed cell has its first count (its model may be pruned now)
        first = next(iter(workload.train_batches(0)), None)
        if first is None:
            raise RuntimeError(f"workload {spec.workload!r} yields no training batch")
        st.flops_initial, st.flops_tokens, st.flops_basis = measure.measure_flops(
            model, lambda: workload.loss(model, first))
        del first
        _record_ranks(st, 0)
    _phase(st, "flops")

    eval_every = budget.eval_every_steps
    warmup = budget.warmup_steps
    if st.graphed is not None:  # the eager warm-up steps and the capture step are never timed
        warmup = max(warmup, st.graphed.warmup + 1)
    st.epoch_clock = measure.Stopwatch(st.device)
    st.timed.machine = timing.MachineState()
    start = st.steps_done  # > 0 when resumed: this process warms up and times its own steps
    first_timed = min(start + warmup, total_steps)
    periods = {p.every for p in prepared.periodic.values() if p.every > 1}
    period = next(iter(periods)) if len(periods) == 1 else prepared.settings.get("time_window_steps")
    st.timed.rounds = timing.round_bounds(first_timed, total_steps, spec.execution.rounds,
                                          steps_per_round=1 if st.timed.gate is None else 2, period=period)
    st.timed.round_starts = {step: r for r, step in enumerate(st.timed.rounds.starts)}
    st.timed.first_step = start
    # a quality cell's training is left as it is: no periodic work off its schedule
    forcing = prepared.force is not None and spec.purpose != specs.PURPOSES[1]
    st.timed.periodic = timing.plan_periodic(
        st.timed.rounds, total_steps, st.timed.gate is not None,
        {name: (p.every, p.phase, p.forceable and forcing) for name, p in prepared.periodic.items()})
    st.timed.force_at = {step: name for name, plan in st.timed.periodic.items() if plan.how == timing.FORCED
                         for step in plan.steps}
    # rounds of whole periods may leave a few timed steps before the first round: warm-up too
    st.timed.timer = measure.StepTimer(st.device, max(warmup, st.timed.rounds.starts[0] - start))
    if eval_every and not spec.execution.timing_group and saved is None:  # a group's cells start without it
        _evaluate(st)
        _phase(st, "eval")
    st.monitor = measure.MemoryMonitor(st.device)
    gc.collect()
    st.monitor.start()
    _phase(st, "memory_baseline")
    bar = progress_lines.progress(total_steps, spec.run_id, progress, start=start)
    limit = budget.time_limit_s
    first_epoch, skip = divmod(start, st.steps_in_epoch)
    if saved is not None:
        checkpoints.restore_rng(saved["rng"])
    _begin(st, f"training step {start + 1}")
    st.training_started = st.last_checkpoint = time.perf_counter()
    if limit and st.watchdog is not None:  # the clock starts with the first training step
        st.watchdog.limit(limit - st.train_s_before + WATCHDOG_GRACE_S)  # earlier processes' training counts
    if st.stop is not None:  # a stop signal from here on waits for the end of the step
        st.stop.at_steps = True
    try:
        for epoch in range(first_epoch, budget.epochs):
            st.epoch = epoch
            st.epoch_clock.start()
            done_in_epoch = skip if epoch == first_epoch else 0
            whole_epoch = done_in_epoch == 0  # an epoch begun by an earlier process has no epoch time here
            for batch in itertools.islice(workload.train_batches(epoch), done_in_epoch, st.steps_in_epoch):
                _round_boundary(st)
                _timed_step(st, batch, epoch)
                done_in_epoch += 1
                bar.update(1)
                if st.steps_done == total_steps:
                    _rounds_over(st)
                if eval_every and (st.steps_done % eval_every == 0 or st.steps_done == st.stage_switch_step):
                    if st.steps_done == total_steps:  # no training follows: the memory region ends here
                        st.monitor.stop()
                    _evaluate(st, epoch)
                if whole_epoch and done_in_epoch == workload.steps_per_epoch:
                    st.full_epochs_s.append(st.epoch_clock.elapsed())
                _check_time(st, limit)
                if st.steps_done < total_steps:  # after the last step the row follows at once
                    if checkpoints.due(st):
                        _begin(st, f"writing the checkpoint after step {st.steps_done}")
                        checkpoints.write(st)
                    _stop_if_asked(st)
                _begin(st, f"training step {st.steps_done + 1}")  # its batch included
        _rounds_over(st)
        st.memory = st.monitor.stop()
        if st.last_eval_step != st.steps_done:
            _evaluate(st, st.epoch)
        _check_parameters(st)
        _check_time(st, limit)
    finally:
        if st.stop is not None:
            st.stop.at_steps = False
        bar.close()
        _record_ranks(st, st.steps_done, st.epoch)


def _build(st: CellState, reg: Registry) -> tuple[Any, Any, int]:
    """Build the cell's workload and prepare its method (into ``st``); returns them and the steps to run."""
    spec, budget = st.spec, st.spec.budget
    workload = st.workload = reg.build_workload(spec.workload, spec.workload_params,
                                                batch_size=spec.batch_size, seed=spec.seed,
                                                device=st.device)
    _phase(st, "build")
    st.steps_in_epoch = workload.steps_per_epoch
    if budget.max_steps_per_epoch is not None:
        st.steps_in_epoch = min(st.steps_in_epoch, budget.max_steps_per_epoch)
    total_steps = budget.epochs * st.steps_in_epoch
    st.method = reg.get_method(spec.method)
    prepared = st.method.prepare(workload.model, workload, dict(spec.method_params),
                                 target_ratio=spec.target_ratio, total_steps=total_steps)
    if prepared.skipped:  # nothing was measured: the row keeps its measurement columns empty
        raise _Skipped(prepared.skipped)
    st.prepared = prepared
    return workload, prepared, total_steps


def _stop_if_asked(st: CellState) -> None:
    """At the end of a training step that a stop signal waited for (harness.core.stops.CellStop): write the
    checkpoint and end the process by that signal, with no row."""
    if st.stop is None or st.stop.asked is None:
        return
    what = checkpoints.write_at_stop(st) if st.checkpoint is not None else "not written (no checkpoints)"
    st.stop.end(f"{st.spec.run_id}: stopped by {signal.Signals(st.stop.asked).name} after step "
                f"{st.steps_done}; its checkpoint is {what}, no row: the cell resumes from it next time")


def _begin(st: CellState, activity: str) -> None:
    """``activity`` starts (the watchdog's error names it): the stall clock starts again."""
    st.activity = activity
    if st.watchdog is not None:
        st.watchdog.resume()


def _phase(st: CellState, name: str) -> None:
    """The start phase ``name`` (:data:`START_PHASES`) ends now (nothing once the first round has begun)."""
    if st.start.phase_mark is None:
        return
    now = time.perf_counter()
    st.start.phases[name] = st.start.phases.get(name, 0.0) + now - st.start.phase_mark
    st.start.phase_mark = now


def _round_boundary(st: CellState) -> None:
    """Before a step that starts a timing round: close the machine-state segment, wait for the round
    coordinator's go (outside every clock and the time limit), open the next segment."""
    r = st.timed.round_starts.get(st.steps_done)
    if r is None:
        return
    st.timed.machine.end()
    _phase(st, "warmup_steps")
    if st.timed.gate is not None:
        phases = st.start.phases if st.start.phase_mark is not None else None
        _wait_at_gate(st, lambda gate: gate.wait(r, phases))
        _phase(st, "gate")
        st.timed.group_start_s = st.timed.gate.group_start_s
        st.timed.timer.rewarm_next = True  # the first step after the pause is not counted
    st.start.phase_mark = None  # the rounds have begun
    st.timed.timer.round = r
    st.timed.machine.begin()


def _rounds_over(st: CellState) -> None:
    """After the last training step: the last segment ends; run_cell's ``after_steps`` runs; wait until
    every cell of the timing group has run its rounds, so that no later work (evaluation, writing)
    overlaps another's steps."""
    st.timed.machine.end()
    if st.after_steps is not None:
        _after_steps(st)
    if st.timed.gate is not None:
        _wait_at_gate(st, lambda gate: gate.done())
        st.timed.gate = None


def _after_steps(st: CellState) -> None:
    """run_cell's ``after_steps``, once: after the memory region ends and, with a round coordinator, in a
    round of its own (the group's round after the timed ones), so that it runs alone too."""
    hook, st.after_steps = st.after_steps, None
    st.memory = st.monitor.stop()
    if st.timed.gate is not None:
        _wait_at_gate(st, lambda gate: gate.wait(len(st.timed.round_starts)))
    _begin(st, "the work after the training steps")
    batch = next(iter(st.workload.train_batches(0)))
    hook(AfterSteps(st.prepared, st.workload, st.device, batch, st.steps_done, st.spec.run_id))


def _wait_at_gate(st: CellState, wait: Callable[[RoundGate], float]) -> None:
    """Run ``wait`` on the round gate with the epoch clock paused; the seconds waited count neither
    against the time limit nor against the watchdog's limits."""
    if st.watchdog is not None:
        st.watchdog.pause()
    with st.epoch_clock.paused():
        if st.monitor is not None:  # on CUDA: its cache back to the cells whose turn it is
            st.monitor.yield_device()
        waited = wait(st.timed.gate)
    st.timed.waited_s += waited
    if st.watchdog is not None:
        st.watchdog.resume()


def _warm_up(st: CellState, reg: Registry) -> None:
    """harness.running.warmup.warm_up for the cell; its outcome and wall time go to ``st`` (a failure too)."""
    spec, started = st.spec, time.perf_counter()
    try:
        st.start.warm_up = warmup.warm_up(
            spec.workload, spec.method, batch_size=spec.batch_size, device=st.device,
            workload_params=dict(spec.workload_params), method_params=dict(spec.method_params),
            target_ratio=spec.target_ratio, seed=spec.seed, build_workload=reg.build_workload,
            get_method=reg.get_method)
    except Exception as exc:  # noqa: BLE001 -- the cell runs without it; the row says why
        st.start.warm_up = f"failed: {type(exc).__name__}: {exc}"
    st.start.warm_up_s = time.perf_counter() - started


def _timed_step(st: CellState, batch: dict[str, torch.Tensor], epoch: int) -> None:
    """One timed training step (``Prepared.train_step``) and its curves, stage and divergence checks."""
    prepared, step = st.prepared, st.steps_done
    if st.graphed is not None:  # outside the timed step: the check is the runner's, not the method's
        before = state_signature(prepared.model, prepared.optimizers)
    forced = st.timed.force_at.get(step)
    if forced is not None:  # outside the timed step: the method only marks the work as due
        prepared.force(forced)
    with st.timed.timer.step():
        task_loss, loss, info = prepared.train_step(st.workload, batch, step, model=st.train_model,
                                                    update=st.graphed)
        task_value, loss_value = float(task_loss), float(loss)
    if st.graphed is not None and (state_signature(prepared.model, prepared.optimizers) != before
                                   or st.stage is not None and info.get("stage", st.stage) != st.stage):
        st.graphed.invalidate()
    st.steps_done += 1
    st.losses.append(task_value)
    n = st.steps_done
    st.curves.append(_curve(st, n, epoch, "train", "loss", task_value))
    st.curves.append(_curve(st, n, epoch, "train", "objective", loss_value))
    for key, value in info.items():
        st.curves.append(_curve(st, n, epoch, "method", key, float(value)))
    stage = info.get("stage")
    if stage is not None and stage != st.stage:
        if st.stage is not None:
            _record_ranks(st, n, epoch)
            st.stage_switch_step = n
        st.stage = stage
    if not (math.isfinite(task_value) and math.isfinite(loss_value)):
        raise _Diverged(f"non-finite loss at step {n}: task loss {task_value}, objective {loss_value}")


def _evaluate(st: CellState, epoch: int = 0) -> None:
    """prepared.before_eval() then workload.evaluate(), outside every clock and the memory monitor (whose
    mark restarts from the RSS after the free heap is handed back). Diverged when any numeric value it
    returns is not finite (recorded first: the row and curves keep it)."""
    _begin(st, f"the evaluation at step {st.steps_done}")
    monitor = st.monitor if st.monitor is not None and st.monitor.running else None
    with (monitor.paused() if monitor else nullcontext()), \
            (st.epoch_clock.paused() if st.epoch_clock else nullcontext()):
        st.prepared.before_eval()
        result = dict(st.workload.evaluate(st.prepared.model))
        st.prepared.model.train()
    st.last_eval, st.last_eval_step = result, st.steps_done
    name = result.get("metric_name", st.workload.metric_name)
    st.curves.append(_curve(st, st.steps_done, epoch, "eval", name, float(result["metric_value"])))
    for key, value in result.items():
        if key not in ("metric_name", "metric_value") and isinstance(value, (int, float)):
            st.curves.append(_curve(st, st.steps_done, epoch, "eval", key, float(value)))
    bad = [f"{key} {value}" for key, value in result.items()
           if isinstance(value, numbers.Real) and not math.isfinite(value)]
    if bad:
        raise _Diverged(f"non-finite evaluation at step {st.steps_done}: {', '.join(bad)}")


def _check_parameters(st: CellState, shown: int = 5) -> None:
    """Diverged when a parameter holds a non-finite value after the last step (names the first few)."""
    bad = [name for name, p in st.prepared.model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
        raise _Diverged(f"non-finite parameters after step {st.steps_done}: {', '.join(bad[:shown])}{more}")


def _check_time(st: CellState, limit: float | None) -> None:
    if limit is not None and training_s(st) > limit:
        raise _Timeout(f"time limit of {st.spec.budget.time_limit_s} s reached after "
                       f"{st.steps_done} steps")


def _end_hung(st: CellState, on_hang: Callable[[dict[str, Any], list[dict[str, Any]]], None],
              stall_s: float | None) -> None:
    """The watchdog's end of a cell whose step or evaluation hangs (past the time limit, or for ``stall_s``
    seconds when not None): the row of what is known so far (status timeout) and the curves go to
    ``on_hang``."""
    if stall_s is not None:
        error = (f"stalled: {st.activity} did not finish within the stall limit of {stall_s:g} s "
                 f"({STALL_ENV}; set it higher if that is expected) after {st.steps_done} steps; "
                 "the process was ended")
    else:
        error = (f"time limit of {st.spec.budget.time_limit_s} s reached after {st.steps_done} steps; "
                 f"{st.activity} was still running {WATCHDOG_GRACE_S:g} s later and the process was ended")
    try:
        # a CUDA reading synchronizes the device, which a hung kernel would block
        if st.monitor is not None and st.memory is None and st.device.type != "cuda":
            st.memory = st.monitor.stop()
        row = build_row(st, "timeout", error, "")
    except Exception:  # noqa: BLE001 -- the main thread changed the method's state while it was read
        row = build_row(replace(st, prepared=None), "timeout", error, "")
    on_hang(row, list(st.curves))


def _record_ranks(st: CellState, step: int, epoch: int = 0) -> None:
    if st.prepared is None:
        return
    for layer, ranks in (st.prepared.ranks() or {}).items():
        for k, r in enumerate(ranks):
            st.curves.append(_curve(st, step, epoch, "ranks", f"{layer}[{k}]", float(r)))


def _curve(st: CellState, step: int, epoch: int, split: str, name: str, value: float) -> dict[str, Any]:
    return {"run_id": st.spec.run_id, "step": step, "epoch": epoch, "split": split,
            "metric_name": name, "value": value}


# ---------------------------------------------------------------------------------------- files

def run_to_files(spec: specs.Spec | dict[str, Any], runs_out: str | os.PathLike,
                 curves_out: str | os.PathLike, *, registry: Registry | None = None,
                 progress: bool | None = None, hang_exit_status: int = 0, started_at: float | None = None
                 ) -> dict[str, Any]:
    """Run a cell and write its runs row and curves atomically (also on failure); returns the row.

    A step or evaluation that hangs past the time limit or the stall limit (:func:`stall_limit_s`) never
    returns: the watchdog writes the partial row (status timeout) and curves, then ends the process with
    ``hang_exit_status`` (1 when they could not be written)."""
    def write(row: dict[str, Any], curves: list[dict[str, Any]]) -> None:
        """The row and curves, atomically; then the cell's checkpoint goes (harness.running.checkpoint)."""
        prov = {c: row[c] for c in results.FILE_PROVENANCE}
        try:
            results.write_parquet_atomic(results.to_frame(curves, "curves"), curves_out, kind="curves",
                                         provenance=prov)
            results.write_parquet_atomic(results.to_frame([row], "runs"), runs_out, kind="runs",
                                         provenance=prov)
        except OSError as exc:
            if exc.errno in ENVIRONMENT_ERRNOS:
                raise EnvironmentFault(exc.errno, f"cannot write the row of {row['run_id']} "
                                                  f"({row['status']}): {exc.strerror}",
                                       str(exc.filename)) from exc
            raise
        checkpoints.path_for(runs_out).unlink(missing_ok=True)

    def end_process(row: dict[str, Any], curves: list[dict[str, Any]]) -> None:
        status = 1
        try:
            write(row, curves)
            print(f"{row['run_id']}: timeout ({row['error']}) -> {runs_out}", file=sys.stderr)
            status = hang_exit_status
        except BaseException:  # noqa: BLE001 -- the process ends either way; say why
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    registry = registry or default_registry()
    spec = cell_spec(spec, registry)
    # a matched cell reads the row of the cell it matches beside its own (baselines.dense.matched_source;
    # imported here: the methods' package is loaded through the registry, whose errors are the row's)
    from baselines.dense import CELLS_DIR_ENV

    os.environ[CELLS_DIR_ENV] = str(Path(runs_out).parent)
    checkpoint = checkpoints.checkpointing(spec, runs_out)
    stop = stops.CellStop(defer=checkpoint is not None)
    with stop.guard():
        row, curves = run_cell(spec, registry=registry, progress=progress, on_hang=end_process,
                               stall_s=stall_limit_s(), started_at=started_at, checkpoint=checkpoint,
                               stop=stop)
    write(row, curves)
    return row
