"""``comera-bench bench``: the performance targets of the project, measured and judged in one table.

Targets (ratios are always measured in the same run, alternating the compared variants round by round
so that a load change on a shared machine hits both):

1. TTLinear forward+backward vs nn.Linear at the paper's layer shapes; each row's profile note times the
   same layer on one token (the cost that does not shrink with tokens) and the ratio that caps.
2. One full training step of the six-encoder transformer (paper shapes, seq 128), each configuration
   in its own process: CoMERA vs uncompressed at batch 32 (time, peak memory) and CoMERA vs GaLore
   at batch 1 (time, peak memory). The processes take turns in ``--step-rounds`` interleaved rounds
   (default 3; harness.interleave, the mechanism of the pipeline's timing groups); a time ratio is the
   median over rounds of the ratio within a round. The speed rows carry a profile:
   the time of CoMERA's tensorized layers (each re-run alone on its step input) and of the rest of its
   step, which bounds the ratio even if the tensorized layers took no time.
3. TTMEmbedding optimized vs naive lookup (time, peak memory) and the TTM table's memory vs an
   nn.Embedding with dense gradients, at 10000..40000 Zipf-like indices.
4. The transformer step after the rank gates halve every rank and comera.rank.prune shrinks the cores.
5. Contraction-plan FLOPs vs the sum of opt_einsum's optimal costs of the forward and backward
   contractions, over a sweep of TT orders and token counts.

Each row carries the physical context of its ratio: the FLOP ratio and the compulsory-traffic ratio of
the two ops, and the roofline bound ``max(F_a/P, B_a/W) / max(F_b/P, B_b/W)`` with the peak matmul rate
``P`` and copy bandwidth ``W`` measured in the same run (harness.microbench.TrafficCounter defines B).
Memory kinds: ``cpu_allocated`` / ``cuda_allocated`` for single ops (see harness.microbench), and for a
training step ``cpu_rss_delta`` (process RSS high-water mark during the steps minus the RSS before the
model was built) or ``cuda_allocated`` (peak allocated minus allocated before the build). On CPU the
free heap is handed back to the kernel (``harness.allocator.release_free_memory``, glibc malloc_trim)
before the baseline is read and again after the method is prepared, just before the high-water mark is
reset: the dense model that CoMERA converts is freed by then, but glibc would otherwise keep its pages
resident and the mark would start above what the training steps use. Before the baseline, each worker
runs one step of its method on the tiny transformer (dropped again), so that once-per-process costs --
lazy imports (GaLore pulls in transformers and bitsandbytes, ~60 MiB), thread pools, library buffers --
sit in the baseline as a training script's imports would; the peak counts the model, its data and its
training.

Allocator: every measuring process (this one and each step worker) applies the ``--allocator`` policy
of :mod:`harness.allocator` (default "reuse": freed memory is kept for reuse instead of being unmapped
and page-faulted again); what was applied is printed in the header and recorded in every row.

Target 3's table-memory row counts what the table costs in training: parameters + parameter gradients
+ the lookup's working memory beyond the (N x d) output (the peak of one forward+backward minus the
output and the gradients; the output gradient is an input and not counted either), i.e. what differs
between the two layers, which produce the same output and receive the same output gradient.
Target 4 carries its Amdahl estimate: the share ``f`` of the step spent in the tensorized layers'
forward+backward (each re-run alone) and their speedup ``s`` after halving give ``1/((1-f)+f/s)``; the
measured step can gain more, since it also sheds work the lone layers do not show.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import re
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from harness import allocator as allocator_lib
from harness import interleave
from harness import microbench as mb
from harness.atomic import atomic_write

TARGET_NAMES = {1: "TTLinear vs nn.Linear", 2: "transformer step", 3: "TTM lookup",
                4: "step after halving ranks", 5: "plan FLOPs vs opt_einsum"}
VERDICTS = ("pass", "short", "error", "info")
"""info: a row without a goal (context for another row; no verdict)."""


@dataclass
class BenchRow:
    """One line of the bench table."""

    target: int
    what: str
    goal: float | None
    """None for an informational row (verdict "info")."""
    better: str
    """">=": measured must reach goal; "<=": measured must stay at or below it."""
    measured: float | None
    verdict: str
    flop_ratio: float | None = None
    traffic_ratio: float | None = None
    roofline_bound: float | None = None
    medians: str = ""
    settings: str = ""
    device: str = ""
    threads: int = 0
    note: str = ""


def verdict(measured: float | None, goal: float | None, better: str) -> str:
    """pass / short, error when nothing was measured, info for a row without a goal."""
    if measured is None or not math.isfinite(measured):
        return "error"
    if goal is None:
        return "info"
    return "pass" if (measured >= goal if better == ">=" else measured <= goal) else "short"


def make_row(target: int, what: str, goal: float | None, measured: float | None, *, better: str = ">=",
             **fields: Any) -> BenchRow:
    return BenchRow(target, what, goal, better, measured, verdict(measured, goal, better), **fields)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# --------------------------------------------------------------------------------- machine and timing

@dataclass
class Roofline:
    flops_per_s: float
    bytes_per_s: float

    def time_bound(self, flops: float, traffic: float) -> float:
        return max(flops / self.flops_per_s, traffic / self.bytes_per_s)

    def speedup_bound(self, slow: tuple[float, float], fast: tuple[float, float]) -> float:
        """Roofline bound on how much faster ``fast`` (flops, bytes) can be than ``slow``."""
        return self.time_bound(*slow) / self.time_bound(*fast)


def measure_roofline(device: torch.device, num_threads: int, *, size: int = 2048,
                     copy_mb: int = 256) -> Roofline:
    """Peak matmul FLOP rate (float32 ``size``^3 matmul) and copy bandwidth (``copy_mb`` MiB) here."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    t_mm = mb.time_call(lambda: torch.mm(a, b), num_threads=num_threads, min_run_time_s=0.5)[0] / 1e3
    src = torch.empty(copy_mb * 2**18, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = mb.time_call(lambda: dst.copy_(src), num_threads=num_threads, min_run_time_s=0.5)[0] / 1e3
    return Roofline(2 * size**3 / t_mm, 2 * src.numel() * src.element_size() / t_copy)


def paired_medians(runs: dict[str, Callable[[], Any]], *, rounds: int, num_threads: int,
                   min_run_time_s: float) -> dict[str, float]:
    """Median (ms) over ``rounds`` of each run's blocked_autorange median, the runs alternating."""
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            per_round[name].append(mb.time_call(run, num_threads=num_threads, min_run_time_s=min_run_time_s)[0])
    return {name: statistics.median(times) for name, times in per_round.items()}


@dataclass
class Config:
    """Sizes and repeats of one bench invocation (``quick`` shrinks everything)."""

    device: torch.device
    num_threads: int
    quick: bool
    rounds: int
    min_run_time_s: float
    allocator: str = "reuse"
    """Policy of harness.allocator for this process and the step workers."""
    allocator_applied: str = ""
    """What applying it did here (set by run_targets)."""
    step_rounds: int = 1
    """Rounds of the transformer-step processes of targets 2 and 4 (every configuration once per round)."""

    @classmethod
    def make(cls, device: str, num_threads: int, quick: bool, allocator: str = "reuse",
             step_rounds: int | None = None) -> "Config":
        if allocator not in allocator_lib.POLICIES:
            raise ValueError(f"--allocator {allocator!r}: expected one of {list(allocator_lib.POLICIES)}")
        step_rounds = (1 if quick else 3) if step_rounds is None else step_rounds
        if step_rounds < 1:
            raise ValueError(f"--step-rounds {step_rounds}: need at least 1")
        return cls(mb.resolve_device(device), num_threads, quick, 2 if quick else 3, 0.05 if quick else 0.5,
                   allocator, step_rounds=step_rounds)

    def label(self) -> str:
        return f"{'quick, ' if self.quick else ''}{self.rounds} rounds x {self.min_run_time_s}s blocks"


# -------------------------------------------------------------------------------------------- target 1

LINEAR_TARGETS = [  # what, in_shape, out_shape, rank, tokens (full, quick), goal
    ("768->3072 r30", (12, 8, 8), (12, 16, 16), 30, (4096, 256), 7.0),
    ("768->768 r30", (12, 8, 8), (8, 8, 12), 30, (4096, 256), 6.0),
    ("768->768 r30", (12, 8, 8), (8, 8, 12), 30, (128, 32), 4.0),
]


def target_linear(cfg: Config, roof: Roofline) -> list[BenchRow]:
    """TTLinear vs nn.Linear, forward + backward (input gradient included), same tokens."""
    from comera.tt import TTLinear

    rows = []
    for what, in_shape, out_shape, rank, tokens_choice, goal in LINEAR_TARGETS:
        tokens = tokens_choice[1] if cfg.quick else tokens_choice[0]
        n_in, n_out = math.prod(in_shape), math.prod(out_shape)
        x = torch.randn(tokens, n_in, device=cfg.device)
        dense = torch.nn.Linear(n_in, n_out, device=cfg.device)
        tt = TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank, device=cfg.device)
        calls = {"dense": mb._call(dense, x, "fwd_bwd", wrt_input=True),
                 "tt": mb._call(tt, x, "fwd_bwd", wrt_input=True),
                 "tt_1": mb._call(tt, x[:1].contiguous(), "fwd_bwd", wrt_input=True)}
        times = paired_medians({k: run for k, (run, _) in calls.items()}, rounds=cfg.rounds,
                               num_threads=cfg.num_threads, min_run_time_s=cfg.min_run_time_s)
        cost = {k: mb.count_cost(run) for k, (run, _) in calls.items() if k != "tt_1"}
        plan = tt.plan(tokens)
        rows.append(make_row(
            1, f"TTLinear fwd+bwd speedup, {what}, {tokens} tokens", goal, _ratio(times["dense"], times["tt"]),
            flop_ratio=_ratio(cost["dense"][0], cost["tt"][0]),
            traffic_ratio=_ratio(cost["dense"][1], cost["tt"][1]),
            roofline_bound=roof.speedup_bound(cost["dense"], cost["tt"]),
            medians=f"nn.Linear {times['dense']:.3f} ms, TTLinear {times['tt']:.3f} ms",
            settings=f"ranks {tt.ranks}, plan {plan.left}/{plan.right}, {cfg.label()}",
            note=fixed_cost_note(times["dense"], times["tt"], times["tt_1"])))
    return rows


