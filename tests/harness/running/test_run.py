import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import results
from harness import spec as specs
from harness.running import checkpoint
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec

FAILURES = [
    ({}, {}, "ok", ""),
    ({"fail": "oom"}, {}, "oom", "MemoryError: toy allocation failed"),
    ({"fail": "nan"}, {}, "diverged", "non-finite loss at step 3"),
    ({"fail": "error"}, {}, "error", "ValueError: toy method broke"),
    ({"fail": "skip"}, {}, "error", "skipped: toy needs a device"),
    ({"sleep_s": 0.02}, {"time_limit_s": 0.01}, "timeout", "time limit of 0.01 s reached after 1 steps"),
]


@pytest.mark.parametrize("method_params, budget, status, error", FAILURES)
def test_every_status_writes_a_complete_row(tmp_path, method_params, budget, status, error):
    spec = toy_spec(method_params=method_params, budget=budget)
    runs_out, curves_out = tmp_path / "c.runs.parquet", tmp_path / "c.curves.parquet"
    row = runner.run_to_files(spec, runs_out, curves_out, registry=TOY_REGISTRY)
    df = results.read_parquet(runs_out, "runs")  # schema-complete, typed
    curves = results.read_parquet(curves_out, "curves")
    assert len(df) == 1 and df.at[0, "status"] == status == row["status"]
    assert df.at[0, "error"].startswith(error)
    assert df.at[0, "device"] == "cpu" and df.at[0, "num_threads"] == 1
    assert results.file_metadata(runs_out)["provenance"]["started_at"] == row["started_at"]
    assert (row["cell_hash"], row["execution_hash"]) == (specs.make(spec, TOY_REGISTRY.checks).cell_hash,
                                                         specs.make(spec, TOY_REGISTRY.checks).execution_hash)
    if status in ("ok", "oom", "diverged", "timeout"):
        assert df.at[0, "steps_timed"] >= 0 and df.at[0, "peak_mem_kind"] == "cpu_rss_delta"
        assert df.at[0, "state_bytes"] > 0 and json.loads(df.at[0, "ranks"]) == {"fc": [1, 4, 1]}
    if status == "ok":
        assert df.loc[0, results.RUNS_COLUMNS[:35]].drop(["seq_len", "target_ratio", "cuda_reserved_bytes",
                                                          "params_factorized_layers", "compression_layers",
                                                          "error"]).notna().all()
        assert df.at[0, "metric_value"] > 0.5  # the toy task is learnable (chance is about 1/3)
    if status == "error" and "ValueError" in error:
        assert "toy method broke" in json.loads(df.at[0, "extra"])["traceback"]
    if status == "diverged":
        assert curves.query("split == 'train' and metric_name == 'loss'")["step"].max() == 3


def test_divergence_in_the_last_step_is_diverged_with_its_numbers():
    """Parameters turn NaN in the last step's update: its loss is finite, the final evaluation is not."""
    spec = toy_spec(method_params={"fail": "nan_params", "fail_at": 2},
                    budget={"epochs": 1, "max_steps_per_epoch": 3, "eval_every_steps": None})
    row, curves = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "diverged"
    assert row["error"] == "non-finite evaluation at step 3: loss nan"
    assert 0 <= row["metric_value"] <= 1 and math.isfinite(row["final_train_loss"])  # partial numbers kept
    extra = json.loads(row["extra"])
    assert extra["steps_done"] == 3 and extra["eval_step"] == 3 and math.isnan(extra["eval"]["loss"])
    assert [c["step"] for c in curves if c["split"] == "eval" and c["metric_name"] == "loss"] == [3]


def test_any_non_finite_evaluation_value_stops_training():
    """Every numeric value of evaluate counts (here an extra metric, finite at step 0, infinite at the
    evaluation after step 2 of 4)."""
    def build(name, params, **kw):
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        evaluate, calls = workload.evaluate, []

        def evaluate_nce(m):
            calls.append(1)
            return {**evaluate(m), "nce": 1.0 if len(calls) == 1 else float("inf"), "samples": 64}
        workload.evaluate = evaluate_nce
        return workload

    registry = runner.Registry(build_workload=build, get_method=TOY_REGISTRY.get_method)
    spec = toy_spec(budget={"epochs": 1, "max_steps_per_epoch": 4, "eval_every_steps": 2})
    row, curves = runner.run_cell(spec, registry=registry)
    assert row["status"] == "diverged" and row["error"] == "non-finite evaluation at step 2: nce inf"
    assert json.loads(row["extra"])["steps_done"] == 2 and row["metric_value"] is not None
    assert max(c["step"] for c in curves if c["split"] == "train") == 2


