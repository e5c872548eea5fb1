"""TTLinear against a dense reference built from dense_weight() (forward, input, core and gate grads)."""
from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from comera import kernels
from comera.contraction import PlanSettings, make_plan
from comera.tt import TTLinear, tt_linear

kernels.register_flop_formulas()  # FlopCounterMode counts oneDNN's inner product (large float32 products)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _random_layer(order: int, seed: int, *, bias: bool = True, dtype=torch.float64, device="cpu"):
    rng = random.Random(seed)
    m = rng.randint(max(1, order - 4), min(4, order - 1))
    modes = [rng.randint(1, 5 if order < 6 else 3) for _ in range(order)]
    ranks = [1] + [rng.randint(1, 6) for _ in range(order - 1)] + [1]
    layer = TTLinear(math.prod(modes[:m]), math.prod(modes[m:]), in_shape=modes[:m], out_shape=modes[m:],
                     rank=ranks, bias=bias, dtype=dtype, device=device)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)  # gates away from 1 so that a wrong gate gradient shows
        if bias:
            layer.bias.normal_()
    return layer, rng


def _partitions(count: int):
    """Groupings of a side's cores: merge (count,), sequential (1,)*count and two mixed ones."""
    return sorted({(count,), (1,) * count, (1, count - 1) if count > 1 else (1,),
                   (count - 1, 1) if count > 1 else (1,)})


def _compare(layer, x, plan, tol):
    """Relative errors of output and every gradient: custom Function vs autograd through dense_weight()."""
    x = x.detach().requires_grad_(True)
    bias = layer.bias
    y = tt_linear(x, layer.cores, layer.gates, bias, plan)
    dy = torch.randn_like(y)
    params = [x, *layer.cores, *layer.gates] + ([bias] if bias is not None else [])
    got = torch.autograd.grad(y, params, dy)
    ref_y = x @ layer.dense_weight() + (bias if bias is not None else 0)
    want = torch.autograd.grad(ref_y, params, dy)
    for name, a, b in [("y", y, ref_y)] + [(f"grad{i}", a, b) for i, (a, b) in enumerate(zip(got, want))]:
        err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e} (plan {plan.left}/{plan.right})"


@pytest.mark.parametrize("order,seed",
                         [(o, s) for o in (2, 4, 6, 8) for s in range(3)] + [(3, 3), (5, 3), (7, 3)])
def test_float64_matches_dense_reference(order, seed):
    """Every strategy: dense, and each partition of each side into groups."""
    layer, rng = _random_layer(order, seed, bias=seed % 2 == 0)
    tokens = rng.choice([1, 3, 17])
    x = torch.randn(tokens, layer.in_features, dtype=torch.float64)
    choices = ["dense"] + [(left, right) for left in _partitions(len(layer.in_shape))
                           for right in _partitions(len(layer.out_shape))]
    for strategies in choices:
        plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens,
                         layer.bias is not None, strategies)
        _compare(layer, x, plan, 1e-10)


