"""Uncompressed AdamW baseline: learning rate, parameter coverage, sizes and analytic state bytes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from baselines.base import state_bytes
from baselines.dense import DenseMethod, uncompressed_size


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # 128+16+48+3 = 195 params


def fake_workload(lr=None, tt_spec=None):
    return SimpleNamespace(name="fake", lr={} if lr is None else {"dense": lr}, tt_spec=tt_spec or {})


def one_step(prepared, batch: int = 4) -> None:
    prepared.model(torch.randn(batch, 8)).pow(2).mean().backward()
    for opt in prepared.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_state_bytes_match_hand_count_for_adamw():
    prepared = DenseMethod().prepare(mlp(), fake_workload(1e-3), {}, target_ratio=None, total_steps=1)
    one_step(prepared)
    # float32: parameters + gradients + exp_avg + exp_avg_sq, plus AdamW's float32 step counter per tensor
    assert state_bytes(prepared.model, prepared.optimizers) == 4 * (195 + 195 + 2 * 195) + 4 * 4
    assert prepared.settings["trainable_params"] == 195


@pytest.mark.parametrize("params, expected_lr", [({}, 3e-3), ({"lr": 1e-4}, 1e-4)])
def test_lr_from_workload_unless_overridden(params, expected_lr):
    prepared = DenseMethod().prepare(mlp(), fake_workload(3e-3), {**params, "weight_decay": 0.1},
                                     target_ratio=None, total_steps=1)
    (group,) = prepared.optimizers[0].param_groups
    assert group["lr"] == expected_lr == prepared.settings["lr"]
    assert group["weight_decay"] == 0.1 == prepared.settings["weight_decay"]


def test_missing_lr_names_workload_and_key():
    with pytest.raises(ValueError, match=r"'lr' is null and workload 'fake' gives no lr\['dense'\]"):
        DenseMethod().prepare(mlp(), fake_workload(None), {}, target_ratio=None, total_steps=1)


def test_optimizer_holds_every_trainable_parameter_once_and_no_frozen_one():
    model = mlp()
    model[0].bias.requires_grad_(False)
    prepared = DenseMethod().prepare(model, fake_workload(1e-3), {}, target_ratio=None, total_steps=1)
    held = [id(p) for g in prepared.optimizers[0].param_groups for p in g["params"]]
    assert sorted(held) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    assert len(held) == 3


def test_size_counts_model_and_the_layers_comera_would_tensorize():
    model = mlp()
    size = uncompressed_size(model, fake_workload(1e-3, {"0": {"kind": "linear"}, "missing": {}}))
    assert size == {"params_total": 195.0, "params_factorized_layers": 128.0 + 16.0,
                    "compression_total": 1.0, "compression_layers": 1.0}


def test_training_step_lowers_the_loss():
    prepared = DenseMethod().prepare(mlp(), fake_workload(1e-2), {}, target_ratio=None, total_steps=1)
    x = torch.randn(32, 8)
    losses = []
    for _ in range(20):
        loss = prepared.model(x).pow(2).mean()
        losses.append(loss.item())
        loss.backward()
        prepared.optimizers[0].step()
        prepared.optimizers[0].zero_grad(set_to_none=True)
    assert losses[-1] < 0.5 * losses[0]


def tiny_transformer():
    from harness.workloads import build_workload

    return build_workload("transformer", {"size": "tiny", "train_samples": 16, "eval_samples": 16},
                          batch_size=4, seed=0, device="cpu")


@pytest.mark.parametrize("target", [0.5, 0.2])
def test_size_matched_model_is_narrower_with_comeras_parameter_count_at_the_target(target):
    """The count matched is CoMERA's after its late stage reaches ``target`` of a TT size that the early
    stage left as it was: every parameter of the tensorized model but the cores and gates, plus ``target`` x
    those."""
    import copy

    from baselines.comera import CoMERAMethod
    from comera import tt_parameter_count

    workload = tiny_transformer()
    full = sum(p.numel() for p in workload.model.parameters())
    tt = CoMERAMethod().prepare(copy.deepcopy(workload.model), workload, {}, target_ratio=target,
                                total_steps=4)
    expected = tt.size()["params_total"] - (1 - target) * tt_parameter_count(tt.model)
    state = torch.get_rng_state()
    prepared = DenseMethod().prepare(workload.model, workload, {"match_target": target}, target_ratio=None,
                                     total_steps=4)
    assert torch.equal(torch.get_rng_state(), state)  # counting CoMERA's size draws nothing from the RNG
    matched = prepared.settings["size_matched"]
    count = sum(p.numel() for p in prepared.model.parameters())
    assert matched["comera_params"] == round(expected) and matched["params"] == count < full
    assert matched["full_params"] == full and matched["target"] == target == prepared.settings["match_target"]
    assert matched["d_model"] < 32 and matched["d_ff"] == 2 * matched["d_model"]  # the tiny preset's 32 / 64
    assert prepared.model.encoder.embeddings.word.weight.shape == (256, matched["d_model"])
    size = prepared.size()
    assert size["params_total"] == count and size["compression_total"] == pytest.approx(full / count)
    assert size["compression_layers"] > 1
    held = {id(p) for g in prepared.optimizers[0].param_groups for p in g["params"]}
    assert held == {id(p) for p in prepared.model.parameters()}
    widths = (matched["d_model"] - 2, matched["d_model"] + 2)
    narrower = [abs(transformer_count(workload, d) - expected) for d in widths]
    assert abs(count - expected) <= min(narrower)  # the nearest width of the rule (steps of 2 heads)


def transformer_count(workload, d_model):
    from harness.workloads import check_params, transformer

    params = check_params("transformer", {"size": "tiny", "d_model": d_model, "d_ff": 2 * d_model})
    return transformer.parameter_count(params)


def test_size_matched_needs_a_workload_that_builds_smaller_models_and_a_target_of_at_most_1():
    workload = SimpleNamespace(**vars(fake_workload(1e-3)), sized_model=None)
    with pytest.raises(ValueError, match="'match_target' needs a workload that builds smaller models.*'fake"):
        DenseMethod().prepare(mlp(), workload, {"match_target": 0.5}, target_ratio=None, total_steps=1)
    with pytest.raises(ValueError, match=r"'match_target' must be in \(0, 1\], got 1.5"):
        DenseMethod().prepare(mlp(), workload, {"match_target": 1.5}, target_ratio=None, total_steps=1)
    prepared = DenseMethod().prepare(mlp(), workload, {}, target_ratio=None, total_steps=1)
    assert prepared.settings["size_matched"] is None and prepared.size()["compression_total"] == 1.0
