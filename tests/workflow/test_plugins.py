"""Plug-ins by file (harness/plugins.py): a toy method and a toy workload, each one file in a folder
named by COMERA_BENCH_PLUGINS, run through the real pipeline on a tiny grid; nothing in the repository
changes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from harness import plugins
from tests.workflow.test_pipeline import ENV, ROOT, snakemake_cmd

TOY_METHOD = '''
"""Plain SGD on every parameter (a toy method plug-in)."""
import torch
from baselines import validate_params
from baselines.base import Prepared

def check_params(params):
    return validate_params("toy_sgd", params, {"lr": 0.1})

class ToySGD:
    name, variant = "toy_sgd", "default"

    def prepare(self, model, workload, params, *, target_ratio, total_steps):
        params = check_params(params)
        return Prepared(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=params["lr"])],
                        settings={"lr": params["lr"]})

METHOD = ToySGD
'''

TOY_WORKLOAD = '''
"""y = x w + noise with a small MLP (a toy workload plug-in); metric: validation MSE."""
import torch
from torch import nn
from harness.workloads.base import Workload, evaluating, seeded_model
from harness.workloads.params import Field, WorkloadParams

PRESETS = {"tiny": {"samples": 64}, "small": {"samples": 256}, "paper": {"samples": 1024}}

class PARAMS(WorkloadParams):
    samples: int = Field(gt=0)
    features: int = Field(8, gt=0)

def validate(params):
    pass

def build(p, *, batch_size, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p["samples"], p["features"], generator=g)
    y = x @ torch.randn(p["features"], 1, generator=g) + 0.01 * torch.randn(p["samples"], 1, generator=g)
    model = seeded_model(lambda q: nn.Sequential(nn.Linear(q["features"], 16), nn.ReLU(), nn.Linear(16, 1)),
                         p, seed, device)
    n = p["samples"] // batch_size

    def batches(epoch):
        for i in range(n):
            yield {"x": x[i * batch_size:(i + 1) * batch_size].to(device),
                   "y": y[i * batch_size:(i + 1) * batch_size].to(device)}

    def loss(m, b):
        return nn.functional.mse_loss(m(b["x"]), b["y"])

    def evaluate(m):
        with evaluating(m):
            return {"metric_name": "mse",
                    "metric_value": float(loss(m, {"x": x.to(device), "y": y.to(device)}))}

    return Workload(name="toy_reg", model=model, tt_spec={}, train_batches=batches,
                    eval_batches=lambda: batches(0), loss=loss, evaluate=evaluate, steps_per_epoch=n,
                    metric_name="mse", lr={"dense": 1e-2})
'''


@pytest.fixture
def plugin_dir(tmp_path):
    folder = tmp_path / "plugins"
    (folder / "methods").mkdir(parents=True)
    (folder / "workloads").mkdir()
    (folder / "methods" / "toy_sgd.py").write_text(TOY_METHOD)
    (folder / "workloads" / "toy_reg.py").write_text(TOY_WORKLOAD)
    return folder


@pytest.mark.slow
def test_toy_method_and_workload_run_through_the_pipeline(plugin_dir, tmp_path):
    config = {"device_name": "cpu-plugins", "execution": {"device": "cpu", "threads": 1},
              "methods": {"dense": {"method": "dense"}, "toy": {"method": "toy_sgd", "params": {"lr": 0.05}}},
              "workloads": {"toy_reg": {"params": {"size": "tiny"}, "batch_sizes": [8],
                                        "methods": ["dense", "toy"],
                                        "budget": {"epochs": 1, "max_steps_per_epoch": 8, "warmup_steps": 1,
                                                   "eval_every_steps": 4}}},
              "microbench": {"specs": {}}}
    configfile = tmp_path / "plugins.yaml"
    configfile.write_text(yaml.safe_dump(config))
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    env = {**ENV, plugins.ENV: str(plugin_dir)}
    proc = subprocess.run(snakemake_cmd(tmp_path / "wd", configfile, "results/cpu-plugins/runs.parquet"),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = pd.read_parquet(tmp_path / "wd" / "results" / "cpu-plugins" / "runs.parquet").set_index("method")
    assert set(runs.index) == {"dense", "toy_sgd"} and (runs.status == "ok").all(), runs[["status", "error"]]
    assert (runs.metric_name == "mse").all() and runs.timing_group.nunique() == 1  # timed together
    assert runs.loc["toy_sgd", "settings"].count('"lr": 0.05') == 2  # its own settings and params
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before


def test_bad_plugins_are_named(tmp_path, monkeypatch):
    for kind, name, text, message in (
            ("methods", "Bad-Name", "METHOD = 1\n", "name must match"),
            ("methods", "dense", "METHOD = 1\n", "'dense' exists already"),
            ("workloads", "noop", "x = 1\n", "no line matching")):
        folder = tmp_path / name
        (folder / kind).mkdir(parents=True)
        (folder / kind / f"{name}.py").write_text(text)
        monkeypatch.setenv(plugins.ENV, str(folder))
        package = ROOT / ("baselines" if kind == "methods" else "harness/workloads")
        with pytest.raises(plugins.PluginError, match=message):
            plugins.discover(kind, package)
    broken = tmp_path / "broken"
    (broken / "methods").mkdir(parents=True)
    (broken / "methods" / "oops.py").write_text("METHOD = undefined_name\n")
    monkeypatch.setenv(plugins.ENV, str(broken))
    found = plugins.discover("methods", ROOT / "baselines")
    with pytest.raises(plugins.PluginError, match=r"oops.py failed to import: NameError"):
        plugins.load("methods", "oops", found["oops"], "baselines")


def test_a_missing_plugin_folder_is_named(tmp_path, monkeypatch):
    """A typo in COMERA_BENCH_PLUGINS is named, not left to surface as 'unknown method'."""
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv(plugins.ENV, os.pathsep.join([str(tmp_path), str(missing)]))
    with pytest.raises(plugins.PluginError,
                       match=re.escape(f"{plugins.ENV} names {missing}, which is not a folder")):
        plugins.discover("methods", ROOT / "baselines")


@pytest.mark.slow
def test_the_cli_names_a_missing_plugin_folder(tmp_path, capsys):
    missing = tmp_path / "typo"
    script = ("import sys; from harness import cli; "
              "sys.exit(cli.main(['run', '--workload', 'transformer', '--method', 'dense', '--batch-size', "
              "'2']))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, plugins.ENV: str(missing)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{plugins.ENV} names {missing}, which is not a folder" in proc.stderr


@pytest.mark.slow
def test_a_dry_run_runs_plugin_code_as_the_docs_say(plugin_dir, tmp_path):
    """docs/architecture.md: a plug-in's top-level code runs on every Snakemake call, -n included."""
    marker = tmp_path / "imported"
    method = plugin_dir / "methods" / "toy_sgd.py"
    method.write_text(f"open({str(marker)!r}, 'w').close()\n" + method.read_text())
    config = {"device_name": "cpu-plugins", "execution": {"device": "cpu", "threads": 1},
              "methods": {"toy": {"method": "toy_sgd"}},
              "workloads": {"toy_reg": {"params": {"size": "tiny"}, "batch_sizes": [8], "methods": ["toy"]}},
              "microbench": {"specs": {}}}
    configfile = tmp_path / "plugins.yaml"
    configfile.write_text(yaml.safe_dump(config))
    proc = subprocess.run(snakemake_cmd(tmp_path / "wd", configfile, "-n"), capture_output=True, text=True,
                          env={**ENV, plugins.ENV: str(plugin_dir)}, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Plug-ins")[1].split("\n## ")[0]
    assert "Plug-ins are code" in section and "dry run `-n` included" in section


@pytest.mark.slow
def test_the_data_cache_lies_in_the_results_folder(plugin_dir, tmp_path):
    """The pipeline's jobs and `comera-bench run` cache data under their results folder, not the cwd's."""
    workload = plugin_dir / "workloads" / "toy_reg.py"
    workload.write_text(workload.read_text().replace(
        "    n = p[\"samples\"] // batch_size\n",
        "    from harness.data.cache import cache_dir\n"
        "    (cache_dir(None, 'toy') / 'built').write_text('1')\n"
        "    n = p[\"samples\"] // batch_size\n"))
    elsewhere = tmp_path / "elsewhere"
    config = {"device_name": "cpu-plugins", "results_dir": str(elsewhere),
              "execution": {"device": "cpu", "threads": 1}, "methods": {"dense": {"method": "dense"}},
              "workloads": {"toy_reg": {"params": {"size": "tiny"}, "batch_sizes": [8], "methods": ["dense"],
                                        "budget": {"epochs": 1, "max_steps_per_epoch": 4,
                                                   "warmup_steps": 1}}},
              "microbench": {"specs": {}}}
    configfile = tmp_path / "cache.yaml"
    configfile.write_text(yaml.safe_dump(config))
    env = {**ENV, plugins.ENV: str(plugin_dir)}
    env.pop("COMERA_BENCH_CACHE_DIR", None)
    proc = subprocess.run(snakemake_cmd(tmp_path / "wd", configfile, "runs"), capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (elsewhere / "cache" / "toy" / "built").exists()
    assert not (tmp_path / "wd" / "results").exists() and not (ROOT / "results" / "cache" / "toy").exists()
    cli_dir = tmp_path / "cli"
    run = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--workload", "toy_reg", "--method",
                          "dense", "--batch-size", "8", "--device", "cpu", "--max-steps-per-epoch", "3",
                          "--results-dir", str(cli_dir)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (cli_dir / "cache" / "toy" / "built").exists() and not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_runs_file_of_another_config_fails_the_merge(plugin_dir, tmp_path):
    """A cell's runs file replaced by one of another config (another budget: another cell_hash) is named
    by the merge, not merged under this grid's spec (it once was, silently)."""
    config = {"device_name": "cpu-plugins", "execution": {"device": "cpu", "threads": 1},
              "methods": {"dense": {"method": "dense"}},
              "workloads": {"toy_reg": {"params": {"size": "tiny"}, "batch_sizes": [8], "methods": ["dense"],
                                        "budget": {"epochs": 1, "max_steps_per_epoch": 4,
                                                   "warmup_steps": 1}}},
              "microbench": {"specs": {}}}
    configfile = tmp_path / "one.yaml"
    configfile.write_text(yaml.safe_dump(config))
    env = {**ENV, plugins.ENV: str(plugin_dir)}
    workdir = tmp_path / "wd"
    proc = subprocess.run(snakemake_cmd(workdir, configfile, "results/cpu-plugins/runs.parquet"),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 3 timed steps: a noisy cell, and the hint to time it again repeats this config
    assert (f"comera-bench noisy {workdir}/results/runs/cpu-plugins --delete && snakemake --cores 1 figures "
            f"--directory {workdir} --configfile {configfile}") in proc.stderr
    assert "not timed in its group's interleaved rounds" not in proc.stderr  # alone in its group: timed alone
    (cell,) = (workdir / "results" / "runs" / "cpu-plugins").glob("*.runs.parquet")
    foreign = pd.read_parquet(cell).assign(cell_hash="0123456789abcdef")  # as a copy from another config
    foreign.to_parquet(cell)
    proc = subprocess.run(snakemake_cmd(workdir, configfile, "results/cpu-plugins/runs.parquet"),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    out = proc.stdout + proc.stderr
    log = (workdir / "results" / "cpu-plugins" / "logs" / "merge_runs.log").read_text()
    assert proc.returncode != 0 and not (workdir / "results" / "cpu-plugins" / "runs.parquet").exists()
    assert (f"{cell.relative_to(workdir)}: its row of cell {cell.name.removesuffix('.runs.parquet')} was "
            "run from another spec") in log
    assert cell.name in out


@pytest.mark.slow
def test_a_cell_out_of_memory_beside_its_group_is_timed_alone(plugin_dir, tmp_path):
    """A method that runs out of memory while its timing group's processes share the machine (a toy that
    fails whenever a round coordinator is there) is timed again by itself after the group: its row is ok,
    in no timing group, says why, and the tables name it; its first log is kept."""
    method = plugin_dir / "methods" / "toy_big.py"
    method.write_text(TOY_METHOD.replace('"toy_sgd"', '"toy_big"').replace("ToySGD", "ToyBig").replace(
        "        params = check_params(params)\n",
        "        params = check_params(params)\n"
        "        import os\n"
        "        if os.environ.get('COMERA_BENCH_ROUNDS'):\n"
        "            raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB "
        "(toy)')\n"))
    config = {"device_name": "cpu-plugins", "execution": {"device": "cpu", "threads": 1, "rounds": 2},
              "methods": {"dense": {"method": "dense"}, "big": {"method": "toy_big"}},
              "workloads": {"toy_reg": {"params": {"size": "tiny"}, "batch_sizes": [8],
                                        "methods": ["dense", "big"],
                                        "budget": {"epochs": 1, "max_steps_per_epoch": 8, "warmup_steps": 1,
                                                   "eval_every_steps": None}}},
              "microbench": {"specs": {}}}
    configfile = tmp_path / "big.yaml"
    configfile.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "wd"
    proc = subprocess.run(snakemake_cmd(workdir, configfile, "figures"), capture_output=True, text=True,
                          env={**ENV, plugins.ENV: str(plugin_dir)}, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("toy_reg_toy_big-default_b8_tnone_s0 ran out of memory beside its timing group: timing it alone"
            in proc.stderr)
    runs = pd.read_parquet(workdir / "results" / "cpu-plugins" / "runs.parquet").set_index("method")
    assert (runs.status == "ok").all(), runs[["status", "error"]]
    assert (runs.loc["dense", "timing_group"] == "toy_reg_b8_s0"
            and pd.isna(runs.loc["toy_big", "timing_group"]))
    reason = json.loads(runs.loc["toy_big", "extra"])["timed_alone"]
    assert reason.startswith("it ran out of memory while the 2 cells of its timing group shared the memory")
    assert "OutOfMemoryError" in reason or "CUDA out of memory" in reason
    logs = workdir / "results" / "runs" / "cpu-plugins" / "logs"
    assert "CUDA out of memory" in (logs / "toy_reg_toy_big-default_b8_tnone_s0.log.in-group").read_text()
    table = (workdir / "figures" / "table_runs.csv")
    assert (pd.read_csv(table).set_index("run_id").loc["toy_reg_toy_big-default_b8_tnone_s0", "timed_alone"]
            == "yes")
    assert "cells timed alone after running out of memory beside their timing group" in (
        workdir / "figures" / "overview.md").read_text()
