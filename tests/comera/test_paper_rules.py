"""The paper's rules (``rules="paper"``): the official code's ``rank_loss`` (``gate_penalty``), its
``compute_size`` (``gate_size``), its late-stage objective, pruning by the gates' threshold and the fixed
2/3 stage split, each checked against a float64 reference written from the formula; with
``$COMERA_BENCH_OFFICIAL_DIR`` naming a checkout of ziyangjoy/CoMERA, against its own two functions too."""
import ast
import os
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import comera
from comera.rank import PAPER_DEFAULTS, gate_penalty, paper_late_objective
from comera.size import gate_size, tensorized_modules
from comera.tt import parameter_entries

TOL = 1e-2


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 8), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the TT layers are larger than the dense ones
        comera.tensorize(model, {"0": {"rank": 3}, "1": {"rank": 4}, "3": {"rank": 4}})
    return model


def _gates(model):
    return [g for _, module in tensorized_modules(model) for g in parameter_entries(module.gates)]


def _set_gates(model, values):
    """Gate entries drawn from ``values`` in turn (above, at and below the threshold, negative)."""
    with torch.no_grad():
        i = 0
        for gate in _gates(model):
            for k in range(gate.numel()):
                gate[k] = values[i % len(values)]
                i += 1


def _reference_penalty(model):
    """``sum_{x > tol} x / #{x > tol}`` and its gradient, entry by entry in Python floats."""
    entries = [float(x) for g in _gates(model) for x in g.detach().reshape(-1)]
    above = [x for x in entries if x > TOL]
    value = sum(above) / len(above) if above else 0.0
    grads = [[1 / len(above) if float(x) > TOL else 0.0 for x in g.detach().reshape(-1)]
             for g in _gates(model)]
    return value, grads


@pytest.mark.parametrize("values", [[1.0], [0.7, -0.3, 0.01, 0.5, 0.002, 1.3, 0.0100001],
                                    [0.01, -2.0, 0.0, 0.005]],  # the last: no entry above the threshold
                         ids=["ones", "mixed", "none-above"])
def test_gate_penalty_is_the_official_rank_loss(values):
    model = _model()
    _set_gates(model, values)
    expected, expected_grads = _reference_penalty(model)
    penalty = gate_penalty(model, TOL)
    penalty.backward()
    assert penalty.dtype == torch.float64 and penalty.dim() == 0
    assert float(penalty.detach()) == pytest.approx(expected, rel=1e-12, abs=0)
    for gate, grad in zip(_gates(model), expected_grads):
        assert gate.grad.tolist() == pytest.approx(grad, rel=1e-12, abs=0)
    if values == [0.01, -2.0, 0.0, 0.005]:  # defined as 0 with zero gradients (the official: 0 / 0)
        assert float(penalty.detach()) == 0.0 and all(not g.grad.any() for g in _gates(model))


OFFICIAL = os.environ.get("COMERA_BENCH_OFFICIAL_DIR")


@pytest.mark.skipif(not OFFICIAL or not (Path(OFFICIAL) / "MNLI_trainer.py").is_file(),
                    reason="$COMERA_BENCH_OFFICIAL_DIR names no checkout of ziyangjoy/CoMERA")
