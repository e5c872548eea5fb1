"""feed_forward: same output and gradients as the plain composition, and no full-width activation saved."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comera import TTLinear
from comera.contraction import PlanSettings, make_plan
from comera.feedforward import _fusable, feed_forward

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}


def _layer(in_shape, out_shape, rng, bias, dtype=torch.float64):
    d = len(in_shape) + len(out_shape)
    layer = TTLinear(math.prod(in_shape), math.prod(out_shape), in_shape=in_shape, out_shape=out_shape,
                     rank=[1] + [rng.randint(1, 3) for _ in range(d - 1)] + [1], bias=bias, dtype=dtype)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
        if bias:
            layer.bias.normal_()
    return layer


def _pair(seed, dtype=torch.float64):
    rng = random.Random(seed)
    outer = [rng.randint(2, 4) for _ in range(rng.randint(2, 3))]
    hidden = [rng.randint(2, 4) for _ in range(rng.randint(2, 3))]
    first = _layer(outer, hidden, rng, bias=seed % 2 == 0, dtype=dtype)
    second = _layer(hidden, outer, rng, bias=seed % 3 != 0, dtype=dtype)
    return first, second, rng


def _grads(fn, first, second, x):
    x = x.detach().requires_grad_(True)
    y = fn(x)
    params = [x, *first.parameters(), *second.parameters()]
    dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1)).to(y.device)
    return y, torch.autograd.grad(y, params, dy)


def _assert_same(first, second, act, x, tol):
    y, got = _grads(lambda t: feed_forward(first, act, second, t), first, second, x)
    y_ref, want = _grads(lambda t: second(act(first(t))), first, second, x)
    pairs = [("y", y, y_ref)] + [(f"grad{i}", a, b) for i, (a, b) in enumerate(zip(got, want))]
    for name, a, b in pairs:
        err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_float64_matches_composition(seed, act):
    first, second, rng = _pair(seed)
    x = torch.randn(rng.choice([1, 5, 12]), first.in_features, dtype=torch.float64)
    assert _fusable(first.plan(x.shape[0]), second.plan(x.shape[0])), "the fused path must be exercised"
    _assert_same(first, second, ACTIVATIONS[act], x, 1e-10)


@pytest.mark.parametrize("strategies", [("sequential", "sequential"), ("merge", "sequential"),
                                        ("sequential", "merge")])
def test_multi_group_plans(monkeypatch, strategies):
    """Plans with several groups per side (recomputed intermediates on both sides of the hidden layer)."""
    rng = random.Random(3)
    first = _layer([2, 3, 2], [3, 2, 4], rng, bias=True)
    second = _layer([3, 2, 4], [2, 3, 2], rng, bias=True)

    def forced(layer, tokens):
        return make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, layer.bias is not None,
                         strategies)

    monkeypatch.setattr(TTLinear, "plan", forced)
    x = torch.randn(7, first.in_features, dtype=torch.float64)
    _assert_same(first, second, F.gelu, x, 1e-10)


def test_batched_input_and_float32():
    first, second, _ = _pair(4, dtype=torch.float32)
    x = torch.randn(3, 5, first.in_features)
    y = feed_forward(first, F.gelu, second, x)
    assert y.shape == (3, 5, second.out_features)
    _assert_same(first, second, F.gelu, x, 1e-5)


def _saved_bytes(fn, x):
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(seen.values()), max(seen.values())


def test_saves_no_full_width_activation():
    """At 512 tokens and hidden 3072 the composition saves two 6 MiB hidden tensors; the fused block none."""
    first = TTLinear(768, 3072, rank=16)
    second = TTLinear(3072, 768, rank=16)
    x = torch.randn(512, 768)
    fused_total, fused_max = _saved_bytes(lambda t: feed_forward(first, F.gelu, second, t), x)
    plain_total, plain_max = _saved_bytes(lambda t: second(F.gelu(first(t))), x)
    hidden_bytes = 512 * 3072 * 4
    assert plain_max >= hidden_bytes
    assert fused_max < hidden_bytes
    assert plain_total - fused_total >= 2 * hidden_bytes - x.numel() * 4


def test_falls_back_for_other_layers_and_inference():
    dense1, dense2 = nn.Linear(6, 12), nn.Linear(12, 6)
    x = torch.randn(4, 6)
    torch.testing.assert_close(feed_forward(dense1, F.relu, dense2, x), dense2(F.relu(dense1(x))))
    first, second, _ = _pair(1, dtype=torch.float32)
    x = torch.randn(4, first.in_features)
    with torch.no_grad():
        torch.testing.assert_close(feed_forward(first, F.gelu, second, x), second(F.gelu(first(x))))


def test_rank_zero_falls_back():
    first = TTLinear(12, 24, in_shape=[3, 4], out_shape=[4, 6], rank=[1, 3, 0, 2, 1], dtype=torch.float64)
    second = TTLinear(24, 12, in_shape=[4, 6], out_shape=[3, 4], rank=3, dtype=torch.float64)
    _assert_same(first, second, F.gelu, torch.randn(5, 12, dtype=torch.float64), 1e-10)


def test_autocast_bfloat16_close_to_composition():
    first, second, _ = _pair(2, dtype=torch.float32)
    x = torch.randn(6, first.in_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = feed_forward(first, F.gelu, second, x)
        plain = second(F.gelu(first(x)))
    assert fused.dtype == plain.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), plain.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("bad", ["width", "input"])
def test_shape_errors_name_the_mismatch(bad):
    first = TTLinear(12, 24, in_shape=[3, 4], out_shape=[4, 6], rank=2)
    second = TTLinear(20 if bad == "width" else 24, 12, in_shape=[4, 5] if bad == "width" else [4, 6],
                      out_shape=[3, 4], rank=2)
    x = torch.randn(2, 12 if bad == "width" else 10)
    with pytest.raises(ValueError, match="out_features=24" if bad == "width" else "last dimension 12"):
        feed_forward(first, F.gelu, second, x)


@pytest.mark.parametrize("tokens,fused", [(4, False), (5, True)])
def test_small_activations_take_the_plain_composition(tokens, fused):
    """With fuse_min_elements set, fewer hidden elements (tokens x hidden) take the plain composition (it
    keeps the activations instead of recomputing them), more the fused path; both give the same result.
    The default, 0, fuses every call."""
    import inspect

    assert inspect.signature(feed_forward).parameters["fuse_min_elements"].default == 0
    first, second, _ = _pair(0)
    x = torch.randn(tokens, first.in_features, dtype=torch.float64, requires_grad=True)
    y = feed_forward(first, F.gelu, second, x, fuse_min_elements=5 * first.out_features)
    node = y.grad_fn.next_functions[0][0]  # under the output's view
    assert (type(node).__name__ == "_TTFeedForwardFunctionBackward") == fused
    torch.testing.assert_close(y, second(F.gelu(first(x))))


# ------------------------------------------------------------------------------------- forced plans

def _force_plans(monkeypatch, strategies, settings=PlanSettings()):
    """Every TTLinear plans with ``strategies`` (a (left, right) pair per layer, by input size) and
    ``settings``."""
    by_width = dict(strategies)

    def forced(layer, tokens):
        return make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, layer.bias is not None,
                         by_width[layer.in_features], settings)

    monkeypatch.setattr(TTLinear, "plan", forced)


def _fixed_pair(bias1, bias2):
    rng = random.Random(3)
    return (_layer([2, 3, 2], [3, 2, 4], rng, bias=bias1), _layer([3, 2, 4], [2, 3, 2], rng, bias=bias2))


STRATEGIES = [(("merge", "merge"), ("merge", "merge")),
                     (("sequential", "sequential"), ("sequential", "sequential")),
                     (("merge", "sequential"), ("sequential", "merge")),
                     (((2, 1), (1, 2)), ((1, 2), (2, 1)))]


@pytest.mark.parametrize("strategies", STRATEGIES, ids=str)
@pytest.mark.parametrize("tokens", [1, 2, 9])
@pytest.mark.parametrize("biases", [(True, True), (False, True), (True, False), (False, False)], ids=str)
def test_forced_plans_match_composition(monkeypatch, strategies, tokens, biases):
    first, second = _fixed_pair(*biases)
    _force_plans(monkeypatch, [(first.in_features, strategies[0]), (second.in_features, strategies[1])])
    _assert_same(first, second, F.gelu, torch.randn(tokens, first.in_features, dtype=torch.float64), 1e-10)


@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("left", ["merge", "sequential"])
def test_folded_biases_match_composition(monkeypatch, tokens, left):
    first, second = _fixed_pair(True, True)
    strategies = [(first.in_features, (left, "merge")), (second.in_features, (left, "merge"))]
    _force_plans(monkeypatch, strategies, PlanSettings(fold_bias_min_tokens=0))
    assert first.plan(tokens).fold_bias and second.plan(tokens).fold_bias
    _assert_same(first, second, F.gelu, torch.randn(tokens, first.in_features, dtype=torch.float64), 1e-10)


@pytest.mark.parametrize("lead", [(0,), (2, 0)], ids=str)
def test_no_tokens_give_an_empty_output_and_zero_gradients(lead):
    first, second = _fixed_pair(True, True)
    x = torch.randn(*lead, first.in_features, dtype=torch.float64, requires_grad=True)
    y = feed_forward(first, F.gelu, second, x)
    assert y.shape == (*lead, second.out_features)
    y.sum().backward()
    for p in [*first.parameters(), *second.parameters()]:
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0


def _dense(layer, t):
    return t @ layer.dense_weight() + (0 if layer.bias is None else layer.bias)


@pytest.mark.parametrize("strategies", [("sequential", "merge"), ("merge", "sequential")], ids=str)
@pytest.mark.parametrize("bias1,bias2", [(True, True), (False, True), (True, False)])
def test_second_derivatives_match_dense_reference(monkeypatch, strategies, bias1, bias2):
    """create_graph (a gradient penalty on x): second derivatives through both layers and the activation
    equal autograd's through the dense weights."""
    first, second = _fixed_pair(bias1, bias2)
    _force_plans(monkeypatch, [(first.in_features, strategies), (second.in_features, strategies)])
    x = torch.randn(4, first.in_features, dtype=torch.float64, requires_grad=True)
    wrt = [x, *first.parameters(), *second.parameters()]
    results = []
    for block in (lambda t: feed_forward(first, torch.tanh, second, t),
                  lambda t: _dense(second, torch.tanh(_dense(first, t)))):
        (gx,) = torch.autograd.grad(block(x).tanh().pow(2).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(gx.pow(2).sum(), wrt))
    for i, (a, b) in enumerate(zip(*results)):
        err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err <= 1e-10, f"grad{i}: relative error {err:.2e}"


