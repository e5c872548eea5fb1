"""The pipeline config: schema (defaults, unknown keys, bad values named), cross-checks and the grid."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from harness.configs import grid
from harness.configs.schema import config_schema
from harness.running import threads

ROOT = Path(__file__).resolve().parents[3]


def filled(config: dict) -> dict:
    """The config with the schema's defaults filled in, as the Snakefile does."""
    config = copy.deepcopy(config)
    grid.fill_defaults(config)
    return config


def expand(config: dict) -> tuple[dict[str, dict], dict[str, dict]]:
    """The grid's cells as their specs' JSON, and its sweep points."""
    cells, sweeps = grid.expand_grid(config)
    return {rid: spec.to_dict() for rid, spec in cells.items()}, sweeps


def paper_data(root: Path) -> None:
    """The data paths config/paper.yaml's cells read (MNLI, Criteo Kaggle, CodeSearchNet JSON lines,
    WikiText-103 raw)."""
    (root / "data" / "mnli").mkdir(parents=True)
    (root / "data" / "wikitext-103-raw").mkdir(parents=True)
    for path in ("criteo/train.txt", "codesearchnet/train.jsonl"):
        (root / "data" / path).parent.mkdir(parents=True)
        (root / "data" / path).touch()


def minimal() -> dict:
    return {
        "methods": {"dense": {"method": "dense"}, "comera": {"method": "comera", "uses_target": True},
                    "comera-rank": {"method": "comera", "variant": "sweep", "sweep": {"rank": [2, 4]}}},
        "workloads": {"transformer": {"params": {"size": "tiny"}, "batch_sizes": [2, 4],
                                      "targets": [None, 0.5],
                                      "methods": ["dense", "comera", {"name": "comera-rank",
                                                                      "batch_sizes": [4]}]}},
    }


PIPELINE_CONFIGS = sorted((ROOT / "config").glob("*.yaml"))


