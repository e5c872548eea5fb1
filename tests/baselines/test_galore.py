"""GaLore baseline: which parameters are projected, layer-wise variant, 8-bit gating, state bytes."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from baselines.base import Periodic, state_bytes
from baselines.galore import BNB_CPU_LOGGER, GaLoreMethod, galore_weights, import_galore_torch

from .conftest import ToyNet

SMALL = {"rank": 4, "update_proj_gap": 3, "scale": 1.0}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # 128+16+48+3 = 195 params


def fake_workload(lr=1e-2):
    return SimpleNamespace(name="fake", lr={"dense": lr}, tt_spec={})


def prepare(model, **params):
    return GaLoreMethod().prepare(model, fake_workload(), {**SMALL, **params}, target_ratio=None,
                                  total_steps=10)


def step(prepared, x) -> None:
    prepared.model(x).pow(2).mean().backward()
    for opt in prepared.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_galore_manages_exactly_the_linear_weights():
    model = ToyNet()
    prepared = prepare(model)
    (plain, projected) = prepared.optimizers[0].param_groups
    linear_weights = [model.fc1.weight, model.fc2.weight]
    assert [id(p) for p in projected["params"]] == [id(p) for p in linear_weights]
    assert projected["rank"] == 4 and projected["update_proj_gap"] == 3 and projected["proj_type"] == "std"
    assert prepared.settings["galore_params"] == sum(p.numel() for p in linear_weights) > 0
    assert all(p.dim() == 2 for p in projected["params"])
    # embedding, norm and biases train in the plain group
    assert {id(p) for p in plain["params"]} == {id(model.emb.weight), id(model.norm.weight),
                                                id(model.norm.bias), id(model.fc1.bias), id(model.fc2.bias)}
    assert "rank" not in plain


def test_linear_tied_to_embedding_is_not_projected():
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "out": nn.Linear(4, 10), "fc": nn.Linear(4, 4)})
    model["out"].weight = model["emb"].weight
    assert [id(p) for p in galore_weights(model)] == [id(model["fc"].weight)]


def test_model_without_linear_is_an_error():
    with pytest.raises(ValueError, match="no trainable nn.Linear weight"):
        prepare(nn.Sequential(nn.Embedding(5, 3)))


def test_state_bytes_match_hand_count_with_projection_matrices():
    prepared = prepare(mlp())
    step(prepared, torch.randn(4, 8))
    # weight (16, 8): right projection (4, 8), moments of the (16, 4) low-rank grad;
    # weight (3, 16): left projection U[:, :4] = (3, 3), moments of the (3, 16) low-rank grad;
    # biases: full moments; the package's step counter is a Python int (no tensor)
    optimizer_floats = (4 * 8 + 2 * 16 * 4) + (3 * 3 + 2 * 3 * 16) + 2 * (16 + 3)
    assert state_bytes(prepared.model, prepared.optimizers) == 4 * (195 + 195 + optimizer_floats)


def test_layerwise_equals_one_optimizer_and_frees_gradients():
    x = [torch.randn(4, 8) for _ in range(7)]  # crosses two projection updates (gap 3)
    whole = prepare(mlp())
    layerwise = prepare(mlp(), layerwise=True)
    assert layerwise.optimizers == [] and layerwise.settings["layerwise"]
    for xi in x:
        step(whole, xi)
        step(layerwise, xi)
        assert all(p.grad is None for p in layerwise.model.parameters())
    for a, b, initial in zip(whole.model.parameters(), layerwise.model.parameters(), mlp().parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not torch.equal(a, initial)
    # analytic state: parameters + per-parameter optimizer state + the largest single gradient (fc1 weight)
    optimizer_floats = (4 * 8 + 2 * 16 * 4) + (3 * 3 + 2 * 3 * 16) + 2 * (16 + 3)
    assert layerwise.state_bytes() == 4 * (195 + 128 + optimizer_floats)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_eight_bit_is_skipped_without_cuda_not_faked():
    prepared = prepare(mlp(), eight_bit=True)
    assert prepared.skipped == "8-bit GaLore needs CUDA (bitsandbytes); not run on cpu"
    assert prepared.optimizers == []


@pytest.mark.cuda  # 8-bit GaLore (bitsandbytes)
def test_eight_bit_trains_on_cuda():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).cuda()
    prepared = prepare(model, eight_bit=True)
    assert prepared.skipped is None and type(prepared.optimizers[0]).__name__ == "AdamW8bit"
    x = torch.randn(32, 64, device="cuda")
    first = prepared.model(x).pow(2).mean().item()
    for _ in range(20):
        step(prepared, x)
    assert prepared.model(x).pow(2).mean().item() < 0.5 * first


def test_settings_record_the_projection_window_for_timing():
    prepared = prepare(mlp(), update_proj_gap=50)
    assert prepared.settings["update_proj_gap"] == prepared.settings["time_window_steps"] == 50
    assert prepared.settings["trainable_params"] == 195
    assert json.loads(json.dumps(prepared.settings)) == prepared.settings  # plain JSON values


def test_the_bitsandbytes_cpu_kernel_notice_is_silenced(caplog):
    """bitsandbytes' 'Failed to load CPU gemm_4bit_forward' (a 4-bit kernel GaLore never uses) is not shown;
    its errors still are."""
    import logging

    import_galore_torch()
    notices = logging.getLogger(BNB_CPU_LOGGER)
    notices.warning("Failed to load CPU gemm_4bit_forward from kernels-community")
    notices.error("a real failure")
    assert "gemm_4bit" not in caplog.text and "a real failure" in caplog.text


@pytest.mark.parametrize("layerwise", [False, True])
def test_force_recomputes_the_projection_at_the_next_step_only(monkeypatch, layerwise):
    """GaLore's SVD runs at its first step and every update_proj_gap steps; Prepared.force makes the next
    step run it too (one SVD per projected weight), and the schedule after it stays."""
    projector = import_galore_torch().galore_projector.GaLoreProjector
    calls = []
    real = projector.get_orthogonal_matrix
    monkeypatch.setattr(projector, "get_orthogonal_matrix",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    prepared = prepare(mlp(), update_proj_gap=50, layerwise=layerwise)
    assert prepared.periodic == {"galore projection": Periodic(50, 0, forceable=True)}
    x = torch.randn(32, 8)
    counts = []
    for i in range(4):
        if i == 2:
            prepared.force("galore projection")
        calls.clear()
        step_any(prepared, x)
        counts.append(len(calls))
    assert counts == [2, 0, 2, 0]  # two projected weights


def step_any(prepared, x) -> None:
    """One step of one optimizer or of layer-wise optimizers (they step in the gradient hooks)."""
    prepared.model(x).pow(2).mean().backward()
    for opt in prepared.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
