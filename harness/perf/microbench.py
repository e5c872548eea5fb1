"""Micro-benchmarks of single layers: TTLinear vs nn.Linear, TTMEmbedding lookups vs nn.Embedding (Fig 5).

``comera-bench microbench --spec S.json|S.yaml --out M.parquet`` (or ``--preset tiny|paper``): one
``microbench`` row (docs/schema.md) per case, timed in rounds (docs/measurement.md, "One timing model").
What each direction and number covers: docs/design-notes.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import yaml
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from harness.core import allocator, timing
from harness.core.measure import (CPU_ALLOCATED, CUDA_ALLOCATED, call_peak, median_iqr, resolve_device,
                                  time_rounds)
from harness.configs import yamlnum
from harness.configs.microbench_spec import DIRECTIONS, EMBEDDING_VARIANTS, check_spec

TTM_LEVELS = {  # variant -> (tensor-index level, unique-rows level) of comera.ttm.TTMEmbedding
    "ttm_naive": (False, False), "ttm_order": (True, False),
    "ttm_unique": (False, True), "ttm_optimized": (True, True),
}

# The paper's encoder layer shapes (docs/workloads.md) and a Criteo-sized embedding table.
PAPER_LAYERS = [
    {"in_shape": [12, 8, 8], "out_shape": [8, 8, 12]},
    {"in_shape": [12, 8, 8], "out_shape": [12, 16, 16]},
    {"in_shape": [16, 16, 12], "out_shape": [8, 8, 12]},
]
PAPER_TABLE = {"num_embeddings": 1_000_000, "embedding_dim": 128, "row_shape": [32, 32, 32, 32],
               "col_shape": [2, 4, 4, 4], "rank": 32}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "device": "cpu", "num_threads": 1, "min_run_time_s": 0.01, "seed": 0,
        "linear": {"layers": [{"in_shape": [4, 4], "out_shape": [4, 8]}], "ranks": [4], "tokens": [16],
                   "directions": list(DIRECTIONS)},
        "embedding": {"tables": [{"num_embeddings": 1000, "embedding_dim": 16, "row_shape": [10, 10, 10],
                                  "col_shape": [2, 2, 4], "rank": 4}],
                      "indices": [256], "variants": list(EMBEDDING_VARIANTS), "directions": ["fwd_bwd"]},
    },
    "paper": {
        "device": "auto", "num_threads": 2, "min_run_time_s": 1.0, "seed": 0,
        "linear": {"layers": PAPER_LAYERS, "ranks": [10, 20, 30], "tokens": [128, 1024, 4096],
                   "directions": list(DIRECTIONS)},
        "embedding": {"tables": [PAPER_TABLE], "indices": [10000, 20000, 40000],
                      "variants": list(EMBEDDING_VARIANTS), "directions": list(DIRECTIONS)},
    },
}


# ------------------------------------------------------------------------------------------- the spec

def load_spec(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML spec file and validate it (errors name the file and the offending key)."""
    path = Path(path)
    try:
        raw = yamlnum.load(path.read_text())  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"microbench spec {path}: cannot read: {exc}") from exc
    return check_spec(raw, source=str(path))


# -------------------------------------------------------------------------------------------- cases

@dataclass
class Case:
    """One measured call: ``run()`` executes the op once (forward, or forward + backward)."""

    op: str
    variant: str
    shape: str
    tokens: int
    rank: int | None
    direction: str
    run: Callable[[], Any]
    reset: Callable[[], None]
    """Drops what ``run`` left behind (gradients), so a measurement starts from the inputs only."""
    param_bytes: int
    """Bytes of the module's parameters (not part of peak_mem_bytes)."""
    output_bytes: int
    """Bytes of one call's output (part of peak_mem_bytes)."""


