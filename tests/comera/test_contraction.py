"""The contraction plan (printable, cached, strategy choice, never costlier than opt_einsum) and the
product kernel its absorptions use.

opt_einsum's cost convention (``PathInfo.opt_cost``, ``opt_einsum.helpers.flop_count``): a pairwise
contraction with a summed index costs 2 x the product of all its index sizes, one without (an elementwise
or outer product) 1 x; the plan counts the same way.
"""
from __future__ import annotations

import math
import random

import opt_einsum
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from comera import kernels
from comera.contraction import DEFAULT_SETTINGS, ContractionPlan, PlanSettings, make_plan

FLOP_SLACK = DEFAULT_SETTINGS.flop_slack

PAPER_FFN = ((12, 8, 8), (12, 16, 16), (1, 12, 30, 30, 30, 16, 1))


def _einsum_problems(in_shape, out_shape, ranks, tokens):
    """The separate contractions of one training step: y, dx, every core gradient, every gate gradient.

    Each is (operand index strings, output index string, sizes)."""
    d, m = len(in_shape) + len(out_shape), len(in_shape)
    symbols = iter(opt_einsum.get_symbol(i) for i in range(2 * d + 1))
    t = next(symbols)
    modes = [next(symbols) for _ in range(d)]
    bonds = [next(symbols) for _ in range(d - 1)]
    sizes = {t: tokens, **dict(zip(modes, in_shape + out_shape)), **dict(zip(bonds, ranks[1:-1]))}
    cores = [(bonds[k - 1] if k else "") + modes[k] + (bonds[k] if k < d - 1 else "") for k in range(d)]
    x, y = t + "".join(modes[:m]), t + "".join(modes[m:])
    problems = [([x, *cores, *bonds], y), ([y, *cores, *bonds], x)]
    problems += [([x, y, *cores[:k], *cores[k + 1:], *bonds], cores[k]) for k in range(d)]
    problems += [([x, y, *cores, *bonds[:k], *bonds[k + 1:]], bonds[k]) for k in range(d - 1)]
    return problems, sizes


def opt_einsum_total(in_shape, out_shape, ranks, tokens) -> int:
    problems, sizes = _einsum_problems(in_shape, out_shape, ranks, tokens)
    total = 0
    for operands, output in problems:
        shapes = [tuple(sizes[c] for c in op) for op in operands]
        _, info = opt_einsum.contract_path(",".join(operands) + "->" + output, *shapes, shapes=True,
                                           optimize="dp")
        total += int(info.opt_cost)
    return total


def _without_redundancy(modes, ranks) -> tuple[int, ...]:
    """Clip ranks so that r_k <= r_{k-1} n_{k-1} and r_k <= n_k r_{k+1}: a larger bond is structurally
    redundant (the TT cannot use it), which TTLinear's int ranks never produce."""
    ranks = list(ranks)
    for k in range(1, len(modes)):
        ranks[k] = min(ranks[k], ranks[k - 1] * modes[k - 1])
    for k in range(len(modes) - 1, 0, -1):
        ranks[k] = min(ranks[k], modes[k] * ranks[k + 1])
    return tuple(ranks)


def _sweep(count: int, orders, seed: int):
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        order = orders[i % len(orders)]
        m = rng.randint(max(1, order - 4), min(4, order - 1))
        modes = tuple(rng.randint(2, 16) for _ in range(order))
        ranks = [1] + [rng.randint(1, 32) for _ in range(order - 1)] + [1]
        cases.append((modes[:m], modes[m:], _without_redundancy(modes, ranks),
                      rng.choice([1, 3, 32, 257, 4096])))
    return cases


def _check_against_opt_einsum(in_shape, out_shape, ranks, tokens):
    plan = make_plan(in_shape, out_shape, ranks, tokens, bias=False)
    reference = opt_einsum_total(in_shape, out_shape, ranks, tokens)
    assert plan.flops <= reference, f"{plan.flops} > opt_einsum {reference}\n{plan}"


@pytest.mark.parametrize("case",
                         _sweep(40, [2, 3, 4, 5, 6], seed=0) + [PAPER_FFN + (t,) for t in (1, 128, 4096)])
def test_plan_never_exceeds_opt_einsum_sum(case):
    _check_against_opt_einsum(*case)


