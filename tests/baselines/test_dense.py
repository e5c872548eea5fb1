"""Uncompressed AdamW baseline: learning rate, parameter coverage, sizes and analytic state bytes."""
from __future__ import annotations

import json
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


def tiny_transformer(**params):
    from harness.workloads import build_workload

    return build_workload("transformer", {"size": "tiny", "train_samples": 64, "eval_samples": 16, **params},
                          batch_size=4, seed=0, device="cpu")


def source_row(folder, run_id, *, status="ok", params=5000, target=0.2, shortfall=None):
    """The runs file of a CoMERA cell that a matched cell reads."""
    import json

    import pandas as pd

    row = {"run_id": run_id, "status": status, "params_total": float(params), "target_ratio": target,
           "compression_total": 4.0, "variant": "reach",
           "settings": json.dumps({"method": {"outcome": {"shortfall": shortfall}}})}
    pd.DataFrame([row]).to_parquet(folder / f"{run_id}.runs.parquet")


@pytest.fixture
def cells(tmp_path, monkeypatch):
    from baselines.dense import CELLS_DIR_ENV

    monkeypatch.setenv(CELLS_DIR_ENV, str(tmp_path))
    return tmp_path


def test_matched_source_reads_the_reached_size_and_names_the_file_of_a_missing_or_failed_cell(cells):
    from baselines.dense import matched_source

    source_row(cells, "c-ok", params=1234, shortfall="the loss guard held it back")
    got = matched_source("dense", "c-ok")
    assert got == {"run": "c-ok", "variant": "reach", "params": 1234, "target": 0.2, "target_reached": False,
                   "compression_total": 4.0}
    source_row(cells, "c-reached")
    assert matched_source("dense", "c-reached")["target_reached"] is True
    with pytest.raises(ValueError, match=f"{cells / 'c-none.runs.parquet'} does not exist"):
        matched_source("dense", "c-none")
    source_row(cells, "c-oom", status="oom")
    with pytest.raises(ValueError, match=f"{cells / 'c-oom.runs.parquet'} has status 'oom'"):
        matched_source("dense", "c-oom")


def test_a_matched_cell_whose_source_failed_is_an_error_row_naming_the_file(cells):
    from harness.running.run import run_cell

    source_row(cells, "c-oom", status="oom")
    row, _ = run_cell({"workload": "transformer", "method": "dense", "batch_size": 4, "purpose": "quality",
                       "workload_params": {"size": "tiny", "train_samples": 16, "eval_samples": 8},
                       "method_params": {"match_run": "c-oom"}, "execution": {"device": "cpu"},
                       "budget": {"epochs": 1, "max_steps_per_epoch": 2, "warmup_steps": 0}})
    assert row["status"] == "error" and "c-oom.runs.parquet has status 'oom'" in row["error"]


class Tagged(nn.Module):
    """A candidate of the fake workload: "linear" can learn y = x @ w, "constant" cannot."""

    def __init__(self, tag: str):
        super().__init__()
        self.tag = tag
        with torch.random.fork_rng(devices=[]):  # seeded as Workload.sized_models' builds are
            torch.manual_seed(0)
            self.net = nn.Linear(4, 1, bias=False)
        if tag == "constant":
            self.net.weight.data.zero_()
            self.net.weight.requires_grad_(False)
            self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.net(x) + (self.bias if self.tag == "constant" else 0)


def selection_workload(calls, tie=False):
    """Training and held-out data follow y = x @ w, the eval split y = -x @ w: the held-out slice picks
    the linear candidate at the highest rate, the eval split would pick the constant one."""
    from harness.workloads.base import Holdout, SizedModel

    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 1, generator=g)
    x = torch.randn(64, 4, generator=g)
    train, held = x[:56], x[56:]

    def score(m, data, sign):
        with torch.no_grad():
            error = (m(data) - sign * data @ w).pow(2).mean().item()
        return {"metric_name": "accuracy", "metric_value": 0.5 if tie else -error, "loss": error}

    def evaluate(m):
        calls.append("eval")
        return score(m, x, -1.0)

    return SimpleNamespace(
        name="fake", lr={"dense": 0.01}, tt_spec={}, loss=lambda m, b: (m(b) - b @ w).pow(2).mean(),
        evaluate=evaluate, eval_batches=lambda: calls.append("eval_batches") or iter(()),
        sized_models=lambda n: [SizedModel(tag, {"tag": tag}, n, lambda tag=tag: Tagged(tag))
                                for tag in ("constant", "linear")],
        holdout=lambda fraction: Holdout(lambda epoch: iter(train.split(8)), 7,
                                         lambda m: score(m, held, 1.0)))


