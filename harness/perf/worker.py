"""A step-worker process of targets 2 and 4: one configuration run as an ordinary cell, then profiled.

After harness.running.run.run_cell, it times the tensorized layers and, for target 4, the same after
halving every rank.
"""
from __future__ import annotations

import copy
import itertools
import json
import statistics
from typing import Any, Callable

import torch

from harness.core import measure, timing
from harness.perf import microbench as mb

LEFT_OUT = ("status", "error", "settings", "extra")
"""Runs columns a step worker's result leaves out: its row's status is ok (a failed cell raises, and
harness.perf.steps.run_step_rounds reports ``{"error": ...}``); the settings and extra JSON are read
into ``method_settings`` and ``allocator``."""


def halve_ranks(model: torch.nn.Module, threshold: float, optimizers=()) -> dict[str, list[int]]:
    """Zero the upper half of every rank gate (keeping max(1, r // 2)) and prune physically."""
    from comera.prune import prune
    from comera.size import ranks, tensorized_modules

    with torch.no_grad():
        for _, module in tensorized_modules(model):
            for gate in module.gates:
                gate[max(1, gate.numel() // 2):] = 0.0
    prune(model, threshold, optimizers)
    return ranks(model)


def cell_spec(job: dict[str, Any]) -> dict[str, Any]:
    """The spec's JSON (harness.spec) of a step configuration: the transformer at the job's size, method,
    batch and seed; ``warmup`` untimed steps, then ``rounds`` rounds of ``steps`` timed steps each plus the
    round's first step (a re-warm step after the pause between rounds, not counted under a round
    coordinator), in the job's ``timing_group`` (harness.perf.steps.TIMING_GROUP under the bench's
    coordinator); no evaluation between steps, no time limit."""
    rounds, steps, warmup = job.get("rounds", 1), job["steps"], job["warmup"]
    total = warmup + rounds * (steps + 1)
    return {"run_id": job.get("run_id") or "step", "purpose": "timing", "workload": "transformer",
            "workload_params": {**job["workload_params"], "train_samples": job["batch_size"] * total,
                                "eval_samples": job["batch_size"]},
            "method": job["method"], "method_params": dict(job.get("method_params", {})),
            "batch_size": job["batch_size"], "target_ratio": None, "seed": job["seed"],
            "budget": {"epochs": 1, "max_steps_per_epoch": total, "warmup_steps": warmup,
                       "eval_every_steps": None, "time_limit_s": None},
            "execution": {"device": job["device"], "num_threads": job["threads"], "rounds": rounds,
                          "allocator": job.get("allocator", "reuse"),
                          "timing_group": job.get("timing_group")}}


def cell_result(row: dict[str, Any]) -> dict[str, Any]:
    """What a step worker reports of its cell's runs row: every column but :data:`LEFT_OUT`, as the row
    holds it except ``round_step_ms`` (the median of each timing round) and ``ranks``, parsed from their
    JSON; the method's settings and the allocator applied, from the settings JSON."""
    settings = json.loads(row["settings"] or "{}")
    return {**{c: v for c, v in row.items() if c not in LEFT_OUT},
            "round_step_ms": json.loads(row["round_step_ms"]) if row["round_step_ms"] else None,
            "ranks": json.loads(row["ranks"] or "{}"), "method_settings": settings.get("method", {}),
            "allocator": settings.get("allocator", "")}


def _capture_tensorized_inputs(model: torch.nn.Module, forward: Callable[[], Any]) -> dict[str, torch.Tensor]:
    """The first positional input each tensorized module (comera.size.tensorized_modules) receives during
    ``forward()`` (run without gradients): index tensors as they are, float inputs as empty tensors of
    the same shape (only their shape matters for timing)."""
    from comera.size import tensorized_modules

    seen: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in tensorized_modules(model):
        def hook(_module, args, name=name):
            x = args[0]
            seen.setdefault(name, x.detach().clone() if not x.is_floating_point() else
                            torch.empty(x.shape, dtype=x.dtype, device=x.device))
        handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _layer_calls(model: torch.nn.Module, inputs: dict[str, torch.Tensor]):
    """For each tensorized module with a captured input: a closure running one forward+backward of it on
    that input (random values, random output gradient, input gradient for float inputs), the reset that
    drops the gradients it left, and its output's bytes (harness.perf.microbench.module_call)."""
    from comera.size import tensorized_modules

    modules = dict(tensorized_modules(model))
    for name, shape_of in inputs.items():
        x = torch.randn_like(shape_of) if shape_of.is_floating_point() else shape_of
        yield mb.module_call(modules[name], x, "fwd_bwd", wrt_input=x.is_floating_point())


def tensorized_layer_ms(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                        min_run_time_s: float = 0.1) -> float:
    """One round's time of the tensorized layers: the sum over them of the ms of one forward+backward on its
    captured input (:func:`_layer_calls`; harness.core.measure.call_ms, blocks of at least
    ``min_run_time_s``)."""
    total = 0.0
    for run, reset, _ in _layer_calls(model, inputs):
        total += measure.call_ms(run, num_threads=torch.get_num_threads(), min_run_time_s=min_run_time_s)
        reset()
    return total


def tensorized_layer_cost(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(matmul-class FLOPs, compulsory traffic bytes) of one forward+backward of every tensorized module on
    its captured input (:func:`_layer_calls`), summed (``harness.perf.microbench.count_cost``)."""
    flops = traffic = 0.0
    for run, reset, _ in _layer_calls(model, inputs):
        cost = mb.count_cost(run)
        reset()
        flops, traffic = flops + cost[0], traffic + cost[1]
    return flops, traffic


def _state_tensor_bytes(model: torch.nn.Module, optimizers) -> int:
    """Bytes of the tensors that live across steps: parameters, buffers and optimizer state."""
    tensors = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    for opt in optimizers:
        for state in opt.state.values():
            tensors.update((id(t), t) for t in state.values() if torch.is_tensor(t))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _halving_medians(key: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """``{key}_halving_rounds`` (the (before, after) pairs of the alternated rounds: each round's mean step
    time, or its lone layers' time), ``{key}_before_halving`` and ``{key}_halved`` (their medians)."""
    return {f"{key}_halving_rounds": pairs, f"{key}_before_halving": statistics.median(b for b, _ in pairs),
            f"{key}_halved": statistics.median(a for _, a in pairs)}


def timed_steps(prepared: Any, workload: Any, batches: list[Any], warmup: int, first_step: int,
                timer: measure.StepTimer, round_index: int) -> None:
    """``batches``' training steps (``Prepared.train_step``) as round ``round_index`` of ``timer``, a cell's
    step timer: its first ``warmup`` steps timed and not counted, as a cell's re-warm step after a pause
    (its round's mean: harness.core.timing.round_means, as a cell's)."""
    timer.round = round_index
    for i, batch in enumerate(batches):
        timer.rewarm_next = i < warmup
        with timer.step():
            prepared.train_step(workload, batch, first_step + i)


def profile(job: dict[str, Any], out: dict[str, Any]) -> Callable[[Any], None]:
    """run_cell's ``after_steps`` of a step worker: into ``out`` the tensor peak (CPU), the profile of the
    tensorized layers and, with ``job["halve"]``, the same after halving every rank of a copy, the steps
    and the lone layers of the cell's model and of the halved copy alternating in rounds."""
    def after_steps(cell) -> None:
        from comera.size import tensorized_modules

        prepared, workload, device = cell.prepared, cell.workload, cell.device
        model = prepared.model
        if device.type == "cpu":
            step_peak, _ = measure.call_peak(
                lambda: prepared.train_step(workload, cell.batch, cell.steps_done), device)
            out["tensor_peak_bytes"] = _state_tensor_bytes(model, prepared.optimizers) + step_peak
        tensorized = tensorized_modules(model)
        inputs = (_capture_tensorized_inputs(model, lambda: workload.loss(model, cell.batch)) if tensorized
                  else {})
        if inputs:
            out.update(tt_layers_ms=tensorized_layer_ms(model, inputs), tt_layers_seen=len(inputs),
                       tt_layers=len(tensorized))
        if not job.get("halve"):
            return
        if inputs:
            out["tt_layers_flops"], out["tt_layers_traffic"] = tensorized_layer_cost(model, inputs)
        # The ranks are halved in a copy, so the steps -- and the lone layers -- of the full-rank model and
        # the halved one alternate in rounds here (minutes separate the timed rounds from this point: a
        # slow spell in between would read as a halving effect), and the cell's row keeps the model it timed.
        halved = copy.deepcopy(prepared)
        out["ranks_halved"] = halve_ranks(halved.model, job["threshold"], halved.optimizers)
        steps, warmup = job["steps"], job["warmup"]
        batches = list(itertools.islice(itertools.cycle(workload.train_batches(0)), steps + warmup))
        timers, layer_pairs = (measure.StepTimer(device), measure.StepTimer(device)), []
        for r in range(max(job.get("rounds", 1), 2)):
            first = cell.steps_done + 1 + 2 * r * len(batches)
            for each, timer in zip((prepared, halved), timers):
                timed_steps(each, workload, batches, warmup, first, timer, r)
            if inputs:
                layer_pairs.append((tensorized_layer_ms(model, inputs),
                                    tensorized_layer_ms(halved.model, inputs)))
        means = [timing.round_means(t.timed_ms, t.timed_rounds) for t in timers]
        out.update(_halving_medians("step_time_ms", list(zip(*means))))
        if inputs:
            out.update(_halving_medians("tt_layers_ms", layer_pairs))
            out["tt_layers_flops_halved"], out["tt_layers_traffic_halved"] = tensorized_layer_cost(
                halved.model, inputs)
    return after_steps


def step_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One step configuration as a cell in this process (a step-worker process of
    :func:`harness.perf.steps.run_step_rounds`, taking turns with the others when a round coordinator is
    reachable, under the job's allocator policy): :func:`cell_result` of its row and what :func:`profile`
    measured after its last step. A row whose status is not ok raises RuntimeError with its error."""
    from harness.running.run import run_cell

    extra: dict[str, Any] = {}
    row, _ = run_cell(cell_spec(job), progress=False, after_steps=profile(job, extra))
    if row["status"] != "ok":
        raise RuntimeError(f"{row['status']}: {row['error']}")
    return {**cell_result(row), **extra}