def fixed_cost_note(dense_ms: float, tt_ms: float, one_token_ms: float) -> str:
    """The TT layer's cost that does not shrink with the token count -- the same call on one token: core
    merges, gate products, per-op overhead -- and the ratio it caps."""
    return (f"profile: the same TTLinear on 1 token takes {one_token_ms:.3f} ms ({one_token_ms / tt_ms:.0%} of "
            f"its time here: core merges, gates, per-op overhead, which do not shrink with tokens); even free "
            f"token-sized products would give at most {dense_ms / one_token_ms:.2f}x")


# -------------------------------------------------------------------------------------------- target 3

EMBEDDING_TABLE = {"full": mb.PAPER_TABLE,
                   "quick": {"num_embeddings": 10_000, "embedding_dim": 32, "row_shape": [10, 10, 10, 10],
                             "col_shape": [2, 2, 2, 4], "rank": 8}}
EMBEDDING_INDICES = {"full": [10_000, 20_000, 40_000], "quick": [1000, 2000]}


def grad_bytes(module: torch.nn.Module) -> int:
    """Bytes of the dense gradients of the module's trainable parameters."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


@dataclass
class TableMemory:
    """Training memory of an embedding table at one lookup (bytes): parameters, parameter gradients and
    the working memory of forward+backward beyond the output (N x d) and the gradients."""

    params: int
    grads: int
    working: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.working

    @classmethod
    def of(cls, module: torch.nn.Module, peak: int, output_bytes: int) -> "TableMemory":
        grads = grad_bytes(module)
        return cls(mb.param_bytes(module), grads, peak - output_bytes - grads)

    def __str__(self) -> str:
        return f"{self.total} B = params {self.params} + grads {self.grads} + working {self.working}"


def target_embedding(cfg: Config, roof: Roofline) -> list[BenchRow]:
    """TTM optimized vs naive lookup (fwd+bwd time and peak memory); TTM vs nn.Embedding table memory."""
    key = "quick" if cfg.quick else "full"
    table = EMBEDDING_TABLE[key]
    variants = ("ttm_naive", "ttm_optimized", "dense_grad")
    modules = {v: mb._embedding_module(v, table, cfg.device) for v in variants}
    shape = f"{table['num_embeddings']}x{table['embedding_dim']} rank {table['rank']}"
    rows = []
    for count in EMBEDDING_INDICES[key]:
        idx = mb.zipf_indices(count, table["num_embeddings"], 1.05, count).to(cfg.device)
        calls = {v: mb._call(m, idx, "fwd_bwd", wrt_input=False) for v, m in modules.items()}
        times = paired_medians({v: run for v, (run, _) in calls.items()}, rounds=cfg.rounds,
                               num_threads=cfg.num_threads, min_run_time_s=cfg.min_run_time_s)
        peaks = {}
        for v, (run, reset) in calls.items():
            peaks[v], kind = mb.peak_memory(run, cfg.device, reset)
        cost = {v: mb.count_cost(run) for v, (run, _) in calls.items()}
        output_bytes = count * table["embedding_dim"] * modules["dense_grad"].weight.element_size()
        footprint = {v: peaks[v] + mb.param_bytes(modules[v]) for v in variants}
        memory = {v: TableMemory.of(modules[v], peaks[v], output_bytes) for v in ("ttm_optimized", "dense_grad")}
        unique = int(torch.unique(idx).numel())
        settings = f"table {shape}, {unique} unique rows, zipf 1.05, {cfg.label()}"
        common = {"settings": settings}
        rows.append(make_row(
            3, f"TTM optimized vs naive lookup fwd+bwd speedup, {count} indices", 5.0,
            _ratio(times["ttm_naive"], times["ttm_optimized"]),
            flop_ratio=_ratio(cost["ttm_naive"][0], cost["ttm_optimized"][0]),
            traffic_ratio=_ratio(cost["ttm_naive"][1], cost["ttm_optimized"][1]),
            roofline_bound=roof.speedup_bound(cost["ttm_naive"], cost["ttm_optimized"]),
            medians=f"naive {times['ttm_naive']:.3f} ms, optimized {times['ttm_optimized']:.3f} ms, "
                    f"nn.Embedding dense grad {times['dense_grad']:.3f} ms", **common))
        rows.append(make_row(
            3, f"TTM optimized vs naive lookup peak memory ratio, {count} indices", 3.0,
            _ratio(peaks["ttm_naive"], peaks["ttm_optimized"]),
            medians=f"naive {peaks['ttm_naive']} B, optimized {peaks['ttm_optimized']} B ({kind})", **common))
        rows.append(make_row(
            3, f"nn.Embedding (dense grad) / TTM table memory (params + grads + lookup working memory "
               f"beyond the {count}x{table['embedding_dim']} output), {count} indices", 15.0,
            _ratio(memory["dense_grad"].total, memory["ttm_optimized"].total),
            medians=f"nn.Embedding {memory['dense_grad']}; TTM {memory['ttm_optimized']} ({kind})", **common))
        rows.append(make_row(
            3, f"nn.Embedding (dense grad) / TTM footprint (params + fwd+bwd peak, which includes the "
               f"{output_bytes} B output both produce), {count} indices", None,
            _ratio(footprint["dense_grad"], footprint["ttm_optimized"]),
            medians=f"nn.Embedding {footprint['dense_grad']} B, TTM {footprint['ttm_optimized']} B ({kind})",
            note="informational: the table-memory row above carries the goal", **common))
    return rows


# ------------------------------------------------------------------------------------- targets 2 and 4

STEP_WORKLOAD = {"full": {"size": "paper"}, "quick": {"size": "tiny"}}
STEP_CONFIGS = [  # name, method, batch size (full, quick)
    ("dense_b32", "dense", (32, 8)),
    ("comera_b32", "comera", (32, 8)),
    ("galore_b1", "galore", (1, 1)),
    ("comera_b1", "comera", (1, 1)),
]


def _proc_status(field: str) -> int | None:
    """A ``/proc/self/status`` memory field in bytes (None where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux clear_refs); False if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


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
    (harness.warmup.warm_up), so that what a process pays once whatever the model -- lazy imports, library
    code pages, thread pools, library buffers -- exists before the memory baseline is read. Only the model,
    its data and its training then count."""
    from baselines import check_params
    from harness.warmup import warm_up

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


def tensorized_layer_ms(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                        min_run_time_s: float = 0.1) -> float:
    """Sum over the tensorized modules of the median time (``harness.microbench.time_call``, blocks of at
    least ``min_run_time_s``) of one forward+backward on its captured input (random values, random output
    gradient, input gradient for float inputs); the parameters' gradients are dropped afterwards."""
    from comera.rank import tensorized_modules

    modules = dict(tensorized_modules(model))
    total = 0.0
    for name, shape_of in inputs.items():
        x = torch.randn_like(shape_of) if shape_of.is_floating_point() else shape_of
        run, reset = mb._call(modules[name], x, "fwd_bwd", wrt_input=x.is_floating_point())
        total += mb.time_call(run, num_threads=torch.get_num_threads(), min_run_time_s=min_run_time_s)[0]
        reset()
    return total


