"""Rank adaptation: sizes, penalties, the two stages and physical pruning (on TTM; TT where available)."""
import math
import warnings

import pytest
import torch
from torch import nn

from comera import rank
from comera.ttm import TTMEmbedding

try:
    from comera.tt import TTLinear
except ImportError:  # pragma: no cover - TTLinear is written by another part
    TTLinear = None



def _ttm(seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=[1, 3, 4, 1],
                         dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    return layer


def _tt(seed=0):
    torch.manual_seed(seed)
    layer = TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=[1, 2, 4, 3, 4, 2, 1],
                     dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    return layer


LAYERS = [pytest.param(_ttm, torch.tensor([[0, 3, 3, 49], [7, 12, 7, 1]]), id="ttm"),
          pytest.param(_tt, torch.randn(2, 5, 24, dtype=torch.float64), id="tt",
                       marks=pytest.mark.skipif(TTLinear is None, reason="comera.tt.TTLinear not available"))]


def _hand_size(ranks_, modes):
    cores = sum(ranks_[k] * modes[k] * ranks_[k + 1] for k in range(len(modes)))
    return cores + sum(ranks_[1:-1])


def test_size_accounting_counts_every_core_and_gate():
    layer = _ttm()
    modes = [2 * 2, 5 * 3, 6 * 4]
    assert rank.tt_parameter_count(layer) == _hand_size([1, 3, 4, 1], modes) == 295
    assert float(rank.size_l0(layer, 1e-2)) == 295
    with torch.no_grad():
        layer.gates[0][1] = 0.0        # bond 1 counts 2
        layer.gates[1][:2] = 0.005     # bond 2 counts 2
    assert float(rank.size_l0(layer, 1e-2)) == _hand_size([1, 2, 2, 1], modes)
    with torch.no_grad():
        for gate in layer.gates:
            gate.fill_(1.0)
    assert float(rank.size_l1(layer).detach()) == _hand_size([1, 3, 4, 1], modes) - 7  # surrogate excludes gates


def _explicit_sizes(model, threshold):
    """Per-module loops over the cores: (l0 size with gates, l1 surrogate)."""
    l0 = l1 = 0.0
    for _, module in rank.tensorized_modules(model):
        gates = [g.detach() for g in module.gates]
        counts = [1.0] + [float((g > threshold).sum()) for g in gates] + [1.0]
        norms = [1.0] + [float(g.abs().sum()) for g in gates] + [1.0]
        for k, core in enumerate(module.cores):
            unit = math.prod(core.shape[1:-1])
            l0 += unit * counts[k] * counts[k + 1]
            l1 += unit * norms[k] * norms[k + 1]
        l0 += sum(counts[1:-1])
    return l0, l1


@pytest.mark.skipif(TTLinear is None, reason="comera.tt.TTLinear not available")
def test_vectorized_sizes_match_per_module_loops_across_pruning():
    torch.manual_seed(3)
    model = nn.ModuleDict({
        "tt": TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=3, dtype=torch.float64),
        "ttm": _ttm(),
        "flat": TTMEmbedding(9, 6, row_shape=[9], col_shape=[6], rank=1, dtype=torch.float64),
    })
    with torch.no_grad():
        for _, module in rank.tensorized_modules(model):
            for gate in module.gates:
                gate.uniform_(-0.05, 1.0)
        model["ttm"].gates[1].zero_()
    for _ in range(2):  # before and after pruning (the cached layout must follow the new shapes)
        l0, l1 = _explicit_sizes(model, 0.02)
        assert float(rank.size_l0(model, 0.02)) == l0
        assert float(rank.size_l1(model).detach()) == pytest.approx(l1, rel=1e-12)
        gates = [g.detach() for _, m in rank.tensorized_modules(model) for g in m.gates]
        cores = [c.detach() for _, m in rank.tensorized_modules(model) for c in m.cores]
        active = [g[g > 0.02] for g in gates]
        assert float(rank.gate_penalty(model, 0.02, "sum").detach()) == pytest.approx(
            float(sum(a.sum() for a in active)))
        assert float(rank.core_l2(model).detach()) == pytest.approx(float(sum(c.square().sum() for c in cores)))
        report = rank.prune(model, 0.02)
    assert report["params_after"] == float(rank.size_l0(model, 0.02)) == rank.tt_parameter_count(model)
    assert model["ttm"].ranks == [1, 3, 0, 1]