@pytest.mark.parametrize("config_file", PIPELINE_CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_are_valid(config_file, tmp_path, monkeypatch):
    paper_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(config_file.read_text())
    assert grid.schema_error(config) is None
    grid.check_config(filled(config))  # method, workload and microbench params accepted by their owners
    config = filled(config)
    config["execution"]["threads"], _ = threads.resolve(config["execution"]["threads"], tmp_path, 0.0, cpus=2)
    cells, _ = expand(config)
    assert {c["method"] for c in cells.values()} == {"dense", "comera", "galore", "lte"}


def test_defaults_filled_and_grid_expanded():
    config = filled(minimal())
    assert config["execution"] == {"device": "auto", "threads": 2, "compile": [False], "cuda_graph": [False],
                                   "matmul_precision": ["highest"], "gpus": None, "rounds": 5,
                                   "interleave": True}
    cells, sweeps = expand(config)
    # dense: 2 batches x 1; comera: 2 batches x 2 targets; sweep: 2 ranks x 1 batch
    assert len(cells) == 2 + 4 + 2
    dense = [c for c in cells.values() if c["method"] == "dense"]
    assert all(c["target_ratio"] is None for c in dense)
    assert {c["target_ratio"] for c in cells.values()
            if c["variant"] == "default" and c["method"] == "comera"} == {None, 0.5}
    assert sorted(p["rank"] for p in sweeps.values()) == [2, 4]
    for run_id, point in sweeps.items():
        assert cells[run_id]["method_params"]["rank"] == point["rank"]
        assert cells[run_id]["variant"] == f"sweep-rank{point['rank']}"
        assert cells[run_id]["batch_size"] == 4
    spec = next(iter(cells.values()))
    assert set(spec) == {"run_id", "purpose", "workload", "workload_params", "method", "variant",
                         "method_params", "batch_size", "target_ratio", "seed", "budget", "execution",
                         "cell_hash", "execution_hash"}  # complete: harness.spec.make
    assert spec["execution"]["num_threads"] == 2


def test_an_entry_can_run_a_workload_under_its_own_name():
    """Two entries of one module (e.g. mlm on code and on text): cells run the module, named by the entry."""
    config = minimal()
    config["workloads"]["wide"] = {"workload": "transformer", "params": {"size": "tiny", "d_model": 64},
                                   "batch_sizes": [4], "methods": ["dense"]}
    config = filled(config)
    assert grid.schema_error(config) is None
    grid.check_config(config)
    cells, _ = expand(config)
    wide = {rid: c for rid, c in cells.items() if rid.startswith("wide_")}
    assert list(wide) == ["wide_dense-default_b4_tnone_s0"]
    spec = wide["wide_dense-default_b4_tnone_s0"]
    assert spec["workload"] == "transformer" and spec["workload_params"]["d_model"] == 64
    assert spec["execution"]["timing_group"] is None  # alone in its entry's group wide_b4_s0: timed alone
    assert "transformer_dense-default_b4_tnone_s0" in cells  # the entry named by its module keeps its ids


def test_timing_groups_hold_the_cells_compared_together():
    groups = grid.timing_groups(grid.expand_grid(filled(minimal()))[0])
    cells, _ = expand(filled(minimal()))
    # one group per batch size: every method, target and sweep point of that batch, timed in rounds
    for group, ids in groups.items():
        specs = [cells[i] for i in ids]
        assert len({(s["workload"], s["batch_size"], s["seed"]) for s in specs}) == 1
        assert all(s["execution"]["timing_group"] == group and s["execution"]["rounds"] == 5 for s in specs)
    named = {s["execution"]["timing_group"] for s in cells.values()} - {None}
    assert named == set(groups)  # no spec names a group it is not timed in (a cell alone is timed alone)
    by_batch = {cells[ids[0]]["batch_size"]: len(ids) for ids in groups.values()}
    assert by_batch == {2: 1 + 2, 4: 1 + 2 + 2}  # dense, comera x 2 targets (+ 2 sweep points at batch 4)
    config = minimal()
    config["execution"] = {"interleave": False}
    alone, _ = grid.expand_grid(filled(config))
    assert grid.timing_groups(alone) == {}
    assert all(s.execution.timing_group is None for s in alone.values())


def test_changing_one_cell_changes_only_its_spec():
    before, _ = expand(filled(minimal()))
    config = minimal()
    config["methods"]["dense"]["params"] = {"lr": 0.01}
    after, _ = expand(filled(config))
    changed = {rid for rid in before if before[rid] != after[rid]}
    assert changed == {rid for rid, c in before.items() if c["method"] == "dense"}
    assert all(before[r]["cell_hash"] != after[r]["cell_hash"] for r in changed)


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c.update(bogus=1), "(top level)"),
    (lambda c: c["workloads"]["transformer"].update(batch_size=[4]), "workloads.transformer"),
    (lambda c: c["workloads"]["transformer"]["batch_sizes"].__setitem__(0, -1),
     "workloads.transformer.batch_sizes[0]"),
    (lambda c: c["methods"]["dense"].update(method="SGD!"), "methods.dense.method"),
    (lambda c: c["workloads"]["transformer"].update(targets=[1.5]), "workloads.transformer.targets[0]"),
    (lambda c: c.update(workloads={"Res-Net": {"batch_sizes": [1], "methods": ["dense"]}}), "workloads"),
])
def test_schema_names_the_bad_key(mutate, key):
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and error.startswith(f"key {key}:"), error


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["methods"]["dense"].update(method="sgd"),
     r"methods\.dense\.method: unknown method 'sgd'; known methods: \['comera', 'dense', 'galore', 'lte'\]"),
    (lambda c: c.update(workloads={"resnet": {"batch_sizes": [1], "methods": ["dense"]}}),
     r"workloads\.resnet: unknown workload 'resnet'; known: \['dlrm', 'mlm', 'transformer'\]"),
    (lambda c: c["workloads"]["transformer"].update(workload="resnet"),
     r"workloads\.transformer\.workload: unknown workload 'resnet'; known: \['dlrm', 'mlm', 'transformer'\]"),
])
def test_unknown_method_or_workload_module_named(mutate, message):
    config = minimal()
    mutate(config)
    with pytest.raises(grid.ConfigError, match=message):
        grid.check_config(filled(config))


def test_unknown_method_reference_named():
    config = filled(minimal())
    config["workloads"]["transformer"]["methods"].append("galore")
    with pytest.raises(grid.ConfigError, match=r"workloads\.transformer\.methods\[3\].*'galore'"):
        grid.check_config(config)


def test_a_budget_that_cannot_time_periodic_work_is_refused():
    """CoMERA prunes after steps 9, 19, ... (prune_every 10) and cannot be made to prune off its schedule:
    9 steps hold none, so their step times would leave the pruning out; 24 hold whole periods."""
    config = filled(minimal())
    config["workloads"]["transformer"]["budget"] = {"epochs": 1, "max_steps_per_epoch": 9, "warmup_steps": 2}
    config = filled(config)
    with pytest.raises(grid.ConfigError, match=r"workloads\.transformer\.budget: method 'comera' \(comera, "
                                               r"variant default\) does its 'comera pruning' every 10 steps"):
        grid.check_config(config)
    config["workloads"]["transformer"]["budget"]["max_steps_per_epoch"] = 24
    grid.check_config(config)
    # GaLore's projection can be forced: 9 steps with none on its schedule (steps 0, 20, ...) are fine
    config["methods"]["galore"] = {**config["methods"]["dense"], "method": "galore", "params": {}}
    config["workloads"]["transformer"]["methods"] = ["galore"]
    config["workloads"]["transformer"]["budget"]["max_steps_per_epoch"] = 9
    grid.check_config(filled(config))


