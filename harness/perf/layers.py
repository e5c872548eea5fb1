"""Targets 1 and 3: single layers against their dense counterparts and the official CoMERA code (TTLinear vs
nn.Linear and the official TT_forward, TTM lookups vs each other, the official unique lookup and
nn.Embedding), each speedup over a dense layer with its roofline bound."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from harness.core import measure
from harness.perf import microbench as mb
from harness.perf.config import Config
from harness.perf.report import BenchRow, make_row, per_round_text, quotient, value_of
from harness.perf.roofline import Roofline
from harness.results import analysis


# -------------------------------------------------------------------------------------------- target 1

def target_linear(cfg: Config, roof: Roofline) -> list[BenchRow]:
    """TTLinear vs nn.Linear, forward + backward (input gradient included), same tokens; and, timed in the
    same interleaved rounds, TTLinear vs the official CoMERA algorithm (harness.perf.official) on the same
    parameters, and nn.Linear vs the official algorithm (info): three rows per shape."""
    from comera.tt import TTLinear
    from harness.perf.official import OfficialTTLinear

    rows = []
    for i, case in enumerate(cfg.goals["linear"]):
        in_shape, out_shape, rank = case["in_shape"], case["out_shape"], case["rank"]
        tokens = case["quick_tokens"] if cfg.quick else case["tokens"]
        n_in, n_out = math.prod(in_shape), math.prod(out_shape)
        x = torch.randn(tokens, n_in, device=cfg.device)
        dense = torch.nn.Linear(n_in, n_out, device=cfg.device)
        tt = TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank, device=cfg.device)
        official = OfficialTTLinear(tt)
        one = x[:1].contiguous()
        calls = {"dense": mb.module_call(dense, x, "fwd_bwd", wrt_input=True),
                 "tt": mb.module_call(tt, x, "fwd_bwd", wrt_input=True),
                 "tt_1": mb.module_call(tt, one, "fwd_bwd", wrt_input=True),
                 "floor_1": mb.module_call(AutogradOnly(tt), one, "fwd_bwd", wrt_input=True),
                 "direct_1": (contraction_only(tt, one), mb.no_reset),
                 "official": mb.module_call(official, x, "fwd_bwd", wrt_input=True)}
        per_round = measure.time_rounds({k: run for k, (run, *_) in calls.items()}, rounds=cfg.rounds,
                                  num_threads=cfg.num_threads, min_run_time_s=cfg.min_run_time_s)
        times = {k: statistics.median(v) for k, v in per_round.items()}
        speedup = analysis.rounds_ratio(per_round["dense"], per_round["tt"])
        vs_official = analysis.rounds_ratio(per_round["official"], per_round["tt"])
        cost = {k: mb.count_cost(run) for k, (run, *_) in calls.items() if k in ("dense", "tt", "official")}
        plan = tt.plan(tokens)
        shape = f"{n_in}->{n_out} r{rank}, {tokens} tokens"
        rows.append(make_row(
            1, f"TTLinear fwd+bwd speedup, {shape}", case["goal"],
            value_of(speedup), goal_key=f"linear[{i}]",
            stability=analysis.rounds_verdict({"nn.Linear": per_round["dense"], "TTLinear": per_round["tt"]}),
            flop_ratio=quotient(cost["dense"][0], cost["tt"][0]),
            traffic_ratio=quotient(cost["dense"][1], cost["tt"][1]),
            bound=roof.speedup_bound(times["dense"] / 1e3, cost["tt"]), bound_basis="roofline",
            medians=f"nn.Linear {times['dense']:.3f} ms, "
                    f"TTLinear {times['tt']:.3f} ms{per_round_text(speedup)}",
            settings=f"ranks {tt.ranks}, plan {plan.left}/{plan.right}, {cfg.label()}; ratio: median over "
                     f"rounds of the ratio within a round (harness.results.analysis.rounds_ratio)"
                     f"{matmul_precision(cfg.device)}",
            note=fixed_cost_note(times["dense"], times["tt"], times["tt_1"], times["floor_1"],
                                 times["direct_1"])))
        rows.append(make_row(
            1, f"TTLinear vs official TT_forward, {shape}", case["vs_official"],
            value_of(vs_official), goal_key=f"linear[{i}].vs_official",
            stability=analysis.rounds_verdict({"official": per_round["official"],
                                               "TTLinear": per_round["tt"]}),
            flop_ratio=quotient(cost["official"][0], cost["tt"][0]),
            traffic_ratio=quotient(cost["official"][1], cost["tt"][1]),
            medians=f"nn.Linear {times['dense']:.3f} ms, TTLinear {times['tt']:.3f} ms, "
                    f"official TT_forward {times['official']:.3f} ms{per_round_text(vs_official)}",
            settings=f"same cores, gates and bias; both multiply the cores by the gates and add the bias "
                     f"(official: get_factors(prune_mask=True) gating and the bias outside TT_forward); "
                     f"ranks {tt.ranks}, {cfg.label()}{matmul_precision(cfg.device)}",
            note="(nn.Linear / TTLinear) / (nn.Linear / official) = official / TTLinear; "
                 f"nn.Linear / official {quotient(times['dense'], times['official']):.2f}x; "
                 "official algorithm reimplemented in harness/perf/official.py, timed in the same "
                 "interleaved rounds; no roofline bound: the two do about the same FLOPs (flop_ratio), "
                 "so the difference is per-op overhead and layouts"))
        dense_vs_official = analysis.rounds_ratio(per_round["dense"], per_round["official"])
        predicted = plan.summary()
        rows.append(make_row(
            1, f"nn.Linear / official TT_forward fwd+bwd speedup, {shape}", None, value_of(dense_vs_official),
            stability=analysis.rounds_verdict({"nn.Linear": per_round["dense"],
                                               "official": per_round["official"]}),
            flop_ratio=quotient(cost["dense"][0], cost["official"][0]),
            traffic_ratio=quotient(cost["dense"][1], cost["official"][1]),
            medians=f"nn.Linear {times['dense']:.3f} ms, official TT_forward {times['official']:.3f} ms"
                    f"{per_round_text(dense_vs_official)}",
            settings=f"same rounds as the two rows above; {cfg.label()}{matmul_precision(cfg.device)}",
            note=f"TTLinear's plan: {predicted['order']}; predicted {predicted['flops']:,d} FLOPs, "
                 f"{predicted['traffic_bytes']:,d} bytes of token-sized operands (float32), "
                 f"{predicted['kernels']} kernels (comera.contraction.ContractionPlan.summary)"))
    return rows


def linear_shapes(cases: list[dict]) -> list[tuple[list[int], list[int], int]]:
    """The distinct (in_shape, out_shape, rank) of target 1's cases, in order."""
    shapes = []
    for case in cases:
        shape = (case["in_shape"], case["out_shape"], case["rank"])
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def target_linear_ops(cfg: Config) -> list[BenchRow]:
    """ATen ops dispatched from Python by one forward+backward of the TTLinear (bias, rank gates; input
    gradient included; gradients reset to None first, as ``zero_grad`` does) at each layer shape of
    ``linear`` and each token count of ``linear_ops``, nn.Linear's count beside it (--quick counts the same
    calls)."""
    from comera.tt import TTLinear

    goal = cfg.goals["linear_ops"]
    rows = []
    for in_shape, out_shape, rank in linear_shapes(cfg.goals["linear"]):
        n_in, n_out = math.prod(in_shape), math.prod(out_shape)
        tt = TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank, device=cfg.device)
        dense = torch.nn.Linear(n_in, n_out, device=cfg.device)
        for tokens in goal["tokens"]:
            x = torch.randn(tokens, n_in, device=cfg.device)
            calls = {k: mb.module_call(m, x, "fwd_bwd", wrt_input=True)[0]
                     for k, m in (("tt", tt), ("dense", dense))}
            ops = {k: mb.count_ops(run) for k, run in calls.items()}
            plan = tt.plan(tokens)
            rows.append(make_row(
                1, f"ATen ops per TTLinear fwd+bwd, {n_in}->{n_out} r{rank}, {tokens} tokens", goal["goal"],
                ops["tt"], better="<=", goal_key="linear_ops.goal",
                medians=f"TTLinear {ops['tt']} ops, nn.Linear {ops['dense']} ops",
                settings=f"ranks {tt.ranks}, plan {plan.left}/{plan.right}, rank gates and bias",
                note="ATen ops dispatched from Python (every op a TorchDispatchMode sees in one "
                     "forward+backward: views, and the one gradient accumulation per leaf "
                     f"({1 + len(list(tt.parameters()))} for TTLinear: input, cores, gates, bias) included)"))
    return rows


