"""Fidelity options to the official code (ziyangjoy/CoMERA): the late-stage formulation and per-step gate
masking, each checked against a small re-implementation written from the official source."""
import copy

import pytest
import torch

from baselines.comera import check_params
from comera import rank
from comera.feedforward import feed_forward
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding

THRESHOLD = 1e-2


# ------------------------------------------------------------------ the official late stage, re-written

def official_rank_loss(model, tol=THRESHOLD):
    """``Transformer_MNLI_Trainer.rank_loss`` (MNLI_trainer.py): sum of the gates above ``tol`` over the
    number of gates above ``tol``, all rank parameters of all tensorized layers together."""
    total, count = 0.0, 0
    for _, module in rank.tensorized_modules(model):
        for gate in module.gates:
            above = gate > tol
            total = total + (gate * above).sum()
            count = count + int(above.sum())
    return total / count


def official_late_loss(model_loss, rank_loss, cur_size, target_loss, target_size):
    """One step of ``Transformer_MNLI_Trainer._run_epoch_late_stage`` (MNLI_trainer.py): fixed weights
    1e-1 on the loss and 1e-2 on the rank loss, plus the loss or the rank loss by the indicator
    ``(loss - L0) / loss < (size - S0) / size``. Returns ``(objective, indicator)``."""
    size_branch = bool((model_loss - target_loss) / model_loss < (cur_size - target_size) / cur_size)
    lam = 1.0 if size_branch else 0.0
    return 0.1 * model_loss + 0.01 * rank_loss + lam * rank_loss + (1 - lam) * model_loss, size_branch


def _model(seed):
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({
        "tt": TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=[1, 2, 4, 3, 4, 2, 1],
                       dtype=torch.float64),
        "ttm": TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=[1, 3, 4, 1],
                            dtype=torch.float64)})
    with torch.no_grad():
        for _, module in rank.tensorized_modules(model):
            for gate in module.gates:
                gate.uniform_(-0.3, 1.2)  # some gates negative or below the threshold
    return model


# (seed, task loss, L0, S0 / S): both branches, relative and absolute gaps of either sign
POINTS = [(0, 1.1, 0.8, 0.5), (1, 0.9, 0.8, 0.5), (2, 0.85, 0.8, 0.95), (3, 2.0, 0.8, 0.2),
          (4, 0.5, 0.8, 0.5), (5, 0.81, 0.8, 0.99), (6, 1.5, 0.8, 0.9), (7, 0.3, 0.8, 1.0),
          (8, 1.0, 0.6, 0.6), (9, 0.7, 0.6, 0.8), (10, 3.0, 1.0, 0.3), (11, 0.8, 0.8, 0.5)]


@pytest.mark.parametrize("seed, loss, loss_target, ratio", POINTS)
def test_official_late_formulation_matches_the_official_formulas(seed, loss, loss_target, ratio):
    model = _model(seed)
    size = float(rank.size_l0(model, THRESHOLD))
    target = rank.LateTarget(loss_target=loss_target, size_target=torch.tensor(ratio * size, dtype=torch.float64),
                             size_scale=size, formulation="official")
    ours_loss = torch.tensor(loss, dtype=torch.float64, requires_grad=True)
    ours, size_active = rank.late_objective(ours_loss, model, target, threshold=THRESHOLD, l2_weight=0.0)
    ours.backward()
    ours_grads = [g.grad.clone() for _, m in rank.tensorized_modules(model) for g in m.gates]
    model.zero_grad()

    their_loss = torch.tensor(loss, dtype=torch.float64, requires_grad=True)
    theirs, size_branch = official_late_loss(their_loss, official_rank_loss(model), size, loss_target,
                                             ratio * size)
    theirs.backward()
    their_grads = [g.grad for _, m in rank.tensorized_modules(model) for g in m.gates]

    assert bool(size_active) == size_branch
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=0)
    torch.testing.assert_close(ours_loss.grad, their_loss.grad, rtol=1e-14, atol=0)
    for mine, official in zip(ours_grads, their_grads):
        torch.testing.assert_close(mine, official, rtol=1e-14, atol=1e-18)


def test_project_and_official_branch_rules_disagree_somewhere():
    disagree = 0
    for seed, loss, loss_target, ratio in POINTS:
        model = _model(seed)
        size = float(rank.size_l0(model, THRESHOLD))
        branches = []
        for formulation in rank.LATE_FORMULATIONS:
            target = rank.LateTarget(loss_target=loss_target, size_scale=size, formulation=formulation,
                                     size_target=torch.tensor(ratio * size, dtype=torch.float64))
            _, active = rank.late_objective(torch.tensor(loss, dtype=torch.float64), model, target,
                                            threshold=THRESHOLD, l2_weight=0.0)
            branches.append(bool(active))
        disagree += branches[0] != branches[1]
    assert 0 < disagree < len(POINTS)


def _adaptation(model, **settings):
    base = dict(threshold=THRESHOLD, late_start_step=1, target_ratio=0.5, prune_every=0)
    return rank.TwoStageRankAdaptation(model, rank.RankSettings(**{**base, **settings}))


@pytest.mark.parametrize("given, expected", [(None, rank.OFFICIAL_LOSS_TARGET), (0.6, 0.6)])
def test_official_late_stage_uses_l0_08_unless_given(given, expected):
    model = _model(0)
    adaptation = _adaptation(model, late_formulation="official", loss_target=given)
    adaptation.objective(torch.tensor(2.5, dtype=torch.float64), 0)  # running loss 2.5, unused by "official"
    adaptation.after_step(0)
    assert adaptation.target.formulation == "official"
    assert adaptation.target.loss_target == expected
    project = _adaptation(_model(0))
    project.objective(torch.tensor(2.5, dtype=torch.float64), 0)
    project.after_step(0)
    assert project.target.loss_target == 2.5