def test_bad_method_param_named():
    config = filled(minimal())
    config["methods"]["dense"]["params"] = {"lr_typo": 1.0}
    with pytest.raises(grid.ConfigError, match=r"methods\.dense\.params.*lr_typo"):
        grid.check_config(config)


def test_missing_data_path_named(tmp_path):
    config = filled(minimal())
    missing = tmp_path / "no-such-mnli"
    config["workloads"]["transformer"]["params"] = {"size": "tiny", "data": "mnli", "data_dir": str(missing)}
    with pytest.raises(grid.ConfigError, match=r"workloads\.transformer\.params\.data_dir.*no-such-mnli"):
        grid.check_config(config)


def test_duplicate_cell_rejected():
    config = filled(minimal())
    config["workloads"]["transformer"]["methods"].append("dense")
    with pytest.raises(grid.ConfigError, match="appears twice"):
        expand(config)


def test_device_label_and_gpu_use(monkeypatch):
    import torch

    config = filled(minimal())
    assert grid.device_label(config) == "cpu" and not grid.uses_gpu(config)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config["execution"]["device"] = "cuda"
    assert grid.device_label(config) == "cuda" and grid.uses_gpu(config)  # e.g. a cluster login node
    config["execution"]["device"] = "auto"
    assert grid.device_label(config) == "cpu" and not grid.uses_gpu(config)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    assert grid.device_label(config) == "nvidia-h200" and grid.uses_gpu(config)
    config["device_name"] = "laptop-2"
    assert grid.device_label(config) == "laptop-2"
    assert grid.slug("NVIDIA GeForce RTX 3090") == "nvidia-geforce-rtx-3090"


def test_grid_file_from_specs(tmp_path):
    from harness import spec as specs

    cells, sweeps = expand(filled(minimal()))
    paths = []
    for rid, spec in grid.expand_grid(filled(minimal()))[0].items():
        paths.append(tmp_path / f"{rid}.spec.json")
        specs.write(spec, paths[-1])
    out = tmp_path / "grid.json"
    import json

    assert grid.main(["--out", str(out), "--sweeps", json.dumps(sweeps), *map(str, paths)]) == 0
    assert json.loads(out.read_text()) == {"cells": cells, "sweeps": sweeps}


@pytest.mark.parametrize("mutate, key, value", [
    (lambda c: c.update(results_dir="res$(touch /tmp/x)"), "results_dir", "res$(touch /tmp/x)"),
    (lambda c: c.update(figures_dir="my figures"), "figures_dir", "my figures"),
    (lambda c: c.update(results_dir="-rf"), "results_dir", "-rf"),
    (lambda c: c.update(compare={"dirs": ["results/gpu; rm -rf ~"]}), "compare.dirs[0]", "rm -rf"),
    (lambda c: c.update(device_name=".."), "device_name", "'..'"),
    (lambda c: c.update(device_name="a b"), "device_name", "'a b'"),
])
def test_paths_and_labels_reject_shell_metacharacters(mutate, key, value):
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and error.startswith(f"key {key}:") and value in error, error
    assert "no spaces" in error or "letters, digits" in error  # the rule, not only the regex


def test_plain_paths_and_labels_accepted():
    config = minimal()
    config.update(results_dir="/tmp/x/results-2.a_b+c@d", figures_dir="figures/tiny", device_name="gpu.a_1",
                  compare={"dirs": ["../other/results/nvidia-h200"]})
    assert grid.schema_error(config) is None


def test_label_pattern_matches_the_schema():
    assert config_schema()["$defs"]["label"]["pattern"] == grid.LABEL_PATTERN


@pytest.mark.parametrize("value", ["x;touch /tmp/y", "$(id)", ".", "..", "a/b", "a b"])
def test_device_environment_variable_checked(monkeypatch, value):
    monkeypatch.setenv("COMERA_BENCH_DEVICE", value)
    with pytest.raises(grid.ConfigError, match=r"COMERA_BENCH_DEVICE=.*" + re.escape(repr(value)[1:-1])):
        grid.env_device_label()
    monkeypatch.setenv("COMERA_BENCH_DEVICE", "nvidia-h200")
    assert grid.env_device_label() == "nvidia-h200"
    monkeypatch.delenv("COMERA_BENCH_DEVICE")
    assert grid.env_device_label() is None


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c["workloads"]["transformer"].update(batch_sizes=[4.0]),
     "workloads.transformer.batch_sizes[0]"),
    (lambda c: c.update(seeds=[0.0]), "seeds[0]"),
    (lambda c: c.update(execution={"threads": 2.0}), "execution.threads"),
    (lambda c: c["workloads"]["transformer"].update(budget={"epochs": 1.0}),
     "workloads.transformer.budget.epochs"),
])
def test_integer_fields_reject_floats(mutate, key):
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and error.startswith(f"key {key}:") and "integer" in error, error


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c["workloads"]["transformer"].update(targets=[float("nan")]),
     "workloads.transformer.targets[0]"),
    (lambda c: c["workloads"]["transformer"].update(budget={"time_limit_s": float("inf")}),
     "workloads.transformer.budget.time_limit_s"),
    (lambda c: c["methods"]["dense"].update(params={"lr": float("nan")}), "methods.dense.params.lr"),
    (lambda c: c["workloads"]["transformer"]["params"].update(dropout=float("-inf")),
     "workloads.transformer.params.dropout"),
])
def test_non_finite_numbers_rejected_everywhere(mutate, key):
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and error.startswith(f"key {key}:") and "not a finite number" in error, error


