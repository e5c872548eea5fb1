"""The method registry and the one guarantee every method gives: it learns the toy task."""
from __future__ import annotations

import importlib

import pytest

import baselines
from baselines.base import trainable_parameters

from .conftest import make_toy_workload, train

METHODS = ["dense", "galore", "lte", "comera"]


def test_methods_are_the_four_of_the_paper():
    assert set(baselines.METHODS) == {"dense", "comera", "galore", "lte"}


def test_unknown_method_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown method 'sgd'.*'dense'.*'galore'"):
        baselines.get_method("sgd")
    with pytest.raises(ValueError, match="unknown method 'sgd'"):
        baselines.check_params("sgd", {})


@pytest.mark.parametrize("name", METHODS)
def test_unknown_param_names_key_and_allowed_keys(name):
    defaults = baselines.check_params(name, {})
    with pytest.raises(ValueError, match=r"'bogus'.*allowed.*'lr"):
        baselines.check_params(name, {"bogus": 1})
    module = importlib.import_module(f"baselines.{name}")
    assert set(defaults) == set(module.PARAMS_DEFAULTS)  # every default filled
    assert defaults == baselines.check_params(name, dict(defaults))


@pytest.mark.parametrize("name, params, match", [
    ("dense", {"lr": "fast"}, "'lr' must be a number > 0 or null, got 'fast'"),
    ("dense", {"lr": -1.0}, "'lr' must be a number > 0 or null, got -1.0"),
    ("dense", {"weight_decay": -0.1}, "'weight_decay' must be a number >= 0, got -0.1"),
    ("galore", {"rank": 4.5}, "'rank' must be an integer"),
    ("galore", {"rank": 0}, "'rank' must be an integer > 0, got 0"),
    ("galore", {"layerwise": 1}, "'layerwise' must be true or false"),
    ("galore", {"proj_type": "diagonal"}, "'proj_type' must be one of"),
    ("lte", {"heads": True}, "'heads' must be an integer"),
    ("lte", {"merge_every": 0}, "'merge_every' must be an integer > 0, got 0"),
    ("lte", {"preset": "best"}, "'preset' must be one of"),
])
def test_bad_values_are_named(name, params, match):
    with pytest.raises(ValueError, match=match):
        baselines.check_params(name, params)


@pytest.mark.parametrize("name, params", [
    ("dense", {}),
    ("galore", {"rank": 4, "update_proj_gap": 25, "scale": 1.0}),
    ("galore", {"rank": 4, "update_proj_gap": 25, "scale": 1.0, "layerwise": True}),
    ("lte", {"preset": "tuned"}),
    ("comera", {}),
])
def test_method_learns_toy_task_well_above_chance(name, params):
    workload = make_toy_workload()
    method = baselines.get_method(name)
    assert method.name == name
    before = workload.evaluate(workload.model)["metric_value"]
    prepared = method.prepare(workload.model, workload, params, target_ratio=None,
                              total_steps=2 * workload.steps_per_epoch)
    assert prepared.skipped is None
    accuracy = train(prepared, workload, epochs=2)
    assert accuracy > 0.7 > before + 0.2, (name, before, accuracy)  # 3 classes: chance 1/3
    if name != "comera":
        assert prepared.settings["trainable_params"] == trainable_parameters(prepared.model)
        assert prepared.size()["params_total"] > 0
