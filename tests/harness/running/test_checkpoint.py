"""A cell stopped in mid-training resumes from its checkpoint (harness.running.checkpoint) and ends as the
cell that was never stopped; a checkpoint that does not fit the cell is not used, and the log says why."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import results
from harness.running import checkpoint as checkpoints
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec

STEPS = 32  # toy_spec: 2 epochs of 16 steps, an evaluation every 8, the toy method's stage switch at 3


class Stopped(BaseException):
    """A stop in mid-training, as a signal's would be: no row."""


def stopping_registry(at_step: int):
    """The toy registry whose method stops the run at the start of step ``at_step`` (0-based), once
    ``at_step`` steps are done."""
    def get_method(name):
        method = TOY_REGISTRY.get_method(name)
        prepare = method.prepare

        def stopping_prepare(*args, **kwargs):
            prepared = prepare(*args, **kwargs)
            total_loss = prepared.total_loss

            def stopping_total_loss(task_loss, step):
                if step == at_step:
                    raise Stopped
                return total_loss(task_loss, step)

            prepared.total_loss = stopping_total_loss
            return prepared

        method.prepare = stopping_prepare
        return method

    return dataclasses.replace(TOY_REGISTRY, get_method=get_method)


def run(spec, path, registry=TOY_REGISTRY, every_s=0.0):
    return runner.run_cell(spec, registry=registry, checkpoint=checkpoints.Checkpointing(path, every_s))


def comparable(row):
    keep = ("status", "metric_value", "final_train_loss", "epochs", "ranks", "flops_per_step", "params_total")
    extra = json.loads(row["extra"])
    return {**{k: row[k] for k in keep}, "eval": extra.get("eval"), "eval_step": extra.get("eval_step"),
            "flops_initial": extra.get("flops_per_step_initial")}


@pytest.mark.parametrize("stop_after", [2, 8, 16, 23])  # before the switch, at an evaluation, an epoch's end
def test_a_stopped_cell_resumes_and_ends_as_the_uninterrupted_one(tmp_path, stop_after, capsys):
    spec = toy_spec(budget={"eval_every_steps": 8})
    whole_row, whole_curves = runner.run_cell(spec, registry=TOY_REGISTRY)

    path = tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(stop_after))
    assert torch.load(path, weights_only=True)["cell"]["steps_done"] == stop_after
    row, curves = run(spec, path)

    assert row["status"] == "ok", row["error"]
    assert comparable(row) == comparable(whole_row)
    assert curves == whole_curves  # losses, objectives, evaluations, ranks: step for step
    extra = json.loads(row["extra"])
    assert [entry["step"] for entry in extra["resumed"]] == [stop_after]
    assert extra["steps_done"] == STEPS and row["steps_timed"] < STEPS - stop_after  # this process's own
    # an epoch has its time when one process ran it whole (16 steps an epoch)
    assert len(extra["full_epochs_s"]) == (2 if stop_after % 16 == 0 else 1)
    assert f"resuming at step {stop_after} from its checkpoint" in capsys.readouterr().err


def test_a_cell_stopped_twice_lists_both_resumptions(tmp_path):
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(5))
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(15))
    row, curves = run(spec, path)
    whole_row, whole_curves = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert [e["step"] for e in json.loads(row["extra"])["resumed"]] == [5, 15]
    assert curves == whole_curves and comparable(row) == comparable(whole_row)


@pytest.mark.parametrize("change, named", [
    ({"seed": 1}, "seed"),
    ({"budget": {"eval_every_steps": 4}}, "budget"),
])
def test_a_checkpoint_of_another_spec_is_not_used(tmp_path, capsys, change, named):
    path = tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(toy_spec(), path, stopping_registry(6))
    row, curves = run(toy_spec(**change), path)
    assert row["status"] == "ok" and "resumed" not in json.loads(row["extra"])
    assert curves == runner.run_cell(toy_spec(**change), registry=TOY_REGISTRY)[1]
    err = capsys.readouterr().err
    assert (f"starting over: the checkpoint is not used: {path} belongs to another spec (it differs in "
            f"{named}" in err)