def test_gate_penalty_and_gate_size_equal_the_official_functions():
    """The official ``rank_loss`` and ``compute_size``, read from the checkout's MNLI_trainer.py (not copied
    here) and called on holders of this model's gates and cores: the same penalty, gradients and size."""
    tree = ast.parse((Path(OFFICIAL) / "MNLI_trainer.py").read_text())
    official = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("rank_loss", "compute_size"):
            namespace = {"torch": torch}
            exec(compile(ast.Module([node], []), "MNLI_trainer.py", "exec"), namespace)
            official[node.name] = namespace[node.name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).double()
    comera.tensorize(model, "all-linear", rank=6)
    modules = [module for _, module in tensorized_modules(model)]
    _set_gates(model, [0.7, -0.3, 0.005, 1.3, 0.02, 0.01, 0.4])

    class Holder(nn.Module):  # the official layers' ``tensor`` attribute
        def __init__(self, module):
            super().__init__()
            self.tensor = types.SimpleNamespace(rank_parameters=list(module.gates),
                                                factors=list(module.cores))

    trainer = types.SimpleNamespace(args=types.SimpleNamespace(emb_tensorized=True, prune_rank=True),
                                    model=nn.ModuleList([Holder(module) for module in modules]))
    expected = official["rank_loss"](trainer)
    expected.backward()
    expected_grads = [g.grad.clone() for g in _gates(model)]
    model.zero_grad()
    penalty = gate_penalty(model)
    penalty.backward()
    assert float(penalty.detach()) == pytest.approx(float(expected.detach()), rel=1e-12)
    for gate, grad in zip(_gates(model), expected_grads):
        torch.testing.assert_close(gate.grad, grad, rtol=1e-12, atol=0)
    assert float(gate_size(model)) == float(official["compute_size"](trainer))


def test_gate_penalty_sum_and_its_bad_reduction_and_a_model_without_tt_layers():
    model = _model()
    _set_gates(model, [0.5, -1.0, 2.0])
    above = [float(x) for g in _gates(model) for x in g.detach() if float(x) > TOL]
    assert float(gate_penalty(model, TOL, reduction="sum")) == pytest.approx(sum(above), rel=1e-12)
    with pytest.raises(ValueError, match="reduction.*'none'"):
        gate_penalty(model, reduction="none")
    assert float(gate_penalty(nn.Linear(3, 3))) == 0.0


def test_gate_size_is_the_official_compute_size():
    """Cores' scalars counting per bond the gates above the threshold (signed), a module with an empty
    bond counting 0, gates not counted."""
    model = _model()
    fc = model[1]
    with torch.no_grad():
        fc.gates[0].copy_(torch.tensor([1.0, -0.5, 0.005, 0.3])[: fc.gates[0].numel()])
    counts = [int((g > TOL).sum()) for g in fc.gates]
    bonds = [1, *counts, 1]
    expected_fc = sum(bonds[k] * core.shape[1:-1].numel() * bonds[k + 1] for k, core in enumerate(fc.cores))
    others = sum(core.numel() for m in (model[0], model[3]) for core in m.cores)  # all gates at 1
    assert float(gate_size(model, TOL)) == expected_fc + others
    with torch.no_grad():
        model[3].gates[0].fill_(-1.0)  # a bond with no rank above: the module's weight is zero
    assert float(gate_size(model, TOL)) == expected_fc + sum(core.numel() for core in model[0].cores)


@pytest.mark.parametrize("loss,size,branch", [(0.9, 1000.0, True),    # (0.9-0.8)/0.9 = 0.11 < 0.5
                                              (1.6, 1000.0, False),   # 0.5 == 0.5: not below
                                              (2.0, 1000.0, False),   # 0.6 > 0.5
                                              (0.5, 400.0, True),     # -0.6 < -0.25: below S0, L below L0
                                              (0.7, 400.0, False)])   # -0.14 > -0.25