@dataclass
class Result:
    case: Case
    round_ms: list[float]
    """ms per call in each round (harness.core.measure.time_rounds)."""
    timing_quality: str
    """The verdict on the rounds (harness.core.timing.judge_rounds)."""
    peak_mem_bytes: int | None
    peak_mem_kind: str | None
    flops: float
    traffic_bytes: float
    """Compulsory memory traffic of the executed ops (see :class:`TrafficCounter`)."""


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def module_call(module: nn.Module, inputs: torch.Tensor, direction: str,
                wrt_input: bool) -> tuple[Callable[[], Any], Callable[[], None], int]:
    """A closure running ``module(inputs)`` once in the given direction, one dropping the gradients it
    left (a ``fwd_bwd`` call starts with it, as ``zero_grad(set_to_none=True)`` would), and the bytes of
    its output."""
    with torch.no_grad():
        output = module(inputs)
    output_bytes = output.numel() * output.element_size()
    if direction == "fwd":
        def fwd():
            with torch.no_grad():
                return module(inputs)
        return fwd, no_reset, output_bytes
    x = inputs.detach().requires_grad_(True) if wrt_input else inputs
    wrt = ([x] if wrt_input else []) + [p for p in module.parameters() if p.requires_grad]
    grad_out = torch.randn_like(output)
    del output

    def reset():
        for t in wrt:
            t.grad = None

    def fwd_bwd():
        reset()
        torch.autograd.backward(module(x), grad_out, inputs=wrt)
    return fwd_bwd, reset, output_bytes


def no_reset() -> None:
    """The reset of a call that leaves nothing behind (a ``fwd`` call, or one that resets itself)."""
    return None


def linear_cases(cfg: dict[str, Any], device: torch.device, seed: int) -> Iterator[Case]:
    """TTLinear (every rank) and nn.Linear at each layer shape, token count and direction."""
    from comera.tt import TTLinear

    gen = torch.Generator().manual_seed(seed)
    for layer in cfg.get("layers", []):
        in_shape, out_shape = [int(n) for n in layer["in_shape"]], [int(n) for n in layer["out_shape"]]
        n_in, n_out = math.prod(in_shape), math.prod(out_shape)
        dims = f"{n_in}x{n_out}"
        tt_shape = f"{dims} [{','.join(map(str, in_shape))}|{','.join(map(str, out_shape))}]"
        modules: list[tuple[str, str, int | None, nn.Module]] = []
        if "dense" in cfg["variants"]:
            modules.append(("dense", dims, None, nn.Linear(n_in, n_out, device=device)))
        if "tt" in cfg["variants"]:
            modules += [("tt", tt_shape, r, TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape,
                                                     rank=r, device=device))
                        for r in cfg.get("ranks", [])]
        for tokens in cfg.get("tokens", []):
            x = torch.randn(tokens, n_in, generator=gen).to(device)
            for variant, shape, rank, module in modules:
                for direction in cfg["directions"]:
                    run, reset, output_bytes = module_call(module, x, direction, wrt_input=True)
                    yield Case("linear", variant, shape, tokens, rank, direction, run, reset,
                               param_bytes(module), output_bytes)