@pytest.mark.parametrize("case", _sweep(4, [7, 8], seed=1) + [((4, 4, 4, 4), (4, 4, 4, 4),
                                                               (1, 4, 16, 30, 30, 30, 16, 4, 1), 1)])
def test_plan_never_exceeds_opt_einsum_sum_high_order(case):
    if case[3] > 64:  # opt_einsum's dp search grows with the token axis at order 8; keep the default run fast
        case = case[:3] + (64,)
    _check_against_opt_einsum(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", _sweep(8, [7, 8], seed=2))
def test_plan_never_exceeds_opt_einsum_sum_high_order_all_tokens(case):
    _check_against_opt_einsum(*case)


def test_plan_is_cached_and_printable():
    plan = make_plan(*PAPER_FFN, 4096)
    assert make_plan(*PAPER_FFN, 4096) is plan
    assert make_plan(*PAPER_FFN, 4095) is not plan
    text = str(plan)
    assert "left=merge" in text and "right=merge" in text
    for step in plan.steps:
        assert step.name in text
    assert f"total {plan.flops:,d}" in text
    assert plan.flops == plan.forward_flops + plan.backward_flops
    phases = [s.phase for s in plan.steps]
    assert phases == sorted(phases, key=["forward", "backward"].index)


def test_paper_ffn_flop_ratio_against_dense():
    tokens = 4096
    plan = make_plan(*PAPER_FFN, tokens)
    dense = 3 * 2 * tokens * 768 * 3072 + 2 * tokens * 3072  # fwd + dx + dW, bias add and grad
    assert 19 < dense / plan.flops < 21


@pytest.mark.parametrize("tokens", [1, 2, 8, 64, 4096])
def test_strategy_is_the_cheapest(tokens):
    """Lowest cost among the plans within FLOP_SLACK of the fewest FLOPs, itself within that slack."""
    chosen = make_plan(*PAPER_FFN, tokens)
    groups = [(3,), (1, 2), (2, 1), (1, 1, 1)]
    others = [make_plan(*PAPER_FFN, tokens, True, strategies)
              for strategies in ["dense"] + [(left, right) for left in groups for right in groups]]
    fewest = min(p.flops for p in others)
    assert chosen.flops <= (1 + FLOP_SLACK) * fewest
    assert all(chosen.cost <= p.cost for p in others if p.flops <= (1 + FLOP_SLACK) * fewest and not p.dense)


def test_traffic_keeps_merge_after_halving_ranks():
    """Halved paper ranks at 4096 tokens: groups(1,2) saves ~10% FLOPs but adds a pass over a (T, 384)
    intermediate; merge is cheaper (and was measured faster)."""
    halved = (1, 6, 15, 15, 15, 6, 1)
    plan = make_plan(PAPER_FFN[0], PAPER_FFN[1], halved, 4096)
    fewest = make_plan(PAPER_FFN[0], PAPER_FFN[1], halved, 4096, True, ((1, 2), (2, 1)))
    assert (plan.left, plan.right) == ("merge", "merge")
    assert fewest.flops < plan.flops and fewest.cost > plan.cost
    assert plan.traffic < fewest.traffic


def test_dense_strategy_for_full_rank_layers():
    plan = make_plan((2,), (2,), (1, 2, 1), 32)
    assert plan.dense and plan.left == plan.right == "dense"


def test_groups_around_a_rank_one_bond():
    """A rank-1 bond inside the input side: merging the cores before it beats both pure strategies."""
    plan = make_plan((16, 6, 12, 7), (8, 15), (1, 16, 10, 1, 7, 6, 1), 32)
    assert plan.left_groups == (3, 1) and plan.left == "groups(3,1)"


def test_small_token_counts_avoid_merging_large_merge():
    """One token: forming the merged blocks would cost 10x more than walking the cores."""
    one = make_plan(*PAPER_FFN, 1)
    assert "merge" not in (one.left, one.right)
    assert one.flops * 10 < make_plan(*PAPER_FFN, 1, True, ("merge", "merge")).flops
    assert (make_plan(*PAPER_FFN, 4096).left, make_plan(*PAPER_FFN, 4096).right) == ("merge", "merge")


def test_zero_rank_plan_has_only_bias():
    plan = make_plan((4, 6), (5, 6), (1, 3, 0, 2, 1), 7)
    assert isinstance(plan, ContractionPlan) and plan.zero
    assert plan.flops == 2 * 7 * 30
    assert make_plan((4, 6), (5, 6), (1, 3, 0, 2, 1), 7, False).flops == 0


@pytest.mark.parametrize("args,match", [
    (((), (4,), (1, 1), 3), "at least one"),
    (((4,), (4,), (1, 2), 3), "ranks"),
    (((4,), (4,), (2, 2, 1), 3), "ranks"),
    (((4,), (4,), (1, -1, 1), 3), "ranks"),
])
def test_bad_plan_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        make_plan(*args)


@pytest.mark.parametrize("strategies,match", [(("merge", "fast"), "right strategy"),
                                              (((1, 1), "merge"), "left strategy"),
                                               ("fast", "strategies"), (("merge",), "strategies")])
def test_bad_strategy(strategies, match):
    with pytest.raises(ValueError, match=match):
        make_plan((4,), (4,), (1, 2, 1), 3, True, strategies)



def _ops_run(fn) -> set[str]:
    """Names of the ATen / oneDNN ops ``fn`` executes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Recorder() as recorder:
        fn()
    return recorder.names


@pytest.mark.parametrize("b_layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("rows", [8, 4096])
def test_mm_equals_torch_mm_and_counts_its_flops(b_layout, rows):
    """kernels._mm: small products and float64 take torch.mm, large float32 ones oneDNN's inner
    product where this PyTorch has it; same result and the same FLOP count either way."""
    torch.manual_seed(0)
    a = torch.randn(rows, 64)
    b = torch.randn(64, 48) if b_layout == "contiguous" else torch.randn(48, 64).t()
    large = rows * 64 * 48 >= kernels.INNER_PRODUCT_MIN_MACS[0]
    kernels.register_flop_formulas()
    ops = _ops_run(lambda: kernels._mm(a, b))
    assert ("mkldnn._linear_pointwise" in ops) == (large and kernels._INNER_PRODUCT is not None), ops
    torch.testing.assert_close(kernels._mm(a, b), a.double().mm(b.double()).float(), rtol=1e-5, atol=1e-4)
    with FlopCounterMode(display=False) as counter:
        kernels._mm(a, b)
    assert counter.get_total_flops() == 2 * rows * 64 * 48
    a64, b64 = a.double(), b.double()
    assert _ops_run(lambda: kernels._mm(a64, b64)) == {"aten.mm"}


@pytest.mark.parametrize("rows", [8, 4096])
def test_mm_with_bias_equals_addmm(rows):
    """The bias rides in the product: oneDNN's fused bias for large float32 products, addmm otherwise."""
    torch.manual_seed(0)
    a, b, bias = torch.randn(rows, 64), torch.randn(64, 48), torch.randn(48)
    ops = _ops_run(lambda: kernels._mm(a, b, bias))
    large = rows * 64 * 48 >= kernels.INNER_PRODUCT_MIN_MACS[0]
    assert ("mkldnn._linear_pointwise" in ops) == (large and kernels._INNER_PRODUCT is not None), ops
    assert large or ops == {"aten.addmm"}
    want = torch.addmm(bias.double(), a.double(), b.double()).float()
    torch.testing.assert_close(kernels._mm(a, b, bias), want, rtol=1e-5, atol=1e-4)


def test_mm_keeps_autograd_when_recording():
    """With grad mode on and an operand that requires grad, the product must be differentiable."""
    a = torch.randn(4096, 64, requires_grad=True)
    b = torch.randn(64, 48)
    out = kernels._mm(a, b)
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(4096, 64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,inner,cols,narrow", [(128, 768, 30, True), (16, 256, 32, True),
                                                     (128, 96, 30, False), (8, 768, 30, False),
                                                     (64, 768, 48, False)])