def test_non_finite_parameters_after_the_last_step_are_diverged():
    """An evaluation that reports nothing non-finite (accuracy only) still cannot hide NaN parameters."""
    def build(name, params, **kw):
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        evaluate = workload.evaluate
        workload.evaluate = lambda m: {k: v for k, v in evaluate(m).items() if k != "loss"}
        return workload

    registry = runner.Registry(build_workload=build, get_method=TOY_REGISTRY.get_method)
    spec = toy_spec(method_params={"fail": "nan_params", "fail_at": 2},
                    budget={"epochs": 1, "max_steps_per_epoch": 3, "eval_every_steps": None})
    row, _ = runner.run_cell(spec, registry=registry)
    assert row["status"] == "diverged"
    assert row["error"] == "non-finite parameters after step 3: 0.weight, 0.bias, 3.weight, 3.bias"
    assert 0 <= row["metric_value"] <= 1 and json.loads(row["extra"])["eval_step"] == 3


def test_quality_is_deterministic_on_cpu():
    rows = [runner.run_cell(toy_spec(), registry=TOY_REGISTRY) for _ in range(2)]
    (a, ca), (b, cb) = rows
    for col in ("metric_value", "final_train_loss"):
        assert a[col] == b[col]
    assert [c["value"] for c in ca if c["split"] != "method"] == \
        [c["value"] for c in cb if c["split"] != "method"]
    other, _ = runner.run_cell(toy_spec(seed=1), registry=TOY_REGISTRY)
    assert other["final_train_loss"] != a["final_train_loss"]


def test_cuda_graph_on_cpu_is_a_clear_error_row():
    row, curves = runner.run_cell(toy_spec(execution={"cuda_graph": True}), registry=TOY_REGISTRY)
    assert row["status"] == "error" and "cuda_graph needs CUDA" in row["error"]
    assert row["variant"] == "default" and row["cuda_graph"] is True and curves == []


def test_curves_record_loss_eval_method_info_and_ranks():
    row, curves = runner.run_cell(toy_spec(budget={"epochs": 1, "eval_every_steps": 5}),
                                  registry=TOY_REGISTRY)
    steps = row["steps_timed"] + 1
    by = {}
    for c in curves:
        by.setdefault((c["split"], c["metric_name"]), []).append(c["step"])
    assert by[("train", "loss")] == list(range(1, steps + 1))
    # every 5 steps, right after the stage switch at step 4, and after the last step
    assert by[("eval", "accuracy")] == [0, 4, 5, 10, 15, 16] and by[("eval", "loss")] == [0, 4, 5, 10, 15, 16]
    assert by[("method", "stage")] == list(range(1, steps + 1))
    assert by[("ranks", "fc[1]")] == [0, 4, 16]  # before training, at the stage switch, at the end