@pytest.mark.skipif(TTLinear is None, reason="comera.tt.TTLinear not available")
def test_core_l2_gradient_is_twice_every_core():
    """The l2 term's own backward (one multi-tensor product) against autograd's numerical gradient and
    the closed form 2 G, over TT and TTM cores together."""
    model = nn.ModuleDict({"tt": _tt(), "ttm": _ttm()})
    cores = [c for _, m in rank.tensorized_modules(model) for c in m.cores]
    grads = torch.autograd.grad(rank.core_l2(model), cores)
    for grad, core in zip(grads, cores):
        torch.testing.assert_close(grad, 2 * core.detach())
    leaves = [c.detach().clone().requires_grad_() for c in cores]
    assert torch.autograd.gradcheck(lambda *cs: rank._SumOfSquares.apply(cs[0].new_ones(()), *cs), leaves)
    assert torch.autograd.gradgradcheck(lambda *cs: rank._SumOfSquares.apply(cs[0].new_ones(()), *cs), leaves)
    # create_graph: the Hessian of sum ||G||^2 is 2 I, so the Hessian-vector product is 2 v
    vectors = [torch.randn_like(c) for c in cores]
    first = torch.autograd.grad(rank.core_l2(model), cores, create_graph=True)
    hvp = torch.autograd.grad(first, cores, vectors)
    for got, v in zip(hvp, vectors):
        torch.testing.assert_close(got, 2 * v)
    loss = torch.tensor(0.3, dtype=torch.float64)
    objective = rank.early_objective(loss, model, l1_weight=0.0, l2_weight=0.5, threshold=0.01)
    for grad, core in zip(torch.autograd.grad(objective, cores), cores):
        torch.testing.assert_close(grad, core.detach())


def test_cached_layout_follows_replaced_parameters_and_dtype():
    """The per-model layout is rebuilt when a parameter is replaced (as loading a pruned checkpoint does)
    or the model changes dtype; sizes and penalties then read the new tensors."""
    layer = _ttm()
    assert float(rank.core_l2(layer)) == pytest.approx(float(sum(c.square().sum() for c in layer.cores)))
    with torch.no_grad():
        layer.cores[1] = nn.Parameter(torch.full_like(layer.cores[1], 2.0))
    expected = float(sum(c.square().sum() for c in layer.cores))
    assert float(rank.core_l2(layer)) == pytest.approx(expected)
    layer.float()
    assert rank.core_l2(layer).dtype == rank.size_l0(layer, 0.01).dtype == torch.float32
    assert float(rank.core_l2(layer)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_penalties_and_early_objective(reduction):
    """The gate penalty covers the active gates only (g > threshold; negative ones are inactive), divided
    by their count for "mean" (the official code's rank_loss), and only they get its gradient."""
    layer = _ttm()
    with torch.no_grad():
        layer.gates[0][0] = -0.5      # negative: inactive, pruned by the sign rule
        layer.gates[1][1] = 0.01      # at the threshold: inactive
    loss = torch.tensor(0.7, dtype=torch.float64)
    active = [g > 0.01 for g in layer.gates]
    l1 = sum(g[a].sum() for g, a in zip(layer.gates, active))
    if reduction == "mean":
        l1 = l1 / sum(int(a.sum()) for a in active)
    l2 = sum(c.square().sum() for c in layer.cores)
    torch.testing.assert_close(rank.gate_penalty(layer, 0.01, reduction), l1)
    torch.testing.assert_close(rank.core_l2(layer), l2)
    objective = rank.early_objective(loss, layer, l1_weight=0.01, l2_weight=0.001, threshold=0.01,
                                     l1_reduction=reduction)
    torch.testing.assert_close(objective, loss + 0.01 * l1 + 0.001 * l2)
    grads = torch.autograd.grad(rank.gate_penalty(layer, 0.01, reduction), list(layer.gates))
    per_gate = 1.0 if reduction == "sum" else 1.0 / sum(int(a.sum()) for a in active)
    for grad, a in zip(grads, active):
        torch.testing.assert_close(grad, a.to(grad.dtype) * per_gate)


def test_mean_penalty_is_gentle_per_gate_where_the_sum_is_not():
    """Per-gate gradient of the mean penalty shrinks with the number of gates (the official code's
    normalisation); the sum's stays 1 whatever the model size."""
    torch.manual_seed(0)
    model = nn.ModuleList(TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=4,
                                       dtype=torch.float64) for _ in range(10))
    gates = [g for m in model for g in m.gates]
    (mean_grad,) = torch.autograd.grad(rank.gate_penalty(model, 1e-2, "mean"), gates[:1])
    (sum_grad,) = torch.autograd.grad(rank.gate_penalty(model, 1e-2, "sum"), gates[:1])
    count = sum(g.numel() for g in gates)
    torch.testing.assert_close(mean_grad, torch.full_like(mean_grad, 1.0 / count))
    torch.testing.assert_close(sum_grad, torch.ones_like(sum_grad))