def test_the_paper_late_objective_takes_its_branch_and_value_from_the_formula(loss, size, branch):
    """``lambda = [(L - L0)/L < (S - S0)/S]``; ``0.1 L + 0.01 R + lambda R + (1 - lambda) L``, with
    L0 = 0.8, S0 = 500; value and the gates' gradient against the formula."""
    model = _model()
    _set_gates(model, [0.7, -0.3, 0.002, 1.3])
    task = torch.tensor(loss, dtype=torch.float64, requires_grad=True)
    objective, active = paper_late_objective(task, model, loss_target=0.8, size=size, size_target=500.0,
                                             penalty_weight=0.01, threshold=TOL)
    lam = 1.0 if (loss - 0.8) / loss < (size - 500.0) / size else 0.0
    assert bool(active) is branch and lam == float(branch)
    penalty, grads = _reference_penalty(model)
    assert float(objective) == pytest.approx(0.1 * loss + 0.01 * penalty + lam * penalty + (1 - lam) * loss,
                                             rel=1e-12)
    objective.backward()
    assert float(task.grad) == pytest.approx(0.1 + (1 - lam), rel=1e-12)
    for gate, grad in zip(_gates(model), grads):
        assert gate.grad.tolist() == pytest.approx([(0.01 + lam) * g for g in grad], rel=1e-12, abs=0)


def _adaptation(model, **settings):
    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=1e-2))
    return optimizer, comera.RankAdaptation(model, optimizer, rules="paper", **settings)


def test_the_paper_preset_fixes_its_rules_and_refuses_what_it_does_not_read():
    settings = _adaptation(_model(), target=0.5, total_steps=30)[1].settings
    assert (settings.rules, settings.l1_weight, settings.min_rank, settings.loss_target) == ("paper", 0.01, 0,
                                                                                           None)
    assert (settings.switch_when, settings.target_ramp, settings.mask_gates, settings.stop_at_target) == (
        "step", 0.0, "every_step", False)
    assert settings.late_start_step == 20  # 2/3 of 30: the official 20 + 10 epochs
    assert comera.adapt.defaults("paper") == {**{k: v for k, v in comera.adapt.defaults().items()
                                                 if k not in comera.rank.PAPER_UNREAD},
                                              **PAPER_DEFAULTS, "rules": "paper", "early_fraction": 2 / 3}
    with pytest.raises(TypeError, match=r"rules='paper' does not read \['size_weight'\]"):
        _adaptation(_model(), target=0.5, total_steps=30, size_weight=3.0)
    with pytest.raises(ValueError, match="rules='paper' fixes switch_when='step', got 'converged'"):
        _adaptation(_model(), target=0.5, total_steps=30, switch_when="converged")
    with pytest.raises(ValueError, match="rules must be one of"):
        comera.RankAdaptation(_model(), rules="papers")


def test_the_driver_runs_the_paper_objectives_and_prunes_by_the_gates():
    """Early: ``L + 0.01 R``; the switch at 2/3 of the steps, whatever the loss; S0 = target x gate_size
    at the switch; late: :func:`paper_late_objective` with L the step's loss; pruning removes a rank by its
    gate (a negative gate of large magnitude, kept by the project's share rule, goes)."""
    model = _model()
    optimizer, adapt = _adaptation(model, target=0.5, total_steps=12, prune_every=3, loss_target=0.8,
                                 late_gate_travel=0.0)  # the gates at their rate: the steps run out
    x, y = torch.randint(0, 64, (16,)), torch.randint(0, 4, (16,))

    def task():
        return nn.functional.cross_entropy(model[1:](model[0](x)), y)

    loss = task()
    expected = float(loss) + 0.01 * float(gate_penalty(model).detach())
    assert float(adapt.loss(loss)) == pytest.approx(expected, rel=1e-12)
    with torch.no_grad():
        model[1].gates[0][0] = -0.5
    shares = comera.rank_shares(model[1])[0]
    assert float(shares[0]) > TOL  # the project's rule would keep it
    rank = comera.ranks(model)["1"][1]
    for step in range(12):
        objective = adapt.loss(loss := task())
        if adapt.stage == "late":
            switch = adapt.driver.switch
            expected, _ = paper_late_objective(loss, model, loss_target=0.8, size=gate_size(model),
                                               size_target=switch["gate_size_target"])
            assert float(objective) == pytest.approx(float(expected), rel=1e-12)
        objective.backward()
        optimizer.step()
        optimizer.zero_grad()
        adapt.step()
        if step == 2:
            assert comera.ranks(model)["1"][1] == rank - 1  # the negative gate's rank went at the 1st pruning
    switch = adapt.driver.switch
    assert switch["step"] == 8 and switch["loss_target"] == 0.8
    assert switch["gate_size_target"] == pytest.approx(0.5 * switch["gate_size"])
    assert adapt.driver.progress.final_steps == 4
    assert adapt.shortfall.endswith("ended first; give it more steps")  # no project setting named