def test_narrow_mm_computes_the_transposed_product_below_onednn_sizes(dtype, rows, inner, cols, narrow):
    """kernels._narrow_mm / _narrow_mm_t: ``a @ b`` and ``a @ w^T``; a narrow CPU product with a long inner
    dimension (below oneDNN's sizes) comes back as the transposed view of a contiguous (cols, rows) result,
    any other as a contiguous one."""
    torch.manual_seed(0)
    a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, cols, dtype=dtype)
    assert rows * inner * cols < kernels.INNER_PRODUCT_MIN_MACS[0]
    want = a.double() @ b.double()
    for got in (kernels._narrow_mm(a, b), kernels._narrow_mm_t(a, b.t().contiguous())):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
        assert got.is_contiguous() != narrow and got.t().is_contiguous() == narrow


def test_mm_falls_back_to_torch_mm_when_onednn_fails(monkeypatch):
    def unsupported(*args):
        raise RuntimeError("could not create a primitive descriptor")

    monkeypatch.setattr(kernels, "_INNER_PRODUCT", unsupported)
    a, b = torch.randn(4096, 64), torch.randn(64, 48)
    torch.testing.assert_close(kernels._mm(a, b), torch.mm(a, b))
    torch.testing.assert_close(kernels._mm_t(a, b.t().contiguous()), torch.mm(a, b))
    assert kernels._INNER_PRODUCT is unsupported  # nothing rebound: the module keeps no state