def test_gate_penalty_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        rank.gate_penalty(_ttm(), 0.01, "max")
    with pytest.raises(ValueError, match="l1_reduction"):
        rank.TwoStageRankAdaptation(_ttm(), rank.RankSettings(l1_reduction="max"))


def test_prune_removes_negative_gates():
    """Sign rule of the official code: every gate <= threshold is pruned, negative ones included."""
    layer = _ttm()
    with torch.no_grad():
        layer.gates[0][2] = -0.8
        layer.gates[1][3] = 0.5
    rank.prune(layer, 1e-2)
    assert layer.ranks == [1, 2, 4, 1]


def test_prune_with_a_size_floor_removes_smallest_gates_first_and_stops_at_the_floor():
    layer = _ttm()
    modes = [4, 15, 24]
    with torch.no_grad():
        layer.gates[1][:] = torch.tensor([0.005, -0.2, 0.001, 0.9], dtype=torch.float64)
    floor = _hand_size([1, 3, 2, 1], modes)  # room for two of the three inactive ranks
    report = rank.prune(layer, 1e-2, min_size=floor)
    assert layer.ranks == [1, 3, 2, 1] and report["params_after"] == floor
    # the smallest gates (-0.2, 0.001) went, the 0.005 one stays
    torch.testing.assert_close(layer.gates[1].detach(), torch.tensor([0.005, 0.9], dtype=torch.float64))
    report = rank.prune(layer, 1e-2, min_size=floor + 1)  # no room at all: nothing removed
    assert layer.ranks == [1, 3, 2, 1]


@pytest.mark.parametrize("make,inputs", LAYERS)
def test_prune_keeps_gated_output_shrinks_and_slices_optimizer_state(make, inputs):
    layer = make()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    for _ in range(2):
        loss = layer(inputs).square().sum()  # stays alive across prune, like the runner's loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        layer.gates[0][1] = 0.0
        layer.gates[1][0] = 0.003  # below the threshold: pruned
    expected_ranks = list(layer.ranks)
    expected_ranks[1] -= 1
    expected_ranks[2] -= 1
    with torch.no_grad():
        layer.gates[1][0] = 0.0    # the gated output with pruned gates set to zero
        expected = layer(inputs)
        layer.gates[1][0] = 0.003
    params = list(layer.parameters())
    state_before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    keep_first = (layer.gates[0].detach().abs() > 1e-2).nonzero().squeeze(1)
    gate_keep = (layer.gates[1].detach().abs() > 1e-2).nonzero().squeeze(1)
    core1_avg = opt.state[layer.cores[1]]["exp_avg"].clone()
    count_before = rank.tt_parameter_count(layer)
    flops_before = layer.flops(10) if hasattr(layer, "flops") else None

    report = rank.prune(layer, 1e-2, [opt])

    assert layer.ranks == expected_ranks == report["ranks_after"][""]
    assert report["params_after"] == rank.tt_parameter_count(layer) < count_before
    assert [id(p) for p in layer.parameters()] == [id(p) for p in params]
    with torch.no_grad():
        torch.testing.assert_close(layer(inputs), expected, rtol=1e-12, atol=1e-12)
    if flops_before is not None:
        assert layer.flops(10) < flops_before
    # optimizer state is sliced, not reset: core 1 lost rank 1 on its first axis and rank 0 on its last
    torch.testing.assert_close(opt.state[layer.cores[1]]["exp_avg"],
                               core1_avg.index_select(0, keep_first).index_select(-1, gate_keep))
    for p in params:
        assert opt.state[p]["exp_avg"].shape == p.shape == opt.state[p]["exp_avg_sq"].shape
        torch.testing.assert_close(opt.state[p]["step"], state_before[id(p)]["step"])
    layer(inputs).square().sum().backward()  # training continues on the smaller layer
    opt.step()
    assert float(opt.state[params[0]]["step"]) == 3.0
    assert all(torch.isfinite(p).all() for p in layer.parameters())


