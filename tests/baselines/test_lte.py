"""LTE baseline: heads on their own batch slices, merges, eval-mode weight, presets, state bytes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from baselines.base import state_bytes
from baselines.lte import PRESETS, LTELinear, LTEMethod, check_params, convert_linears


def fake_workload(lr=1e-2):
    return SimpleNamespace(name="fake", lr={"dense": lr}, tt_spec={"0": {"kind": "linear"}})


def prepare(model, **params):
    return LTEMethod().prepare(model, fake_workload(), params, target_ratio=None, total_steps=10)


def linear64(in_features=6, out_features=5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(in_features, out_features)).double()


def step(prepared, x, target) -> float:
    loss = (prepared.model(x) - target).pow(2).mean()
    loss.backward()
    for opt in prepared.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    prepared.after_step(0)
    return loss.item()


@pytest.mark.parametrize("merge_every", [1, 3])
def test_one_head_is_a_lora_step_folded_into_the_weight(merge_every):
    prepared = prepare(linear64(), heads=1, rank=2, alpha=4.0, merge_every=merge_every, lr=0.05,
                       lr_other=0.02)
    layer = prepared.model[0]
    scale = 2.0
    w0 = layer.weight.detach().clone()
    a = layer.lora_A[0].detach().clone().requires_grad_()
    b = torch.zeros(5, 2, dtype=torch.float64, requires_grad=True)
    bias = layer.bias.detach().clone().requires_grad_()
    reference = torch.optim.AdamW([{"params": [a, b], "lr": 0.05}, {"params": [bias], "lr": 0.02}],
                                  weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(8, 6, generator=gen, dtype=torch.float64)
        target = torch.randn(8, 5, generator=gen, dtype=torch.float64)
        ref_loss = (x @ w0.T + bias + scale * x @ a.T @ b.T - target).pow(2).mean()
        ref_loss.backward()
        reference.step()
        reference.zero_grad()
        assert step(prepared, x, target) == pytest.approx(ref_loss.item(), rel=1e-12)
    prepared.before_eval()
    torch.testing.assert_close(layer.weight, w0 + scale * b.detach() @ a.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.bias, bias.detach(), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(layer.weight, w0)


def test_each_head_trains_on_its_own_contiguous_batch_chunk():
    model = linear64()
    prepared = prepare(model, heads=2, rank=3, alpha=3.0)
    layer = prepared.model[0]
    with torch.no_grad():
        layer.lora_B.normal_()  # nonzero so A gets a gradient
    x = torch.randn(4, 7, 6, dtype=torch.float64)  # (batch, seq, features): heads split the batch
    weights = torch.randn(4, 7, 5, dtype=torch.float64)
    (prepared.model(x) * weights).sum().backward()
    for h in range(2):
        a = layer.lora_A[h].detach().clone().requires_grad_()
        b = layer.lora_B[h].detach().clone().requires_grad_()
        chunk = x[2 * h:2 * h + 2]
        out = chunk @ layer.weight.T + layer.bias + (chunk @ a.T @ b.T - chunk @ layer.snapshot_A[h].T
                                                       @ layer.snapshot_B[h].T)
        (out * weights[2 * h:2 * h + 2]).sum().backward()
        torch.testing.assert_close(layer.lora_A.grad[h], a.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.lora_B.grad[h], b.grad, rtol=1e-12, atol=1e-12)


def test_merge_adds_the_mean_head_update_and_restarts_heads_from_merged_weight():
    prepared = prepare(linear64(), heads=3, rank=2, alpha=2.0, merge_every=2)
    layer = prepared.model[0]
    with torch.no_grad():
        layer.lora_A.normal_()
        layer.lora_B.normal_()
    w0 = layer.weight.detach().clone()
    delta = torch.einsum("hor,hri->oi", layer.lora_B, layer.lora_A) - torch.einsum(
        "hor,hri->oi", layer.snapshot_B, layer.snapshot_A)
    assert prepared.after_step(0) == {}  # first of two steps: no merge
    assert torch.equal(layer.weight, w0)
    assert prepared.after_step(1) == {"lte_merges": 1.0}
    torch.testing.assert_close(layer.weight, w0 + 1.0 * delta / 3, rtol=1e-12, atol=1e-12)
    x = torch.randn(6, 6, dtype=torch.float64)
    train_out = prepared.model.train()(x)
    torch.testing.assert_close(train_out, prepared.model.eval()(x))  # zero update right after a merge


def test_eval_uses_merged_weight_and_before_eval_merges_what_was_learned():
    prepared = prepare(linear64(), heads=1, rank=2, alpha=4.0, merge_every=1000, lr=0.05)
    model = prepared.model
    gen = torch.Generator().manual_seed(2)
    x, target = torch.randn(8, 6, generator=gen, dtype=torch.float64), torch.zeros(8, 5, dtype=torch.float64)
    for _ in range(5):
        step(prepared, x, target)
    layer = model[0]
    with torch.no_grad():
        train_out = model.train()(x)
        eval_before = model.eval()(x)
        torch.testing.assert_close(eval_before, x @ layer.weight.T + layer.bias)
        assert not torch.allclose(train_out, eval_before)
        prepared.before_eval()
        torch.testing.assert_close(model.eval()(x), train_out, rtol=1e-12, atol=1e-12)


def test_batch_not_divisible_by_heads_is_a_clear_error():
    prepared = prepare(linear64(), heads=4)
    with pytest.raises(ValueError, match=r"LTE layer '0': batch size 6 is not divisible by the number of "
                                         r"heads 4"):
        prepared.model(torch.randn(6, 6, dtype=torch.float64))
    prepared.model.eval()(torch.randn(6, 6, dtype=torch.float64))  # eval has no heads: any batch


def test_state_bytes_match_hand_count():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    prepared = LTEMethod().prepare(model, fake_workload(), {"heads": 2, "rank": 2, "alpha": 4.0},
                                   target_ratio=None, total_steps=1)
    step(prepared, torch.randn(4, 8), torch.zeros(4, 3))
    # per layer: frozen W, trainable bias, heads A (2,2,in) + B (2,out,2), and their snapshots (frozen)
    heads1, heads2 = 2 * 2 * 8 + 2 * 16 * 2, 2 * 2 * 16 + 2 * 3 * 2
    params = (128 + 16 + 2 * heads1) + (48 + 3 + 2 * heads2)
    trainable = 16 + heads1 + 3 + heads2
    assert prepared.settings["trainable_params"] == trainable == 191
    # float32 params + grads + two AdamW moments, plus a float32 step counter for each of 6 tensors
    assert state_bytes(prepared.model, prepared.optimizers) == 4 * (params + 3 * trainable) + 4 * 6
    assert prepared.size()["params_total"] == 195  # the deployed (merged) model
    assert prepared.size()["params_factorized_layers"] == 128 + 16


def test_optimizer_groups_heads_and_other_parameters_with_their_lrs():
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 4))
    prepared = prepare(model, lr=0.1, lr_other=0.01)
    heads, other = prepared.optimizers[0].param_groups
    assert heads["lr"] == 0.1 and other["lr"] == 0.01
    layer = prepared.model[2]
    assert {id(p) for p in heads["params"]} == {id(layer.lora_A), id(layer.lora_B)}
    assert {id(p) for p in other["params"]} == {id(model[0].weight), id(model[1].weight), id(model[1].bias),
                                                 id(layer.bias)}
    assert not layer.weight.requires_grad
    assert prepared.settings["other_trainable_params"] == 40 + 8 + 4


def test_linear_tied_to_embedding_stays_a_normal_linear():
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "out": nn.Linear(4, 10), "fc": nn.Linear(4, 4)})
    model["out"].weight = model["emb"].weight
    assert convert_linears(model, heads=1, rank=2, alpha=2.0) == ["fc"]
    assert isinstance(model["fc"], LTELinear) and type(model["out"]) is nn.Linear


def test_presets_fill_values_and_explicit_keys_win():
    assert {k: check_params({})[k] for k in PRESETS["default"]} == {
        "heads": 1, "rank": 8, "alpha": 16.0, "merge_every": 1, "lr": None}
    tuned = check_params({"preset": "tuned", "rank": 4, "lr": 5e-4})
    assert tuned["rank"] == 4 and tuned["heads"] == PRESETS["tuned"]["heads"] > 1
    assert tuned["lr"] == 5e-4 and check_params({"preset": "tuned"})["lr"] == PRESETS["tuned"]["lr"]
    with pytest.raises(ValueError, match="'rank' must be an integer"):
        check_params({"preset": "tuned", "rank": 4.0})
    prepared = prepare(linear64(), preset="tuned")
    assert prepared.settings["preset"] == "tuned" and prepared.settings["heads"] == PRESETS["tuned"]["heads"]
    assert prepared.settings["merge_every"] == PRESETS["tuned"]["merge_every"]
    # the merge is periodic work: its period times the cell's rounds (harness.core.timing.round_bounds)
    assert prepared.settings["time_window_steps"] == PRESETS["tuned"]["merge_every"] > 1
    assert prepare(linear64()).settings["time_window_steps"] is None  # merging every step: no period


def test_flops_match_counted_training_step():
    from torch.utils.flop_counter import FlopCounterMode

    layer = LTELinear(nn.Linear(12, 20), heads=2, rank=3, alpha=3.0)
    x = torch.randn(4, 5, 12, requires_grad=True)  # 20 rows
    with FlopCounterMode(display=False) as counter:
        layer(x).sum().backward()
    assert layer.flops(20) == counter.get_total_flops() > 0