BATCH = "workloads.transformer.batch_sizes[0]"


@pytest.mark.parametrize("mutate, key, bound", [
    (lambda c: c["workloads"]["transformer"].update(batch_sizes=[10**30]), BATCH, "2**32"),
    (lambda c: c["workloads"]["transformer"].update(batch_sizes=[2**21]), BATCH, "maximum of 1048576"),
    (lambda c: c["workloads"]["transformer"].update(budget={"epochs": 10**18}),
     "workloads.transformer.budget.epochs", "2**32"),
    (lambda c: c["workloads"]["transformer"].update(budget={"epochs": 10**6}),
     "workloads.transformer.budget.epochs", "maximum of 100000"),
    (lambda c: c.update(execution={"rounds": 10**12}), "execution.rounds", "2**32"),
    (lambda c: c.update(execution={"rounds": 10**6}), "execution.rounds", "maximum of 1000"),
    (lambda c: c.update(execution={"threads": 10**6}), "execution.threads", "maximum of 1024"),
    (lambda c: c["methods"]["dense"].update(params={"lr": 1e308}), "methods.dense.params.lr", "2**32"),
    (lambda c: c["workloads"]["transformer"]["params"].update(d_model=2**62),
     "workloads.transformer.params.d_model", "2**32"),
])
def test_numbers_too_large_for_a_cell_are_refused_naming_the_key(mutate, key, bound):
    """Values that would crash every cell using them (an integer overflow with no row) or run it for
    ever are refused by the config check (hence by ``snakemake -n``)."""
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and error.startswith(f"key {key}:") and bound in error, error


def test_a_config_with_a_huge_comment_is_read_quickly(tmp_path):
    """A 10 MB comment: the config's own check reads it with libyaml (27 s with PyYAML's Python parser)."""
    import time

    path = tmp_path / "big.yaml"
    path.write_text("seeds: [0]\n# " + "x" * 10_000_000 + "\n")
    started = time.process_time()  # this process's CPU time: a busy machine does not add to it
    assert grid.load_config_file(path) == {"seeds": [0]}
    assert time.process_time() - started < 10