def _state_tensor_bytes(model: torch.nn.Module, optimizers) -> int:
    """Bytes of the tensors that live across steps: parameters, buffers and optimizer state."""
    tensors = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    for opt in optimizers:
        for state in opt.state.values():
            tensors.update((id(t), t) for t in state.values() if torch.is_tensor(t))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def amdahl_bound(share: float, layer_speedup: float) -> float:
    """Step speedup when a share ``share`` of the step gets ``layer_speedup`` times faster."""
    return 1.0 / ((1.0 - share) + share / layer_speedup)


def step_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Time full training steps of one configuration in this process (a step-worker process of
    :func:`run_step_rounds`, taking turns with the others when a round coordinator is reachable), under
    the job's allocator policy."""
    with allocator_lib.policy(job.get("allocator", "reuse")) as applied:
        return _step_worker(job, applied)


def _step_worker(job: dict[str, Any], allocator_applied: str) -> dict[str, Any]:
    from baselines import check_params, get_method
    from comera.rank import ranks, tensorized_modules
    from harness.workloads import build_workload

    device = mb.resolve_device(job["device"])
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
        base = _proc_status("VmRSS")
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
        kind = "cpu_rss_delta" if _reset_rss_peak() else "cpu_rss_delta_since_start"

    def one_step(step: int, batch) -> float:
        start = time.perf_counter()
        prepared.train_step(workload, batch, step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1e3

    def timed(offset: int) -> list[float]:
        return [one_step(offset + i, b) for i, b in enumerate(batches)][warmup:]

    for i, b in enumerate(batches[:warmup]):
        one_step(i, b)
    times, per_round = [], []
    for r in range(rounds):  # with a coordinator, one configuration at a time (harness.interleave)
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
        peak = (_proc_status("VmHWM") or 0) - (base or 0)
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
        out["ranks_halved"] = halve_ranks(model, job["threshold"], prepared.optimizers)
        out["step_ms_halved"] = statistics.median(timed(steps + warmup))
        if inputs:
            out["tt_layers_ms_halved"] = tensorized_layer_ms(model, inputs)
    if gate is not None:
        gate.done()
    return out


def step_jobs(cfg: Config, targets: set[int]) -> dict[str, dict[str, Any]]:
    """The subprocess jobs targets 2 and 4 need (4 reuses comera_b32, which then also halves)."""
    key = "quick" if cfg.quick else "full"
    names = {"dense_b32", "comera_b32", "galore_b1", "comera_b1"} if 2 in targets else {"comera_b32"}
    jobs = {}  # two warm-up steps in full runs: under "reuse" the heap grows during the first steps
    for name, method, batches in STEP_CONFIGS:
        if name in names:
            jobs[name] = {"method": method, "batch_size": batches[1] if cfg.quick else batches[0],
                          "workload_params": STEP_WORKLOAD[key], "device": cfg.device.type, "seed": 0,
                          "threads": cfg.num_threads, "warmup": 1 if cfg.quick else 2,
                          "steps": 2 if cfg.quick else 3 if batches[0] > 1 else 10,  # batch-1 steps are short
                          "halve": name == "comera_b32" and 4 in targets, "threshold": 1e-2,
                          "allocator": cfg.allocator}
    return jobs


def amdahl_note(result: dict[str, Any]) -> str:
    """The Amdahl estimate of target 4 from a step worker's result ("" when it was not measured)."""
    needed = ("step_ms", "tt_layers_ms", "tt_layers_ms_halved")
    if not all(result.get(k) for k in needed):
        return ""
    share = min(1.0, result["tt_layers_ms"] / result["step_ms"])
    speedup = result["tt_layers_ms"] / result["tt_layers_ms_halved"]
    return (f"Amdahl: TT/TTM layers fwd+bwd take f={share:.2f} of the step before halving "
            f"({result['tt_layers_ms']:.1f} of {result['step_ms']:.1f} ms, {result.get('tt_layers_seen')} of "
            f"{result.get('tt_layers')} tensorized modules, each re-run alone on its step input), "
            f"s={speedup:.2f}x faster after halving ({result['tt_layers_ms_halved']:.1f} ms): "
            f"Amdahl estimate 1/((1-f)+f/s) = {amdahl_bound(share, speedup):.2f}x; even s=inf gives "
            f"{1 / (1 - share) if share < 1 else float('inf'):.2f}x (the step also sheds work the lone "
            f"layers do not show: the fused feed-forward's recomputation, smaller gate/penalty terms)")


OTHER_NAMES = {"dense_b32": "the uncompressed model", "galore_b1": "GaLore"}


def share_note(comera: dict[str, Any], other: dict[str, Any], other_name: str) -> str:
    """Where a CoMERA step's time goes, from a step worker's result: the tensorized layers (each re-run
    alone) and the rest, and the ratio the step could reach if the tensorized layers took no time ("" when
    not measured)."""
    step, layers, other_step = comera.get("step_ms"), comera.get("tt_layers_ms"), other.get("step_ms")
    if not (step and layers and other_step):
        return ""
    rest = max(step - layers, 1e-9)
    return (f"profile: tensorized layers fwd+bwd {layers:.1f} of the {step:.1f} ms CoMERA step "
            f"(f={min(1.0, layers / step):.2f}, {comera.get('tt_layers_seen')} modules re-run alone); the rest, "
            f"{rest:.1f} ms, is attention, GELU, LayerNorm, dropout, embeddings, loss, rank penalty and the "
            f"optimizer, work {other_name} does at least as much of: even free tensorized layers would give "
            f"at most {other_step / rest:.2f}x")


def _fmt_bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def run_step_rounds(jobs: dict[str, dict[str, Any]], rounds: int, timeout_s: float,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, dict[str, Any]]:
    """Every configuration in its own process, all alive at once, timed in interleaved rounds by the
    coordinator of the pipeline's timing groups (harness.interleave): in each round one configuration
    at a time runs its timed steps, the order reversed every other round, so that a slow spell of the
    machine hits every configuration of a round; a last round (alone too) for the tensor peak, the
    profile and the halving. name -> the worker's result, with ``step_ms_rounds`` (one median per
    round); ``{"error": ...}`` for a configuration that failed."""
    with tempfile.TemporaryDirectory(prefix="comera-bench-steps-") as tmp:
        cells = []
        for name, job in jobs.items():
            spec = Path(tmp) / f"{name}.json"
            spec.write_text(json.dumps({**job, "run_id": name, "rounds": rounds}))
            cells.append(interleave.Cell(str(spec), str(Path(tmp) / f"{name}.out.json"), "",
                                         str(Path(tmp) / f"{name}.log")))

        def command(cell: interleave.Cell) -> list[str]:
            return [sys.executable, "-m", "harness.bench", "--step-worker-file", cell.spec,
                    "--step-out", cell.runs, "--step-log", cell.log]

        try:
            interleave.run_group(cells, rounds + 1, command=command, log=progress, timeout_s=timeout_s)
            timed_out = ""
        except TimeoutError:
            timed_out = f"timed out after {timeout_s:.0f} s"
        out = {}
        for name, cell in zip(jobs, cells):
            path, log = Path(cell.runs), Path(cell.log)
            if path.exists():
                out[name] = json.loads(path.read_text())
                continue
            tail = (log.read_text(errors="replace").strip().splitlines() if log.exists() else []) or ["no output"]
            code = cell.proc.returncode if cell.proc is not None else None
            out[name] = {"error": timed_out or f"exit {code}: {tail[-1]}"}
    return out


def round_ratios(results: dict[str, dict[str, Any]], num: tuple[str, str], den: tuple[str, str]) -> list[float]:
    """``num``/``den`` ((configuration, key) each): per round where both keys were timed round by round
    (``<key>_rounds``), else the one ratio of the two values; empty where either is missing."""
    a, b = results.get(num[0], {}), results.get(den[0], {})
    ra, rb = a.get(f"{num[1]}_rounds"), b.get(f"{den[1]}_rounds")
    if ra and rb and len(ra) == len(rb):
        return [x / y for x, y in zip(ra, rb) if x is not None and y]
    x, y = a.get(num[1]), b.get(den[1])
    return [x / y] if x is not None and y else []


def target_steps(cfg: Config, targets: set[int], timeout_s: float,
                 progress: Callable[[str], None] = lambda line: None) -> list[BenchRow]:
    """Targets 2 and 4 from one process per configuration, timed in interleaved rounds; each time ratio is
    the median over the rounds of the ratio within a round."""
    jobs = step_jobs(cfg, targets)
    res = run_step_rounds(jobs, cfg.step_rounds, timeout_s, progress)
    errors = "; ".join(f"{n}: {r['error']}" for n, r in res.items() if "error" in r)
    size = STEP_WORKLOAD["quick" if cfg.quick else "full"]["size"]

    def get(name: str, key: str) -> float | None:
        return res.get(name, {}).get(key)

    def ratio(num: tuple[str, str], den: tuple[str, str]) -> tuple[float | None, str]:
        """Median of the per-round ratios, and the per-round list when there are several rounds."""
        per_round = round_ratios(res, num, den)
        shown = f"; per round {', '.join(f'{v:.2f}' for v in per_round)}" if len(per_round) > 1 else ""
        return (statistics.median(per_round) if per_round else None), shown

    def pair(a: str, b: str) -> str:
        return f"{a} {get(a, 'step_ms') or float('nan'):.1f} ms / {_fmt_bytes(get(a, 'peak_bytes'))}, " \
               f"{b} {get(b, 'step_ms') or float('nan'):.1f} ms / {_fmt_bytes(get(b, 'peak_bytes'))}"

    kind = next((r["peak_kind"] for r in res.values() if "peak_kind" in r), "n/a")
    differing = sorted({r["allocator"] for r in res.values() if r.get("allocator", cfg.allocator_applied)
                        != cfg.allocator_applied})  # the workers normally apply what this process did
    some_job = next(iter(jobs.values()))
    counts = ", ".join(f"{name} {job['steps']}" for name, job in jobs.items())
    base = (f"transformer size={size}, one process per config, {cfg.step_rounds} interleaved round(s) "
            f"(harness.interleave; time ratio: median over rounds of the ratio within a round), "
            f"median of timed steps ({counts}) after {some_job['warmup']} warm-up, memory {kind}"
            + (f", worker allocator {' / '.join(differing)}" if differing else ""))
    rows = []
    if 2 in targets:
        b32 = jobs["dense_b32"]["batch_size"]
        for what, goal, better, num, den, shown in (
                (f"CoMERA vs uncompressed step speedup, batch {b32}", 4.0, ">=",
                 ("dense_b32", "step_ms"), ("comera_b32", "step_ms"), ("dense_b32", "comera_b32")),
                (f"CoMERA / uncompressed peak memory, batch {b32}", 0.7, "<=",
                 ("comera_b32", "peak_bytes"), ("dense_b32", "peak_bytes"), ("dense_b32", "comera_b32")),
                ("CoMERA vs GaLore step speedup, batch 1", 5.0, ">=",
                 ("galore_b1", "step_ms"), ("comera_b1", "step_ms"), ("galore_b1", "comera_b1")),
                ("GaLore / CoMERA peak memory, batch 1", 12.0, ">=",
                 ("galore_b1", "peak_bytes"), ("comera_b1", "peak_bytes"), ("galore_b1", "comera_b1"))):
            measured, per_round = ratio(num, den)
            profile = (share_note(res.get(shown[1], {}), res.get(shown[0], {}), OTHER_NAMES[shown[0]])
                       if "speedup" in what else "")
            rows.append(make_row(2, what, goal, measured, better=better, medians=pair(*shown) + per_round,
                                 settings=base, note="; ".join(filter(None, [profile, errors]))))
        for slow, fast, label in (("dense_b32", "comera_b32", f"uncompressed / CoMERA, batch {b32}"),
                                  ("galore_b1", "comera_b1", "GaLore / CoMERA, batch 1")):
            if get(fast, "tensor_peak_bytes"):
                measured, per_round = ratio((slow, "tensor_peak_bytes"), (fast, "tensor_peak_bytes"))
                rows.append(make_row(
                    2, f"{label} tensor-allocation peak (cpu_allocated: parameters, buffers, optimizer "
                       f"state + one step's allocator peak, the CPU analogue of cuda_allocated)", None,
                    measured, medians=f"{slow} {_fmt_bytes(get(slow, 'tensor_peak_bytes'))}, "
                                      f"{fast} {_fmt_bytes(get(fast, 'tensor_peak_bytes'))}{per_round}",
                    settings=base,
                    note="informational: the RSS rows above carry the goals; the gap between the two is "
                         "memory outside tensors (library workspaces and JIT code, heap, Python)"))
    if 4 in targets:
        ranks_before = get("comera_b32", "ranks") or {}
        ranks_after = get("comera_b32", "ranks_halved") or {}
        sample = next(iter(ranks_before), None)
        change = f"{sample}: {ranks_before.get(sample)} -> {ranks_after.get(sample)}" if sample else ""
        before, after = get("comera_b32", "step_ms"), get("comera_b32", "step_ms_halved")
        measured, per_round = ratio(("comera_b32", "step_ms"), ("comera_b32", "step_ms_halved"))
        rows.append(make_row(4, f"CoMERA step speedup after halving every rank, batch {jobs['comera_b32']['batch_size']}",
                             1.5, measured,
                             medians=f"before {before or float('nan'):.1f} ms, after {after or float('nan'):.1f} ms"
                                     + per_round,
                             settings=f"{base}; {change}", note="; ".join(filter(None, [
                                 amdahl_note(res.get("comera_b32", {})), errors]))))
    return rows


# -------------------------------------------------------------------------------------------- target 5

_GATE_OR_BIAS = re.compile(r"^(gate|dgate|dcore)\d+$|^d?bias$")


def plan_contraction_flops(plan) -> int:
    """Plan FLOPs of the contractions only (gate scaling and bias steps left out)."""
    return sum(s.flops for s in plan.steps if not _GATE_OR_BIAS.match(s.name))


def optimal_sum_flops(in_shape: tuple[int, ...], out_shape: tuple[int, ...], ranks: tuple[int, ...],
                      tokens: int) -> int:
    """Sum of opt_einsum's optimal (dynamic programming, outer products allowed) costs of the d+2
    contractions of a TT linear layer: y, dx and every core gradient dG_k, each optimized alone."""
    import opt_einsum as oe

    d, m = len(in_shape) + len(out_shape), len(in_shape)
    modes = tuple(in_shape) + tuple(out_shape)
    n_idx = [oe.get_symbol(1 + k) for k in range(d)]
    b_idx = [oe.get_symbol(1 + d + k) for k in range(d - 1)]
    sizes = {"t": tokens, **dict(zip(n_idx, modes)), **dict(zip(b_idx, ranks[1:-1]))}
    cores = [(b_idx[k - 1] if k else "") + n_idx[k] + (b_idx[k] if k < d - 1 else "") for k in range(d)]
    x, y = "t" + "".join(n_idx[:m]), "t" + "".join(n_idx[m:])
    problems = [([x, *cores], y), ([y, *cores], x)]
    problems += [([x, y, *cores[:k], *cores[k + 1:]], cores[k]) for k in range(d)]
    total = 0
    for inputs, output in problems:
        shapes = [tuple(sizes[c] for c in term) for term in inputs]
        _, info = oe.contract_path(",".join(inputs) + "->" + output, *shapes, shapes=True,
                                   optimize=oe.DynamicProgramming(search_outer=True))
        total += int(info.opt_cost)
    return total


def plan_sweep(quick: bool) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]]:
    """Distinct (in_shape, out_shape, ranks, tokens) over orders 2..8 (quick: 2..4), ranks (clipped to
    the largest rank of each bond) and token counts."""
    modes = (4, 6, 8, 5, 3, 7, 2, 8)
    orders = range(2, 5) if quick else range(2, 9)
    rank_choices = (4,) if quick else (2, 8, 30)
    token_choices = (1, 64) if quick else (1, 16, 256, 4096)
    cases = []
    for d in orders:
        m = (d + 1) // 2
        in_shape, out_shape = modes[:m], modes[m:d]
        full = in_shape + out_shape
        for r in rank_choices:
            ranks = (1, *(min(r, math.prod(full[:k]), math.prod(full[k:])) for k in range(1, d)), 1)
            cases += [(in_shape, out_shape, ranks, t) for t in token_choices]
    return list(dict.fromkeys(cases))  # clipped ranks repeat cases


