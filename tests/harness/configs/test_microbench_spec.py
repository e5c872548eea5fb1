"""The micro-benchmark spec check the grid runs (harness.configs.microbench_spec) without importing the
benchmark (harness.perf.microbench)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from harness.configs import microbench_spec
from harness.perf import microbench

def test_the_default_config_specs_pass_and_fill_the_defaults():
    with open("config/config.yaml") as fh:
        specs = yaml.safe_load(fh)["microbench"]["specs"]
    for name, spec in specs.items():
        out = microbench_spec.check_spec(spec, source=f"spec {name}")
        assert out["allocator"] in ("reuse", "system") and out["seed"] >= 0


def test_the_benchmark_uses_this_check():
    """One definition: harness.perf.microbench validates its specs with this module's check_spec."""
    assert microbench.check_spec is microbench_spec.check_spec
    assert (microbench.DIRECTIONS, microbench.EMBEDDING_VARIANTS) == \
        (microbench_spec.DIRECTIONS, microbench_spec.EMBEDDING_VARIANTS)


@pytest.mark.parametrize("spec, message", [({"repeats": 3}, "unknown key 'repeats'"),
                                           ({"linear": {"tokens": [0]}}, "linear.tokens: 0"),
                                           ({"embedding": {"variants": ["fast"]}}, "unknown value 'fast'")])
def test_bad_specs_name_the_key(spec, message):
    with pytest.raises(ValueError, match=message):
        microbench_spec.check_spec(spec)


def test_the_config_check_does_not_import_the_benchmark():
    code = ("import sys; from harness.configs import grid, microbench_spec; "
            "microbench_spec.check_spec({}); print('harness.perf.microbench' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("text, message", [
    ("min_run_time_s: .nan", "min_run_time_s=nan must be a finite number > 0"),
    ("min_run_time_s: .inf", "min_run_time_s=inf must be a finite number > 0"),
    ("min_run_time_s: -.inf", "min_run_time_s=-inf must be a finite number > 0"),
    ("embedding: {zipf_exponent: .nan}", "embedding.zipf_exponent=nan must be a finite number >= 0"),
    ("linear: {layers: [{in_shape: [.inf], out_shape: [2]}]}", "linear.layers[0].in_shape[0]=inf"),
])
def test_a_spec_file_with_a_non_finite_number_is_refused_naming_key_and_file(tmp_path, text, message):
    """A NaN or infinite time would time forever (``<= 0`` lets NaN through)."""
    path = tmp_path / "mb.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=re.escape(f"microbench {path}: ") + ".*" + re.escape(message)):
        microbench.load_spec(path)


@pytest.mark.parametrize("key, value, message", [
    ("num_threads", 2**31, "num_threads=2147483648 must be an integer from 1 to 1024"),
    ("seed", 2**32, "seed=4294967296 must be an integer from 0 to 4294967295"),
    ("rounds", 10**12, "rounds=1000000000000 must be an integer from 1 to 1000"),
    ("rounds", 0, "rounds=0 must be an integer from 1 to 1000"),
])
def test_integers_past_what_runs_are_refused(key, value, message):
    """The bounds a cell's spec has (threads: the config's cap; seed: numpy's; rounds: the config's)."""
    with pytest.raises(ValueError, match=re.escape(f"microbench spec: {message}")):
        microbench_spec.check_spec({key: value})
    assert microbench_spec.check_spec({key: {"num_threads": 1024, "seed": 2**32 - 1, "rounds": 1000}[key]})
