"""harness.spec: a cell's keys, defaults and checks (messages name key and value), its name and hashes."""
from __future__ import annotations

import copy
import json
import pickle
import re

import pytest

from harness import spec as specs
from tests.harness.running.run_toys import toy_spec


def toy(**raw):
    return specs.make({"workload": "toy", "method": "toy", "batch_size": 4, **raw}, specs.AS_WRITTEN)


@pytest.mark.parametrize("section, key, value, message", [
    (None, "bogus", 1, "spec: unknown key 'bogus'; allowed: ['batch_size', 'budget', "),
    ("budget", "epoch", 1, "spec: unknown key 'budget.epoch'; allowed: ['epochs', "),
    ("execution", "gpu", True, "spec: unknown key 'execution.gpu'"),
    (None, "batch_size", 0, "spec: key 'batch_size' must be an integer in [1, 1048576], got 0"),
    (None, "batch_size", 10**30, f"key 'batch_size' must be an integer in [1, 1048576], got {10**30}"),
    (None, "batch_size", 4.0, "key 'batch_size' must be an integer in [1, 1048576], got 4.0"),
    ("budget", "epochs", 10**18, f"key 'budget.epochs' must be an integer in [1, 100000], got {10**18}"),
    (None, "target_ratio", 2.0, "key 'target_ratio' must be a number in (0, 1] or null, got 2.0"),
    (None, "variant", {"a": 1}, "spec: key 'variant' must be a non-empty string, got {'a': 1}"),
    (None, "variant", 3, "spec: key 'variant' must be a non-empty string, got 3"),
    ("execution", "device", "tpu", "key 'execution.device' must be cpu, cuda, cuda:N or auto, got 'tpu'"),
    ("execution", "num_threads", None, "'execution.num_threads' must be an integer in [1, 1024], got None"),
    ("execution", "num_threads", 2**31, f"num_threads' must be an integer in [1, 1024], got {2**31}"),
    ("execution", "num_threads", 1025, "'execution.num_threads' must be an integer in [1, 1024], got 1025"),
    ("execution", "cuda_graph", 1, "'execution.cuda_graph' must be true or false, got 1"),
    (None, "seed", 2**32, f"spec: key 'seed' must be an integer in [0, 4294967295], got {2**32}"),
    (None, "seed", -1, "spec: key 'seed' must be an integer in [0, 4294967295], got -1"),
    (None, "run_id", "r" * 151, "spec: key 'run_id' must be a plain file name"),
    (None, "run_id", "a/b", "spec: key 'run_id' must be a plain file name (letters, digits, . _ -; not "
                            "starting with '.' or '-') of at most 150 characters or null, got 'a/b'"),
    ("budget", "time_limit_s", -1, "time_limit_s' must be a number in (0, 100000000] or null, got -1"),
    ("budget", "time_limit_s", float("nan"), "'budget.time_limit_s' must be a number in (0, 100000000] or "
                                             "null, got nan"),
    ("budget", "time_limit_s", float("inf"), "got inf"),
    ("execution", "allocator", "tcmalloc",
     "spec: key 'execution.allocator' must be one of ['reuse', 'system'], got 'tcmalloc'"),
    (None, "method_params", [1], "spec: key 'method_params' must be a mapping, got [1]"),
    (None, "budget", 5, "spec: key 'budget' must be a mapping, got 5"),
])
def test_bad_spec_is_named(section, key, value, message):
    spec = toy_spec()
    (spec[section] if section else spec)[key] = value
    with pytest.raises(specs.SpecError, match=re.escape(message)):
        specs.make(spec, specs.AS_WRITTEN)


def test_spec_bounds_are_what_runs():
    """The largest seed (numpy's) and thread count a cell runs with pass; a float for a number is kept
    as a float, a null section is its defaults."""
    assert toy(seed=2**32 - 1).seed == 2**32 - 1
    assert toy(execution={"num_threads": 1024, "device": "cuda:1"}).execution.num_threads == 1024
    assert toy(run_id="r" * 150).run_id == "r" * 150
    assert toy(target_ratio=1).target_ratio == 1.0 and isinstance(toy(target_ratio=1).target_ratio, float)
    assert toy(budget=None, execution=None).budget == specs.Budget()


def test_params_inside_a_spec_are_read_only():
    spec = toy(method_params={"lr": 0.1})
    with pytest.raises(TypeError, match="read-only params: 'lr' cannot be set"):
        spec.method_params["lr"] = 1.0
    with pytest.raises(TypeError):
        spec.workload_params.update(size="tiny")
    with pytest.raises(ValueError):  # pydantic's frozen model refuses, naming the field
        spec.seed = 3
    assert specs.make(spec.to_dict(), specs.AS_WRITTEN) == spec
    # still a dict to JSON, pickle and copy (a row's settings, a process boundary)
    assert json.loads(json.dumps(spec.method_params)) == {"lr": 0.1}
    assert pickle.loads(pickle.dumps(spec)) == spec and copy.deepcopy(spec) == spec


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