@pytest.mark.parametrize("tokens", [1, 5, 24])
def test_frozen_cores_and_gates_give_exact_input_and_bias_grads_without_core_grads(tokens):
    """Cores and gates that need no gradient (frozen): every strategy and the folded bias still give the
    float64 reference's output, input and bias gradients, and the backward forms no core gradient: it runs
    only the products of dz and dx (and the bias sum), none of the merges' backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += str(func.overloadpacket) in ("aten.mm", "aten.bmm", "aten.addmm", "aten.t_copy",
                                                       "mkldnn._linear_pointwise", "aten.mul",
                                                       "aten._foreach_mul")
            return func(*args, **(kwargs or {}))

    layer, _ = _random_layer(6, 5, bias=True)
    for p in [*layer.cores, *layer.gates]:
        p.requires_grad_(False)
    m, q = len(layer.in_shape), len(layer.out_shape)
    x = torch.randn(tokens, layer.in_features, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(tokens, layer.out_features, dtype=torch.float64)
    want_y = x @ layer.dense_weight() + layer.bias
    want = torch.autograd.grad(want_y, [x, layer.bias], dy)
    choices = ["dense", ("merge", "merge"), ("sequential", "sequential"), ((1, m - 1), (q - 1, 1))]
    for strategies, fold in [(c, 10**9) for c in choices] + [(("merge", "merge"), 0)]:
        plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, True, strategies,
                         PlanSettings(fold_bias_min_tokens=fold))
        y = tt_linear(x, layer.cores, layer.gates, layer.bias, plan)
        with Products() as products:
            got = torch.autograd.grad(y, [x, layer.bias], dy)
        for a, b in [(y, want_y), *zip(got, want)]:
            assert ((a - b).norm() / b.norm()).item() <= 1e-10, str(plan)
        # dense: dx = dy W^T; grouped: one product per group and side (dz, then dz .. dx)
        expected = 1 if plan.dense else len(plan.left_groups) + len(plan.right_groups)
        assert products.count == expected, (str(plan), products.count)


def _second_derivatives(linear, x, params):
    """Gradients of ``|| d/dx sum(tanh(linear(x))^2) ||^2`` (a gradient penalty) with respect to ``x`` and
    ``params``: second derivatives through the layer, as create_graph gives them."""
    (gx,) = torch.autograd.grad(linear(x).tanh().pow(2).sum(), x, create_graph=True)
    return torch.autograd.grad(gx.pow(2).sum(), [x, *params])


@pytest.mark.parametrize("order,seed", [(2, 0), (4, 1), (5, 3), (6, 2)])
def test_second_derivatives_match_dense_reference(order, seed):
    """create_graph through every strategy: the saved intermediates are no constants to the second
    derivative."""
    layer, rng = _random_layer(order, seed, bias=seed % 2 == 0)
    tokens = rng.choice([1, 3, 17])
    x = torch.randn(tokens, layer.in_features, dtype=torch.float64, requires_grad=True)
    params = [*layer.cores, *layer.gates] + ([layer.bias] if layer.bias is not None else [])
    want = _second_derivatives(lambda t: t @ layer.dense_weight() + (0 if layer.bias is None else layer.bias),
                               x, params)
    choices = ["dense"] + [(left, right) for left in _partitions(len(layer.in_shape))
                           for right in _partitions(len(layer.out_shape))]
    for strategies in choices:
        plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens,
                         layer.bias is not None, strategies)
        got = _second_derivatives(lambda t: tt_linear(t, layer.cores, layer.gates, layer.bias, plan), x,
                                  params)
        for i, (a, b) in enumerate(zip(got, want)):
            err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
            assert err <= 1e-10, f"grad{i}: relative error {err:.2e} (plan {plan.left}/{plan.right})"


@pytest.mark.parametrize("strategies", [None, "dense", ((1, 1), (2,))], ids=str)
def test_gradgradcheck(strategies):
    """Second derivatives (and the first derivatives' graph) against finite differences, bias included."""
    layer = TTLinear(6, 6, in_shape=(2, 3), out_shape=(3, 2), rank=2, dtype=torch.float64)
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), 3, True, strategies)
    d = len(layer.cores)
    inputs = [torch.randn(3, 6, dtype=torch.float64, requires_grad=True), layer.bias, *layer.cores,
              *layer.gates]
    assert torch.autograd.gradgradcheck(lambda x, b, *p: tt_linear(x, p[:d], p[d:], b, plan), inputs)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("order,seed", [(3, 0), (4, 1), (6, 2), (7, 4)])
def test_one_token_matches_dense_reference(order, seed, bias):
    """One token (its absorptions before the bond are plain matmuls) and 2 tokens (batched), every
    strategy: output and the gradients of x, cores, gates and bias in float64."""
    layer, _ = _random_layer(order, seed, bias=bias)
    choices = ["dense"] + [(left, right) for left in _partitions(len(layer.in_shape))
                           for right in _partitions(len(layer.out_shape))]
    for tokens in (1, 2):
        x = torch.randn(tokens, layer.in_features, dtype=torch.float64)
        for strategies in choices:
            plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, bias, strategies)
            _compare(layer, x, plan, 1e-10)