def test_flop_formula_is_registered_only_on_request():
    """Importing comera leaves torch's flop_registry alone; register_flop_formulas() adds the inner
    product's formula (idempotent) and FlopCounterMode then counts it like aten.mm."""
    import subprocess
    import sys

    code = ("import torch, comera; from torch.utils.flop_counter import flop_registry; "
            "op = getattr(torch.ops.mkldnn, '_linear_pointwise', None); "
            "print(op is not None and op in flop_registry)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    kernels.register_flop_formulas()
    kernels.register_flop_formulas()
    if kernels._INNER_PRODUCT is not None:
        from torch.utils.flop_counter import flop_registry

        assert kernels._INNER_PRODUCT in flop_registry


@pytest.mark.parametrize("tokens", [1, 16, 128])
def test_kernel_cost_is_part_of_the_cost_and_can_decide(tokens):
    """cost = flops + traffic_weight * traffic + kernel_cost * kernels; with free kernels the choice is
    the FLOP/traffic one, with very costly kernels the plan with the fewest kernels (within the slack)."""
    groups = [(3,), (1, 2), (2, 1), (1, 1, 1)]
    every = [(left, right) for left in groups for right in groups]
    for per_kernel in (0, 10**12):
        settings = PlanSettings(kernel_cost=per_kernel)
        chosen = make_plan(*PAPER_FFN, tokens, settings=settings)
        others = [make_plan(*PAPER_FFN, tokens, True, s, settings) for s in every]
        assert chosen.settings is settings
        assert chosen.cost == (chosen.flops + settings.traffic_weight * chosen.traffic
                               + per_kernel * chosen.kernels)
        fewest = min(p.flops for p in others)
        eligible = [p for p in others if p.flops <= (1 + FLOP_SLACK) * fewest]
        assert chosen.cost == min(p.cost for p in eligible)
        if per_kernel:
            assert chosen.kernels == min(p.kernels for p in eligible)


def test_kernel_counts():
    """A batched absorption (before the bond) copies its operand first: 2 kernels; merge launches fewest."""
    merge = make_plan(*PAPER_FFN, 8, True, ("merge", "merge"))
    sequential = make_plan(*PAPER_FFN, 8, True, ("sequential", "sequential"))
    assert merge.kernels < sequential.kernels
    assert {s.kernels for s in sequential.steps if s.name.startswith("absorb")} == {1, 2}
    assert f"{merge.kernels} kernels" in str(merge)


@pytest.mark.parametrize("field", ["kernel_cost", "traffic_weight", "fold_bias_min_tokens", "flop_slack"])
@pytest.mark.parametrize("value", [-1, True, "2"])
def test_plan_settings_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        PlanSettings(**{field: value})


def test_plan_settings_are_part_of_the_plan_key():
    """Settings are an argument, not global state: two settings give two plans side by side, each
    memoized; the default plan is untouched."""
    default = make_plan(*PAPER_FFN, 16)
    other = PlanSettings(kernel_cost=DEFAULT_SETTINGS.kernel_cost + 1)
    after = make_plan(*PAPER_FFN, 16, settings=other)
    assert after is not default and after.cost == default.cost + after.kernels
    assert make_plan(*PAPER_FFN, 16) is default and make_plan(*PAPER_FFN, 16, settings=other) is after
    assert make_plan(list(PAPER_FFN[0]), PAPER_FFN[1], list(PAPER_FFN[2]), 16) is default
    with pytest.raises(TypeError, match="PlanSettings"):
        make_plan(*PAPER_FFN, 16, settings={"kernel_cost": 1})


@pytest.mark.parametrize("tokens", [1, 128, 2048, 4096])
def test_fold_flag(tokens):
    """A one-group output side folds the bias from fold_bias_min_tokens; without a bias, or with a grouped
    output side, nothing is folded."""
    plan = make_plan(*PAPER_FFN, tokens, True, ("merge", "merge"))
    folds = tokens >= DEFAULT_SETTINGS.fold_bias_min_tokens
    assert plan.fold_bias == folds
    no_bias = make_plan(*PAPER_FFN, tokens, False, ("merge", "merge"))
    assert not no_bias.fold_bias
    grouped = make_plan(*PAPER_FFN, tokens, True, ("merge", (1, 2)))
    assert not grouped.fold_bias
    assert any(s.name == "bias" for s in plan.steps) != folds


PAPER_ATTN = ((12, 8, 8), (8, 8, 12), (1, 12, 30, 30, 30, 12, 1))


@pytest.mark.parametrize("shape, tokens, folded", [(PAPER_FFN, 4096, True), (PAPER_ATTN, 4096, True),
                                                   (PAPER_ATTN, 128, False)])
def test_paper_shapes_choose_one_block_per_side_and_the_fewest_flops(shape, tokens, folded):
    """At the paper's shapes the plan merges each side into one block (x @ A -> z, z @ B -> y: two token
    GEMMs forward, the official TT_forward's order), which has the fewest FLOPs of every grouping; from
    fold_bias_min_tokens the bias rides in the output GEMM, so the plan moves fewer bytes than the same order
    with the bias added and summed in passes of its own (what the official code does)."""
    plan = make_plan(*shape, tokens)
    groups = [(3,), (1, 2), (2, 1), (1, 1, 1)]
    every = [make_plan(*shape, tokens, True, (left, right)) for left in groups for right in groups]
    assert (plan.left_groups, plan.right_groups, plan.fold_bias) == ((3,), (3,), folded)
    assert plan.flops <= min(p.flops for p in every)
    assert plan.order == ("x @ (G0 G1 G2) -> z; z @ (G3 G4 G5) -> y + b"
                          + (" (folded into the GEMM)" if folded else ""))
    unfolded = make_plan(*shape, tokens, True, ("merge", "merge"),
                         PlanSettings(fold_bias_min_tokens=tokens + 1))
    if folded:
        passes = 3 * tokens * math.prod(plan.out_shape)  # y += b reads y and writes it; db reads dy
        assert unfolded.traffic - plan.traffic == passes - tokens * 2  # the column of ones, forward + dB
        assert plan.traffic_bytes() < unfolded.traffic_bytes()
    else:
        assert unfolded == plan


def test_summary_and_printout_give_the_order_and_predicted_cost():
    plan = make_plan(*PAPER_FFN, 4096)
    summary = plan.summary()
    assert summary == {"order": plan.order, "left": "merge", "right": "merge", "fold_bias": True,
                       "flops": plan.flops, "traffic_bytes": 4 * plan.traffic, "kernels": plan.kernels,
                       "cost": plan.cost}
    assert plan.summary(element_size=2)["traffic_bytes"] == 2 * plan.traffic
    text = str(plan)
    assert f"order: {plan.order}" in text
    assert f"predicted cost {plan.cost:,d} FLOP-equivalents" in text
    assert f"({plan.traffic_bytes():,d} bytes in float32)" in text
    for step in plan.steps:
        assert f"{step.traffic:,d}" in text
    with pytest.raises(ValueError, match="element_size"):
        plan.traffic_bytes(0)


def test_order_of_dense_sequential_and_zero_rank_plans():
    assert make_plan((2,), (2,), (1, 2, 1), 32).order == "W = (G0) @ (G1); y = x @ W + b"
    one = make_plan(*PAPER_FFN, 1)
    assert one.order.startswith("x @ (G0) @ (G1) @ (G2) -> z; ")
    assert make_plan((4, 6), (5, 6), (1, 3, 0, 2, 1), 7).order.startswith("y = b")
    assert make_plan((4, 6), (5, 6), (1, 3, 0, 2, 1), 7, False).order.startswith("y = 0")