def test_unknown_formulation_and_mask_mode_are_named():
    with pytest.raises(ValueError, match="late_formulation"):
        _adaptation(_model(0), late_formulation="paper")
    with pytest.raises(ValueError, match="mask_gates"):
        _adaptation(_model(0), mask_gates="always")


def test_method_params_reach_the_settings_and_official_rejects_custom_weights():
    params = check_params({"late_formulation": "official", "mask_gates": "every_step"})
    assert (params["late_formulation"], params["mask_gates"]) == ("official", "every_step")
    assert check_params(None)["late_formulation"] == "project"
    assert check_params(None)["mask_gates"] == "at_prune"
    with pytest.raises(ValueError, match="size_weight"):
        check_params({"late_formulation": "official", "size_weight": 5.0})
    with pytest.raises(ValueError, match="mask_gates"):
        check_params({"mask_gates": "sometimes"})


# ------------------------------------------------------------------ per-step gate masking

def _masked_layer(make, seed):
    """A float64 layer with one gate entry per bond negative or at / below the threshold."""
    torch.manual_seed(seed)
    layer = make()
    with torch.no_grad():
        for k, gate in enumerate(layer.gates):
            gate.uniform_(0.5, 1.5)
            gate[k % gate.numel()] = (-0.2, THRESHOLD, 0.004)[k % 3]
    return layer


def _reference(layer):
    """A copy of ``layer`` without masking whose masked gate entries are set to zero by hand."""
    ref = copy.deepcopy(layer)
    ref.gate_threshold = None
    with torch.no_grad():
        for gate in ref.gates:
            gate[gate <= THRESHOLD] = 0.0
    return ref


MAKERS = {
    "tt": (lambda: TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=[1, 2, 4, 3, 4, 2, 1],
                            dtype=torch.float64),
           lambda: torch.randn(3, 24, dtype=torch.float64)),
    "ttm": (lambda: TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=[1, 3, 4, 1],
                                 dtype=torch.float64),
            lambda: torch.tensor([[0, 3, 3, 49], [7, 12, 7, 1]])),
}


@pytest.mark.parametrize("kind", MAKERS)
def test_every_step_masking_zeroes_gates_at_or_below_the_threshold(kind):
    make, inputs = MAKERS[kind]
    layer = _masked_layer(make, 0)
    _adaptation(layer, mask_gates="every_step")
    assert layer.gate_threshold == THRESHOLD
    ref = _reference(layer)
    x = inputs()
    y, y_ref = layer(x), ref(x)
    dense = layer.dense_weight()
    torch.testing.assert_close(dense, ref.dense_weight(), rtol=1e-13, atol=1e-15)
    if kind == "tt":
        torch.testing.assert_close(y, x @ dense + layer.bias, rtol=1e-12, atol=1e-14)
    else:
        torch.testing.assert_close(y, dense[x], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-14)

    # a masked rank contributes exactly zero: changing its core slices leaves the output as it was
    with torch.no_grad():
        for k, gate in enumerate(layer.gates):
            for i in (gate <= THRESHOLD).nonzero().flatten():
                layer.cores[k][..., i] += 7.0
    assert torch.equal(layer(x), y)
    with torch.no_grad():
        for k, gate in enumerate(layer.gates):
            for i in (gate <= THRESHOLD).nonzero().flatten():
                layer.cores[k][..., i] -= 7.0

    # gradients: as the hand-masked layer's, and none on the masked gate entries
    weights = torch.randn_like(y)
    (layer(x) * weights).sum().backward()
    (ref(x) * weights).sum().backward()
    for core, core_ref in zip(layer.cores, ref.cores):
        torch.testing.assert_close(core.grad, core_ref.grad, rtol=1e-12, atol=1e-14)
    for gate, gate_ref in zip(layer.gates, ref.gates):
        active = gate.detach() > THRESHOLD
        assert torch.all(gate.grad[~active] == 0)
        torch.testing.assert_close(gate.grad[active], gate_ref.grad[active], rtol=1e-12, atol=1e-14)


def test_every_step_masking_in_the_fused_feed_forward():
    first = _masked_layer(lambda: TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=4,
                                           dtype=torch.float64), 1)
    second = _masked_layer(lambda: TTLinear(20, 24, in_shape=[5, 2, 2], out_shape=[2, 3, 4], rank=4,
                                            dtype=torch.float64), 2)
    model = torch.nn.ModuleList([first, second])
    _adaptation(model, mask_gates="every_step")
    refs = [_reference(first), _reference(second)]
    x = torch.randn(5, 24, dtype=torch.float64)
    y = feed_forward(first, torch.tanh, second, x)
    y_ref = refs[1](torch.tanh(refs[0](x)))
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-14)
    y.sum().backward()
    y_ref.sum().backward()
    for layer, ref in zip((first, second), refs):
        for core, core_ref in zip(layer.cores, ref.cores):
            torch.testing.assert_close(core.grad, core_ref.grad, rtol=1e-12, atol=1e-14)
        for gate in layer.gates:
            assert torch.all(gate.grad[gate.detach() <= THRESHOLD] == 0)


def test_at_prune_keeps_raw_gates_between_prunings():
    layer = _masked_layer(MAKERS["tt"][0], 0)
    _adaptation(layer, mask_gates="at_prune")
    assert layer.gate_threshold is None
    x = MAKERS["tt"][1]()
    assert not torch.allclose(layer(x), _reference(layer)(x))