def test_prune_bond_to_zero_makes_layer_zero_and_is_counted():
    layer = _ttm()
    with torch.no_grad():
        layer.gates[1].zero_()
    report = rank.prune(layer, 1e-2)
    assert layer.ranks == [1, 3, 0, 1]
    assert report["params_after"] == 4 * 3 + 0 + 0 + 3  # core 0, cores 1-2 empty, gates of bond 1
    out = layer(torch.tensor([1, 2]))
    assert torch.count_nonzero(out) == 0
    assert float(rank.size_l0(layer, 1e-2)) == report["params_after"]


def test_ranks_lists_every_tensorized_module():
    model = nn.Sequential(_ttm(), nn.Linear(24, 3), _ttm(seed=1))
    assert rank.ranks(model) == {"0": [1, 3, 4, 1], "2": [1, 3, 4, 1]}
    assert rank.tt_parameter_count(model) == 2 * 295


def test_late_stage_starts_after_the_early_steps_with_reference_point():
    layer = _ttm()
    settings = rank.RankSettings(late_start_step=3, target_ratio=0.5, prune_every=0, loss_average=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    losses = [2.0, 1.5, 1.25]
    for step, value in enumerate(losses):
        assert driver.stage == 0
        driver.objective(torch.tensor(value, dtype=torch.float64), step)
        info = driver.after_step(step)
    assert driver.stage == 1 and info["stage"] == 1.0
    assert driver.target.loss_target == 1.25  # loss_average 0: the last early-stage loss
    assert driver.target.size_target == 0.5 * 295 and driver.target.size_scale == 295


def test_late_stage_branch_switches_exactly_at_the_l0_condition():
    """Zero one more gate of bond 2 per step; predict from S(D) when w2 (S - S0)/S_start <= w1 (L - L0)."""
    layer = _ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.6, prune_every=1000, rho=0.25,
                                 loss_target=1.0, size_weight=2.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    driver.objective(torch.tensor(1.0, dtype=torch.float64), 0)
    driver.after_step(0)
    assert driver.stage == 1
    task_value = 1.1                                  # loss gap w1 (L - L0) = 0.1
    s_start, s0 = 295.0, 0.6 * 295.0
    modes = [4, 15, 24]
    observed, predicted = [], []
    for zeroed in range(5):
        with torch.no_grad():
            layer.gates[1].fill_(1.0)
            layer.gates[1][:zeroed] = 0.0
        size = _hand_size([1, 3, 4 - zeroed, 1], modes)
        predicted.append(2.0 * (size - s0) / s_start > task_value - 1.0)
        task_loss = torch.tensor(task_value, dtype=torch.float64, requires_grad=True)
        objective = driver.objective(task_loss, zeroed + 1)
        (grad,) = torch.autograd.grad(objective, task_loss)
        observed.append(bool(driver.last_size_active))
        # size branch weighs the loss by rho * w1, the loss branch by (1 + rho) * w1
        assert float(grad) == pytest.approx(0.25 if observed[-1] else 1.25)
    assert observed == predicted == [True, True, False, False, False]


def test_periodic_pruning_shrinks_and_stops_at_zero_gates():
    layer = _ttm()
    settings = rank.RankSettings(prune_every=2)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    with torch.no_grad():
        layer.gates[0][0] = 0.0
    driver.after_step(0)
    assert layer.ranks == [1, 3, 4, 1]
    info = driver.after_step(1)
    assert layer.ranks == [1, 2, 4, 1] and info["params_tt"] == rank.tt_parameter_count(layer)
    assert info["rank_mean"] == 3.0 and info["stage"] == 0.0
    internal = [r for bonds in rank.ranks(layer).values() for r in bonds[1:-1]]
    assert info["rank_mean"] == sum(internal) / len(internal)


def test_bad_target_ratio_is_named():
    with pytest.raises(ValueError, match="target_ratio"):
        rank.TwoStageRankAdaptation(_ttm(), rank.RankSettings(target_ratio=1.5))


def test_ramped_target_falls_linearly_and_floors_pruning():
    """target_ramp_steps: S0 moves from the size at the switch to target_ratio x that size in n steps;
    pruning never goes below the current S0."""
    layer = _ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.2, prune_every=1, target_ramp_steps=4)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    driver.objective(torch.tensor(1.0, dtype=torch.float64), 0)
    driver.after_step(0)
    assert driver.switch == {"step": 1, "size": 295.0, "size_target": 59.0, "loss_target": 1.0}
    assert float(driver.target.size_target) == 295.0
    targets = []
    for step in range(1, 7):
        with torch.no_grad():
            for gate in layer.gates:
                gate.fill_(0.0)  # every rank inactive: only the floor stops pruning
        driver.after_step(step)
        targets.append(float(driver.target.size_target))
        assert rank.tt_parameter_count(layer) >= targets[-1]
    assert targets == pytest.approx([295 - 236 * k / 4 for k in (1, 2, 3, 4)] + [59.0, 59.0])


