"""Exponent-notation numbers are numbers (YAML 1.2), in files, options and configs Snakemake read."""
import math

import pytest

from harness.configs import yamlnum


@pytest.mark.parametrize("text, value", [
    ("1e-3", 1e-3), ("3e-4", 3e-4), ("1e30", 1e30), ("-2.0E+5", -2.0e5), (".5e2", 50.0), ("+1_0e1", 100.0),
    ("1.0e-3", 1e-3), ("0.5", 0.5), ("7", 7), (".inf", math.inf),
])
def test_numbers(text, value):
    loaded = yamlnum.load(text)
    assert loaded == value and type(loaded) is type(value)


@pytest.mark.parametrize("text", ["e5", "1e", "1e-3x", "1e-3.5", "abc", "'1e-3'", "1e 3"])
def test_other_text_stays_text(text):
    assert isinstance(yamlnum.load(text), str)


def test_a_loaded_config_gets_its_numbers():
    config = {"methods": {"dense": {"params": {"lr": "1e-3", "name": "e5"}}}, "targets": ["2e-1", 0.5],
              "seeds": [0], "label": "run1e3"}
    assert yamlnum.exponent_strings_as_numbers(config) is config
    assert config == {"methods": {"dense": {"params": {"lr": 1e-3, "name": "e5"}}}, "targets": [0.2, 0.5],
                      "seeds": [0], "label": "run1e3"}


def test_a_mapping_given_with_config_is_typed():
    """`--config execution='{threads: 1}'`: Snakemake's base loader gives '1'; read again, 1."""
    config = {"execution": {"device": "cpu", "threads": "1", "compile": False}, "results_dir": "out"}
    yamlnum.typed_config_args(config, ["execution={threads: 1, rounds: 1e1}", "results_dir=out", "novalue"])
    assert config == {"execution": {"device": "cpu", "threads": 1, "compile": False, "rounds": 10.0},
                      "results_dir": "out"}
    assert yamlnum.typed_config_args({"a": 1}, None) == {"a": 1}
