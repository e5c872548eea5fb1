"""The resume guarantee every method gives: a run stopped after any step, saved with
``Prepared.state_dict()`` and loaded into the same method prepared afresh (``load_state_dict``), goes on
exactly as the run that was not stopped -- losses, evaluations and parameters bit for bit on the CPU."""
from __future__ import annotations

import itertools

import pytest
import torch

import baselines

from .conftest import make_toy_workload

STEPS, EVAL_EVERY = 24, 7
METHODS = [
    ("dense", {}, None),
    ("galore", {"rank": 4, "update_proj_gap": 5, "scale": 1.0}, None),
    ("galore", {"rank": 4, "update_proj_gap": 5, "scale": 1.0, "layerwise": True}, None),
    ("lte", {"preset": "tuned", "merge_every": 3}, None),
    ("comera", {"prune_every": 2, "threshold": 0.3, "lr_gates": 0.1}, 0.5),
    ("comera", {"prune_every": 2, "threshold": 0.3, "lr_gates": 0.1, "switch_when": "step"}, 0.5),
]
PRUNED_BEFORE = 16
"""CoMERA's runs above have pruned ranks before this step: a stop there resumes smaller cores."""


def _prepared(name, params, target_ratio):
    workload = make_toy_workload(steps_per_epoch=STEPS)
    prepared = baselines.get_method(name).prepare(workload.model, workload, params, target_ratio=target_ratio,
                                                  total_steps=STEPS)
    return workload, prepared


def _run(workload, prepared, start, stop, record):
    """Steps ``start`` .. ``stop - 1`` of the runner's loop, an evaluation every EVAL_EVERY steps."""
    prepared.model.train()
    for step, batch in itertools.islice(enumerate(workload.train_batches(0)), start, stop):
        task_loss, loss, info = prepared.train_step(workload, batch, step)
        record.append((step, task_loss.item(), loss.item(), sorted(info.items())))
        if (step + 1) % EVAL_EVERY == 0:
            prepared.before_eval()
            record.append((step, workload.evaluate(prepared.model)))
            prepared.model.train()


@pytest.mark.parametrize("stop_at", [5, PRUNED_BEFORE])
@pytest.mark.parametrize("name, params, target_ratio", METHODS)
def test_a_resumed_run_goes_on_as_the_uninterrupted_one(tmp_path, name, params, target_ratio, stop_at):
    workload, prepared = _prepared(name, params, target_ratio)
    whole: list = []
    _run(workload, prepared, 0, STEPS, whole)

    workload, prepared = _prepared(name, params, target_ratio)
    parts: list = []
    _run(workload, prepared, 0, stop_at, parts)
    torch.save({"state": prepared.state_dict(), "rng": torch.get_rng_state()}, tmp_path / "checkpoint.pt")
    del workload, prepared

    workload, prepared = _prepared(name, params, target_ratio)  # as a new process would
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # data only, as a checkpoint is read
    prepared.load_state_dict(saved["state"])
    torch.set_rng_state(saved["rng"])
    _run(workload, prepared, stop_at, STEPS, parts)

    assert parts == whole
    if name == "comera":
        rank_mean = [dict(entry[3])["rank_mean"] for entry in whole if len(entry) == 4]
        assert rank_mean[PRUNED_BEFORE - 1] < rank_mean[0]
    prepared.before_eval()
    final = dict(prepared.model.named_parameters())
    workload, again = _prepared(name, params, target_ratio)
    _run(workload, again, 0, STEPS, [])
    again.before_eval()
    for key, param in again.model.named_parameters():
        assert torch.equal(param, final[key]), key


def test_a_state_for_another_method_is_refused():
    _, lte = _prepared("lte", {"preset": "tuned"}, None)
    _, dense = _prepared("dense", {}, None)
    with pytest.raises((ValueError, RuntimeError)):
        dense.load_state_dict(lte.state_dict())