def test_a_checkpoint_of_other_code_or_unreadable_is_not_used(tmp_path, monkeypatch):
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(6))
    normalized = runner.cell_spec(spec, TOY_REGISTRY).to_dict()
    assert checkpoints.load(path, normalized)[0] is not None
    identity = checkpoints.code_identity()
    monkeypatch.setattr(checkpoints, "code_identity", lambda: {**identity, "sources": "0" * 16})
    saved, why_not = checkpoints.load(path, normalized)
    assert saved is None and "was written by other code (sources" in why_not
    path.write_bytes(b"not a checkpoint")
    saved, why_not = checkpoints.load(path, normalized)
    assert saved is None and why_not.startswith(f"cannot read {path}")
    assert checkpoints.load(tmp_path / "none.pt", normalized) == (None, "")


def test_the_time_limit_counts_the_training_before_the_stop(tmp_path):
    """50 ms per step and a 0.6 s limit: the resumed process has less than 0.6 s left."""
    spec = toy_spec(method_params={"sleep_s": 0.05}, budget={"time_limit_s": 0.6, "eval_every_steps": None})
    path = tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(8))
    row, _ = run(spec, path)
    assert row["status"] == "timeout"
    done = json.loads(row["extra"])["steps_done"]
    assert 8 < done < 8 + 12, done  # the whole limit would allow about 12 steps after the stop


def test_checkpoints_are_written_every_interval_outside_the_clocks(tmp_path, monkeypatch):
    spec = toy_spec(method_params={"sleep_s": 0.02}, budget={"eval_every_steps": None})
    saves = []
    real_save = checkpoints.save
    monkeypatch.setattr(checkpoints, "save",
                        lambda *a, **k: (saves.append(time.perf_counter()), real_save(*a, **k)))
    row, _ = run(spec, tmp_path / "cell.checkpoint.pt", every_s=0.2)
    assert row["status"] == "ok"
    extra = json.loads(row["extra"])
    assert extra["checkpoints"]["written"] == len(saves) and 2 <= len(saves) <= STEPS * 0.02 / 0.2 + 1
    assert min(b - a for a, b in zip(saves, saves[1:])) >= 0.2


FULL_DISK = [OSError(28, "No space left on device"),  # torch.save's own error on a full disk:
             RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")]


@pytest.mark.parametrize("error", FULL_DISK, ids=["OSError", "RuntimeError"])
def test_a_checkpoint_that_cannot_be_written_does_not_stop_the_training(tmp_path, monkeypatch, capsys, error):
    def full_disk(path, *args):
        raise error

    monkeypatch.setattr(checkpoints, "save", full_disk)
    row, curves = run(toy_spec(), tmp_path / "cell.checkpoint.pt")
    assert row["status"] == "ok"
    assert curves == runner.run_cell(toy_spec(), registry=TOY_REGISTRY)[1]
    failed = json.loads(row["extra"])["checkpoints"]
    said = f"{type(error).__name__}: {error}"
    assert failed["written"] == 0 and failed["last_error"] == f"after step {STEPS - 1}: {said}"
    assert f"the checkpoint could not be written after step 1: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("error", FULL_DISK, ids=["OSError", "RuntimeError"])
def test_a_failed_checkpoint_leaves_the_last_one_and_the_cell_resumes_from_it(tmp_path, monkeypatch, error):
    """The disk fills after the checkpoint of step 4: the later ones fail, the one of step 4 stays; a stop
    at step 10 then ends the cell without a row, and the next run resumes at step 4."""
    real_save, saves = checkpoints.save, []

    def filling(path, spec, content):
        saves.append(content["cell"]["steps_done"])
        if content["cell"]["steps_done"] > 4:
            raise error
        real_save(path, spec, content)

    monkeypatch.setattr(checkpoints, "save", filling)
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(10))
    assert saves[:5] == [1, 2, 3, 4, 5] and torch.load(path, weights_only=True)["cell"]["steps_done"] == 4
    monkeypatch.setattr(checkpoints, "save", real_save)
    row, curves = run(spec, path)
    assert row["status"] == "ok" and [e["step"] for e in json.loads(row["extra"])["resumed"]] == [4]
    assert curves == runner.run_cell(spec, registry=TOY_REGISTRY)[1]