def target_plans(cfg: Config) -> list[BenchRow]:
    """Max over the sweep of plan FLOPs / opt_einsum optimal sum (must be <= 1)."""
    from comera.contraction import make_plan

    worst, worst_case, count, over = 0.0, None, 0, 0
    for in_shape, out_shape, ranks, tokens in plan_sweep(cfg.quick):
        plan = make_plan(in_shape, out_shape, ranks, tokens, False)
        ratio = plan_contraction_flops(plan) / optimal_sum_flops(in_shape, out_shape, ranks, tokens)
        count += 1
        over += ratio > 1.0
        if ratio > worst:
            worst, worst_case = ratio, (in_shape, out_shape, ranks, tokens)
    return [make_row(5, f"plan FLOPs / sum of opt_einsum optimal costs (max over {count} cases, "
                        f"{over} above 1)", 1.0, worst, better="<=", flop_ratio=worst,
                     medians=f"worst case in={list(worst_case[0])} out={list(worst_case[1])} "
                             f"ranks={list(worst_case[2])} tokens={worst_case[3]}" if worst_case else "",
                     settings="orders 2-4, rank 4, tokens 1,64" if cfg.quick else
                     "orders 2-8, ranks 2/8/30, tokens 1/16/256/4096; gate scaling and bias excluded")]


