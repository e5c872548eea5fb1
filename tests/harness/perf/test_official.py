"""harness.perf.official: the official-algorithm TT layer of target 1 computes the TTLinear's function and its
gradients (dense float64 reference and TTLinear itself), shares its parameters, and only takes 3+3 modes."""
from __future__ import annotations

import pytest
import torch

from comera.tt import TTLinear
from harness.perf import microbench as mb
from harness.perf.official import OfficialTTLinear

CASES = {
    "bench 768->768 r30": ([12, 8, 8], [8, 8, 12], 30),
    "bench 768->3072 r30": ([12, 8, 8], [12, 16, 16], 30),
    "small, uneven ranks": ([2, 3, 4], [3, 2, 4], [1, 2, 5, 3, 4, 2, 1]),
    "size-1 modes and bonds": ([1, 4, 3], [2, 1, 5], [1, 1, 3, 1, 2, 2, 1]),
}


def _layer(in_shape, out_shape, rank, dtype=torch.float64, seed=0) -> TTLinear:
    torch.manual_seed(seed)
    n_in, n_out = torch.Size(in_shape).numel(), torch.Size(out_shape).numel()
    tt = TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank, dtype=dtype)
    with torch.no_grad():
        for g in tt.gates:
            g.uniform_(0.25, 1.75)  # gates away from one, so a gate left out would show
        tt.bias.normal_()
    return tt


def _values_and_grads(y: torch.Tensor, wrt: list[torch.Tensor], dy: torch.Tensor) -> list[torch.Tensor]:
    return [y.detach(), *torch.autograd.grad(y, wrt, dy)]


def _close(got: list[torch.Tensor], want: list[torch.Tensor], rtol: float) -> None:
    names = ["y", "x"] + [f"param {i}" for i in range(len(want) - 2)]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, name
        scale = b.abs().max().clamp_min(1e-30)
        assert float((a.double() - b.double()).abs().max() / scale) < rtol, name


@pytest.mark.parametrize("in_shape, out_shape, rank", CASES.values(), ids=CASES.keys())
def test_forward_and_every_gradient_match_the_dense_reference_and_ttlinear(in_shape, out_shape, rank):
    tt = _layer(in_shape, out_shape, rank)
    official = OfficialTTLinear(tt)
    x = torch.randn(7, tt.in_features, dtype=torch.float64, requires_grad=True)
    wrt = [x, *tt.cores, *tt.gates, tt.bias]
    dy = torch.randn(7, tt.out_features, dtype=torch.float64)
    reference = _values_and_grads(x @ tt.dense_weight() + tt.bias, wrt, dy)
    _close(_values_and_grads(official(x), wrt, dy), reference, 1e-12)
    _close(_values_and_grads(official(x), wrt, dy), _values_and_grads(tt(x), wrt, dy), 1e-12)


def test_float32_at_a_bench_shape_matches_the_float64_reference():
    in_shape, out_shape, rank = CASES["bench 768->3072 r30"]
    tt64 = _layer(in_shape, out_shape, rank)
    tt32 = _layer(in_shape, out_shape, rank, dtype=torch.float32)
    with torch.no_grad():
        for p32, p64 in zip(tt32.parameters(), tt64.parameters()):
            p32.copy_(p64)
    x64 = torch.randn(16, tt64.in_features, dtype=torch.float64, requires_grad=True)
    x32 = x64.detach().float().requires_grad_(True)
    dy = torch.randn(16, tt64.out_features, dtype=torch.float64)
    reference = _values_and_grads(x64 @ tt64.dense_weight() + tt64.bias, [x64, *tt64.parameters()], dy)
    got = _values_and_grads(OfficialTTLinear(tt32)(x32), [x32, *tt32.parameters()], dy.float())
    _close(got, reference, 1e-4)


def test_leading_axes_are_flattened_and_restored():
    tt = _layer(*CASES["small, uneven ranks"])
    x = torch.randn(2, 3, tt.in_features, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 3, tt.out_features, dtype=torch.float64)
    wrt = [x, *tt.parameters()]
    _close(_values_and_grads(OfficialTTLinear(tt)(x), wrt, dy), _values_and_grads(tt(x), wrt, dy), 1e-12)