def test_duplicated_yaml_key_rejected_naming_file_and_key(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("methods:\n  dense: {method: dense}\nseeds: [0]\nmethods:\n  comera: {method: comera}\n")
    # what Snakemake sees
    assert yaml.safe_load(path.read_text())["methods"] == {"comera": {"method": "comera"}}
    with pytest.raises(grid.ConfigError, match=rf"{re.escape(str(path))}: key 'methods' appears twice "
                                               r"\(lines 1 and 4\)"):
        grid.load_config_file(path)
    path.write_text("methods:\n  dense: {method: dense}\n  dense: {method: galore}\n")
    with pytest.raises(grid.ConfigError, match="key 'dense' appears twice"):
        grid.load_config_file(path)
    path.write_text("base: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n")  # a merge key overridden: allowed
    assert grid.load_config_file(path) == {"base": {"x": 1}, "m": {"x": 2}}


@pytest.mark.parametrize("where", ["params", "sweep"])
def test_comera_rank_zero_rejected(where):
    config = filled(minimal())
    entry = config["methods"]["comera-rank"]
    if where == "params":
        entry.update(sweep={}, params={"rank": 0})
    else:
        entry["sweep"] = {"rank": [4, 0]}
    message = rf"methods\.comera-rank\.{where}.*'rank' must be an integer >= 1 or null, got 0"
    with pytest.raises(grid.ConfigError, match=message):
        grid.check_config(config)


def test_quality_cells_have_their_own_budget_params_and_run_ids():
    config = minimal()
    config["workloads"]["transformer"]["quality"] = {
        "params": {"eval_samples": 64}, "batch_sizes": [8], "targets": [0.5], "methods": ["dense", "comera"],
        "budget": {"max_steps_per_epoch": 50, "eval_every_steps": 10}}
    cells, _ = expand(filled(config))
    timing = {k: c for k, c in cells.items() if c["purpose"] == "timing"}
    quality = {k: c for k, c in cells.items() if c["purpose"] == "quality"}
    assert len(timing) == 8  # as without the block: timing run_ids and hashes do not change
    assert timing == expand(filled(minimal()))[0]
    assert sorted(quality) == ["transformer_comera-default_b8_t0.5_s0_quality",
                               "transformer_dense-default_b8_tnone_s0_quality"]
    for spec in quality.values():  # resolved: the tiny preset with the quality block's eval_samples
        assert spec["workload_params"]["size"] == "tiny" and spec["workload_params"]["eval_samples"] == 64
        assert spec["budget"]["max_steps_per_epoch"] == 50 and spec["budget"]["eval_every_steps"] == 10


@pytest.mark.parametrize("block, key", [
    ({"batch_sizes": [8], "methods": ["dense"]}, "budget"),                      # a budget is required
    ({"batch_sizes": [8], "methods": ["dense"], "budget": {}, "extra": 1}, "extra"),
    ({"batch_sizes": [8], "methods": ["nope"], "budget": {}}, "quality.methods[0]"),
    ({"batch_sizes": [8], "methods": ["dense"], "budget": {}, "params": {"size": "huge"}}, "quality.params"),
])
def test_bad_quality_blocks_are_named(block, key):
    config = minimal()
    config["workloads"]["transformer"]["quality"] = block
    error = grid.schema_error(config)
    if error is None:
        with pytest.raises(grid.ConfigError, match=re.escape(key)):
            grid.check_config(filled(config))
    else:
        assert key in error


def test_workload_sweep_runs_every_cell_once_per_point():
    config = minimal()
    config["workloads"]["transformer"]["sweep"] = {"seq_len": [24, 32]}
    config["workloads"]["transformer"]["params"]["max_positions"] = 32
    cells, _ = expand(filled(config))
    assert len(cells) == 2 * 8
    assert {c["workload_params"]["seq_len"] for c in cells.values()} == {24, 32}
    assert "transformer_dense-default_b2_tnone_s0_seq_len32" in cells
    grid.check_config(filled(config))
    config["workloads"]["transformer"]["sweep"] = {"seq_len": [16, 64]}  # 64 > max_positions
    with pytest.raises(grid.ConfigError, match="seq_len"):
        grid.check_config(filled(config))


def test_a_grid_cells_spec_made_again_is_the_same_cell():
    """One run_id scheme and one pair of hashes (harness.spec; its defaults are the schema's:
    tests/harness/test_spec.py): a grid cell's spec made again from its JSON without its name is itself,
    named by the grid's scheme and its cell hash."""
    from harness import spec as specs

    cells, _ = expand(filled(minimal()))
    for spec in cells.values():
        bare = {k: v for k, v in spec.items() if k not in ("run_id", "cell_hash", "execution_hash")}
        again = specs.make(bare).to_dict()
        assert again == {**spec, "run_id": f"{spec['run_id']}_c{spec['cell_hash'][:8]}"}


@pytest.mark.parametrize("purpose", ["timing", "quality"])
def test_the_cli_and_the_pipeline_give_a_cell_one_identity(purpose):
    """The same cell from `comera-bench run` options and from a config's grid: the same spec and hashes
    (harness.spec.make, once for both); the CLI's name is the grid's with the cell hash."""
    from harness import cli
    from harness import spec as specs

    config = {
        "execution": {"interleave": False},  # the CLI runs one cell alone
        "methods": {"comera": {"method": "comera", "uses_target": True, "params": {"size_weight": 10.0}}},
        "workloads": {"transformer": {"params": {"size": "tiny"}, "batch_sizes": [4], "targets": [0.5],
                                      "methods": ["comera"],
                                      "budget": {"epochs": 1, "max_steps_per_epoch": 13, "warmup_steps": 1,
                                                 "eval_every_steps": 6}}},
    }
    if purpose == "quality":
        config["workloads"]["transformer"]["quality"] = {
            "params": {"eval_samples": 64}, "batch_sizes": [4], "targets": [0.5], "methods": ["comera"],
            "budget": {"max_steps_per_epoch": 13, "warmup_steps": 1, "eval_every_steps": 6}}
    cells, _ = expand(filled(config))
    from_grid = next(c for c in cells.values() if c["purpose"] == purpose)
    args = cli._parser().parse_args(
        ["run", "--workload", "transformer", "--method", "comera", "--batch-size", "4", "--target-ratio",
         "0.5", "--method-param", "size_weight=10", "--workload-param", "size=tiny",
         "--max-steps-per-epoch", "13", "--warmup-steps", "1", "--eval-every-steps", "6"]
        + (["--purpose", "quality", "--workload-param", "eval_samples=64"] if purpose == "quality" else []))
    from_cli = specs.make(cli.spec_from_args(args)).to_dict()
    assert from_cli["run_id"] == f"{from_grid['run_id']}_c{from_grid['cell_hash'][:8]}"
    for key in ("cell_hash", "execution_hash"):
        assert from_cli[key] == from_grid[key]
    assert from_cli == {**from_grid, "run_id": from_cli["run_id"]}


def test_a_cli_cell_and_a_grid_cell_of_one_name_are_one_cell():
    """`comera-bench run ... --purpose quality` without the config's quality block trains another task
    than the grid's quality cell of the same options: it must not take that cell's name (equal names,
    equal cells). The shipped config's quality cell and the issue's command."""
    from harness import cli
    from harness import spec as specs

    config = filled(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    config["execution"]["threads"] = 2  # 'auto' is resolved by the pipeline first
    cells, _ = expand(config)
    from_grid = cells["transformer_dense-default_b32_tnone_s0_quality"]
    args = cli._parser().parse_args(["run", "--workload", "transformer", "--method", "dense", "--batch-size",
                                     "32", "--seed", "0", "--purpose", "quality"])
    from_cli = specs.make(cli.spec_from_args(args)).to_dict()
    assert from_cli["cell_hash"] != from_grid["cell_hash"]  # another task: the quality block not applied
    assert from_cli["run_id"] != from_grid["run_id"]
    assert from_cli["run_id"] == f"{from_grid['run_id']}_c{from_cli['cell_hash'][:8]}"


def test_a_budget_without_a_timed_step_is_refused():
    config = minimal()
    config["workloads"]["transformer"]["budget"] = {"max_steps_per_epoch": 3, "warmup_steps": 3}
    with pytest.raises(grid.ConfigError, match=r"workloads\.transformer\.budget\.warmup_steps: 3 warm-up "
                                               r"step\(s\) of 3 leave no timed step"):
        grid.check_config(filled(config))



@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.update(seeds=[4294967296]), "key seeds[0]: 4294967296 is greater than the maximum"),
    (lambda c: c.update(device_name="d" * 300), "key device_name"),
    (lambda c: c["methods"]["dense"].update(variant="v" * 240), "key methods.dense.variant"),
])
def test_values_that_would_fail_every_cell_are_refused_by_the_schema(mutate, message):
    config = minimal()
    mutate(config)
    error = grid.schema_error(config)
    assert error is not None and message in error, error