# ------------------------------------------------------------------------------------------ the table

def run_targets(targets: set[int], cfg: Config, *, step_timeout_s: float = 1800,
                progress: Callable[[str], None] = lambda line: None) -> list[BenchRow]:
    """Measure the chosen targets under ``cfg.allocator`` (this process; the step workers apply it to
    themselves); a target that fails becomes an error row naming the exception."""
    with allocator_lib.policy(cfg.allocator) as cfg.allocator_applied:
        progress(f"allocator: {cfg.allocator} ({cfg.allocator_applied})")
        return _run_targets(targets, cfg, step_timeout_s, progress)


def _run_targets(targets: set[int], cfg: Config, step_timeout_s: float,
                 progress: Callable[[str], None]) -> list[BenchRow]:
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(0)
    roof = measure_roofline(cfg.device, cfg.num_threads, size=512 if cfg.quick else 2048,
                            copy_mb=16 if cfg.quick else 256) if targets & {1, 3} else None
    if roof:
        progress(f"roofline: {roof.flops_per_s / 1e9:.1f} GFLOP/s matmul, {roof.bytes_per_s / 1e9:.1f} GB/s copy")
    jobs: list[tuple[set[int], Callable[[], list[BenchRow]]]] = [
        ({1}, lambda: target_linear(cfg, roof)),
        ({3}, lambda: target_embedding(cfg, roof)),
        ({2, 4}, lambda: target_steps(cfg, targets, step_timeout_s, progress)),
        ({5}, lambda: target_plans(cfg)),
    ]
    rows: list[BenchRow] = []
    for covers, job in jobs:
        if not covers & targets:
            continue
        progress(f"targets {sorted(covers & targets)} ...")
        try:
            new = job()
        except Exception as exc:  # a broken part is reported in the table, not hidden
            new = [make_row(t, TARGET_NAMES[t], float("nan"), None, note=f"{type(exc).__name__}: {exc}")
                   for t in sorted(covers & targets)]
        for row in new:
            row.device, row.threads = cfg.device.type, cfg.num_threads
            progress(format_row(row))
        rows += new
    rows.sort(key=lambda r: r.target)
    for row in rows:
        row.settings += f"; allocator {cfg.allocator} ({cfg.allocator_applied})"
        if roof:
            row.settings += f"; roofline {roof.flops_per_s / 1e9:.1f} GFLOP/s, {roof.bytes_per_s / 1e9:.1f} GB/s"
    return rows


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "" if x is None or not math.isfinite(x) else fmt.format(x)