def test_evaluation_is_outside_clocks_and_memory(monkeypatch):
    """A fake clock advances 1 s per training step and 100 s per evaluation; evaluation also holds a
    200 MB buffer that training never needs."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    real_build, real_method = TOY_REGISTRY.build_workload, TOY_REGISTRY.get_method("toy")

    def build(name, params, **kw):
        workload = real_build(name, params, **kw)
        evaluate = workload.evaluate

        def slow_fat_evaluate(model):
            buf = torch.ones(50 << 20)
            clock[0] += 100.0
            return {**evaluate(model), "touched": float(buf[0])}
        workload.evaluate = slow_fat_evaluate
        return workload

    class TickingMethod:
        name, variant = "toy", "default"

        def prepare(self, model, workload, params, **kw):
            prepared = real_method.prepare(model, workload, params, **kw)
            after_step = prepared.after_step

            def tick(step):
                clock[0] += 1.0
                return after_step(step)
            prepared.after_step = tick
            return prepared

    registry = runner.Registry(build_workload=build, get_method=lambda name: TickingMethod())
    row, _ = runner.run_cell(toy_spec(budget={"epochs": 2, "eval_every_steps": 4}), registry=registry)
    extra = json.loads(row["extra"])
    assert row["status"] == "ok" and row["epoch_time_kind"] == "measured"
    assert extra["full_epochs_s"] == [16.0, 16.0] and row["epoch_time_s"] == 16.0
    assert (row["step_time_ms"], row["step_time_ms_iqr"], row["steps_timed"]) == (1000.0, 0.0, 31)
    assert row["peak_mem_bytes"] < 100 << 20
    assert extra["eval"]["touched"] == 1.0


def test_time_limit_counts_from_the_first_training_step(monkeypatch):
    """A fake clock: building each workload (the warm-up's tiny one and the cell's) takes 100 s, the
    evaluation before training 100 s, each training step 1 s. Only the steps count toward the limit."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def build(name, params, **kw):
        clock[0] += 100.0
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        evaluate = workload.evaluate

        def slow_first_evaluate(model):
            clock[0] += 100.0 if clock[0] < 300 else 0.0
            return evaluate(model)
        workload.evaluate = slow_first_evaluate
        return workload

    class TickingMethod:
        name, variant = "toy", "default"

        def prepare(self, model, workload, params, **kw):
            prepared = TOY_REGISTRY.get_method("toy").prepare(model, workload, params, **kw)
            after_step = prepared.after_step
            prepared.after_step = lambda step: clock.__setitem__(0, clock[0] + 1.0) or after_step(step)
            return prepared

    registry = runner.Registry(build_workload=build, get_method=lambda name: TickingMethod())
    ok, _ = runner.run_cell(toy_spec(budget={"epochs": 1, "eval_every_steps": 16, "time_limit_s": 20}),
                            registry=registry)
    assert ok["status"] == "ok" and json.loads(ok["extra"])["steps_done"] == 16
    cut, _ = runner.run_cell(toy_spec(budget={"epochs": 1, "eval_every_steps": 16, "time_limit_s": 10.5}),
                             registry=registry)
    assert cut["status"] == "timeout" and cut["error"] == "time limit of 10.5 s reached after 11 steps"
    assert cut["steps_timed"] == 10 and cut["final_train_loss"] is not None


HANG = """
import sys
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec
runner.WATCHDOG_GRACE_S = 0.5
spec = toy_spec(method_params={method_params!r}, workload_params={workload_params!r},
                budget={{"epochs": 1, "eval_every_steps": 2, "time_limit_s": 2.0}})
runner.run_to_files(spec, sys.argv[1], sys.argv[2], registry=TOY_REGISTRY, hang_exit_status=3)
print("run_to_files returned")
"""


@pytest.mark.slow
@pytest.mark.parametrize("method_params, workload_params, steps, activity", [
    ({"hang_at": 3}, {}, 3, "training step 4"),
    ({}, {"hang_eval": 2}, 4, "the evaluation at step 4"),  # evaluations at steps 0, 2 and 4
])
def test_a_hung_step_or_evaluation_ends_as_timeout_with_its_row(tmp_path, method_params, workload_params,
                                                                 steps, activity):
    """The toy blocks for an hour; the watchdog writes the partial row 2 + 0.5 s into training and ends
    the process."""
    runs_out, curves_out = tmp_path / "h.runs.parquet", tmp_path / "h.curves.parquet"
    script = HANG.format(method_params=method_params, workload_params=workload_params)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script, str(runs_out), str(curves_out)],
                          cwd=Path(__file__).parents[3], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "returned" not in proc.stdout and time.monotonic() - started < 60
    df = results.read_parquet(runs_out, "runs")
    assert df.at[0, "status"] == "timeout"
    assert df.at[0, "error"].startswith(f"time limit of 2.0 s reached after {steps} steps; {activity} ")
    assert df.at[0, "error"] in proc.stderr
    extra = json.loads(df.at[0, "extra"])
    assert extra["steps_done"] == steps and df.at[0, "steps_timed"] == steps - 1
    assert df.at[0, "metric_value"] is not None and df.at[0, "peak_mem_kind"] == "cpu_rss_delta"
    curves = results.read_parquet(curves_out, "curves")
    assert curves.query("split == 'train' and metric_name == 'loss'")["step"].max() == steps


STALL = """
import sys
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec
spec = toy_spec(method_params={method_params!r},
                budget={{"epochs": 1, "eval_every_steps": 2, "time_limit_s": None}})
runner.run_to_files(spec, sys.argv[1], sys.argv[2], registry=TOY_REGISTRY, hang_exit_status=3)
print("run_to_files returned")
"""