def test_seq_len_too_short_for_the_synthetic_pairs_is_refused():
    config = minimal()
    config["workloads"]["transformer"]["params"]["seq_len"] = 12  # tiny: premise 10 + hypothesis 4 + 4
    with pytest.raises(grid.ConfigError, match=r"seq_len=12 is too short for premise_len \+ hypothesis_len"):
        grid.check_config(filled(config))


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):  # 10^9 values once expanded, 1.5 KB of text
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(grid.ConfigError, match=r"bomb.yaml: more than 100000 values once its YAML aliases"):
        grid.load_config_file(path)  # the walk stops at the limit: no expansion of the 10^9 values


def test_a_config_with_a_few_aliases_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {epochs: 1}\nworkloads: {t: {budget: *b}}\n")
    assert grid.load_config_file(path)["workloads"]["t"]["budget"] == {"epochs": 1}


def test_a_list_where_a_size_belongs_is_named():
    config = minimal()
    config["workloads"]["transformer"]["params"]["size"] = [1, 2]
    message = r"parameter 'size' must be one of \['tiny', 'small', 'paper'\], got \[1, 2\]"
    with pytest.raises(grid.ConfigError, match=message):
        grid.check_config(filled(config))


def test_compile_is_a_grid_axis_timed_with_the_eager_cells():
    config = minimal()
    config["execution"] = {"compile": [False, True]}
    cells, _ = expand(filled(config))
    compiled = {rid: c for rid, c in cells.items() if c["execution"]["compile"]}
    assert len(compiled) == len(cells) // 2 and all(rid.endswith("_compiled") for rid in compiled)
    eager = cells[next(iter(compiled)).removesuffix("_compiled")]
    assert (eager["execution"]["timing_group"]
            == compiled[eager["run_id"] + "_compiled"]["execution"]["timing_group"])
    single = filled(minimal())
    single["execution"]["compile"] = True  # one boolean is one value
    assert all(rid.endswith("_compiled") for rid in expand(single)[0])


def test_matmul_precision_is_a_grid_axis_in_the_cell_identity():
    config = minimal()
    config["execution"] = {"matmul_precision": ["highest", "high"]}
    config["workloads"]["transformer"]["methods"].append({"name": "dense", "batch_sizes": [4],
                                                          "matmul_precision": ["medium"]})
    cells, _ = expand(filled(config))
    by_precision = {p: {rid for rid, c in cells.items() if c["execution"]["matmul_precision"] == p}
                    for p in ("highest", "high", "medium")}
    assert len(by_precision["high"]) == len(by_precision["highest"]) and all(
        rid.endswith("_matmul-high") for rid in by_precision["high"])
    assert by_precision["medium"] == {"transformer_dense-default_b4_tnone_s0_matmul-medium"}
    full = cells["transformer_dense-default_b4_tnone_s0"]
    tf32 = cells["transformer_dense-default_b4_tnone_s0_matmul-high"]
    assert full["cell_hash"] == tf32["cell_hash"] and full["execution_hash"] != tf32["execution_hash"]
    assert full["execution"]["timing_group"] == tf32["execution"]["timing_group"]  # timed together
    config["execution"] = {"matmul_precision": ["fast"]}
    assert "matmul_precision[0]: 'fast' is not one of" in grid.schema_error(config)


