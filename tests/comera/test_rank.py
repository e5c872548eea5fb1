"""The two stages: each objective, the stage switch, the late stage's branch test, pruning floors, what the
driver says when it does not reach its target."""
import math
import re
import warnings

import pytest
import torch

from comera import rank, size
from comera.prune import prune
from comera.running_loss import RunningLoss
from tests.comera.test_size import ttm

F64 = torch.float64


def loss(value, grad=False):
    return torch.tensor(value, dtype=F64, requires_grad=grad)


def test_early_objective_adds_the_relative_soft_size_and_the_core_norms():
    layer = ttm()
    task = loss(0.7)
    stored = size.tt_parameter_count(layer)
    objective = rank.early_objective(task, layer, l1_weight=0.01, l2_weight=0.001)
    expected = task + 0.01 * size.soft_size(layer) / stored + 0.001 * size.core_l2(layer)
    torch.testing.assert_close(objective, expected)
    assert rank.early_objective(task, layer, l1_weight=0.0) is task


def _late(layer, **kwargs):
    target = rank.LateTarget(loss_target=1.0, size_target=torch.tensor(100.0, dtype=F64), size_scale=295.0,
                             size_span=195.0, size_weight=10.0, tolerance=0.05, loss_fall=1.0)
    for key, value in kwargs.items():
        setattr(target, key, value)
    return target


@pytest.mark.parametrize("loss_value,stored,size_branch", [
    (1.0, 295.0, True),     # no loss gap, the whole size gap: shrink
    (1.06, 295.0, False),   # loss gap 0.06 / 0.05 = 1.2 > size gap 1: repair
    (1.04, 295.0, True),    # 0.8 < 1
    (1.04, 217.0, False),   # size gap (217 - 100) / 195 = 0.6 < 0.8
    (1.0, 100.0, False),    # at the target: nothing to shrink
])
def test_late_branch_compares_the_size_gap_with_the_loss_gap_over_its_tolerance(loss_value, stored,
                                                                                size_branch):
    layer = ttm()
    task = loss(loss_value, grad=True)
    objective, active = rank.late_objective(task, layer, _late(layer), size=stored)
    assert bool(active) is size_branch
    (grad,) = torch.autograd.grad(objective, task)
    assert float(grad) == 1.0  # the task loss keeps weight 1 in both branches
    surrogate = 10.0 * size.soft_size(layer).detach() / 295.0
    assert float(objective.detach()) == pytest.approx(loss_value + (float(surrogate) if size_branch else 0.0))


def test_the_noise_of_the_branch_loss_widens_the_tolerance():
    layer = ttm()
    task = loss(1.2)
    _, active = rank.late_objective(task, layer, _late(layer), size=295.0)
    assert not bool(active)                        # 0.2 / 0.05 = 4 > 1
    _, active = rank.late_objective(task, layer, _late(layer), size=295.0, noise=0.1)
    assert bool(active)                            # 0.2 / (0.05 + 0.2) = 0.8 < 1


def test_the_size_branch_pushes_the_small_gates_of_a_bond_down_and_none_of_its_scale():
    layer = ttm()
    with torch.no_grad():
        layer.gates[1].copy_(torch.tensor([1.0, 0.8, 0.3, 0.1], dtype=F64))
    objective, active = rank.late_objective(loss(0.5), layer, _late(layer, loss_target=0.5), size=295.0)
    assert bool(active)
    (grad,) = torch.autograd.grad(objective, [layer.gates[1]])
    assert grad[2] > 0 and grad[3] > 0 and grad[0] < 0
    assert float(grad @ layer.gates[1].detach()) == pytest.approx(0.0, abs=1e-12)


def _drive(driver, values, start=0):
    infos = []
    for step, value in enumerate(values, start=start):
        driver.objective(loss(value), step)
        infos.append(driver.after_step(step))
    return infos


def test_switch_at_a_step_fixes_the_reference_point():
    layer = ttm()
    settings = rank.RankSettings(late_start_step=3, target_ratio=0.5, prune_every=0, loss_average=0.0,
                                 switch_when="step")
    driver = rank.TwoStageRankAdaptation(layer, settings)
    infos = _drive(driver, [2.0, 1.5, 1.25])
    assert [i["stage"] for i in infos] == [0.0, 0.0, 1.0] and driver.stage == 1
    assert float(driver.target.loss_target) == 1.25  # loss_average 0: the last loss is the best
    assert float(driver.target.size_target) == pytest.approx(0.5 * 295) and driver.target.size_scale == 295
    assert driver.switch["step"] == 3 and driver.switch["size"] == 295.0