def zipf_indices(count: int, num_embeddings: int, exponent: float, seed: int) -> torch.Tensor:
    """``count`` row ids with Zipf-like frequencies (P(k-th most frequent) ~ k^-exponent); which row is
    the k-th most frequent is a random permutation, so hot rows are spread over the table."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_embeddings + 1, dtype=np.float64) ** exponent
    ranks = rng.choice(num_embeddings, size=count, p=weights / weights.sum())
    return torch.from_numpy(rng.permutation(num_embeddings)[ranks]).long()


def embedding_module(variant: str, table: dict[str, Any], device: torch.device) -> nn.Module:
    """The lookup module of an embedding ``variant`` (EMBEDDING_VARIANTS) for ``table`` (the spec's
    num_embeddings, embedding_dim, row_shape, col_shape, rank) on ``device`` ("meta" builds no storage)."""
    if variant in ("dense_grad", "sparse_grad"):
        return nn.Embedding(table["num_embeddings"], table["embedding_dim"], sparse=variant == "sparse_grad",
                            device=device)
    from comera.ttm import TTMEmbedding

    order_level, unique_level = TTM_LEVELS[variant]
    return TTMEmbedding(table["num_embeddings"], table["embedding_dim"], row_shape=table.get("row_shape"),
                        col_shape=table.get("col_shape"), rank=table["rank"], tensor_index_level=order_level,
                        unique_rows=unique_level, device=device)


def embedding_cases(cfg: dict[str, Any], device: torch.device, seed: int) -> Iterator[Case]:
    """Every lookup variant of each table at each index count (Zipf-like indices) and direction.

    One module lives at a time (a dense table with its gradient may take gigabytes)."""
    for table in cfg.get("tables", []):
        num, dim = int(table["num_embeddings"]), int(table["embedding_dim"])
        indices = {n: zipf_indices(n, num, cfg["zipf_exponent"], seed + n).to(device)
                   for n in cfg.get("indices", [])}
        for variant in cfg["variants"]:
            module = embedding_module(variant, table, device)
            ttm = variant.startswith("ttm_")
            shape = f"{num}x{dim}"
            if ttm:
                shape += f" [{','.join(map(str, module.row_shape))}|{','.join(map(str, module.col_shape))}]"
            for count, idx in indices.items():
                for direction in cfg["directions"]:
                    run, reset, output_bytes = module_call(module, idx, direction, wrt_input=False)
                    yield Case("embedding", variant, shape, count, int(table["rank"]) if ttm else None,
                               direction, run, reset, param_bytes(module), output_bytes)
            del module


# ------------------------------------------------------------------------------------------ measuring

_GATHERS = {torch.ops.aten.index_select.default, torch.ops.aten.embedding.default,
            torch.ops.aten.index.Tensor, torch.ops.aten.gather.default}
_NO_TRAFFIC = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
               torch.ops.aten.empty_strided.default, torch.ops.aten.detach.default}


class TrafficCounter(TorchDispatchMode):
    """Compulsory memory traffic of the executed ATen ops: every non-view op reads its tensor arguments
    and writes its outputs once; a gather reads only the rows it returns (2x output + indices).
    A lower bound of real traffic for operands larger than the caches (reused operands counted again)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func not in _NO_TRAFFIC:
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if func in _GATHERS:
                index = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                         and not t.is_floating_point()]
                self.bytes += 2 * _nbytes(outs) + _nbytes(index)
            else:
                ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                self.bytes += _nbytes(ins) + _nbytes(outs)
        return out