@pytest.mark.slow
@pytest.mark.parametrize("method_params, steps, activity", [
    ({"hang_at": 3}, 3, "training step 4"),
    ({"hang_at": 0}, 0, "the warm-up"),  # the warm-up's throwaway step is step 0 too
])
def test_a_stalled_step_without_a_time_limit_ends_as_timeout(tmp_path, method_params, steps, activity):
    """No time limit: the stall limit (COMERA_BENCH_STALL_LIMIT_S, 5 s here; an hour by default) ends a step
    that hangs, with its row, instead of hanging the cell, its timing group and the pipeline for ever."""
    runs_out, curves_out = tmp_path / "s.runs.parquet", tmp_path / "s.curves.parquet"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STALL.format(method_params=method_params), str(runs_out),
                           str(curves_out)], cwd=Path(__file__).parents[3], capture_output=True, text=True,
                          timeout=120, env={**os.environ, runner.STALL_ENV: "5"})
    assert proc.returncode == 3, proc.stderr
    assert "returned" not in proc.stdout and time.monotonic() - started < 60
    row = results.read_parquet(runs_out, "runs").iloc[0]
    # no timer yet: the warm-up
    assert row["status"] == "timeout" and json.loads(row["extra"]).get("steps_done", 0) == steps, row["error"]
    assert row["error"].startswith(f"stalled: {activity} did not finish within the stall limit of 5 s "
                                   f"({runner.STALL_ENV}")


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf"])
@pytest.mark.parametrize("variable, read", [(runner.STALL_ENV, runner.stall_limit_s),
                                             (checkpoint.CHECKPOINT_ENV, checkpoint.every_s)])
def test_a_bad_stall_limit_or_checkpoint_interval_is_named(monkeypatch, value, variable, read):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=rf"environment variable {variable}='{value}': .* >= 0 \(0: no "):
        read()


def test_the_stall_limit_defaults_to_an_hour_and_0_turns_it_off(monkeypatch):
    monkeypatch.delenv(runner.STALL_ENV, raising=False)
    assert runner.stall_limit_s() == runner.STALL_LIMIT_S == 3600
    monkeypatch.setenv(runner.STALL_ENV, "0")
    assert runner.stall_limit_s() is None


def test_a_finished_cell_stops_its_watchdog(tmp_path):
    row = runner.run_to_files(toy_spec(budget={"epochs": 1, "time_limit_s": 60}), tmp_path / "w.runs.parquet",
                              tmp_path / "w.curves.parquet", registry=TOY_REGISTRY)
    assert row["status"] == "ok"
    assert not [t for t in threading.enumerate() if t.name == "cell-watchdog"]


def test_partial_epochs_are_extrapolated():
    row, _ = runner.run_cell(toy_spec(budget={"max_steps_per_epoch": 5}), registry=TOY_REGISTRY)
    assert row["epoch_time_kind"] == "extrapolated" and row["epochs"] == 2.0
    extra = json.loads(row["extra"])
    assert row["epoch_time_s"] == pytest.approx(extra["step_time_ms_mean"] * 16 / 1e3)
    assert row["steps_timed"] == 9


def test_flops_per_step_from_linear_shapes():
    row, _ = runner.run_cell(toy_spec(), registry=TOY_REGISTRY)
    assert row["flops_per_step"] == 6 * 16 * (8 * 16 + 16 * 3)


def test_allocator_is_applied_and_recorded(monkeypatch):
    from harness.core import allocator

    calls = []
    monkeypatch.setattr(allocator, "apply", lambda policy: calls.append(policy) or f"applied {policy}")
    monkeypatch.setattr(allocator, "release_free_memory", lambda: calls.append("release") or True)
    row, _ = runner.run_cell(toy_spec(budget={"epochs": 1, "eval_every_steps": 8}), registry=TOY_REGISTRY)
    settings = json.loads(row["settings"])
    assert row["status"] == "ok" and settings["execution"]["allocator"] == "reuse"
    assert settings["allocator"] == "applied reuse"
    # applied first; then the memory monitor hands the free heap back (see test_measure for when)
    assert calls[0] == "reuse" and calls[1:] == ["release"] * (len(calls) - 1) and len(calls) >= 2


def test_cuda_request_without_cuda_is_an_error_row():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    row, _ = runner.run_cell(toy_spec(execution={"device": "cuda"}), registry=TOY_REGISTRY)
    assert row["status"] == "error" and "CUDA is not available" in row["error"]


def real_spec(method):
    return {"workload": "transformer", "workload_params": {"size": "tiny"}, "method": method,
            "batch_size": 8, "seed": 0, "target_ratio": 0.5 if method == "comera" else None,
            "budget": {"epochs": 1, "max_steps_per_epoch": 4, "warmup_steps": 1},
            "execution": {"device": "cpu", "num_threads": 1}}