def test_finished_cells_are_those_whose_three_files_exist(tmp_path):
    """only_finished's grid: a cell whose job was stopped has no runs/curves file (written atomically at
    its end), so it is left out; the order stays the grid's."""
    cells, _ = grid.expand_grid(filled(minimal()))
    done, stopped, *rest = list(cells)
    every = ("spec.json", "runs.parquet", "curves.parquet")
    for rid, kinds in ((done, every), (stopped, every[:2]), (rest[-1], every)):
        for kind in kinds:
            (tmp_path / f"{rid}.{kind}").write_text("x")
    assert list(grid.finished(cells, tmp_path)) == [done, rest[-1]]
    assert grid.finished(cells, tmp_path / "missing") == {}


def test_the_default_grid_draws_fig9_and_fig10_from_quality_cells_of_two_seeds():
    """Fig 9 and Fig 10 come from DLRM and MLM cells trained to learn (docs/workloads.md), dense and
    CoMERA side by side, seeds 0 and 1, not from the 20- and 30-step timing cells."""
    config = filled(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    config["execution"]["threads"] = 1  # "auto" is resolved before the grid is expanded
    cells, _ = expand(config)
    for workload in ("dlrm", "mlm"):
        quality = [c for c in cells.values() if c["workload"] == workload and c["purpose"] == "quality"]
        assert sorted((c["method"], c["seed"]) for c in quality) == [
            ("comera", 0), ("comera", 1), ("dense", 0), ("dense", 1)], workload
        assert all(c["target_ratio"] is None for c in quality)


def test_the_papers_comera_runs_beside_the_projects_at_targets_half_and_a_fifth():
    """The default grid's transformer quality cells run CoMERA under the paper's rules (variant "paper",
    ``rules: paper``) at targets 0.5 and 0.2 only, on both seeds, beside the project's rules with the
    target as a deadline (variant "reach", ``reach_target``) at both targets, which the size-matched models
    match; config/paper.yaml has all three in the transformer's quality cells."""
    config = filled(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    config["execution"]["threads"] = 1
    cells, _ = expand(config)
    quality = [c for c in cells.values() if c["workload"] == "transformer" and c["purpose"] == "quality"
               and c["method"] == "comera"]
    paper = sorted((c["target_ratio"], c["seed"]) for c in quality if c["variant"] == "paper")
    assert paper == [(0.2, 0), (0.2, 1), (0.5, 0), (0.5, 1)]
    assert all(c["method_params"]["rules"] == "paper" and "size_weight" not in c["method_params"]
               for c in quality if c["variant"] == "paper")
    assert sorted({c["target_ratio"] for c in quality if c["variant"] == "reach"}) == [0.2, 0.5]
    assert all(c["method_params"]["reach_target"] for c in quality if c["variant"] == "reach")
    assert not [c for c in quality if c["variant"] == "default"]  # the library's defaults: config/paper.yaml
    matched = [c["method_params"]["match_run"] for c in cells.values() if c["method_params"].get("match_run")]
    assert matched and all("_comera-reach_" in run for run in matched)
    full = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert full["methods"]["comera-paper"]["params"] == {"rules": "paper", "loss_target": 0.8}  # MNLI's L0
    methods = full["workloads"]["transformer"]["quality"]["methods"]
    assert methods.index("comera-paper") == methods.index("comera") + 2  # comera-reach between them


def matched_config() -> dict:
    config = minimal()
    config["methods"]["dense-matched"] = {"method": "dense", "variant": "size-matched", "match": "comera"}
    config["methods"]["comera-fixed"] = {"method": "comera", "variant": "fixed-rank", "match": "comera"}
    config["workloads"]["transformer"]["quality"] = {
        "batch_sizes": [8], "targets": [0.8, 0.5, 0.2], "seeds": [0, 1],
        "budget": {"max_steps_per_epoch": 20},
        "methods": ["dense", {"name": "dense-matched", "targets": [0.5, 0.2]}, "comera", "comera-fixed"]}
    return config


def test_a_matched_cell_names_the_comera_cell_of_its_target_batch_and_seed_and_has_no_target():
    config = filled(matched_config())
    grid.check_config(config)
    cells, _ = expand(config)
    dense = {k: c for k, c in cells.items() if c["variant"] == "size-matched"}
    fixed = {k: c for k, c in cells.items() if c["variant"] == "fixed-rank"}
    assert sorted(dense) == [f"transformer_dense-size-matched_b8_t{t}_s{s}_quality"
                             for t in ("0.2", "0.5") for s in (0, 1)]
    assert len(fixed) == 6  # every CoMERA target when the reference names none
    for rid, cell in {**dense, **fixed}.items():
        source = cells[cell["method_params"]["match_run"]]
        assert (source["method"], source["variant"], source["purpose"]) == ("comera", "default", "quality")
        assert (source["seed"], source["batch_size"]) == (cell["seed"], cell["batch_size"])
        assert f"_t{source['target_ratio']:g}_" in rid and cell["target_ratio"] is None
    from harness import spec as specs

    bare = {k: v for k, v in dense["transformer_dense-size-matched_b8_t0.5_s1_quality"].items()
            if k not in ("run_id", "cell_hash", "execution_hash")}
    made = specs.make(bare)  # one identity: the same cell, its name derived with the cell hash
    assert made.run_id.startswith("transformer_dense-size-matched_b8_t0.5_s1_quality_c")
    assert made.cell_hash == dense["transformer_dense-size-matched_b8_t0.5_s1_quality"]["cell_hash"]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["workloads"]["transformer"]["quality"]["methods"].remove("comera"),
     "matches 'comera', which this block does not run"),
    (lambda c: c["workloads"]["transformer"]["quality"]["methods"].__setitem__(
        1, {"name": "dense-matched", "targets": [0.3]}), r"targets \[0.3\] must be among 'comera'"),
    (lambda c: c["workloads"]["transformer"]["methods"].append("dense-matched"), "quality blocks only"),
    (lambda c: c["methods"]["dense-matched"].__setitem__("match", "dense"), "methods.dense-matched.match"),
    (lambda c: c["methods"].__setitem__("galore-matched", {"method": "galore", "match": "comera"}),
     "takes no param match_run"),
])
def test_bad_matches_are_named(mutate, message):
    config = matched_config()
    mutate(config)
    with pytest.raises(grid.ConfigError, match=message):
        grid.check_config(filled(config))


