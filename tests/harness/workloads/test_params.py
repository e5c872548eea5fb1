import pytest
import torch

from harness.workloads import PARAMS_DEFAULTS, WORKLOADS, build_workload, check_params


@pytest.mark.parametrize("name", WORKLOADS)
def test_defaults_are_the_small_preset_and_complete(name):
    params = check_params(name, {})
    assert params["size"] == "small"
    assert PARAMS_DEFAULTS[name] == params
    assert check_params(name, params) == params  # idempotent: a checked dict passes again unchanged


@pytest.mark.parametrize("name", WORKLOADS)
def test_unknown_key_is_named_with_the_allowed_keys(name):
    message = rf"workload '{name}': unknown parameter 'not_a_key'; allowed: .*'size'"
    with pytest.raises(ValueError, match=message):
        check_params(name, {"not_a_key": 1})


@pytest.mark.parametrize("name", WORKLOADS)
def test_bad_size_is_named(name):
    with pytest.raises(ValueError, match=rf"workload '{name}': parameter 'size' must be one of .*got 'huge'"):
        check_params(name, {"size": "huge"})


@pytest.mark.parametrize("name, key, value, message", [
    ("transformer", "d_model", "big", "parameter 'd_model' must be an integer > 0, got 'big'"),
    ("transformer", "num_heads", 5, "num_heads=5 must divide d_model=128"),
    ("transformer", "seq_len", 1000, "seq_len=1000 exceeds max_positions"),
    ("transformer", "data", "snli", r"parameter 'data' must be one of \['synthetic', 'mnli'\], got 'snli'"),
    ("transformer", "dropout", True, r"parameter 'dropout' must be a number in \[0, 1\), got True"),
    ("transformer", "rank", 0, "parameter 'rank' must be an integer > 0, got 0"),
    ("transformer", "embedding_row_shape", [4, 2.0], "'embedding_row_shape' must be a list of values each an "
                                                      r"integer or null, got \[4, 2.0\]"),
    ("dlrm", "bottom_mlp", [64, 8], "bottom_mlp=\\[64, 8\\] must end with embedding_dim=16"),
    ("dlrm", "table_sizes", [10] * 3, "must be 26 positive sizes"),
    ("dlrm", "eval_fraction", 1.5, r"parameter 'eval_fraction' must be a number in \(0, 1\), got 1.5"),
    ("mlm", "mask_prob", 0.0, r"parameter 'mask_prob' must be a number in \(0, 1\), got 0.0"),
    ("mlm", "vocab_size", 100, "vocab_size=100 must exceed"),
])
def test_bad_values_are_named(name, key, value, message):
    with pytest.raises(ValueError, match=message):
        check_params(name, {key: value})


@pytest.mark.parametrize("name, key", [("transformer", "data_dir"), ("dlrm", "data_path"),
                                       ("mlm", "data_path")])
def test_real_data_needs_its_path(name, key):
    source = {"transformer": "mnli", "dlrm": "criteo", "mlm": "jsonl"}[name]
    with pytest.raises(ValueError, match=f"{key}=None is required"):
        check_params(name, {"data": source})


def test_overrides_win_over_the_preset():
    params = check_params("transformer", {"size": "tiny", "d_model": 64, "dropout": 0})
    assert params["d_model"] == 64 and params["num_layers"] == 1
    assert isinstance(params["dropout"], float)


def test_unknown_workload_and_bad_batch_size():
    with pytest.raises(ValueError, match="unknown workload 'vision'"):
        check_params("vision", {})
    with pytest.raises(ValueError, match="batch_size=0"):
        build_workload("transformer", {"size": "tiny"}, batch_size=0, seed=0, device=torch.device("cpu"))