@pytest.mark.parametrize("method", ["dense", "comera"])
def test_real_tiny_transformer_cell(tmp_path, method):
    row = runner.run_to_files(real_spec(method), tmp_path / "r.runs.parquet", tmp_path / "r.curves.parquet")
    assert row["status"] == "ok", row["error"] + json.loads(row["extra"]).get("traceback", "")
    df = results.read_parquet(tmp_path / "r.runs.parquet", "runs")
    assert df.at[0, "metric_name"] == "accuracy" and 0 <= df.at[0, "metric_value"] <= 1
    assert df.at[0, "seq_len"] > 0 and df.at[0, "params_total"] > 0 and df.at[0, "flops_per_step"] > 0
    assert df.at[0, "steps_timed"] == 3 and df.at[0, "epoch_time_kind"] == "extrapolated"
    extra = json.loads(df.at[0, "extra"])
    outcome = json.loads(df.at[0, "settings"])["method"].get("outcome", {})
    # the rank adaptation's verdict on its target, written into the row (none for a method without one)
    assert pd.isna(df.at[0, "target_reached"]) == (method == "dense")
    if method == "comera":
        assert df.at[0, "target_reached"] == outcome["reached"] and outcome["reached"] is False
        # 4 steps: the switch at the late stage's deadline (a third of the run left: step 3), one late step
        assert "the late stage (1 steps) ended first" in outcome["shortfall"]
        assert df.at[0, "compression_total"] > 1 and json.loads(df.at[0, "ranks"])
        assert extra["flops_modules_plan"] > 0  # TT layers count through their plans
        again, _ = runner.run_cell(real_spec(method))
        assert (again["metric_value"], again["final_train_loss"]) == (row["metric_value"],
                                                                      row["final_train_loss"])


def test_real_dlrm_divergence_in_its_only_step():
    """The reported case: lr 1e30 makes the only step's update non-finite; accuracy stays at the
    always-no-click rate, so only the evaluation's loss values tell."""
    spec = {"workload": "dlrm", "workload_params": {"size": "tiny"}, "method": "dense",
            "method_params": {"lr": 1e30}, "batch_size": 64,
            "budget": {"max_steps_per_epoch": 1}, "execution": {"device": "cpu", "num_threads": 1}}
    row, _ = runner.run_cell(spec)
    assert row["status"] == "diverged" and row["error"].startswith("non-finite evaluation at step 1: ")
    assert "bce nan" in row["error"] and 0 < row["metric_value"] < 1


def test_tt_rank_falls_back_to_the_workload_spec():
    class NoRankSetting:
        name, variant = "tt", "default"

        def prepare(self, model, workload, params, *, target_ratio, total_steps):
            prepared = TOY_REGISTRY.get_method("toy").prepare(model, workload, params,
                                                              target_ratio=target_ratio,
                                                              total_steps=total_steps)
            prepared.settings = {}
            return prepared

    def build(name, params, **kw):
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        workload.tt_spec = {"0": {"kind": "linear", "rank": [1, 6, 1]},
                            "e": {"kind": "embedding", "rank": 9}}
        return workload

    row, _ = runner.run_cell(toy_spec(budget={"epochs": 1}),
                             registry=runner.Registry(build_workload=build,
                                                      get_method=lambda n: NoRankSetting()))
    assert row["status"] == "ok" and row["rank"] == 6


def test_matmul_precision_applies_while_the_model_is_built_and_is_a_column():
    seen = []

    def build(name, params, **kw):
        seen.append(torch.get_float32_matmul_precision())
        return TOY_REGISTRY.build_workload(name, params, **kw)

    registry = runner.Registry(build_workload=build, get_method=TOY_REGISTRY.get_method)
    before = torch.get_float32_matmul_precision()
    row, _ = runner.run_cell(toy_spec(execution={"matmul_precision": "medium"}, budget={"epochs": 1}),
                             registry=registry)
    assert row["status"] == "ok", row["error"]
    assert set(seen) == {"medium"} and torch.get_float32_matmul_precision() == before  # warm-up and model
    assert row["matmul_precision"] == "medium" and row["variant"] == "default"
    seen.clear()
    default, _ = runner.run_cell(toy_spec(budget={"epochs": 1}), registry=registry)
    assert default["matmul_precision"] == "highest" and default["variant"] == "default"
    assert set(seen) == {"highest"}
    with pytest.raises(specs.SpecError, match="key 'execution.matmul_precision' must be one of"):
        runner.run_cell(toy_spec(execution={"matmul_precision": "tf32"}), registry=registry)


