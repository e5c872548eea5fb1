"""harness.perf.plans: the opt_einsum reference and the sweep of target 5."""
from __future__ import annotations

from harness.perf import plans


def test_optimal_sum_matches_hand_count_for_two_cores():
    # x[T,a] G0[a,r] G1[r,b]; T=100, a=4, r=2, b=6
    T, a, r, b = 100, 4, 2, 6
    y = min(2 * T * a * r + 2 * T * r * b, 2 * a * r * b + 2 * T * a * b)
    dx = min(2 * T * b * r + 2 * T * r * a, 2 * a * r * b + 2 * T * a * b)
    dg0 = min(2 * T * b * r + 2 * T * a * r, 2 * T * a * b + 2 * a * b * r)
    dg1 = min(2 * T * a * r + 2 * T * r * b, 2 * T * a * b + 2 * a * b * r)
    assert plans.optimal_sum_flops((a,), (b,), (1, r, 1), T) == y + dx + dg0 + dg1


def test_plan_contraction_flops_leave_out_gate_scaling():
    from comera.contraction import make_plan

    plan = make_plan((4, 4), (4, 8), (1, 4, 4, 4, 1), 64, False)
    gated_core_sizes = 1 * 4 * 4 + 4 * 4 * 4 + 4 * 4 * 4  # cores 0..d-2 carry a gate
    # per gated core: H = G * g (1 per element), dg (2), dG = dH * g (1)
    assert plans.plan_contraction_flops(plan) == plan.flops - 4 * gated_core_sizes


def test_plan_sweep_covers_orders_and_is_distinct():
    full = plans.plan_sweep(quick=False)
    assert {len(i) + len(o) for i, o, _, _ in full} == set(range(2, 9))
    assert {t for *_, t in full} == {1, 16, 256, 4096}
    assert len(full) == len(set(full))
    for in_shape, out_shape, ranks, _ in full:
        assert len(ranks) == len(in_shape) + len(out_shape) + 1 and ranks[0] == ranks[-1] == 1