class Payload:
    """What a crafted checkpoint carries: unpickling it would run ``touch <marker>``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("content", ["code", "no spec"])
def test_a_crafted_checkpoint_is_never_run_and_the_cell_starts_over(tmp_path, capsys, content):
    """A results folder is data: a checkpoint that holds code is refused (not unpickled), one without the
    expected layout too; either way the cell starts over, saying why, and ends ok."""
    marker, path = tmp_path / "ran", tmp_path / "cell.checkpoint.pt"
    crafted = {"format": checkpoints.FORMAT, "payload": Payload(marker)} if content == "code" else \
        {"format": checkpoints.FORMAT, "method": {}, "cell": {}}
    torch.save(crafted, path)
    row, curves = run(toy_spec(), path)
    assert not marker.exists(), "the checkpoint's code ran"
    assert row["status"] == "ok", row["error"]
    assert curves == runner.run_cell(toy_spec(), registry=TOY_REGISTRY)[1]
    err = capsys.readouterr().err
    why = (f"cannot read {path} (UnpicklingError: " if content == "code" else
           f"{path} is not a usable checkpoint: it lacks or has the wrong type of spec, code, written_at")
    assert f"starting over: the checkpoint is not used: {why}" in err


@pytest.mark.parametrize("field, value, why", [
    ("steps_done", 10**6, f"its steps_done 1000000 is outside [0, {STEPS}], the budget's 2 epoch(s) of 16"),
    ("steps_done", STEPS + 1, f"its steps_done {STEPS + 1} is outside [0, {STEPS}]"),
    ("epoch", 2, "its epoch 2 is outside [0, 1]"),
    ("last_eval_step", 7, "its last_eval_step 7 is outside [-1, 6] (its steps_done)"),
    ("stage_switch_step", 50, "its stage_switch_step 50 is outside [0, 6]"),
    ("train_s_before", -1.0, "its train_s_before holds -1.0, not a finite number of seconds >= 0"),
    ("train_s_before", math.inf, "its train_s_before holds inf"),
    ("full_epochs_s", [1.0, 1.0, 1.0], "its full_epochs_s holds 3 epoch times"),
    ("flops_initial", -5, "its flops_initial -5 is below 0"),
])
def test_a_checkpoint_whose_counters_are_outside_the_budget_is_not_used(tmp_path, capsys, field, value, why):
    """A checkpoint of the right layout, spec and code whose counters do not fit the spec's budget (2 epochs
    of 16 steps; stopped after step 6): the cell starts over, saying why and naming the file, and ends as
    one that never resumed."""
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(6))
    saved = torch.load(path, weights_only=True)
    saved["cell"][field] = value
    torch.save(saved, path)
    row, curves = run(spec, path)
    assert row["status"] == "ok", row["error"]
    assert "resumed" not in json.loads(row["extra"]) and json.loads(row["extra"])["steps_done"] == STEPS
    assert curves == runner.run_cell(spec, registry=TOY_REGISTRY)[1]
    assert (f"starting over: the checkpoint is not used: {path} is not a usable checkpoint: {why}"
            in capsys.readouterr().err)


def test_a_checkpoint_the_method_cannot_take_starts_the_cell_over(tmp_path, capsys):
    """A checkpoint of the right layout, spec and code whose method state does not fit (an optimizer
    missing): the method, partly loaded, is prepared again and the cell ends as one that never resumed."""
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(6))
    saved = torch.load(path, weights_only=True)
    saved["method"]["model"] = {k: v + 1.0 for k, v in saved["method"]["model"].items()}
    saved["method"]["optimizers"] = []
    torch.save(saved, path)
    row, curves = run(spec, path)
    assert row["status"] == "ok", row["error"]
    assert "resumed" not in json.loads(row["extra"])
    assert curves == runner.run_cell(spec, registry=TOY_REGISTRY)[1]
    assert (f"starting over: the checkpoint is not used: {path} does not fit the method (ValueError: the "
            "saved state has 0 optimizer(s), this method 1)") in capsys.readouterr().err


@pytest.fixture
def fresh_digest():
    """The sources' digest taken anew (a process takes it once), before and after the test."""
    checkpoints.sources_digest.cache_clear()
    yield
    checkpoints.sources_digest.cache_clear()