@pytest.mark.slow
def test_compiled_model_trains():
    row, _ = runner.run_cell(toy_spec(execution={"compile": True}, budget={"epochs": 1}),
                             registry=TOY_REGISTRY)
    assert row["status"] == "ok", row["error"]
    assert row["variant"] == "default" and row["compile"] is True
    assert json.loads(row["settings"])["execution"]["compile"]
    assert row["metric_value"] > 0.4


def test_evaluation_after_the_last_step_is_outside_the_memory_region():
    """The last evaluation (at step 16 of 16) leaves 100 MB behind; no training follows it."""
    kept = []

    def build(name, params, **kw):
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        evaluate, calls = workload.evaluate, []

        def evaluate_leaving_memory(model):
            calls.append(1)
            if len(calls) == 4:  # steps 0 (before the region), 4 (the toy's stage switch), 8, 16
                kept.append(torch.ones(25 << 20))
            return evaluate(model)
        workload.evaluate = evaluate_leaving_memory
        return workload

    registry = runner.Registry(build_workload=build, get_method=TOY_REGISTRY.get_method)
    row, curves = runner.run_cell(toy_spec(budget={"epochs": 1, "eval_every_steps": 8}), registry=registry)
    assert row["status"] == "ok" and len(kept) == 1
    assert [c["step"] for c in curves if c["metric_name"] == "accuracy"] == [0, 4, 8, 16]
    assert row["peak_mem_bytes"] < 50 << 20


def test_a_failing_warm_up_is_recorded_and_the_cell_runs():
    def build(name, params, **kw):
        if params.get("size") == "tiny":
            raise ValueError("no tiny toy")
        return TOY_REGISTRY.build_workload(name, params, **kw)

    registry = runner.Registry(build_workload=build, get_method=TOY_REGISTRY.get_method)
    failed, _ = runner.run_cell(toy_spec(budget={"epochs": 1}), registry=registry)
    ok, _ = runner.run_cell(toy_spec(budget={"epochs": 1}), registry=TOY_REGISTRY)
    assert failed["status"] == ok["status"] == "ok"
    assert json.loads(failed["settings"])["warm_up"] == "failed: ValueError: no tiny toy"
    assert json.loads(ok["settings"])["warm_up"] == "ok" and json.loads(ok["extra"])["warm_up_s"] > 0
    assert failed["final_train_loss"] == ok["final_train_loss"]


def test_the_warm_up_changes_no_number(monkeypatch):
    """With dropout the training draws from torch's global stream, which the workload does not reseed."""
    spec = {**real_spec("dense"), "workload_params": {"size": "tiny", "dropout": 0.1},
            "budget": {"epochs": 1, "max_steps_per_epoch": 4, "warmup_steps": 1, "eval_every_steps": 2}}
    warmed, warmed_curves = runner.run_cell(spec)
    monkeypatch.setattr(runner.warmup, "warm_up", lambda *a, **k: "not run")
    cold, cold_curves = runner.run_cell(spec)
    assert json.loads(warmed["settings"])["warm_up"] == "ok"
    assert json.loads(cold["settings"])["warm_up"] == "not run"
    for col in ("metric_value", "final_train_loss"):
        assert warmed[col] == cold[col]
    assert [(c["step"], c["metric_name"], c["value"]) for c in warmed_curves] == \
        [(c["step"], c["metric_name"], c["value"]) for c in cold_curves]


@pytest.mark.parametrize("budget", [{"max_steps_per_epoch": 2, "warmup_steps": 2, "epochs": 1},
                                    {"max_steps_per_epoch": 1, "warmup_steps": 3, "epochs": 2}])
def test_a_cell_without_a_timed_step_is_not_ok(budget):
    row, _ = runner.run_cell(toy_spec(budget=budget), registry=TOY_REGISTRY)
    assert row["status"] == "error" and row["error"].startswith("no timed step:"), row["error"]
    assert row["steps_timed"] == 0


@pytest.mark.parametrize("variable", [runner.STALL_ENV, "COMERA_BENCH_CHECKPOINT_S"])
def test_the_pipeline_and_the_cli_refuse_a_bad_stall_limit_or_checkpoint_interval(tmp_path, monkeypatch,
                                                                                  capsys, variable):
    from harness import cli, running

    monkeypatch.setenv(variable, "soon")
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(workload="transformer", method="dense")))
    assert cli.main(["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.runs.parquet")]) == 2
    assert f"environment variable {variable}='soon'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=variable):  # the pipeline's check (workflow/rules/common.smk)
        running.check_environment()