def _nbytes(tensors: list[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        if t.is_sparse:
            total += _nbytes([t._indices(), t._values()])
        else:
            total += t.numel() * t.element_size()
    return total


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while it is active, views and autograd's gradient accumulation
    included (one per op call, whatever it launches); ``names`` lists them in order (``"aten.mm.default"``,
    ``"aten.add.Tensor"``, ...)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    @property
    def count(self) -> int:
        return len(self.names)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def count_ops(run: Callable[[], Any]) -> int:
    """ATen ops dispatched by one call of ``run`` (after one uncounted call, which may set things up)."""
    run()
    with OpCounter() as counter:
        run()
    return counter.count


def count_cost(run: Callable[[], Any]) -> tuple[float, float]:
    """(matmul-class FLOPs, compulsory traffic bytes) of one call."""
    from comera import register_flop_formulas

    register_flop_formulas()  # oneDNN's inner product (large float32 CPU products of TT layers) counts too
    counter = FlopCounterMode(display=False)
    traffic = TrafficCounter()
    with counter, traffic:
        run()
    return float(counter.get_total_flops()), float(traffic.bytes)


def measure(case: Case, device: torch.device, *, num_threads: int, min_run_time_s: float, rounds: int,
            memory: bool = True) -> Result:
    """Time (``rounds`` rounds and their verdict, with the machine's state while they ran), peak memory
    and op cost of one case."""
    machine = timing.MachineState()
    machine.begin()
    round_ms = time_rounds({"case": case.run}, rounds=rounds, num_threads=num_threads,
                           min_run_time_s=min_run_time_s)["case"]
    machine.end()
    state = machine.columns()
    verdict = timing.judge_rounds(round_ms, "rounds", run_queue_frac=state["run_queue_frac"],
                                  cpu_pressure=state["cpu_pressure"])
    mem, kind = call_peak(case.run, device, case.reset) if memory else (None, None)
    flops, traffic = count_cost(case.run)
    return Result(case, round_ms, verdict, mem, kind, flops, traffic)


def run_cases(spec: dict[str, Any], *, progress: Callable[[str], None] | None = None) -> Iterator[Result]:
    """Measure every case of a (checked) spec, one at a time (the caller sets the allocator policy)."""
    device = resolve_device(spec["device"], "microbench device")
    torch.set_num_threads(spec["num_threads"])
    torch.manual_seed(spec["seed"])
    cases: list[Iterator[Case]] = []
    if "linear" in spec:
        cases.append(linear_cases(spec["linear"], device, spec["seed"]))
    if "embedding" in spec:
        cases.append(embedding_cases(spec["embedding"], device, spec["seed"]))
    for generator in cases:
        for case in generator:
            result = measure(case, device, num_threads=spec["num_threads"], rounds=spec["rounds"],
                             min_run_time_s=spec["min_run_time_s"], memory=spec["memory"])
            if progress:
                progress(f"{case.op:9s} {case.variant:13s} {case.shape:28s} tokens={case.tokens:<6d} "
                         f"rank={case.rank!s:4s} {case.direction:7s} "
                         f"{median_iqr(result.round_ms)[0]:10.3f} ms  "
                         f"peak={result.peak_mem_bytes}  {result.timing_quality}")
            yield result


def to_row(result: Result, prov: dict[str, Any]) -> dict[str, Any]:
    """A ``microbench`` row (docs/schema.md) for one result."""
    c = result.case
    median, iqr = median_iqr(result.round_ms)
    return {"op": c.op, "variant": c.variant, "shape": c.shape, "tokens": c.tokens, "rank": c.rank,
            "direction": c.direction, "time_ms": median, "time_ms_iqr": iqr,
            "round_time_ms": json.dumps(result.round_ms), "timing_quality": result.timing_quality,
            "peak_mem_bytes": result.peak_mem_bytes, "param_bytes": c.param_bytes,
            "output_bytes": c.output_bytes, "flops": result.flops, **prov}


def run(spec: dict[str, Any], *, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Rows with the ``microbench`` columns for every case of ``spec`` (checked here), measured under its
    allocator policy."""
    from harness.results import provenance

    spec = check_spec(spec)
    with allocator.policy(spec["allocator"]):
        results = list(run_cases(spec, progress=progress))
    prov = provenance(resolve_device(spec["device"], "microbench device"))
    return [to_row(r, prov) for r in results]


def cli(argv: list[str]) -> int:
    """``comera-bench microbench (--spec S.json | --preset tiny|paper) --out M.parquet``"""
    from harness.results import PROVENANCE_COLUMNS, provenance, to_frame, write_parquet_atomic

    ap = argparse.ArgumentParser(prog="comera-bench microbench",
                                 description="Time and memory of single TT/TTM layers against dense ones.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", help="JSON or YAML spec (ops, shapes, ranks, tokens, lookups, repeats, "
                                    "device)")
    src.add_argument("--preset", choices=sorted(PRESETS), help="a built-in spec")
    ap.add_argument("--out", required=True, help="microbench Parquet file (written atomically)")
    ap.add_argument("--device", choices=["cpu", "cuda", "auto"], help="override the spec's device")
    ap.add_argument("--allocator", choices=allocator.POLICIES,
                    help="override the spec's allocator policy (default reuse; see harness.core.allocator)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.spec) if args.spec else check_spec(PRESETS[args.preset],
                                                                 source=f"preset {args.preset}")
        if args.device:
            spec["device"] = args.device
        if args.allocator:
            spec["allocator"] = args.allocator
        with allocator.policy(spec["allocator"]) as applied:
            rows = run(spec, progress=None if args.quiet else lambda line: print(line, file=sys.stderr))
    except (ValueError, RuntimeError) as exc:
        print(f"comera-bench microbench: {exc}", file=sys.stderr)
        return 2
    device = resolve_device(spec["device"], "microbench device")
    meta = {**(provenance(device) if not rows else {k: rows[0][k] for k in PROVENANCE_COLUMNS}),
            "peak_mem_kind": CUDA_ALLOCATED if device.type == "cuda" else CPU_ALLOCATED, "spec": spec,
            "allocator": applied}
    try:
        write_parquet_atomic(to_frame(rows, "microbench"), args.out, kind="microbench",
                             provenance=json.loads(json.dumps(meta, default=str)))
    except OSError as exc:
        print(f"comera-bench microbench: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{len(rows)} microbench rows -> {args.out}")
    return 0