def test_the_size_matched_dense_model_is_chosen_on_held_out_training_data_never_the_eval_split(cells):
    calls = []
    workload = selection_workload(calls)
    source_row(cells, "c-t0.2", params=4)
    model = mlp()
    state = torch.get_rng_state()
    prepared = DenseMethod().prepare(model, workload, {"match_run": "c-t0.2", "select_fraction": 0.5},
                                     target_ratio=None, total_steps=20)
    assert calls == []  # neither the eval split's evaluation nor its batches
    assert torch.equal(torch.get_rng_state(), state)
    selection = prepared.settings["selection"]
    assert (selection["shape"], selection["lr"], selection["steps"]) == ("linear", pytest.approx(0.03), 10)
    assert [(c["shape"], round(c["lr"], 4)) for c in selection["candidates"]] == [
        (shape, lr) for shape in ("constant", "linear") for lr in (0.0033, 0.01, 0.03)]
    best = max(selection["candidates"], key=lambda c: c["score"])
    assert best["shape"] == "linear" and best["lr"] == selection["lr"] and selection["seconds"] >= 0
    assert selection["tied"] == 1
    # the eval split would have chosen the constant model
    assert workload.evaluate(Tagged("constant"))["metric_value"] > workload.evaluate(Tagged("linear"))[
        "metric_value"]
    assert prepared.settings["lr"] == selection["lr"] and prepared.settings["matched"]["run"] == "c-t0.2"
    assert torch.equal(prepared.model.net.weight, Tagged("linear").net.weight)  # the winner from scratch
    assert prepared.optimizers[0].param_groups[0]["lr"] == selection["lr"]


def test_size_matched_needs_a_workload_that_builds_smaller_models(cells):
    source_row(cells, "c-t0.2", params=100)
    workload = SimpleNamespace(**vars(fake_workload(1e-3)), sized_models=None, holdout=None)
    with pytest.raises(ValueError, match="'match_run' needs a workload that builds smaller models.*'fake"):
        DenseMethod().prepare(mlp(), workload, {"match_run": "c-t0.2"}, target_ratio=None, total_steps=1)
    with pytest.raises(ValueError, match=r"'holdout_fraction' must be a number in \(0, 1\), got 1$"):
        DenseMethod().prepare(mlp(), workload, {"holdout_fraction": 1}, target_ratio=None, total_steps=1)
    prepared = DenseMethod().prepare(mlp(), workload, {}, target_ratio=None, total_steps=1)
    assert prepared.settings["matched"] is None and prepared.size()["compression_total"] == 1.0


def test_matched_transformer_tries_width_depth_and_the_task_vocabulary(cells):
    """The tiny preset has one layer: width and the task's vocabulary (its 256-word table over the ids the
    synthetic task emits: 54 with 48 words); the row's count is the winner's, matched to the source's."""
    workload = tiny_transformer(num_words=48)
    full = sum(p.numel() for p in workload.model.parameters())
    source_row(cells, "c-t0.2", params=full // 4)
    prepared = DenseMethod().prepare(workload.model, workload, {"match_run": "c-t0.2"}, target_ratio=None,
                                     total_steps=8)
    selection = prepared.settings["selection"]
    assert {c["shape"] for c in selection["candidates"]} == {"width", "task-vocabulary"}
    assert len(selection["candidates"]) == 6
    count = sum(p.numel() for p in prepared.model.parameters())
    assert count == selection["params"] and prepared.size()["params_total"] == count
    assert abs(count - full // 4) < full // 8
    assert prepared.size()["compression_total"] == pytest.approx(full / count)


def test_a_cell_run_to_files_finds_the_cell_it_matches_beside_its_own_runs_file(tmp_path, monkeypatch):
    """The runner points the method at the folder of ``--runs-out`` (whatever the variable said before)."""
    from baselines.dense import CELLS_DIR_ENV
    from harness.running.run import run_to_files

    monkeypatch.setenv(CELLS_DIR_ENV, str(tmp_path / "elsewhere"))
    folder = tmp_path / "runs" / "cpu"
    folder.mkdir(parents=True)
    workload = tiny_transformer()
    source_row(folder, "c-t0.5", params=sum(p.numel() for p in workload.model.parameters()) // 3)
    row = run_to_files({"workload": "transformer", "method": "dense", "batch_size": 4, "purpose": "quality",
                        "workload_params": {"size": "tiny", "train_samples": 64, "eval_samples": 16},
                        "method_params": {"match_run": "c-t0.5"}, "execution": {"device": "cpu",
                                                                                "num_threads": 1},
                        "budget": {"epochs": 1, "max_steps_per_epoch": 4, "warmup_steps": 1}},
                       folder / "m.runs.parquet", folder / "m.curves.parquet")
    assert row["status"] == "ok", row["error"]
    assert json.loads(row["settings"])["method"]["matched"]["run"] == "c-t0.5"


def test_held_out_scores_that_tie_are_chosen_between_by_held_out_loss_and_counted(cells):
    """Every candidate on the same held-out accuracy (a plateau): the lowest held-out loss wins, and the
    record says how many tied."""
    source_row(cells, "c-t0.2", params=4)
    prepared = DenseMethod().prepare(mlp(), selection_workload([], tie=True),
                                     {"match_run": "c-t0.2", "select_fraction": 0.5}, target_ratio=None,
                                     total_steps=20)
    selection = prepared.settings["selection"]
    assert selection["tied"] == 6
    best = min(selection["candidates"], key=lambda c: c["loss"])
    assert (selection["shape"], selection["lr"]) == (best["shape"], best["lr"])
    assert (best["shape"], best["lr"]) == ("linear", pytest.approx(0.03))