def format_row(row: BenchRow) -> str:
    goal = "no goal" if row.goal is None else f"goal {row.better} {_num(row.goal)}"
    return f"[{row.target}] {row.what}: {_num(row.measured)} ({goal}) -> {row.verdict}  {row.medians} {row.note}"


TABLE_COLUMNS = ["target", "what", "measured", "goal", "verdict", "flop_ratio", "traffic_ratio",
                 "roofline_bound", "medians", "device", "threads", "settings", "note"]


def to_markdown(rows: list[BenchRow]) -> str:
    head = "| " + " | ".join(TABLE_COLUMNS) + " |\n|" + "---|" * len(TABLE_COLUMNS) + "\n"
    lines = []
    for r in rows:
        cells = [str(r.target), r.what, _num(r.measured), "" if r.goal is None else f"{r.better} {_num(r.goal)}", r.verdict,
                 _num(r.flop_ratio), _num(r.traffic_ratio), _num(r.roofline_bound), r.medians, r.device,
                 str(r.threads), r.settings, r.note]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


def write_outputs(rows: list[BenchRow], out_dir: Path, device: torch.device,
                  allocator: str = "") -> tuple[Path, Path]:
    """results/bench/bench_<device>.md and .parquet (provenance, with the allocator applied, in the
    Parquet metadata)."""
    import pandas as pd

    from harness.results import provenance, write_parquet_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"bench_{device.type}"
    prov = {**provenance(device), "allocator": allocator}
    md = stem.with_suffix(".md")
    md.write_text(f"# comera-bench bench ({prov['device_name']}, {prov['started_at']})\n\n"
                  + (f"Allocator: {allocator}\n\n" if allocator else "") + to_markdown(rows))
    frame = pd.DataFrame([asdict(r) for r in rows])
    pq = write_parquet_atomic(frame, stem.with_suffix(".parquet"), provenance=prov)
    return md, pq