def test_gradgradcheck():
    """Second derivatives in x (and the first derivative's dependence on the output gradient) of the fused
    block against finite differences; the parameters' are checked against the dense reference above."""
    first, second = _fixed_pair(True, True)
    x = torch.randn(2, first.in_features, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: feed_forward(first, torch.tanh, second, x), [x])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tokens", [1, 200])
def test_paper_shape_block_matches_composition_on_the_device(device, dtype, tokens):
    """On each device (the CUDA case runs in scripts/gpu_check.sh's test phase): the paper-shape block's
    output and gradients equal the plain composition's (float64: 1e-10; float32: 1e-4 relative norm)."""
    torch.manual_seed(0)
    first = TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=8, dtype=dtype,
                     device=device)
    second = TTLinear(3072, 768, in_shape=(12, 16, 16), out_shape=(12, 8, 8), rank=8, dtype=dtype,
                      device=device)
    x = torch.randn(tokens, 768, dtype=dtype, device=device)
    assert _fusable(first.plan(tokens), second.plan(tokens))
    _assert_same(first, second, F.gelu, x, 1e-10 if dtype == torch.float64 else 1e-4)


@pytest.mark.slow
def test_torch_compile_takes_the_block_in_one_graph():
    """Under torch.compile (fullgraph: a graph break would raise) the block is the plain composition of two
    TT layers, each one traced Function: values and gradients as the fused eager block's."""
    torch._dynamo.reset()  # a static token count: one more would be traced as a symbolic one
    first, second, rng = _pair(2)
    x = torch.randn(12, first.in_features, dtype=torch.float64)
    compiled = torch.compile(lambda t: feed_forward(first, F.gelu, second, t), backend="eager",
                             fullgraph=True)
    y, got = _grads(compiled, first, second, x)
    y_ref, want = _grads(lambda t: feed_forward(first, F.gelu, second, t), first, second, x)
    for a, b in [(y, y_ref), *zip(got, want)]:
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch._dynamo.reset()