def test_the_converged_switch_waits_until_the_loss_stops_falling():
    """Checked every prune_every steps, not before late_start_step: while the best running loss falls
    by more than 2% of its fall so far over the window, the early stage goes on."""
    layer = ttm()
    settings = rank.RankSettings(late_start_step=20, target_ratio=0.5, prune_every=10, loss_average=0.0,
                                 converged_window=20, threshold=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    falling = [2.0 - 0.01 * step for step in range(60)]      # still learning at step 20, 40 and 60
    infos = _drive(driver, falling)
    assert driver.stage == 0 and all(i["stage"] == 0 for i in infos)
    assert "still improving" in driver.shortfall()
    flat = [falling[-1]] * 40                                  # falls no more
    infos = _drive(driver, flat, start=60)
    switched = [60 + k + 1 for k, i in enumerate(infos) if i["stage"] == 1.0]
    assert switched[0] == 80  # the first check whose window (60 -> 80) saw no fall
    assert driver.switch["loss_target"] == pytest.approx(falling[-1])


def test_a_late_stage_reaches_its_target_size_or_says_why_not():
    layer = ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.5, prune_every=1, switch_when="step",
                                 target_ramp=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    _drive(driver, [1.0])
    assert driver.stage == 1
    with torch.no_grad():
        layer.gates[1][0] = 0.0      # one rank goes: not enough for half the size
    driver.objective(loss(1.0), 1)
    driver.after_step(1)
    message = driver.shortfall()
    assert message.startswith("stopped at 0.") and "target 0.5" in message and driver.reached() is False
    with torch.no_grad():
        for gate in layer.gates:
            gate.zero_()             # every rank inactive: the size floor stops pruning at the target
    driver.objective(loss(1.0), 2)
    driver.after_step(2)
    assert size.tt_parameter_count(layer) >= 0.5 * 295 and driver.shortfall() is None
    assert driver.reached() is True


def test_reached_is_the_one_rule_and_goes_into_the_outcome():
    """``reached``: None without a target, False with no late stage or a size still above the target by
    more than 5% and one rank's saving (nothing pruned), True within; the last step writes it into the
    outcome beside the shortfall (each CoMERA row's target_reached)."""
    layer = ttm()
    assert rank.TwoStageRankAdaptation(layer, rank.RankSettings()).reached() is None
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.5, prune_every=1, switch_when="step",
                                 target_ramp=0.0, total_steps=3, threshold=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    assert driver.reached() is False and "no late stage" in driver.shortfall()
    _drive(driver, [1.0, 1.0, 1.0])    # threshold 0: nothing is pruned
    assert driver.outcome["reached"] is False and driver.outcome["shortfall"].startswith("stopped at 1.000")
    target = driver.switch["size_target"]
    saving = rank.smallest_saving(layer, settings.min_rank)
    assert size.tt_parameter_count(layer) - target > max(saving, rank.REACHED_WITHIN * target)


def test_ramped_target_falls_linearly_and_floors_pruning():
    layer = ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.2, prune_every=1, target_ramp=0.5,
                                 total_steps=9, switch_when="step", recover_fraction=0.0)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    _drive(driver, [1.0])
    assert driver.switch == {"step": 1, "size": 295.0, "size_target": 59.0, "loss_target": 1.0,
                             "ramp_steps": 4, "recover_step": None}
    assert float(driver.target.size_target) == 295.0
    targets = []
    for step in range(1, 7):
        with torch.no_grad():
            for gate in layer.gates:
                gate[1:] = 0.0     # all but one rank per bond inactive: only the floor stops pruning
        driver.after_step(step)
        targets.append(float(driver.target.size_target))
        assert size.tt_parameter_count(layer) >= targets[-1]
    assert targets == pytest.approx([295 - 236 * k / 4 for k in (1, 2, 3, 4)] + [59.0, 59.0])


