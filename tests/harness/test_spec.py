"""harness.spec: a cell's keys and defaults (the config schema's), their checks, its name and hashes."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from harness import spec as specs
from tests.harness.running.run_toys import toy_spec

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


def toy(**raw):
    return specs.make({"workload": "toy", "method": "toy", "batch_size": 4, **raw}, specs.AS_WRITTEN)


def schema_default(schema: dict, key: str):
    """The default of a dotted schema key ("execution.threads", "methods.*.params", "$defs.budget.epochs");
    a grid axis (a list) gives its one value."""
    node = schema
    for part in key.split("."):
        if part == "*":
            node = node["additionalProperties"]
        elif part == "$defs":
            node = schema["$defs"]
            continue
        else:
            node = node["properties"][part] if "properties" in node else node[part]
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] | node if "$ref" in node else node
    default = node["default"]
    if isinstance(default, list):
        assert len(default) == 1, f"{key}: a grid axis with {default} by default"
        return default[0]
    return default


def test_every_spec_default_is_the_schemas():
    """Every key of a spec either shares the config schema's default or says why it has none."""
    schema = yaml.safe_load(SCHEMA.read_text())
    spec = toy()
    keys = [f.name for f in dataclasses.fields(specs.Spec) if f.name not in ("budget", "execution")]
    keys += [f"budget.{f.name}" for f in dataclasses.fields(specs.Budget)]
    keys += [f"execution.{f.name}" for f in dataclasses.fields(specs.Execution)]
    assert sorted(keys) == sorted(specs.SCHEMA_KEYS)
    for key, schema_key in specs.SCHEMA_KEYS.items():
        if schema_key is None:
            continue
        section, _, name = key.rpartition(".")
        value = getattr(getattr(spec, section), name) if section else getattr(spec, name)
        value = {} if isinstance(value, dict) else value
        assert value == schema_default(schema, schema_key), key


@pytest.mark.parametrize("section, key, value, message", [
    (None, "bogus", 1, "unknown spec key 'bogus'"),
    ("budget", "epoch", 1, "unknown key budget.epoch"),
    ("execution", "gpu", True, "unknown key execution.gpu"),
    (None, "batch_size", 0, "batch_size must be an integer from 1 to 2**32, got 0"),
    (None, "batch_size", 10**30, f"batch_size must be an integer from 1 to 2**32, got {10**30}"),
    ("budget", "epochs", 10**18, f"budget.epochs must be an integer from 1 to 2**32, got {10**18}"),
    (None, "target_ratio", 2.0, "target_ratio must be null or in"),
    (None, "variant", {"a": 1}, "spec variant must be a non-empty string, got {'a': 1}"),
    (None, "variant", 3, "spec variant must be a non-empty string, got 3"),
    ("execution", "device", "tpu", "execution.device must be cpu|cuda|auto, got 'tpu'"),
    ("execution", "num_threads", None, "execution.num_threads must be an integer from 1 to 1024, got None"),
    ("execution", "num_threads", 2**31, f"num_threads must be an integer from 1 to 1024, got {2**31}"),
    ("execution", "num_threads", 1025, "execution.num_threads must be an integer from 1 to 1024, got 1025"),
    (None, "seed", 2**32, f"spec seed must be an integer from 0 to 2**32 - 1, got {2**32}"),
    (None, "seed", -1, "spec seed must be an integer from 0 to 2**32 - 1, got -1"),
    (None, "run_id", "r" * 151, f"spec run_id must be at most 150 characters (it names files), got "
                                f"{'r' * 151!r}"),
    (None, "run_id", "a/b", "spec run_id must be a plain file name"),
    ("budget", "time_limit_s", -1, "time_limit_s must be null or a finite number > 0"),
    ("budget", "time_limit_s", float("nan"), "time_limit_s must be null or a finite number > 0, got nan"),
    ("budget", "time_limit_s", float("inf"), "time_limit_s must be null or a finite number > 0, got inf"),
    ("execution", "allocator", "tcmalloc",
     "execution.allocator must be one of ['reuse', 'system'], got 'tcmalloc'"),
    (None, "method_params", [1], "spec method_params must be a mapping of parameter names to values"),
])
def test_bad_spec_is_named(section, key, value, message):
    spec = toy_spec()
    (spec[section] if section else spec)[key] = value
    with pytest.raises(specs.SpecError, match=re.escape(message)):
        specs.make(spec, specs.AS_WRITTEN)


def test_spec_bounds_are_what_runs():
    """The largest seed (numpy's) and thread count (the config's cap) a cell runs with pass; the threads
    bound is the config schema's."""
    assert toy(seed=2**32 - 1).seed == 2**32 - 1
    assert toy(execution={"num_threads": 1024}).execution.num_threads == 1024
    assert toy(run_id="r" * 150).run_id == "r" * 150
    threads = yaml.safe_load(SCHEMA.read_text())["properties"]["execution"]["properties"]["threads"]
    assert threads["maximum"] == specs.MAX_THREADS


def test_a_long_derived_run_id_is_refused_too():
    with pytest.raises(specs.SpecError, match="spec run_id must be at most 150 characters"):
        toy(variant="v" * 150)


def test_spec_defaults_and_ids():
    spec = toy()
    assert spec.budget == specs.Budget() and spec.execution == specs.Execution()
    # the pipeline's scheme (harness.spec.run_id) and, made without a name, its cell hash
    assert spec.run_id == f"toy_toy-default_b4_tnone_s0_c{spec.cell_hash[:8]}"
    assert toy().cell_hash == spec.cell_hash != toy(seed=1).cell_hash
    assert specs.make(spec.to_dict(), specs.AS_WRITTEN) == spec  # its JSON makes it again
    with pytest.raises(specs.SpecError, match="missing the key 'method'"):
        specs.make({"workload": "toy", "batch_size": 4}, specs.AS_WRITTEN)


def test_a_param_the_owner_refuses_is_a_spec_error_naming_it():
    with pytest.raises(specs.SpecError, match="method_params: method 'comera': unknown parameter 'colour'"):
        specs.make({"workload": "transformer", "method": "comera", "batch_size": 2,
                    "method_params": {"colour": "red"}})


def test_the_cell_hash_is_of_the_resolved_params_and_not_of_the_device():
    """``size_weight: 10`` and ``10.0``, a default stated and left out: one cell; another device or thread
    count: the same cell run elsewhere (another execution hash); another size_weight: another cell."""
    def comera(**method_params):
        return {"workload": "transformer", "method": "comera", "batch_size": 2,
                "workload_params": {"size": "tiny"}, "method_params": method_params}

    base = specs.make(comera(size_weight=10))
    assert specs.make(comera(size_weight=10.0)).cell_hash == base.cell_hash
    assert specs.make(comera(size_weight=10,
                             threshold=specs.registry_checks().method("comera", {})["threshold"])
                      ).cell_hash == base.cell_hash
    stated = {**comera(size_weight=10), "workload_params": {"size": "tiny", "seq_len": 32}}  # tiny's own
    assert specs.make(stated).cell_hash == base.cell_hash
    gpu = specs.make({**comera(size_weight=10), "execution": {"device": "cuda", "num_threads": 8}})
    assert gpu.cell_hash == base.cell_hash and gpu.execution_hash != base.execution_hash
    assert specs.make(comera(size_weight=1)).cell_hash != base.cell_hash


def test_hashes_in_a_specs_json_are_derived_again():
    spec = toy()
    stale = {**spec.to_dict(), "cell_hash": "0" * 16, "execution_hash": "1" * 16}
    assert specs.make(stale, specs.AS_WRITTEN).to_dict() == spec.to_dict()