def graphed_fwd_bwd(module: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *, warmup: int = 3):
    """A closure replaying one forward+backward of ``module`` from a CUDA graph captured once, after
    ``warmup`` eager calls on a side stream. ``x`` (a leaf that requires grad) and ``grad_out`` are the
    graph's static input and output gradient (copy new values into them before a replay); each replay
    rewrites the gradients the capture left on ``x`` and the parameters."""
    wrt = [x, *(p for p in module.parameters() if p.requires_grad)]

    def step() -> None:
        for t in wrt:
            t.grad = None
        torch.autograd.backward(module(x), grad_out, inputs=wrt)

    side = torch.cuda.Stream(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream(x.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for t in wrt:
        t.grad = None
    with torch.cuda.graph(graph):
        torch.autograd.backward(module(x), grad_out, inputs=wrt)
    return graph.replay


def compiled_fwd_bwd(module: torch.nn.Module, x: torch.Tensor):
    """The fwd_bwd closure of ``torch.compile(module)``, called once (so it is compiled before timing)."""
    run = mb.module_call(torch.compile(module), x, "fwd_bwd", wrt_input=True)[0]
    run()
    return run


def target_linear_cuda(cfg: Config, progress: Callable[[str], None]) -> list[BenchRow]:
    """On CUDA, TTLinear vs nn.Linear forward+backward (input gradient included) at each case of
    ``cuda_linear``, timed in the same interleaved rounds in three ways, each like for like: both eager,
    both replayed from a CUDA graph of their forward+backward, both under torch.compile; and the official
    algorithm (harness.perf.official) eager. Rows record the float32 matmul precision (TF32 or not). On
    another device no row: the reason is printed."""
    if cfg.device.type != "cuda":
        progress(f"target 1 CUDA rows skipped: they need a CUDA device, this run's is {cfg.device.type}")
        return []
    from comera.tt import TTLinear
    from harness.perf.official import OfficialTTLinear

    rows = []
    for i, case in enumerate(cfg.goals["cuda_linear"]):
        in_shape, out_shape, rank = case["in_shape"], case["out_shape"], case["rank"]
        tokens = case["quick_tokens"] if cfg.quick else case["tokens"]
        n_in, n_out = math.prod(in_shape), math.prod(out_shape)
        x = torch.randn(tokens, n_in, device=cfg.device)
        layers = {"dense": torch.nn.Linear(n_in, n_out, device=cfg.device),
                  "tt": TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank,
                                 device=cfg.device)}
        runs = {k: mb.module_call(m, x, "fwd_bwd", wrt_input=True)[0] for k, m in layers.items()}
        runs["official"] = mb.module_call(OfficialTTLinear(layers["tt"]), x, "fwd_bwd", wrt_input=True)[0]
        grad_out = torch.randn(tokens, n_out, device=cfg.device)
        runs.update({f"{k}_graph": graphed_fwd_bwd(m, x.clone().requires_grad_(True), grad_out)
                     for k, m in layers.items()})
        compile_error = ""
        try:  # a compiler failure costs its own row only, not the eager and graph rows
            runs.update({f"{k}_compile": compiled_fwd_bwd(m, x) for k, m in layers.items()})
        except Exception as exc:  # inductor raises many kinds
            compile_error = f"torch.compile failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
            progress(f"target 1 CUDA, {n_in}->{n_out}: {compile_error}")
        per_round = measure.time_rounds(runs, rounds=cfg.rounds, num_threads=cfg.num_threads,
                                  min_run_time_s=cfg.min_run_time_s)
        times = {k: statistics.median(v) for k, v in per_round.items()}
        plan = layers["tt"].plan(tokens)
        shape = f"{n_in}->{n_out} r{rank}, {tokens} tokens"
        settings = (f"ranks {layers['tt'].ranks}, plan {plan.left}/{plan.right}, {cfg.label()}; ratio: "
                    f"median over rounds of the ratio within a round{matmul_precision(cfg.device)}")
        for mode, what, goal_name in (("_graph", "CUDA graph replay", "graph"), ("", "eager", "eager"),
                                      ("_compile", "torch.compile", None)):
            if f"tt{mode}" not in runs:
                rows.append(make_row(1, f"TTLinear fwd+bwd speedup, {what}, {shape}", None, None,
                                     settings=settings, note=compile_error))
                continue
            value = analysis.rounds_ratio(per_round[f"dense{mode}"], per_round[f"tt{mode}"])
            goal = case.get(goal_name) if goal_name else None
            rows.append(make_row(
                1, f"TTLinear fwd+bwd speedup, {what}, {shape}", goal, value_of(value),
                goal_key=f"cuda_linear[{i}].{goal_name}" if goal is not None else "",
                stability=analysis.rounds_verdict({"nn.Linear": per_round[f"dense{mode}"],
                                                   "TTLinear": per_round[f"tt{mode}"]}),
                medians=f"nn.Linear {times[f'dense{mode}']:.3f} ms, TTLinear {times[f'tt{mode}']:.3f} ms"
                        f"{per_round_text(value)}",
                settings=settings))
        value = analysis.rounds_ratio(per_round["official"], per_round["tt"])
        rows.append(make_row(
            1, f"TTLinear vs official TT_forward, eager, {shape}", case["vs_official"], value_of(value),
            goal_key=f"cuda_linear[{i}].vs_official",
            stability=analysis.rounds_verdict({"official": per_round["official"],
                                               "TTLinear": per_round["tt"]}),
            medians=f"TTLinear {times['tt']:.3f} ms, official TT_forward {times['official']:.3f} ms"
                    f"{per_round_text(value)}",
            settings=settings))
    return rows


def matmul_precision(device: torch.device) -> str:
    """``"; float32 matmul precision <p>"`` on CUDA (TF32 or not changes nn.Linear's time several-fold),
    else ""."""
    return (f"; float32 matmul precision {torch.get_float32_matmul_precision()}" if device.type == "cuda"
            else "")


def fixed_cost_note(dense_ms: float, tt_ms: float, one_token_ms: float, floor_ms: float,
                    direct_ms: float) -> str:
    """The TT layer's cost that does not shrink with the token count -- the same call on one token: core
    merges, gate products, per-op overhead -- the ratio it caps, and its two parts measured on one token:
    autograd alone (:class:`AutogradOnly`) and the contraction's own calls (:func:`contraction_only`)."""
    return (f"profile: the same TTLinear on 1 token takes {one_token_ms:.3f} ms "
            f"({one_token_ms / tt_ms:.0%} of its time here: core merges, gates, per-op overhead, "
            "which do not shrink with tokens); even free token-sized products would give at most "
            f"{dense_ms / one_token_ms:.2f}x; on 1 token, autograd alone (a Function over the same tensors "
            f"that does no arithmetic) takes {floor_ms:.3f} ms and the contraction's forward and backward "
            f"called directly (no autograd) {direct_ms:.3f} ms")


def contraction_only(layer: torch.nn.Module, x: torch.Tensor):
    """A closure running the forward and the backward of ``layer``'s contraction (a TTLinear's
    ``comera.tt.TTLinearFunction``) directly on ``x``, outside autograd: the ATen calls and the Python
    of a TT call without the graph, its saved tensors or gradient accumulation."""
    from comera.tt import TTLinearFunction, forward_gates, parameter_entries

    plan, params = layer.plan(x.shape[0]), [*parameter_entries(layer.cores), *forward_gates(layer)]
    dy = torch.randn(x.shape[0], layer.out_features, device=x.device, dtype=x.dtype)

    class Context:  # what forward and backward use of autograd's context object
        needs_input_grad = (False, True, layer.bias is not None) + (True,) * len(params)

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

    def run() -> None:
        with torch.no_grad():
            ctx = Context()
            TTLinearFunction.forward(ctx, plan, x, layer.bias, *params)
            TTLinearFunction.backward(ctx, dy)
    return run


class _NoArithmetic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, width, x, *params):
        ctx.save_for_backward(x, *params)
        return x.new_empty(x.shape[0], width)

    @staticmethod
    def backward(ctx, dy):
        return (None, *(torch.empty_like(t) for t in ctx.saved_tensors))