@pytest.mark.parametrize("reach", [False, True])
def test_reach_target_prunes_the_smallest_shares_down_to_a_ceiling_falling_to_the_target(reach):
    """With ``reach_target`` each late pruning step removes ranks, smallest share first, down to a ceiling
    that falls linearly from the switch's size to the target at the last pruning step before the recovery
    (none would take the size below it), whatever their shares; then nothing is pruned. Without it, shares
    above ``threshold`` stay (here every one: threshold 0)."""
    layer = ttm()
    settings = rank.RankSettings(late_start_step=1, target_ratio=0.3, prune_every=1, switch_when="step",
                                 total_steps=11, recover_fraction=0.2, threshold=0.0, reach_target=reach)
    driver = rank.TwoStageRankAdaptation(layer, settings)
    _drive(driver, [1.0])
    assert driver.switch["recover_step"] == 9    # 2 of the 10 late steps recover
    sizes = []
    for step in range(1, 11):
        driver.objective(loss(1.0), step)
        driver.after_step(step)
        sizes.append(size.tt_parameter_count(layer))
        ceiling = 295 - (295 - 0.3 * 295) * min(1, step / 8)
        if reach and step <= 8:
            assert ceiling <= sizes[-1] < ceiling + rank.smallest_saving(layer, settings.min_rank)
    if reach:
        assert sizes[-1] == sizes[7] < 295 and driver.reached() is True  # recovery: no pruning
    else:
        assert sizes == [295] * 10 and driver.reached() is False
        assert driver.shortfall().startswith("stopped at 1.000")


def test_late_reference_loss_is_the_best_slow_running_loss():
    layer = ttm()
    settings = rank.RankSettings(late_start_step=2, target_ratio=0.5, prune_every=0, loss_average=0.5,
                                 switch_when="step")
    driver = rank.TwoStageRankAdaptation(layer, settings)
    _drive(driver, [2.0, 1.0])                  # slow running loss 2.0, then 1.5
    assert driver.stage == 1 and driver.switch["loss_target"] == 1.5
    references = []
    for step, value in enumerate([0.5, 3.0, 3.0, 0.9], start=2):  # slow: 1.0, 2.0, 2.5, 1.7
        driver.objective(loss(value), step)
        driver.after_step(step)
        references.append(float(driver.target.loss_target))
    assert references == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("values,slow", [
    ([1.0, math.inf, math.nan, 0.5], 0.98 * 1.0 + 0.02 * 0.5),  # the bad steps leave it alone
    ([math.nan, 1.0, 0.5], 0.98 * 1.0 + 0.02 * 0.5),            # a first bad loss gives way to a number
])
def test_a_non_finite_task_loss_leaves_the_running_loss_alone(values, slow):
    running = RunningLoss(0.98, 0.9)
    for value in values:
        running.update(loss(value))
    assert float(running.slow) == pytest.approx(slow) and math.isfinite(float(running.best))
    assert math.isfinite(float(running.fast)) and math.isfinite(float(running.variance))


def test_the_fast_running_loss_noise_follows_the_loss_variance():
    running = RunningLoss(0.98, 0.9)
    torch.manual_seed(0)
    for value in 1.0 + 0.1 * torch.randn(4000, dtype=F64):
        running.update(value)
    # Var of an EMA of white noise with std 0.1: 0.01 (1 - b) / (1 + b)
    assert float(running.fast_noise()) == pytest.approx(0.1 * math.sqrt(0.1 / 1.9), rel=0.15)


def test_a_removed_layer_is_warned_about_and_listed():
    layer = ttm()
    driver = rank.TwoStageRankAdaptation(layer, rank.RankSettings(prune_every=1, min_rank=0))
    with torch.no_grad():
        layer.gates[1].zero_()
    with pytest.warns(RuntimeWarning, match="removed layer ''"):
        _drive(driver, [1.0])
    assert driver.progress.removed == [""] and size.removed_layers(layer) == [""]