def test_a_checkpoint_is_not_used_across_an_uncommitted_code_change(tmp_path, monkeypatch, capsys,
                                                                    fresh_digest):
    """The code a cell runs includes the plug-in folders and every uncommitted edit: a plug-in edited
    between the stop and the next run makes the cell start over (so would an edit of the package)."""
    plugins = tmp_path / "plugins"
    (plugins / "methods").mkdir(parents=True)
    method = plugins / "methods" / "mine.py"
    method.write_text("METHOD = None  # d_ff 64\n")
    monkeypatch.setenv("COMERA_BENCH_PLUGINS", str(plugins))
    spec, path = toy_spec(), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(6))
    method.write_text("METHOD = None  # d_ff 48\n")
    checkpoints.sources_digest.cache_clear()  # as the next process would
    row, _ = run(spec, path)
    assert row["status"] == "ok" and "resumed" not in json.loads(row["extra"])
    assert f"{path} was written by other code (sources " in capsys.readouterr().err


def test_the_sources_digest_follows_every_file_of_the_packages(tmp_path, monkeypatch, fresh_digest):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "presets.py").write_text("D_FF = 64\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(checkpoints, "CODE_PACKAGES", ("pkg",))
    before = checkpoints.sources_digest()
    (package / "sub" / "presets.py").write_text("D_FF = 48\n")
    assert checkpoints.sources_digest() == before  # taken once per process
    checkpoints.sources_digest.cache_clear()
    assert checkpoints.sources_digest() != before


def test_run_to_files_removes_the_checkpoint_once_the_row_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoints.CHECKPOINT_ENV, "0.000001")
    runs_out = tmp_path / "cell.runs.parquet"
    path = checkpoints.path_for(runs_out)
    assert path == tmp_path / "cell.checkpoint.pt"
    written = []
    real_save = checkpoints.save
    monkeypatch.setattr(checkpoints, "save", lambda p, *a: (written.append(p), real_save(p, *a)))
    row = runner.run_to_files(toy_spec(), runs_out, tmp_path / "cell.curves.parquet", registry=TOY_REGISTRY)
    assert row["status"] == "ok" and written and set(written) == {path}
    assert not path.exists() and results.read_parquet(runs_out, "runs").at[0, "status"] == "ok"


def test_a_cell_of_a_timing_group_writes_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoints.CHECKPOINT_ENV, "0.000001")
    grouped = runner.cell_spec(toy_spec(execution={"timing_group": "g"}), TOY_REGISTRY)
    assert checkpoints.checkpointing(grouped, tmp_path / "c.runs.parquet") is None
    monkeypatch.setenv(checkpoints.CHECKPOINT_ENV, "0")
    alone = runner.cell_spec(toy_spec(), TOY_REGISTRY)
    assert checkpoints.checkpointing(alone, tmp_path / "c.runs.parquet") is None


def test_the_interval_defaults_to_ten_minutes_and_0_turns_it_off(monkeypatch):
    monkeypatch.delenv(checkpoints.CHECKPOINT_ENV, raising=False)
    assert checkpoints.every_s() == 600.0
    monkeypatch.setenv(checkpoints.CHECKPOINT_ENV, "0")
    assert checkpoints.every_s() is None


def test_the_supervisor_keeps_the_checkpoint_of_a_killed_cell_and_says_so(tmp_path, monkeypatch):
    from harness.running import supervise

    monkeypatch.setattr(supervise, "oom_kill_count", lambda: 0)
    monkeypatch.setattr(supervise, "kernel_log_oom", lambda pid: False)
    spec = tmp_path / "cell.spec.json"
    spec.write_text(json.dumps(toy_spec(run_id="cell")))
    runs = tmp_path / "cell.runs.parquet"
    checkpoints.path_for(runs).write_bytes(b"saved")
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert supervise.supervise(killed, spec, runs, tmp_path / "cell.curves.parquet") == (0, "error")
    row = results.read_parquet(runs, "runs").iloc[0]
    kept = tmp_path / "cell.checkpoint.pt"
    assert kept.exists() and json.loads(row["extra"])["checkpoint"] == str(kept)
    assert row["error"] == (f"killed by signal 9 (SIGKILL); its checkpoint {kept} is kept: delete "
                            "cell.runs.parquet to run the cell again from it")


