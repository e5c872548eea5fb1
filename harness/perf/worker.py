"""A step-worker process of targets 2 and 4: full training steps of one configuration (time, peak memory),
then the profile of its tensorized layers and, for target 4, the same after halving every rank."""
from __future__ import annotations

import copy
import gc
import itertools
import statistics
import time
from typing import Any, Callable

import torch

from harness.core import allocator as allocator_lib
from harness.core import interleave, measure
from harness.perf import microbench as mb


def halve_ranks(model: torch.nn.Module, threshold: float, optimizers=()) -> dict[str, list[int]]:
    """Zero the upper half of every rank gate (keeping max(1, r // 2)) and prune physically."""
    from comera.rank import prune, ranks, tensorized_modules

    with torch.no_grad():
        for _, module in tensorized_modules(model):
            for gate in module.gates:
                gate[max(1, gate.numel() // 2):] = 0.0
    prune(model, threshold, optimizers)
    return ranks(model)


def _warm_up_code_path(job: dict[str, Any], device: torch.device) -> None:
    """One training step of the job's method on the tiny transformer, dropped afterwards
    (harness.running.warmup.warm_up), so that what a process pays once whatever the model -- lazy imports, library
    code pages, thread pools, library buffers -- exists before the memory baseline is read. Only the model,
    its data and its training then count."""
    from baselines import check_params
    from harness.running.warmup import warm_up

    warm_up("transformer", job["method"], batch_size=1, device=device, seed=job["seed"],
            method_params=check_params(job["method"], job.get("method_params", {})))


def _capture_tensorized_inputs(model: torch.nn.Module, forward: Callable[[], Any]) -> dict[str, torch.Tensor]:
    """The first positional input each tensorized module (comera.rank.tensorized_modules) receives during
    ``forward()`` (run without gradients): index tensors as they are, float inputs as empty tensors of
    the same shape (only their shape matters for timing)."""
    from comera.rank import tensorized_modules

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
    that input (random values, random output gradient, input gradient for float inputs), and the reset
    that drops the gradients it left."""
    from comera.rank import tensorized_modules

    modules = dict(tensorized_modules(model))
    for name, shape_of in inputs.items():
        x = torch.randn_like(shape_of) if shape_of.is_floating_point() else shape_of
        yield mb.module_call(modules[name], x, "fwd_bwd", wrt_input=x.is_floating_point())


def tensorized_layer_ms(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                        min_run_time_s: float = 0.1) -> float:
    """Sum over the tensorized modules of the median time (``harness.perf.microbench.time_call``, blocks of at
    least ``min_run_time_s``) of one forward+backward on its captured input (:func:`_layer_calls`)."""
    total = 0.0
    for run, reset in _layer_calls(model, inputs):
        total += mb.time_call(run, num_threads=torch.get_num_threads(), min_run_time_s=min_run_time_s)[0]
        reset()
    return total


def tensorized_layer_cost(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(matmul-class FLOPs, compulsory traffic bytes) of one forward+backward of every tensorized module on
    its captured input (:func:`_layer_calls`), summed (``harness.perf.microbench.count_cost``)."""
    flops = traffic = 0.0
    for run, reset in _layer_calls(model, inputs):
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
    """``{key}_halving_rounds`` (the (before, after) pairs of the alternated rounds), ``{key}_before_halving``
    and ``{key}_halved`` (their medians)."""
    return {f"{key}_halving_rounds": pairs, f"{key}_before_halving": statistics.median(b for b, _ in pairs),
            f"{key}_halved": statistics.median(a for _, a in pairs)}


def step_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Time full training steps of one configuration in this process (a step-worker process of
    :func:`harness.perf.steps.run_step_rounds`, taking turns with the others when a round coordinator is
    reachable), under the job's allocator policy."""
    with allocator_lib.policy(job.get("allocator", "reuse")) as applied:
        return _step_worker(job, applied)


def _step_worker(job: dict[str, Any], allocator_applied: str) -> dict[str, Any]:
    from baselines import check_params, get_method
    from comera.rank import ranks, tensorized_modules
    from harness.workloads import build_workload

    device = measure.resolve_device(job["device"], "bench --device")
    torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    steps, warmup, rounds = job["steps"], job["warmup"], job.get("rounds", 1)
    gate = interleave.RoundGate.from_env(job["run_id"]) if job.get("run_id") else None
    samples = job["batch_size"] * (steps + warmup)
    params = {**job["workload_params"], "train_samples": samples, "eval_samples": job["batch_size"]}
    _warm_up_code_path(job, device)
    gc.collect()
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
    else:
        allocator_lib.release_free_memory()
        base = measure.rss()
    workload = build_workload("transformer", params, batch_size=job["batch_size"], seed=job["seed"], device=device)
    method = get_method(job["method"])
    prepared = method.prepare(workload.model, workload, check_params(job["method"], job.get("method_params", {})),
                              target_ratio=None, total_steps=10**6)
    model = prepared.model
    model.train()
    batches = list(itertools.islice(itertools.cycle(list(workload.train_batches(0))), steps + warmup))
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        kind = "cuda_allocated"
    else:
        allocator_lib.release_free_memory()  # the converted dense model's freed pages leave the RSS
        kind = "cpu_rss_delta" if measure.reset_hwm() else "cpu_rss_delta_since_start"

    def one_step(step: int, batch, prep=prepared) -> float:
        start = time.perf_counter()
        prep.train_step(workload, batch, step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1e3

    def timed(offset: int, prep=prepared) -> list[float]:
        return [one_step(offset + i, b, prep) for i, b in enumerate(batches)][warmup:]

    for i, b in enumerate(batches[:warmup]):
        one_step(i, b)
    times, per_round = [], []
    for r in range(rounds):  # with a coordinator, one configuration at a time (harness.core.interleave)
        if gate is not None:  # after the pause, one step re-warms the caches (timed steps follow)
            gate.wait(r)
            one_step(warmup + r * (steps + 1), batches[0])
        these = [one_step(warmup + r * (steps + 1) + 1 + i, b) for i, b in enumerate(batches[warmup:])]
        times += these
        per_round.append(statistics.median(these))
    if gate is not None:  # the last round: the tensor peak, profile and halving below, alone too
        gate.wait(rounds)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = (measure.vm_hwm() or 0) - base
    out = {"step_ms": statistics.median(times), "step_ms_all": times, "step_ms_rounds": per_round,
           "peak_bytes": peak, "peak_kind": kind,
           "ranks": ranks(model), "method_settings": prepared.settings, "allocator": allocator_applied}
    if device.type == "cpu":  # after the timed steps and the RSS reading: nothing here is in them
        step_peak, _ = mb.peak_memory(lambda: one_step(steps + warmup, batches[0]), device)
        out["tensor_peak_bytes"] = _state_tensor_bytes(model, prepared.optimizers) + step_peak
    # Profile and halving after the timed steps and the memory reading: nothing here is in them.
    tensorized = tensorized_modules(model)
    inputs = _capture_tensorized_inputs(model, lambda: workload.loss(model, batches[0])) if tensorized else {}
    if inputs:
        out.update(tt_layers_ms=tensorized_layer_ms(model, inputs), tt_layers_seen=len(inputs),
                   tt_layers=len(tensorized))
    if job.get("halve"):
        if inputs:
            out["tt_layers_flops"], out["tt_layers_traffic"] = tensorized_layer_cost(model, inputs)
        # A copy keeps the full ranks, so the steps -- and the lone layers -- before and after halving
        # alternate in rounds here (minutes separate the rounds above from this point: a slow spell in
        # between would read as a halving effect).
        full = copy.deepcopy(prepared)
        out["ranks_halved"] = halve_ranks(model, job["threshold"], prepared.optimizers)
        pairs, layer_pairs = [], []
        for r in range(max(rounds, 2)):
            offset = (2 * r + 1) * (steps + warmup)
            pairs.append((statistics.median(timed(offset, full)), statistics.median(timed(offset, prepared))))
            if inputs:
                layer_pairs.append((tensorized_layer_ms(full.model, inputs), tensorized_layer_ms(model, inputs)))
        del full
        out.update(_halving_medians("step_ms", pairs))
        if inputs:
            out.update(_halving_medians("tt_layers_ms", layer_pairs))
            out["tt_layers_flops_halved"], out["tt_layers_traffic_halved"] = tensorized_layer_cost(model, inputs)
    if gate is not None:
        gate.done()
    return out