def parse_targets(text: str) -> set[int]:
    try:
        targets = {int(t) for t in text.split(",") if t.strip()}
    except ValueError:
        raise ValueError(f"--targets {text!r}: expected comma-separated numbers from {sorted(TARGET_NAMES)}") from None
    unknown = targets - set(TARGET_NAMES)
    if unknown or not targets:
        raise ValueError(f"--targets {text!r}: unknown target(s) {sorted(unknown)}; known: {sorted(TARGET_NAMES)}")
    return targets


def _step_worker_main(job_file: str, out: str, log: str) -> int:
    """A step worker process: its result JSON to ``out``; a failure's traceback tail to ``log``."""
    try:
        result = step_worker(json.loads(Path(job_file).read_text()))
    except Exception as exc:  # noqa: BLE001 -- the parent reports it as the configuration's error
        Path(log).write_text("".join(traceback.format_exception(exc))[-4000:])
        return 1
    atomic_write(out, lambda tmp: tmp.write_text(json.dumps(result, default=str)))
    return 0


def cli(argv: list[str]) -> int:
    """``comera-bench bench [--quick] [--targets 1,2,...] [--device cpu|cuda|auto] [--threads N]
    [--allocator reuse|system]``"""
    ap = argparse.ArgumentParser(prog="comera-bench bench", description="Measure and judge the performance "
                                 "targets (ratios measured in the same run).")
    ap.add_argument("--quick", action="store_true", help="reduced sizes and repeats (tests, smoke runs)")
    ap.add_argument("--targets", default="1,2,3,4,5", help="comma-separated target numbers (default all)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--out-dir", default="results/bench", help="where the .md and .parquet go")
    ap.add_argument("--step-timeout", type=float, default=1800, help="seconds for all transformer-step processes together")
    ap.add_argument("--step-rounds", type=int, default=None,
                    help="rounds of the transformer-step processes of targets 2 and 4, every configuration "
                         "once per round (default 3, --quick 1)")
    ap.add_argument("--allocator", choices=allocator_lib.POLICIES, default="reuse",
                    help="CPU allocator policy of this process and the step workers (default reuse; "
                         "see harness.allocator)")
    ap.add_argument("--step-worker-file", help=argparse.SUPPRESS)
    ap.add_argument("--step-out", help=argparse.SUPPRESS)
    ap.add_argument("--step-log", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step_worker_file:
        return _step_worker_main(args.step_worker_file, args.step_out, args.step_log)
    try:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}: need at least 1")
        if not args.step_timeout > 0:
            raise ValueError(f"--step-timeout {args.step_timeout:g}: need a positive number of seconds")
        targets = parse_targets(args.targets)
        cfg = Config.make(args.device, args.threads, args.quick, args.allocator, args.step_rounds)
    except (ValueError, RuntimeError) as exc:
        print(f"comera-bench bench: {exc}", file=sys.stderr)
        return 2
    rows = run_targets(targets, cfg, step_timeout_s=args.step_timeout,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    applied = f"{cfg.allocator}: {cfg.allocator_applied}"
    md, pq = write_outputs(rows, Path(args.out_dir), cfg.device, applied)
    print(f"Allocator: {applied}\n")
    print(to_markdown(rows))
    print(f"-> {md}, {pq}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