def test_a_gate_threshold_masks_the_gates_as_the_ttlinear_does():
    tt = _layer(*CASES["small, uneven ranks"])
    tt.gate_threshold = 1.0  # about half of the gates drawn in [0.25, 1.75] are zeroed
    x = torch.randn(5, tt.in_features, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, tt.out_features, dtype=torch.float64)
    wrt = [x, *tt.gates, *tt.cores, tt.bias]
    got = _values_and_grads(OfficialTTLinear(tt)(x), wrt, dy)
    _close(got, _values_and_grads(tt(x), wrt, dy), 1e-12)
    masked = [gate <= 1.0 for gate in tt.gates]
    assert 0 < sum(int(m.sum()) for m in masked) < sum(m.numel() for m in masked)
    for mask, grad in zip(masked, got[2:2 + len(tt.gates)]):
        assert (grad[mask] == 0).all() and (grad[~mask] != 0).all()


def test_it_shares_the_ttlinear_parameters_and_runs_as_a_bench_call():
    tt = _layer(*CASES["small, uneven ranks"], dtype=torch.float32)
    official = OfficialTTLinear(tt)
    assert sorted(id(p) for p in official.parameters()) == sorted(id(p) for p in tt.parameters())
    run, reset, _ = mb.module_call(official, torch.randn(4, tt.in_features), "fwd_bwd", wrt_input=True)
    run()
    assert all(p.grad is not None for p in tt.parameters())
    reset()
    assert all(p.grad is None for p in tt.parameters())


@pytest.mark.parametrize("in_shape, out_shape", [([4, 4], [4, 8]), ([2, 2, 2, 2], [2, 2, 4]),
                                                 ([4, 4, 4], [8, 8])])
def test_other_than_three_plus_three_modes_is_a_clear_error(in_shape, out_shape):
    tt = TTLinear(torch.Size(in_shape).numel(), torch.Size(out_shape).numel(), in_shape=in_shape,
                  out_shape=out_shape, rank=2)
    with pytest.raises(ValueError, match="official TT_forward handles 3 input and 3 output modes"):
        OfficialTTLinear(tt)


def test_official_ttm_lookup_matches_the_dense_table_and_the_optimized_lookup():
    """The official unique lookup (order 4) returns the table's rows and the same gradients as the
    optimized TTMEmbedding it shares its parameters with (float64, gates away from one, repeated
    indices)."""
    from comera.ttm import TTMEmbedding
    from harness.perf.official import OfficialTTMEmbedding

    torch.manual_seed(0)
    ttm = TTMEmbedding(300, 24, row_shape=[4, 5, 3, 5], col_shape=[2, 2, 3, 2], rank=[1, 3, 4, 2, 1],
                       dtype=torch.float64)
    with torch.no_grad():
        for g in ttm.gates:
            g.uniform_(0.25, 1.75)
    official = OfficialTTMEmbedding(ttm)
    idx = torch.tensor([[0, 299, 17, 17], [150, 0, 42, 299]])
    dy = torch.randn(2, 4, 24, dtype=torch.float64)
    wrt = [*ttm.cores, *ttm.gates]
    got = official(idx)
    assert torch.allclose(got, ttm.dense_weight()[idx], rtol=1e-12, atol=1e-12)
    want_grads = torch.autograd.grad(ttm(idx), wrt, dy)
    for a, b in zip(torch.autograd.grad(got, wrt, dy), want_grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert list(official.parameters()) == list(ttm.parameters())


def test_official_ttm_lookup_takes_four_cores_only():
    from comera.ttm import TTMEmbedding
    from harness.perf.official import OfficialTTMEmbedding

    with pytest.raises(ValueError, match="4 cores, got row_shape=\\[10, 10, 10\\]"):
        OfficialTTMEmbedding(TTMEmbedding(1000, 8, row_shape=[10, 10, 10], col_shape=[2, 2, 2], rank=2))