def real_cell(steps: int) -> dict:
    return {"run_id": "tiny-comera", "workload": "transformer", "workload_params": {"size": "tiny"},
            "method": "comera", "batch_size": 8, "seed": 0, "target_ratio": 0.5,
            "method_params": {"prune_every": 4, "threshold": 0.9, "lr_gates": 0.02},  # pruned from step 8 on
            "budget": {"epochs": 1, "max_steps_per_epoch": steps, "warmup_steps": 1, "eval_every_steps": 10},
            "execution": {"device": "cpu", "num_threads": 1}}


@pytest.mark.slow
def test_a_cell_process_stopped_by_sigterm_resumes_in_the_next_run(tmp_path):
    """The pipeline's way (``comera-bench run --isolate``), the real transformer and CoMERA: SIGTERM in
    mid-training ends the process by the signal, after the step and its checkpoint, no row; the next run
    resumes at that step and ends as a run that was never stopped."""
    steps = 300
    spec = tmp_path / "tiny-comera.spec.json"
    spec.write_text(json.dumps(real_cell(steps)))
    runs, curves = tmp_path / "tiny-comera.runs.parquet", tmp_path / "tiny-comera.curves.parquet"
    log = tmp_path / "tiny-comera.log"
    path = checkpoints.path_for(runs)
    command = [sys.executable, "-m", "harness.cli", "run", "--isolate", "--spec", str(spec), "--runs-out",
               str(runs), "--curves-out", str(curves), "--log", str(log)]
    env = {**os.environ, checkpoints.CHECKPOINT_ENV: "0.3"}
    child = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None and not path.exists():
        time.sleep(0.02)
    periodic = torch.load(path, weights_only=True)["cell"]["steps_done"]
    time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
    assert not runs.exists() and path.exists()
    stopped_at = torch.load(path, weights_only=True)["cell"]["steps_done"]
    assert periodic <= stopped_at < steps, (periodic, stopped_at)
    assert (f"stopped by SIGTERM after step {stopped_at}; its checkpoint is written, no row: "
            "the cell resumes from it next time") in log.read_text()

    assert subprocess.run(command, env=env, timeout=300).returncode == 0
    row = results.read_parquet(runs, "runs").iloc[0]
    assert row["status"] == "ok", row["error"]
    assert [e["step"] for e in json.loads(row["extra"])["resumed"]] == [stopped_at]
    assert not path.exists()
    assert f"resuming at step {stopped_at}" in log.read_text()

    whole_row, whole_curves = runner.run_cell(real_cell(steps))
    rank_mean = {c["step"]: c["value"] for c in whole_curves if c["metric_name"] == "rank_mean"}
    assert rank_mean[stopped_at] < rank_mean[1]  # the resumed process loaded pruned cores
    assert (row["metric_value"], row["final_train_loss"], row["ranks"]) == (
        whole_row["metric_value"], whole_row["final_train_loss"], whole_row["ranks"])
    resumed = results.read_parquet(curves, "curves")
    assert resumed[["step", "split", "metric_name", "value"]].to_dict("records") == [
        {k: c[k] for k in ("step", "split", "metric_name", "value")} for c in whole_curves]


def test_a_cell_resumed_after_its_last_timed_step_keeps_its_quality_without_a_step_time(tmp_path):
    """Resumed one step before its end (fewer steps left than its warm-up): no step is timed in the last
    process, which is not an error: the row is ok, with its evaluation, and no step time."""
    spec, path = toy_spec(budget={"warmup_steps": 2}), tmp_path / "cell.checkpoint.pt"
    with pytest.raises(Stopped):
        run(spec, path, stopping_registry(STEPS - 1))
    row, curves = run(spec, path)
    whole_row, whole_curves = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "ok" and row["steps_timed"] == 0 and math.isnan(row["step_time_ms"])
    assert curves == whole_curves and row["metric_value"] == whole_row["metric_value"]