def test_the_train_rule_runs_a_matched_cell_after_the_cell_it_matches(tmp_path):
    """Snakemake's dry run of the matched config: the size-matched cell's job lists the CoMERA cell's runs
    file as an input."""
    import subprocess
    import sys

    config = matched_config()
    config["workloads"]["transformer"]["quality"].update(targets=[0.5], seeds=[0])
    config["workloads"]["transformer"]["quality"]["methods"] = ["dense-matched", "comera"]
    config.update(device_name="cpu-test", results_dir=str(tmp_path / "results"),
                  figures_dir=str(tmp_path / "figures"), execution={"device": "cpu", "threads": 1})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cells = tmp_path / "results" / "runs" / "cpu-test"
    target = cells / "transformer_dense-size-matched_b8_t0.5_s0_quality.runs.parquet"
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                          "--directory", str(tmp_path), "--printshellcmds", str(target)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    source = cells / "transformer_comera-default_b8_t0.5_s0_quality.runs.parquet"
    inputs = {line.split("output: ")[1].split(",")[0]: previous.split("input: ")[1].split(", ")
              for previous, line in zip(out.stdout.splitlines(), out.stdout.splitlines()[1:])
              if line.strip().startswith("output: ") and "input: " in previous}
    assert str(source) in inputs[str(target)]
    assert str(source) in inputs  # the cell it matches is a job of the same run


@pytest.mark.parametrize("workload", ["mlm", "dlrm"])
def test_the_size_matched_dense_model_on_a_workload_without_smaller_models_is_refused(workload):
    """``match`` on the dense method needs a workload that builds smaller models of its kind (the
    transformer's ``sized_candidates``): on MLM or DLRM every such cell would end as an error row after it
    ran, so the config check names the workload entry's method reference, the method configuration, the
    workload and why."""
    config = matched_config()
    grid.check_config(filled(config))  # the transformer has them
    config["workloads"][workload] = {"params": {"size": "tiny"}, "batch_sizes": [4], "methods": ["dense"],
                                     "quality": {"batch_sizes": [4], "methods": ["comera", "dense-matched"],
                                                 "targets": [0.5], "budget": {}}}
    with pytest.raises(grid.ConfigError) as err:
        grid.check_config(filled(config))
    assert str(err.value) == (
        f"config key workloads.{workload}.quality.methods[1]: method configuration 'dense-matched' (method "
        f"'dense') cannot run on workload {workload!r}: its size-matched dense model (match) is chosen among "
        f"smaller models of the workload's kind, and workload {workload!r} offers no sized_models (its "
        "module defines no sized_candidates; docs/workloads.md); leave 'dense-matched' out of this "
        "workload's methods")
