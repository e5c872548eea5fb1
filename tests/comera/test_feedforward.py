"""feed_forward: same output and gradients as the plain composition, and no full-width activation saved;
with the native ops (comera.native) the same results, bit for bit, as with the Python kernels."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comera import TTLinear, native
from comera.contraction import PlanSettings, make_plan
from comera.feedforward import _fusable, feed_forward
from tests.comera.flops import native_and_python_flops

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}
needs_native = pytest.mark.skipif(not native.status().in_use, reason=f"native ops: {native.status().reason}")


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
    dy = torch.randn_like(y, generator=torch.Generator().manual_seed(1))
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


@pytest.mark.parametrize("python_kernels", [False, True], ids=["default", "python_kernels"])
def test_saves_no_full_width_activation(python_kernels):
    """At 512 tokens and hidden 3072 the composition saves two 6 MiB hidden tensors; the fused block none,
    with the native ops (where built) as with the Python kernels."""
    first = TTLinear(768, 3072, rank=16)
    second = TTLinear(3072, 768, rank=16)
    x = torch.randn(512, 768)
    with native.disabled() if python_kernels else torch.enable_grad():
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


# ------------------------------------------------------------------------------------- native ops

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


def _fused_fwd_bwd(first, second, x, need_dx=True, act=F.gelu):
    """feed_forward's output and the gradients of (x,) both layers' parameters for a fixed output gradient."""
    x = x.detach().clone().requires_grad_(need_dx)
    y = feed_forward(first, act, second, x)
    wrt = ([x] if need_dx else []) + [*first.parameters(), *second.parameters()]
    dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1)).to(y.device)
    return [y, *torch.autograd.grad(y, wrt, dy)]


def _assert_native_is_python(first, second, x, need_dx=True):
    """The native path runs (both plans usable) and equals the Python kernels' results bit for bit."""
    tokens = x.shape[0]
    assert native.usable(first.plan(tokens)) and native.usable(second.plan(tokens))
    got = _fused_fwd_bwd(first, second, x, need_dx)
    with native.disabled():
        want = _fused_fwd_bwd(first, second, x, need_dx)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"output {i}: native and Python kernels differ"


NATIVE_STRATEGIES = [(("merge", "merge"), ("merge", "merge")),
                     (("sequential", "sequential"), ("sequential", "sequential")),
                     (("merge", "sequential"), ("sequential", "merge")),
                     (((2, 1), (1, 2)), ((1, 2), (2, 1)))]


@needs_native
@pytest.mark.parametrize("strategies", NATIVE_STRATEGIES, ids=str)
@pytest.mark.parametrize("tokens", [1, 2, 9])
@pytest.mark.parametrize("biases", [(True, True), (False, True), (True, False), (False, False)], ids=str)
@pytest.mark.parametrize("need_dx", [True, False])
def test_native_equals_python_kernels(monkeypatch, strategies, tokens, biases, need_dx):
    first, second = _fixed_pair(*biases)
    _force_plans(monkeypatch, [(first.in_features, strategies[0]), (second.in_features, strategies[1])])
    x = torch.randn(tokens, first.in_features, dtype=torch.float64)
    _assert_native_is_python(first, second, x, need_dx)
    if need_dx:
        _assert_same(first, second, F.gelu, x, 1e-10)


@needs_native
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("left", ["merge", "sequential"])
def test_native_folded_biases_equal_python_kernels(monkeypatch, tokens, left):
    first, second = _fixed_pair(True, True)
    strategies = [(first.in_features, (left, "merge")), (second.in_features, (left, "merge"))]
    _force_plans(monkeypatch, strategies, PlanSettings(fold_bias_min_tokens=0))
    assert first.plan(tokens).fold_bias and second.plan(tokens).fold_bias
    x = torch.randn(tokens, first.in_features, dtype=torch.float64)
    _assert_native_is_python(first, second, x)
    _assert_same(first, second, F.gelu, x, 1e-10)


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_native_default_plans_equal_python_kernels(seed):
    first, second, rng = _pair(seed)
    _assert_native_is_python(first, second, torch.randn(rng.choice([1, 5, 12]), first.in_features,
                                                        dtype=torch.float64))


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