def test_the_paper_rules_shrink_a_small_tt_mlp_toward_s0():
    """End to end on a TT MLP (a few hundred steps): the late stage removes ranks and the counted size
    falls from its value at the switch toward S0 (only that it shrinks; no accuracy is asserted)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    comera.tensorize(model, ["2"], rank=8)
    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=3e-3))
    steps = 240
    adapt = comera.RankAdaptation(model, optimizer, target=0.3, total_steps=steps, rules="paper",
                                  loss_target=0.5)
    mapping = torch.randn(16, 4)
    initial = comera.ranks(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the last step's "target not reached", if so
        for _ in range(steps):
            x = torch.randn(32, 16)
            adapt.loss(nn.functional.cross_entropy(model(x), (x @ mapping).argmax(1))).backward()
            optimizer.step()
            optimizer.zero_grad()
            adapt.step()
    switch = adapt.driver.switch
    assert switch["step"] == 160
    assert comera.ranks(model) != initial
    assert float(gate_size(model)) < switch["gate_size"] and adapt.size < switch["size"]


def test_the_paper_rules_give_the_gates_one_official_late_epochs_travel():
    """The official late stage: 10 MNLI epochs of 392,702 // 32 = 12,271 steps at gate rate 1e-3; the
    default travel is one such epoch's, 12.271, so at the switch of a 30-step run (10 late steps) the
    gates' rate is 1.2271 and the other groups keep theirs."""
    assert PAPER_DEFAULTS["late_gate_travel"] == pytest.approx(1e-3 * 12_271)
    optimizer, adapt = _adaptation(_model(), target=0.5, total_steps=30)
    before = {g["name"]: g["lr"] for g in optimizer.param_groups}
    x, y = torch.randint(0, 64, (16,)), torch.randint(0, 4, (16,))
    for _ in range(20):
        adapt.loss(nn.functional.cross_entropy(adapt.model[1:](adapt.model[0](x)), y)).backward()
        optimizer.step()
        optimizer.zero_grad()
        adapt.step()
    assert adapt.stage == "late"
    after = {g["name"]: g["lr"] for g in optimizer.param_groups}
    assert after == {**before, "gates": pytest.approx(12.271 / 10)}


def test_the_paper_rules_take_l0_from_the_loss_at_the_switch_unless_given():
    """``loss_target`` None (the default): L0 is the slow running loss at the switch (the official 0.8 was
    its MNLI model's loss there), fixed for the late stage; a given ``loss_target`` is L0 as it is."""
    from comera.paper import OFFICIAL_LOSS_TARGET

    assert PAPER_DEFAULTS["loss_target"] is None and OFFICIAL_LOSS_TARGET == 0.8
    for given in (None, 0.8):
        model = _model()
        _, adapt = _adaptation(model, target=0.5, total_steps=6, late_gate_travel=0.0,
                               **({} if given is None else {"loss_target": given}))
        slow = []
        for value in (2.0, 1.0, 1.5, 0.5, 0.25, 3.0):
            adapt.loss(torch.tensor(value, dtype=torch.float64, requires_grad=True))
            slow.append(float(adapt.driver.running.slow))
            adapt.step()
        expected = slow[3] if given is None else given   # switch after the 4th step (2/3 of 6)
        assert adapt.driver.switch["step"] == 4
        assert adapt.driver.switch["loss_target"] == pytest.approx(expected)
        assert adapt.driver.target.loss_target == pytest.approx(expected)