def test_a_group_cell_timed_without_its_rounds_says_so(monkeypatch):
    """A cell of a timing group that reached no round coordinator is timed alone: its row has no group
    start time and its timing verdict is noisy, naming why (claims and figures use stable rows only)."""
    from harness.core import interleave

    monkeypatch.delenv(interleave.ENV, raising=False)
    spec = toy_spec(execution={"timing_group": "g", "rounds": 2})
    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "ok" and row["timing_group"] == "g" and row["group_start_s"] is None
    assert "not timed in its group's interleaved rounds" in row["timing_quality"]
    alone, _ = runner.run_cell(toy_spec(), registry=TOY_REGISTRY)  # a cell that has no group
    assert "interleaved rounds" not in alone["timing_quality"]


@pytest.mark.slow
def test_a_group_cell_records_its_groups_start_time(tmp_path):
    """In its group's rounds the row gets the seconds the group took to reach its first round."""
    from harness.core import interleave

    spec = toy_spec(run_id="a", execution={"timing_group": "g", "rounds": 2})
    path, out = tmp_path / "a.spec.json", tmp_path / "row.json"
    path.write_text(json.dumps(spec))
    cell = f"""
import json
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY
row, _ = runner.run_cell(json.loads(open({str(path)!r}).read()), registry=TOY_REGISTRY)
open({str(out)!r}, "w").write(json.dumps(row, default=str))
"""
    failed = interleave.run_group([interleave.Cell(str(path), "", "")], 2, log=lambda m: None,
                                  command=lambda c: [sys.executable, "-c", cell])
    row = json.loads(out.read_text())
    assert failed == 0 and row["timing_group"] == "g" and row["group_start_s"] > 0
    assert "interleaved rounds" not in row["timing_quality"]
    means = json.loads(row["round_step_mean_ms"])  # per round: the statistic every time ratio uses
    assert len(means) == len(json.loads(row["round_step_ms"])) == 2 and all(m > 0 for m in means)


@pytest.mark.slow
def test_a_group_cell_hands_its_device_cache_back_before_every_wait(tmp_path):
    """Before each wait for the group (each round and the end of the rounds) the cell's memory monitor
    yields the device (on CUDA: reads the GPU's memory in use, empties this process's cache); the step after
    each wait is not counted."""
    from harness.core import interleave

    spec = toy_spec(run_id="a", execution={"timing_group": "g", "rounds": 3},
                    budget={"epochs": 1, "max_steps_per_epoch": 10, "warmup_steps": 1,
                            "eval_every_steps": None})
    path, out = tmp_path / "a.spec.json", tmp_path / "out.json"
    path.write_text(json.dumps(spec))
    cell = f"""
import json
from harness.core import measure
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY
calls, original = [], measure.MemoryMonitor.yield_device
def spy(self):
    calls.append(self.running)
    original(self)
measure.MemoryMonitor.yield_device = spy
row, _ = runner.run_cell(json.loads(open({str(path)!r}).read()), registry=TOY_REGISTRY)
open({str(out)!r}, "w").write(json.dumps({{"calls": calls, "row": row}}, default=str))
"""
    failed = interleave.run_group([interleave.Cell(str(path), "", "")], 3, log=lambda m: None,
                                  command=lambda c: [sys.executable, "-c", cell])
    got = json.loads(out.read_text())
    assert failed == 0 and got["calls"] == [True] * 4  # rounds 1-3 and the end of the rounds, in the region
    row = got["row"]
    # the warm-up step, a step after each wait
    assert row["status"] == "ok" and row["steps_timed"] == 10 - 1 - 3


