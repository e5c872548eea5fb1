"""TTLinear vs nn.Linear (and the official CoMERA contraction) and TTM lookup vs nn.Embedding, forward +
backward (pytest-benchmark): a developer's regression check, not the project's timing model.

Each pair shares a benchmark group, so ``pytest benchmarks/`` prints them side by side; the ratios with
their goals are ``comera-bench bench``'s table (docs/performance.md)."""
from __future__ import annotations

import math

import pytest
import torch

from comera.tt import TTLinear
from harness.perf import microbench as mb

LINEAR_SHAPES = {  # id -> in_shape, out_shape, tokens (the paper's encoder layers, rank 30)
    "768x768-128tok": ((12, 8, 8), (8, 8, 12), 128),
    "768x768-4096tok": ((12, 8, 8), (8, 8, 12), 4096),
    "768x3072-4096tok": ((12, 8, 8), (12, 16, 16), 4096),
}
RANK = 30
TABLE = {"num_embeddings": 100_000, "embedding_dim": 64, "row_shape": [10, 10, 20, 50],
         "col_shape": [2, 2, 4, 4], "rank": 16}
LOOKUPS = 4096


@pytest.mark.parametrize("variant", ["nn.Linear", "TTLinear", "official"])
@pytest.mark.parametrize("shape", list(LINEAR_SHAPES))
def test_linear_fwd_bwd(benchmark, shape, variant):
    """``official``: the official CoMERA contraction (harness/perf/official.py) on a TTLinear's parameters."""
    from harness.perf.official import OfficialTTLinear

    in_shape, out_shape, tokens = LINEAR_SHAPES[shape]
    n_in, n_out = math.prod(in_shape), math.prod(out_shape)
    if variant == "nn.Linear":
        layer = torch.nn.Linear(n_in, n_out)
    else:
        layer = TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=RANK)
        layer = OfficialTTLinear(layer) if variant == "official" else layer
    run, *_ = mb.module_call(layer, torch.randn(tokens, n_in), "fwd_bwd", wrt_input=True)
    benchmark.group = f"linear {shape}"
    benchmark(run)


@pytest.mark.parametrize("variant", ["dense_grad", "ttm_optimized"], ids=["nn.Embedding", "TTMEmbedding"])
def test_lookup_fwd_bwd(benchmark, variant):
    module = mb.embedding_module(variant, TABLE, torch.device("cpu"))
    indices = mb.zipf_indices(LOOKUPS, TABLE["num_embeddings"], 1.05, seed=0)
    run, *_ = mb.module_call(module, indices, "fwd_bwd", wrt_input=False)
    benchmark.group = f"lookup {TABLE['num_embeddings']}x{TABLE['embedding_dim']}-{LOOKUPS}idx"
    benchmark(run)
