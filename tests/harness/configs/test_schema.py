"""harness.configs.schema: the config schema's spec keys come from harness.spec's one declaration."""
from __future__ import annotations

import yaml

from harness import spec as specs
from harness.configs import grid
from harness.configs.schema import SCHEMA_FILE, config_schema
from harness.params import field_schema


def test_the_spec_keys_are_filled_from_the_declaration():
    schema = config_schema()
    assert yaml.safe_load(SCHEMA_FILE.read_text())["$defs"]["budget"] == {}  # not written in the file
    budget = schema["$defs"]["budget"]["properties"]
    assert set(budget) == set(specs.Budget.model_fields)
    for name, field in specs.Budget.model_fields.items():
        assert budget[name] == field_schema(field)
    execution = schema["properties"]["execution"]["properties"]
    assert execution["threads"]["default"] == specs.Execution().num_threads
    assert execution["threads"]["maximum"] == specs.MAX_THREADS
    assert execution["rounds"]["maximum"] == specs.MAX_ROUNDS
    assert execution["device"]["default"] == "auto"
    assert execution["matmul_precision"]["default"] == ["highest"]
    assert schema["$defs"]["matmul_precision"]["items"]["enum"] == ["highest", "high", "medium"]
    assert schema["properties"]["seeds"]["items"]["maximum"] == specs.MAX_SEED
    assert schema["$defs"]["target"]["exclusiveMinimum"] == 0


def config(**budget):
    return {"methods": {"dense": {"method": "dense"}},
            "workloads": {"transformer": {"batch_sizes": [2], "methods": ["dense"], "budget": budget}}}


def test_a_bad_spec_key_in_a_config_is_named():
    assert grid.schema_error(config(epochs=2)) is None
    error = grid.schema_error(config(epochs=0))
    assert error.startswith("key workloads.transformer.budget.epochs: 0 is less than the minimum of 1")
    assert "seeds[0]" in grid.schema_error({**config(), "seeds": [-1]})
    assert "execution.threads" in grid.schema_error({**config(), "execution": {"threads": 0}})
    assert grid.schema_error({**config(), "execution": {"threads": "auto", "device": "cuda:1"}}) is None
    assert grid.uses_gpu({"execution": {"device": "cuda:1"}})  # the spec's device values, cuda:N too
    assert not grid.uses_gpu({"execution": {"device": "cpu"}})


def test_the_defaults_filled_are_the_specs():
    filled = config()
    grid.fill_defaults(filled)
    assert filled["workloads"]["transformer"]["budget"] == specs.Budget().as_dict()
    assert filled["execution"]["threads"] == specs.Execution().num_threads
    assert filled["execution"]["rounds"] == specs.Execution().rounds
    assert filled["seeds"] == [0]