@pytest.mark.parametrize("order", [2, 4, 6, 8])
@pytest.mark.parametrize("device", DEVICES)
def test_float32_matches_dense_reference(order, device):
    layer, _ = _random_layer(order, 11, dtype=torch.float32, device=device)
    for tokens in (2, 300):
        x = torch.randn(tokens, layer.in_features, device=device)
        _compare(layer, x, layer.plan(tokens), 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_runs_close_to_float64(device):
    layer = TTLinear(96, 128, in_shape=[4, 4, 6], out_shape=[4, 4, 8], rank=6, dtype=torch.float64,
                     device=device)
    x = torch.randn(5, 7, 96, dtype=torch.float64, device=device)
    ref = layer(x)
    low = layer.to(torch.bfloat16)
    xb = x.to(torch.bfloat16).requires_grad_(True)
    y = low(xb)
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    assert xb.grad is not None and all(c.grad is not None for c in low.cores)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-2


def test_autocast_bfloat16_on_cpu():
    layer = TTLinear(64, 48, in_shape=[4, 4, 4], out_shape=[4, 4, 3], rank=5)
    x = torch.randn(6, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and all(c.grad.dtype == torch.float32 for c in layer.cores)
    ref = x @ layer.dense_weight() + layer.bias
    assert ((y.float() - ref).norm() / ref.norm()).item() < 5e-2


def test_leading_batch_dims_and_module_forward():
    layer = TTLinear(64, 48, in_shape=[4, 4, 4], out_shape=[4, 4, 3], rank=5, dtype=torch.float64)
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    y = layer(x)
    assert y.shape == (3, 5, 48)
    torch.testing.assert_close(y, x @ layer.dense_weight() + layer.bias, rtol=1e-12, atol=1e-12)
    xt = x.transpose(0, 1)  # non-contiguous input
    torch.testing.assert_close(layer(xt), xt @ layer.dense_weight() + layer.bias, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_zero_rank_bond_gives_bias_and_zero_grads(bias):
    layer = TTLinear(24, 30, in_shape=[4, 6], out_shape=[5, 6], rank=[1, 3, 0, 2, 1], bias=bias,
                     dtype=torch.float64)
    assert layer.ranks == [1, 3, 0, 2, 1]
    x = torch.randn(2, 4, 24, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    expected = layer.bias.expand(2, 4, 30) if bias else torch.zeros(2, 4, 30, dtype=torch.float64)
    torch.testing.assert_close(y, expected)
    assert torch.count_nonzero(layer.dense_weight()) == 0 and layer.dense_weight().shape == (24, 30)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.count_nonzero(x.grad) == 0
    for p in [*layer.cores, *layer.gates]:
        assert p.grad is not None and p.grad.shape == p.shape and torch.count_nonzero(p.grad) == 0
    if bias:
        torch.testing.assert_close(layer.bias.grad, dy.sum((0, 1)))


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_no_tokens_give_an_empty_output_and_zero_gradients(lead, bias):
    """An empty batch, as nn.Linear takes it: output (*lead, out_features), every gradient zero."""
    layer = TTLinear(24, 30, in_shape=[4, 6], out_shape=[5, 6], rank=3, bias=bias, dtype=torch.float64)
    x = torch.randn(*lead, 24, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    assert y.shape == (*lead, 30)
    y.sum().backward()
    assert x.grad.shape == x.shape
    for p in layer.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and torch.count_nonzero(p.grad) == 0


def test_prune_by_slicing_data_changes_plan_and_stays_correct():
    layer = TTLinear(64, 64, in_shape=[4, 4, 4], out_shape=[4, 4, 4], rank=6, dtype=torch.float64)
    before = layer.plan(10)
    assert layer.plan(10) is before
    keep = torch.tensor([0, 2, 5])
    with torch.no_grad():  # shrink bond 3 (between cores[2] and cores[3]) as rank.py does
        layer.cores[2].data = layer.cores[2].data[:, :, keep].contiguous()
        layer.gates[2].data = layer.gates[2].data[keep].contiguous()
        layer.cores[3].data = layer.cores[3].data[keep].contiguous()
    assert layer.ranks == [1, 4, 6, 3, 6, 4, 1]
    after = layer.plan(10)
    assert after is not before and after.ranks == tuple(layer.ranks)
    _compare(layer, torch.randn(10, 64, dtype=torch.float64), after, 1e-10)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threshold", [None, 0.9, 2.0])
def test_training_with_ranks_pruned_mid_way_stays_exact(bias, threshold):
    """SGD steps on a float64 layer called as a module with batch-shaped input, one token and many tokens,
    a bond shrunk between steps as rank pruning does (the memoized plans follow the new ranks), optionally
    with masked gates (``gate_threshold``: zeroed entries get no gradient; 2.0 masks every gate, so the
    weight is zero): output and the gradients of x,
    cores, gates and bias equal autograd through dense_weight() at every step."""
    torch.manual_seed(3)
    layer = TTLinear(60, 48, in_shape=[3, 4, 5], out_shape=[4, 3, 4], rank=6, bias=bias, dtype=torch.float64)
    layer.gate_threshold = threshold
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    shapes = [(2, 3, 60), (1, 60), (40, 60), (1, 1, 60)]
    for step in range(6):
        if step == 3:  # shrink bond 2 (cores[1] | cores[2]) and bond 4 as comera.prune.prune does: a fresh
            # tensor behind each parameter object (the last step's graph, still alive, keeps the old ones)
            for k, keep in ((1, torch.tensor([0, 2, 3])), (3, torch.tensor([1, 4]))):
                for param, dim in ((layer.cores[k], 2), (layer.gates[k], 0), (layer.cores[k + 1], 0)):
                    torch.utils.swap_tensors(param, nn.Parameter(param.detach().index_select(dim, keep)))
            assert layer.ranks[2] == 3 and layer.ranks[4] == 2
        x = torch.randn(*shapes[step % len(shapes)], dtype=torch.float64, requires_grad=True)
        params = [x, *layer.parameters()]
        y = layer(x)
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, params, dy)
        ref_y = x @ layer.dense_weight() + (layer.bias if bias else 0)
        want = torch.autograd.grad(ref_y, params, dy)
        torch.testing.assert_close(y, ref_y, rtol=1e-10, atol=1e-12)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            for p, g in zip(params[1:], got[1:]):
                p.sub_(0.05 * g / g.norm().clamp_min(1.0))  # bounded steps: the values stay O(1)


@pytest.mark.parametrize("rank,expected", [(30, [1, 12, 30, 30, 30, 16, 1]),
                                           (100, [1, 12, 96, 100, 100, 16, 1]),
                                           ([1, 2, 3, 4, 5, 6, 1], [1, 2, 3, 4, 5, 6, 1])])
def test_rank_int_is_clipped_and_list_is_kept(rank, expected):
    layer = TTLinear(768, 3072, in_shape=[12, 8, 8], out_shape=[12, 16, 16], rank=rank)
    assert layer.ranks == expected
    assert [tuple(c.shape) for c in layer.cores] == [(expected[k], n, expected[k + 1])
                                                     for k, n in enumerate([12, 8, 8, 12, 16, 16])]
    assert [g.shape[0] for g in layer.gates] == expected[1:-1]
    assert all(torch.all(g == 1) for g in layer.gates)


def test_automatic_factorization():
    layer = TTLinear(768, 3072, rank=8)
    assert math.prod(layer.in_shape) == 768 and math.prod(layer.out_shape) == 3072
    assert len(layer.cores) == len(layer.in_shape) + len(layer.out_shape)


@pytest.mark.parametrize("kwargs,match", [
    ({"in_shape": [5, 5]}, "in_shape"), ({"out_shape": [2, 2]}, "out_shape"),
    ({"rank": [1, 2, 1]}, "rank list"), ({"rank": -1}, "rank"), ({"rank": 2.5}, "rank")])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    args = {"rank": 3, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        TTLinear(24, 12, **args)


def test_wrong_input_width_raises():
    with pytest.raises(ValueError, match="last dimension 24"):
        TTLinear(24, 12, rank=2)(torch.randn(3, 25))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_an_input_of_another_dtype_is_named(dtype):
    with pytest.raises(TypeError, match=rf"input dtype {dtype} differs from the layer's torch.float32"):
        TTLinear(24, 12, rank=2)(torch.ones(3, 24, dtype=dtype))


@pytest.mark.parametrize("shape", [((12, 8, 8), (12, 16, 16), 30), ((8, 8), (8, 8), 8),
                                   ((4, 4, 4, 4), (4, 4, 4, 4), 16)])
def test_init_scale_matches_nn_linear(shape):
    in_shape, out_shape, rank = shape
    n_in, n_out = math.prod(in_shape), math.prod(out_shape)
    torch.manual_seed(0)
    variances = [TTLinear(n_in, n_out, in_shape=in_shape, out_shape=out_shape, rank=rank,
                          bias=False).dense_weight().var().item() for _ in range(4)]
    ratio = sum(variances) / len(variances) / (1.0 / (3 * n_in))
    assert 0.5 < ratio < 2.0, ratio


@pytest.mark.parametrize("tokens", [1, 2, 64, 512])
def test_executed_matmul_flops_equal_plan(tokens):
    """FlopCounterMode counts the matmuls that really run; they must equal the plan's matmul steps
    (with one token an einsum whose summed axes all have size 1 runs as an outer product, uncounted)."""
    layer = TTLinear(768, 3072, in_shape=[12, 8, 8], out_shape=[12, 16, 16], rank=[1, 12, 30, 30, 30, 16, 1])
    x = torch.randn(tokens, 768, requires_grad=True)
    plan = layer.plan(tokens)
    with FlopCounterMode(display=False) as counter:
        layer(x).sum().backward()
    planned = sum(s.flops for s in plan.steps if "@" in s.expr)
    executed = counter.get_total_flops()
    assert executed == planned or (tokens == 1 and 0.95 * planned <= executed <= planned), str(plan)


def test_backward_saves_no_full_width_tensor():
    layer = TTLinear(768, 3072, in_shape=[12, 8, 8], out_shape=[12, 16, 16], rank=[1, 12, 30, 30, 30, 16, 1])
    x = torch.randn(256, 768, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x)
    assert saved, "the custom Function saved nothing"
    assert max(t.numel() for t in saved) <= 256 * 768  # x itself; nothing of size tokens x 3072


@pytest.mark.parametrize("tokens", [1, 128])
def test_backward_saves_each_gated_core_only_as_its_chain_views(tokens):
    """Saved per call (each a packed tensor autograd keeps, with its bookkeeping on every call): the input
    (twice: as the layer input and as the first absorption's), the 6 cores and 5 gates (their gradients
    need them), and per side the merge chain, 2 per core but one, or one matrix per core when every
    group is one core, plus each group's input: not the gated cores besides (their shapes are the cores')."""
    layer = TTLinear(768, 768, in_shape=[12, 8, 8], out_shape=[8, 8, 12], rank=30)
    plan = layer.plan(tokens)
    x = torch.randn(tokens, 768, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x)
    chains = sum(2 * size - 1 for size in plan.left_groups + plan.right_groups)
    group_inputs = len(plan.left_groups) + len(plan.right_groups)
    assert len(saved) == 1 + 6 + 5 + chains + group_inputs, str(plan)


@pytest.mark.parametrize("strategies", ["dense", ((3, 1), (1, 1)), ((1, 3), (2,)), ((2, 2), "merge")])
def test_executed_matmul_flops_equal_plan_for_forced_strategies(strategies):
    layer = TTLinear(120, 12, in_shape=[4, 3, 5, 2], out_shape=[3, 4], rank=[1, 4, 6, 3, 5, 4, 1])
    x = torch.randn(7, 120, requires_grad=True)
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), 7, True, strategies)
    with FlopCounterMode(display=False) as counter:
        tt_linear(x, layer.cores, layer.gates, layer.bias, plan).sum().backward()
    assert counter.get_total_flops() == sum(s.flops for s in plan.steps if "@" in s.expr), str(plan)


@pytest.mark.parametrize("bias", [True, False])
def test_float32_at_inner_product_sizes_matches_dense_reference(bias):
    """Enough tokens that the absorptions leave torch.mm (kernels._mm); an expanded output gradient
    (from ``y.sum()``) too, which the inner product cannot read in place."""
    torch.manual_seed(0)
    layer = TTLinear(768, 768, in_shape=[12, 8, 8], out_shape=[8, 8, 12], rank=30, bias=bias)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    tokens = 256
    assert tokens * 768 * 30 >= kernels.INNER_PRODUCT_MIN_MACS[0]
    x = torch.randn(tokens, 768)
    _compare(layer, x, layer.plan(tokens), 1e-4)
    x = x.requires_grad_(True)
    params = [x, *layer.cores, *layer.gates] + ([layer.bias] if bias else [])
    got = torch.autograd.grad(layer(x).sum(), params)
    want = torch.autograd.grad((x @ layer.dense_weight() + (layer.bias if bias else 0)).sum(), params)
    for a, b in zip(got, want):
        assert ((a - b).norm() / b.norm()).item() <= 1e-4


@pytest.mark.parametrize("bias", [True, False])
def test_float64_at_narrow_product_sizes_matches_dense_reference(bias, monkeypatch):
    """Enough tokens and input features that ``z = x A`` and ``dz = dy B^T`` run as transposed products
    (kernels._narrow_mm, _narrow_mm_t; z and dz are then transposed views): output, the gradients of x,
    cores, gates and bias, and second derivatives (create_graph) equal the float64 reference."""
    torch.manual_seed(0)
    layer = TTLinear(256, 320, in_shape=[8, 8, 4], out_shape=[4, 8, 10], rank=[1, 6, 9, 7, 5, 8, 1],
                     bias=bias, dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    tokens = 24
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, bias, ("merge", "merge"))
    transposed = []
    for name in ("_narrow_mm", "_narrow_mm_t"):
        def spy(*args, _fn=getattr(kernels, name)):
            out = _fn(*args)
            transposed.append(not out.is_contiguous())
            return out
        monkeypatch.setattr(kernels, name, spy)
    x = torch.randn(tokens, 256, dtype=torch.float64)
    _compare(layer, x, plan, 1e-10)
    assert len(transposed) == 2 and all(transposed)
    x = x.requires_grad_(True)
    params = [*layer.cores, *layer.gates] + ([layer.bias] if bias else [])
    want = _second_derivatives(lambda t: t @ layer.dense_weight() + (layer.bias if bias else 0), x, params)
    got = _second_derivatives(lambda t: tt_linear(t, layer.cores, layer.gates, layer.bias, plan), x, params)
    for i, (a, b) in enumerate(zip(got, want)):
        assert ((a - b).norm() / b.norm()).item() <= 1e-10, f"grad{i}"


@pytest.mark.slow
def test_compiled_layer_at_inner_product_sizes_matches_eager():
    """Under torch.compile the contraction leaves the oneDNN inner product to the compiler (its lowering
    of that op asserted on a weight computed from the cores); forward and gradients equal eager's. The
    planner is traced as the pure function it is: Dynamo warns of no ``lru_cache`` (a cache it would
    bypass, "possible silent incorrectness") and tracing leaves the plan memo alone. On this CPU the
    compile takes about 6 s."""
    import warnings

    from comera import contraction

    torch.manual_seed(0)
    layer = TTLinear(768, 768, in_shape=[12, 8, 8], out_shape=[8, 8, 12], rank=30)
    x = torch.randn(256, 768)
    compiled = torch.compile(layer)
    key = (layer.in_shape, layer.out_shape, tuple(layer.ranks), 256, True, None, layer.plan_settings)
    contraction._PLANS.pop(key, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_y = compiled(x)
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    assert key not in contraction._PLANS  # the traced call built its plan without memoizing it
    got = torch.autograd.grad(got_y.square().sum(), [*layer.cores, *layer.gates])
    want_y = layer(x)
    assert key in contraction._PLANS
    want = torch.autograd.grad(want_y.square().sum(), [*layer.cores, *layer.gates])
    assert torch.allclose(got_y, want_y, rtol=1e-4, atol=1e-4)
    for a, b in zip(got, want):
        assert ((a - b).norm() / b.norm()).item() <= 1e-4


@pytest.mark.parametrize("fold_from", [0, 10**9])
@pytest.mark.parametrize("order,seed", [(2, 0), (4, 1), (5, 3), (6, 2)])
def test_fused_and_folded_bias_match_dense_reference(fold_from, order, seed):
    """One group per side: the bias fused into the output GEMM and the folded bias (``[z | 1] @ [B ; b]``),
    whichever ``fold_bias_min_tokens`` picks, equal the float64 reference."""
    layer, _ = _random_layer(order, seed, bias=True)
    x = torch.randn(5, layer.in_features, dtype=torch.float64)
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), 5, True, ("merge", "merge"),
                     PlanSettings(fold_bias_min_tokens=fold_from))
    assert plan.fold_bias == (fold_from == 0)
    _compare(layer, x, plan, 1e-10)


@pytest.mark.parametrize("fold_from", [0, 10**9])
def test_layer_plan_settings_reach_the_plan(fold_from):
    """A layer's plan_settings (argument or attribute) pick its plans; module forward stays exact."""
    layer, _ = _random_layer(4, 1, bias=True)
    layer.plan_settings = PlanSettings(fold_bias_min_tokens=fold_from, kernel_cost=10**12)
    plan = layer.plan(5)
    assert plan.settings is layer.plan_settings
    x = torch.randn(5, layer.in_features, dtype=torch.float64)
    _compare(layer, x, plan, 1e-10)
    other = TTLinear(24, 12, rank=2, plan_settings=PlanSettings(kernel_cost=0))
    assert (other.plan(3).settings.kernel_cost == 0
            and TTLinear(24, 12, rank=2).plan(3).settings == PlanSettings())


def test_measure_kernel_cost_is_a_positive_flop_count():
    from comera.tt import measure_kernel_cost

    cost = measure_kernel_cost(min_run_time_s=0.01)
    assert isinstance(cost, int) and cost > 0


PAPER_LAYERS = [((12, 8, 8), (8, 8, 12)), ((12, 8, 8), (12, 16, 16))]
OP_BOUND = 77
"""ATen ops (views and the 13 gradient accumulations included) one forward+backward of a paper-shape
layer dispatches at most (the contraction before the op-count work: 82-110)."""


def _fwd_bwd_ops(in_shape, out_shape, tokens: int) -> int:
    """Ops dispatched by one forward+backward (bias, rank gates away from 1, input gradient; gradients
    reset to None as zero_grad does), counted as the bench counts them."""
    from harness.perf.microbench import count_ops

    torch.manual_seed(0)
    layer = TTLinear(math.prod(in_shape), math.prod(out_shape), in_shape=in_shape,
                     out_shape=out_shape, rank=30)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    x = torch.randn(tokens, layer.in_features, requires_grad=True)
    grad_out = torch.randn(tokens, layer.out_features)
    wrt = [x, *layer.parameters()]

    def run():
        for t in wrt:
            t.grad = None
        torch.autograd.backward(layer(x), grad_out, inputs=wrt)
    return count_ops(run)


@pytest.mark.parametrize("tokens", [1, 128, 4096])
@pytest.mark.parametrize("in_shape,out_shape", PAPER_LAYERS)
def test_fwd_bwd_dispatches_at_most_the_bound(in_shape, out_shape, tokens):
    """The kernels' bound on the ATen ops dispatched from Python."""
    assert _fwd_bwd_ops(in_shape, out_shape, tokens) <= OP_BOUND


@pytest.mark.slow
@pytest.mark.parametrize("bias", [True, False])
def test_torch_compile_takes_the_layer_in_one_graph(bias):
    """fullgraph: a graph break (the planner's search once broke it) would raise; values and gradients as
    eager's, in float64."""
    torch._dynamo.reset()  # a static token count: one more would be traced as a symbolic one
    torch.manual_seed(0)
    layer = TTLinear(64, 96, in_shape=[4, 4, 4], out_shape=[4, 4, 6], rank=8, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    params = list(layer.parameters())
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    got_y = compiled(x)
    got = torch.autograd.grad(got_y.square().sum(), params)
    want_y = layer(x)
    want = torch.autograd.grad(want_y.square().sum(), params)
    torch.testing.assert_close(got_y, want_y, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch._dynamo.reset()