@pytest.mark.parametrize("field,value", [
    ("target_ratio", 1.5), ("switch_when", "later"), ("min_rank", -1), ("mask_gates", "always"),
    ("loss_tolerance", -0.1), ("target_ramp", 2.0), ("converged_window", 0),
    # types: an int field takes no float and no bool; a float field no bool and nothing non-finite
    ("min_rank", 1.5), ("min_rank", True), ("min_rank", rank.MAX_RANK + 1), ("min_rank", 10**6),
    ("prune_every", 2.0), ("converged_window", True), ("late_start_step", 3.5), ("late_start_step", -1),
    ("total_steps", 0), ("stop_at_target", 1), ("reach_target", 1), ("reach_target", True),
    ("threshold", float("nan")), ("threshold", -1), ("threshold", float("inf")), ("threshold", True),
    ("l1_weight", float("nan")), ("l1_weight", -0.01), ("l2_weight", float("inf")),
    ("size_weight", float("inf")), ("converged_gain", float("nan")), ("loss_average", float("nan")),
    ("target_ratio", float("nan")), ("loss_target", float("nan")), ("loss_target", float("-inf")),
])
def test_bad_settings_are_named(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        rank.TwoStageRankAdaptation(ttm(), rank.RankSettings(**{field: value}))


@pytest.mark.parametrize("field,value", [("min_rank", rank.MAX_RANK), ("min_rank", 0), ("threshold", 0),
                                         ("threshold", 1), ("loss_target", -2.5), ("late_start_step", 0)])
def test_settings_at_their_bounds_are_accepted(field, value):
    rank.RankSettings(**{field: value}).check()


@pytest.mark.parametrize("kwargs, message", [({"min_rank": 1.5}, "min_rank must be an integer >= 0, got 1.5"),
                                             ({"min_rank": True}, "min_rank must be an integer"),
                                             ({"threshold": float("nan")}, "threshold must be a finite")])
def test_prune_refuses_a_bad_min_rank_or_threshold(kwargs, message):
    kwargs = {"threshold": 1e-2, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        prune(ttm(), kwargs.pop("threshold"), **kwargs)


def test_a_late_stage_loss_well_above_the_switch_warns_once():
    """Above the switch's running loss by more than three tolerances (3 x 0.05 x its fall 1.6) + 0.05."""
    layer = ttm()
    settings = rank.RankSettings(late_start_step=2, target_ratio=0.5, prune_every=1, loss_average=0.0,
                                 switch_when="step")
    driver = rank.TwoStageRankAdaptation(layer, settings)
    _drive(driver, [2.0, 0.4])
    for step, value in enumerate([0.6, 0.68], start=2):  # at most 0.4 + 0.24 + 0.05 = 0.69: quiet
        driver.objective(loss(value), step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            driver.after_step(step)
    driver.objective(loss(0.9), 4)
    with pytest.warns(RuntimeWarning, match=r"step 5: the running task loss 0.9 is well above its 0.4 at the "
                                            r"switch \(step 2\)"):
        driver.after_step(4)
    driver.objective(loss(2.0), 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        driver.after_step(5)  # once


def test_the_switch_raises_the_gates_rate_to_their_travel_over_the_late_steps():
    """At the switch, each optimizer group of gates alone gets at least ``late_gate_travel`` / the late
    stage's steps as its rate; the other groups, and a group that mixes gates with cores, keep theirs."""
    import comera
    layer = ttm()
    optimizer = torch.optim.AdamW(comera.param_groups(layer, lr=1e-3))
    mixed = torch.optim.AdamW([*layer.cores, *layer.gates], lr=1e-3)
    settings = rank.RankSettings(late_start_step=6, target_ratio=0.5, prune_every=0, switch_when="step",
                                 total_steps=10, late_gate_travel=2.0)
    driver = rank.TwoStageRankAdaptation(layer, settings, [optimizer, mixed])
    _drive(driver, [1.0] * 5)
    assert {g["name"]: g["lr"] for g in optimizer.param_groups} == {"embedding_cores": 1e-3, "gates": 5e-3}
    _drive(driver, [1.0], start=5)
    assert driver.stage == 1
    assert {g["name"]: g["lr"] for g in optimizer.param_groups} == {"embedding_cores": 1e-3, "gates": 2.0 / 4}
    assert mixed.param_groups[0]["lr"] == 1e-3 and driver.switch["gate_lr"] == 0.5
    fast = rank.RankSettings(late_start_step=6, target_ratio=0.5, prune_every=0, switch_when="step",
                             total_steps=10, late_gate_travel=0.01)   # 0.01 / 4 < 5e-3: kept
    optimizer = torch.optim.AdamW(comera.param_groups(layer, lr=1e-3))
    driver = rank.TwoStageRankAdaptation(layer, fast, [optimizer])
    _drive(driver, [1.0] * 6)
    assert driver.stage == 1 and optimizer.param_groups[1]["lr"] == 5e-3