class AutogradOnly(torch.nn.Module):
    """What autograd alone costs one call of ``layer`` (a TTLinear): a custom Function over the same input,
    bias, cores and gates that saves them, allocates the output and one gradient per input, and computes
    nothing. Its time is a floor of the layer's fixed cost in eager PyTorch on the machine at hand."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from comera.tt import parameter_entries

        layer = self.layer
        bias = [] if layer.bias is None else [layer.bias]
        return _NoArithmetic.apply(layer.out_features, x, *bias, *parameter_entries(layer.cores),
                                   *parameter_entries(layer.gates))


# -------------------------------------------------------------------------------------------- target 3

MNLI_TABLE = {"num_embeddings": 30522, "embedding_dim": 768, "row_shape": [16, 20, 10, 10],
              "col_shape": [4, 4, 8, 6], "rank": 32}
"""The official CoMERA MNLI model's word embedding (its ``init_Transformer``: shape [[16, 20, 10, 10],
[4, 4, 8, 6]], ranks [1, 32, 32, 32, 1])."""
EMBEDDING_CASES = {"full": [(mb.PAPER_TABLE, [10_000, 20_000, 40_000], True), (MNLI_TABLE, [40_000], False)],
                   "quick": [({"num_embeddings": 10_000, "embedding_dim": 32, "row_shape": [10, 10, 10, 10],
                               "col_shape": [2, 2, 2, 4], "rank": 8}, [1000, 2000], True)]}
"""Target 3's tables (full run, --quick): each with its index counts and whether the nn.Embedding / TTM
table-memory rows are given (the goal of 15x is the DLRM paper table's; a 30522-row table is smaller than
the lookup's working memory at 40,000 indices)."""


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
    """For each table and index count of :data:`EMBEDDING_CASES`: TTM optimized vs naive lookup (fwd+bwd
    time and peak memory), the official CoMERA unique lookup (harness.perf.official, order-4 tables) vs
    the optimized one on the same parameters, timed in the same interleaved rounds; TTM vs nn.Embedding
    table memory."""
    from harness.perf.official import OfficialTTMEmbedding

    goals = cfg.goals["lookup"]
    rows = []
    for table, counts, table_memory in EMBEDDING_CASES["quick" if cfg.quick else "full"]:
        variants = ("ttm_naive", "ttm_optimized", "dense_grad")
        modules = {v: mb.embedding_module(v, table, cfg.device) for v in variants}
        if len(modules["ttm_optimized"].row_shape) == 4:
            modules["official"] = OfficialTTMEmbedding(modules["ttm_optimized"])
        shape = f"{table['num_embeddings']}x{table['embedding_dim']} rank {table['rank']}"
        for count in counts:
            rows += _lookup_rows(cfg, roof, goals, table, modules, shape, count, table_memory)
        del modules
    return rows


def _lookup_rows(cfg: Config, roof: Roofline, goals: dict, table: dict, modules: dict, shape: str,
                 count: int, table_memory: bool) -> list[BenchRow]:
    """Target 3's rows of one table at one index count (the table-memory rows when ``table_memory``)."""
    idx = mb.zipf_indices(count, table["num_embeddings"], 1.05, count).to(cfg.device)
    calls = {v: mb.module_call(m, idx, "fwd_bwd", wrt_input=False) for v, m in modules.items()}
    per_round = measure.time_rounds({v: run for v, (run, *_) in calls.items()}, rounds=cfg.rounds,
                                    num_threads=cfg.num_threads, min_run_time_s=cfg.min_run_time_s)
    times = {v: statistics.median(t) for v, t in per_round.items()}
    speedup = analysis.rounds_ratio(per_round["ttm_naive"], per_round["ttm_optimized"])
    peaks = {}
    for v, (run, reset, _) in calls.items():
        peaks[v], kind = measure.call_peak(run, cfg.device, reset)
    cost = {v: mb.count_cost(run) for v, (run, *_) in calls.items()}
    output_bytes = count * table["embedding_dim"] * modules["dense_grad"].weight.element_size()
    ttm_variants = ("ttm_naive", "ttm_optimized", "dense_grad")
    footprint = {v: peaks[v] + mb.param_bytes(modules[v]) for v in ttm_variants}
    memory = {v: TableMemory.of(modules[v], peaks[v], output_bytes) for v in ("ttm_optimized", "dense_grad")}
    unique = int(torch.unique(idx).numel())
    common = {"settings": f"table {shape}, {unique} unique rows, zipf 1.05, {cfg.label()}"}
    at = f"{shape}, {count} indices"
    official = "official" in modules
    rows = [make_row(
        3, f"TTM optimized vs naive lookup fwd+bwd speedup, {at}", goals["speedup"],
        value_of(speedup),
        stability=analysis.rounds_verdict({"naive": per_round["ttm_naive"],
                                           "optimized": per_round["ttm_optimized"]}),
        flop_ratio=quotient(cost["ttm_naive"][0], cost["ttm_optimized"][0]),
        traffic_ratio=quotient(cost["ttm_naive"][1], cost["ttm_optimized"][1]),
        bound=roof.speedup_bound(times["ttm_naive"] / 1e3, cost["ttm_optimized"]), bound_basis="roofline",
        goal_key="lookup.speedup",
        medians=f"naive {times['ttm_naive']:.3f} ms, optimized {times['ttm_optimized']:.3f} ms, "
                + (f"official unique {times['official']:.3f} ms, " if official else "")
                + f"nn.Embedding dense grad {times['dense_grad']:.3f} ms{per_round_text(speedup)}",
        **common),
        make_row(
        3, f"TTM optimized vs naive lookup peak memory ratio, {at}", goals["memory"],
        quotient(peaks["ttm_naive"], peaks["ttm_optimized"]), goal_key="lookup.memory",
        medians=f"naive {peaks['ttm_naive']} B, optimized {peaks['ttm_optimized']} B"
                + (f", official unique {peaks['official']} B" if official else "") + f" ({kind})", **common)]
    if official:
        vs_official = analysis.rounds_ratio(per_round["official"], per_round["ttm_optimized"])
        rows.append(make_row(
            3, f"TTM optimized lookup vs official unique lookup fwd+bwd speedup, {at}", goals["vs_official"],
            value_of(vs_official), goal_key="lookup.vs_official",
            stability=analysis.rounds_verdict({"official": per_round["official"],
                                               "optimized": per_round["ttm_optimized"]}),
            flop_ratio=quotient(cost["official"][0], cost["ttm_optimized"][0]),
            traffic_ratio=quotient(cost["official"][1], cost["ttm_optimized"][1]),
            medians=f"official unique {times['official']:.3f} ms, optimized {times['ttm_optimized']:.3f} ms"
                    f"{per_round_text(vs_official)}; peak memory official / optimized "
                    f"{quotient(peaks['official'], peaks['ttm_optimized']):.2f}",
            note="official TensorizedEmbedding_order4 lookup with use_unique=True, reimplemented in "
                 "harness/perf/official.py on the same cores and gates, timed in the same rounds",
            **common))
    if not table_memory:
        return rows
    rows.append(make_row(
        3, f"nn.Embedding (dense grad) / TTM table memory (params + grads + lookup working memory "
           f"beyond the {count}x{table['embedding_dim']} output), {at}", goals["table_memory"],
        quotient(memory["dense_grad"].total, memory["ttm_optimized"].total),
        goal_key="lookup.table_memory",
        medians=f"nn.Embedding {memory['dense_grad']}; TTM {memory['ttm_optimized']} ({kind})", **common))
    rows.append(make_row(
        3, f"nn.Embedding (dense grad) / TTM footprint (params + fwd+bwd peak, which includes the "
           f"{output_bytes} B output both produce), {at}", None,
        quotient(footprint["dense_grad"], footprint["ttm_optimized"]),
        medians=f"nn.Embedding {footprint['dense_grad']} B, TTM {footprint['ttm_optimized']} B ({kind})",
        note="informational: the table-memory row above carries the goal", **common))
    return rows