@pytest.mark.slow
def test_a_group_cell_records_where_its_start_went_and_evaluates_no_untrained_model(tmp_path):
    """Each cell of a group records its start phases (extra.start_phases_s) and sends them with its first
    ready; the group logs the slowest cell's. A cell of a timing group starts without the evaluation
    before the first step (a cell without a group keeps it); its start turns never overlap with one slot."""
    from harness.core import interleave

    cells, outs = [], {}
    for name in ("a", "b"):
        spec = toy_spec(run_id=name, budget={"eval_every_steps": 4},
                        execution={"timing_group": "g", "rounds": 2})
        path = tmp_path / f"{name}.spec.json"
        path.write_text(json.dumps(spec))
        outs[name] = tmp_path / f"{name}.json"
        cells.append(interleave.Cell(str(path), "", ""))
    cell = """
import json, sys
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY
row, curves = runner.run_cell(json.loads(open(sys.argv[1]).read()), registry=TOY_REGISTRY, started_at=0.0)
open(sys.argv[2], "w").write(json.dumps({"row": row, "curves": curves}, default=str))
"""
    said: list[str] = []
    failed = interleave.run_group(cells, 2, log=said.append, slots=1,
                                  command=lambda c: [sys.executable, "-c", cell, c.spec, str(outs[c.run_id])])
    assert failed == 0
    for name in ("a", "b"):
        out = json.loads(outs[name].read_text())
        row, curves = out["row"], out["curves"]
        phases = json.loads(row["extra"])["start_phases_s"]
        assert set(phases) == set(runner.START_PHASES) - {"eval"}, phases
        assert all(seconds >= 0 for seconds in phases.values())
        assert row["group_start_s"] > 0 and row["status"] == "ok"
        assert 0 not in {c["step"] for c in curves if c["split"] == "eval"}  # no evaluation before step 1
        assert {c["step"] for c in curves if c["split"] == "eval"} >= {4, 8}
    slowest = [line for line in said if line.startswith("  slowest to start: ")]
    assert len(slowest) == 1 and "warm up" in slowest[0] and "start turn" in slowest[0]
    alone, curves = runner.run_cell(toy_spec(budget={"eval_every_steps": 4}), registry=TOY_REGISTRY)
    phases = json.loads(alone["extra"])["start_phases_s"]
    assert "eval" in phases and "gate" not in phases and "start" not in phases  # no started_at given
    assert 0 in {c["step"] for c in curves if c["split"] == "eval"}


@pytest.mark.slow
def test_a_cell_imports_galores_packages_only_when_it_runs_galore(tmp_path):
    """GaLore's packages (galore_torch, which imports transformers) are imported by GaLore cells only: a
    CoMERA cell's process never pays for them."""
    code = """
import sys
from harness.running import run as runner
spec = {"workload": "transformer", "method": "comera", "batch_size": 2, "seed": 0,
        "workload_params": {"size": "tiny", "train_samples": 8, "eval_samples": 2},
        "budget": {"epochs": 1, "max_steps_per_epoch": 2, "warmup_steps": 1, "eval_every_steps": None},
        "execution": {"device": "cpu", "num_threads": 1}}
row, _ = runner.run_cell(spec)
assert row["status"] == "ok", row["error"]
print(sorted(m for m in ("galore_torch", "transformers", "bitsandbytes") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_training_step_is_prepared_train_step(monkeypatch):
    """One step definition: the cell loop runs Prepared.train_step (whose eager part, Prepared.update, is
    what a CUDA graph captures) once per step; the warm-up's throwaway step is one too."""
    from baselines.base import Prepared

    calls = []
    real = Prepared.train_step
    monkeypatch.setattr(Prepared, "train_step",
                        lambda self, *a, **kw: calls.append(a[2]) or real(self, *a, **kw))
    spec = toy_spec(budget={"epochs": 1, "max_steps_per_epoch": 4, "eval_every_steps": None})
    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "ok" and calls == [0, 0, 1, 2, 3]  # the warm-up's step, then the cell's


def test_after_steps_runs_once_outside_the_memory_region_on_the_trained_cell(monkeypatch):
    """run_cell's after_steps (the performance bench's profile) gets the trained cell after its last step,
    once the memory region has ended; what it raises is the row's error."""
    events = []
    stop = runner.measure.MemoryMonitor.stop
    monkeypatch.setattr(runner.measure.MemoryMonitor, "stop",
                        lambda self: events.append("stop") or stop(self))

    def after_steps(cell):
        events.append(("after_steps", cell.steps_done, cell.run_id))
        cell.prepared.train_step(cell.workload, cell.batch, cell.steps_done)  # more steps: not in the row

    spec = toy_spec(budget={"epochs": 1, "max_steps_per_epoch": 3, "eval_every_steps": None})
    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY, after_steps=after_steps)
    assert row["status"] == "ok" and events[:2] == ["stop", ("after_steps", 3, row["run_id"])]
    assert json.loads(row["extra"])["steps_done"] == 3 and len(json.loads(row["extra"])["step_ms"]) == 3

    def broken(cell):
        raise RuntimeError("profile broke")

    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY, after_steps=broken)
    assert row["status"] == "error" and "profile broke" in row["error"]