@pytest.mark.parametrize("reference", ["best", "switch"])
def test_late_reference_loss_follows_the_best_running_loss_or_stays_at_the_switch(reference):
    """``loss_reference="best"``: L0 is the lowest running loss so far, also after the switch, and the branch
    test compares the running loss with it; ``"switch"``: L0 is the running loss at the switch, fixed, and
    the test compares each step's loss."""
    layer = _ttm()
    settings = rank.RankSettings(late_start_step=2, target_ratio=0.5, prune_every=0, loss_average=0.5,
                                 loss_reference=reference, size_weight=1e-3)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    for step, value in enumerate([2.0, 1.0]):  # running loss 2.0, then 1.5
        driver.objective(torch.tensor(value, dtype=torch.float64), step)
        driver.after_step(step)
    assert driver.stage == 1 and driver.switch["loss_target"] == 1.5
    l0, branch = [], []
    for step, value in enumerate([0.5, 3.0, 3.0, 0.9], start=2):  # running 1.0, 2.0, 2.5, 1.7
        driver.objective(torch.tensor(value, dtype=torch.float64), step)
        driver.after_step(step)
        l0.append(float(driver.target.loss_target))
        branch.append(bool(driver.last_size_active))
    if reference == "best":
        # the size gap (~1e-3) loses against any running loss above the best (2.0 - 1.0, 2.5 - 1.0, 1.7 - 1.0)
        assert l0 == [1.0, 1.0, 1.0, 1.0] and branch == [True, False, False, False]
    else:
        # each step's loss against L0 = 1.5: 0.5 and 0.9 below it (size branch), 3.0 above (loss branch)
        assert l0 == [1.5] * 4 and branch == [True, False, False, True]


def test_unknown_loss_reference_is_named():
    with pytest.raises(ValueError, match="loss_reference='last'"):
        rank.TwoStageRankAdaptation(_ttm(), rank.RankSettings(loss_reference="last"))


def test_a_late_stage_loss_well_above_the_switch_warns_once():
    layer = _ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.5, prune_every=1, loss_average=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    driver.objective(torch.tensor(0.4, dtype=torch.float64), 0)
    driver.after_step(0)
    for step, value in enumerate([0.6, 0.64], start=1):  # at most 1.5 x 0.4 + 0.05 = 0.65: quiet
        driver.objective(torch.tensor(value, dtype=torch.float64), step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            driver.after_step(step)
    driver.objective(torch.tensor(0.9, dtype=torch.float64), 3)
    with pytest.warns(RuntimeWarning, match=r"step 4: the running task loss 0.9 is well above its 0.4 at the "
                                            r"switch \(step 1\)"):
        driver.after_step(3)
    driver.objective(torch.tensor(2.0, dtype=torch.float64), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        driver.after_step(4)  # once