@pytest.mark.parametrize("python_kernels", [False, True], ids=["default", "python-kernels"])
@pytest.mark.parametrize("strategies", [("sequential", "merge"), ("merge", "sequential")], ids=str)
@pytest.mark.parametrize("bias1,bias2", [(True, True), (False, True), (True, False)])
def test_second_derivatives_match_dense_reference(monkeypatch, strategies, bias1, bias2, python_kernels):
    """create_graph (a gradient penalty on x): second derivatives through both layers and the activation
    equal autograd's through the dense weights, with the native ops (where built) and the Python kernels."""
    first, second = _fixed_pair(bias1, bias2)
    _force_plans(monkeypatch, [(first.in_features, strategies), (second.in_features, strategies)])
    x = torch.randn(4, first.in_features, dtype=torch.float64, requires_grad=True)
    wrt = [x, *first.parameters(), *second.parameters()]
    results = []
    for block in (lambda t: feed_forward(first, torch.tanh, second, t),
                  lambda t: _dense(second, torch.tanh(_dense(first, t)))):
        with native.disabled() if python_kernels else torch.enable_grad():
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


def _paper_pair():
    torch.manual_seed(0)
    return (TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=30),
            TTLinear(3072, 768, in_shape=(12, 16, 16), out_shape=(12, 8, 8), rank=30))


def _dispatched(first, second, x):
    """Names of the ATen ops one forward+backward dispatches from Python (gradients reset to None first,
    as zero_grad does; after one uncounted call)."""
    from harness.perf.microbench import OpCounter

    def run():
        for p in (x, *first.parameters(), *second.parameters()):
            p.grad = None
        feed_forward(first, F.gelu, second, x).sum().backward()

    run()
    with OpCounter() as seen:
        run()
    return seen.names


@needs_native
@pytest.mark.parametrize("tokens", [1, 128])
def test_native_ops_dispatched_per_forward_and_backward(tokens):
    """The paper-shape block (768->3072->768, rank 30) with the native ops: 41-42 ops from Python (the 6
    native ops, the activation thrice, autograd's 25 accumulations, views), 165-185 with the Python
    kernels."""
    first, second = _paper_pair()
    x = torch.randn(tokens, 768, requires_grad=True)
    names = _dispatched(first, second, x)
    multi = len(second.plan(tokens).left_groups) > 1  # layer 2's input groups' outputs are recomputed
    assert [n for n in names if n.startswith("comera_native.")] == [
        "comera_native.tt_forward.default", "comera_native.tt_forward.default",
        "comera_native.tt_right_forward.default",
        *(["comera_native.tt_left_forward.default"] if multi else []),
        "comera_native.tt_backward.default", "comera_native.tt_backward.default"]
    assert not any(n.startswith(("aten.mm", "aten._foreach")) for n in names)
    assert len(names) <= 42
    with native.disabled():
        assert len(_dispatched(first, second, x)) >= 160


@needs_native
@pytest.mark.parametrize("strategies", [None, ("sequential", "merge"), ((2, 1), (1, 2))], ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 2048])
@pytest.mark.parametrize("need_dx", [True, False])
def test_native_flops_count_what_the_python_kernels_run(monkeypatch, strategies, tokens, need_dx):
    first, second = _fixed_pair(True, True)
    first, second = first.float(), second.float()
    if strategies is not None:
        _force_plans(monkeypatch, [(first.in_features, strategies), (second.in_features, strategies)])
    x = torch.randn(tokens, first.in_features)
    natively, python = native_and_python_flops(lambda: _fused_fwd_bwd(first, second, x, need_dx))
    assert natively == python > 0


@needs_native
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tokens", [1, 200])
def test_native_equals_python_kernels_on_the_device(device, dtype, tokens):
    """On each device (the CUDA case runs in scripts/gpu_check.sh's test phase): the paper-shape block's
    output and gradients, native vs Python kernels (float64: 1e-12; float32: 1e-5 relative)."""
    torch.manual_seed(0)
    first = TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=8, dtype=dtype,
                     device=device)
    second = TTLinear(3072, 768, in_shape=(12, 16, 16), out_shape=(12, 8, 8), rank=8, dtype=dtype,
                      device=device)
    x = torch.randn(tokens, 768, dtype=dtype, device=device)
    assert native.usable(first.plan(tokens)) and native.usable(second.plan(tokens))
    got = _fused_fwd_bwd(first, second, x)
    with native.disabled():
        want = _fused_fwd_bwd(first, second, x)
    tol = {"rtol": 0, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    for g, w in zip(got, want, strict=True):
        assert g.device.type == device
        torch.testing.assert_close(g, w, **tol)


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
