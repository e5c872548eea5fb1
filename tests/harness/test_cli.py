import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from harness import cli, results
from harness.running import run as runner
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec


@pytest.fixture
def toys(monkeypatch):
    monkeypatch.setattr(runner, "default_registry", lambda: TOY_REGISTRY)


def test_run_with_spec_file(tmp_path, toys):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(run_id="cell-1", budget={"epochs": 1})))
    runs, curves = tmp_path / "o" / "r.parquet", tmp_path / "o" / "c.parquet"
    assert cli.main(["run", "--spec", str(spec), "--runs-out", str(runs), "--curves-out", str(curves)]) == 0
    df = results.read_parquet(runs, "runs")
    assert df.at[0, "run_id"] == "cell-1" and df.at[0, "status"] == "ok"
    assert (results.read_parquet(curves, "curves")["run_id"] == "cell-1").all()


def test_run_without_spec_uses_defaults(tmp_path, toys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--workload", "toy", "--method", "toy", "--batch-size", "16", "--device", "cpu",
                     "--threads", "1", "--method-param", "lr=0.02", "--max-steps-per-epoch", "3"]) == 0
    folder = tmp_path / "results" / "cli" / "cpu"  # apart from the pipeline's results/runs
    (runs,) = folder.glob("*.runs.parquet")
    run_id = runs.name[:-len(".runs.parquet")]
    assert (folder / f"{run_id}.curves.parquet").exists()
    spec = json.loads((folder / f"{run_id}.spec.json").read_text())
    # the pipeline's run_id scheme, and the cell hash: no config's cell of another spec has this name
    assert run_id == f"toy_toy-default_b16_tnone_s0_c{spec['cell_hash'][:8]}" == spec["run_id"]
    assert spec["method_params"] == {"lr": 0.02} and spec["budget"]["max_steps_per_epoch"] == 3
    assert json.loads(results.read_parquet(runs, "runs").at[0, "settings"])["method"]["lr"] == 0.02
    assert spec["execution"]["allocator"] == "reuse"
    assert spec["budget"]["warmup_steps"] == 2  # the config schema's default


def test_run_issue_command_with_exponent_lr_is_diverged(tmp_path):
    """The divergence case as a user types it: lr=1e30 is a number (YAML 1.1 would make it text)."""
    runs = tmp_path / "d.runs.parquet"
    cli.main(["run", "--workload", "dlrm", "--method", "dense", "--batch-size", "64", "--workload-param",
              "size=tiny", "--method-param", "lr=1e30", "--max-steps-per-epoch", "1", "--device", "cpu",
              "--threads", "1", "--runs-out", str(runs)])
    row = results.read_parquet(runs, "runs").iloc[0]
    assert row["status"] == "diverged" and "bce nan" in row["error"]
    assert json.loads(row["settings"])["method"]["lr"] == 1e30


def test_run_allocator_option_is_applied_and_recorded(tmp_path, toys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--workload", "toy", "--method", "toy", "--batch-size", "16", "--device", "cpu",
                     "--threads", "1", "--max-steps-per-epoch", "2", "--allocator", "system"]) == 0
    (runs,) = (tmp_path / "results" / "cli" / "cpu").glob("*.runs.parquet")
    settings = json.loads(results.read_parquet(runs, "runs").at[0, "settings"])
    assert settings["execution"]["allocator"] == "system" and settings["allocator"].startswith("system")


def test_run_failure_still_writes_and_can_fail_the_exit_code(tmp_path, toys):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(method_params={"fail": "nan"})))
    args = ["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.parquet")]
    assert cli.main(args) == 0
    assert results.read_parquet(tmp_path / "r.parquet", "runs").at[0, "status"] == "diverged"
    assert (tmp_path / "r.curves.parquet").exists()
    assert cli.main(args + ["--fail-on-error"]) == 1


def test_run_gives_a_hung_cell_the_exit_status_of_a_failed_one(tmp_path, monkeypatch, toys):
    """The watchdog ends a hung cell's process itself (tests/harness/running/test_run.py), with this
    status."""
    statuses = []

    def run_to_files(spec, runs_out, curves_out, **kw):
        statuses.append(kw["hang_exit_status"])
        return {"run_id": spec.run_id, "status": "timeout", "error": "hung"}
    monkeypatch.setattr(runner, "run_to_files", run_to_files)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec()))
    args = ["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.parquet")]
    assert cli.main(args) == 0 and cli.main(args + ["--fail-on-error"]) == 1
    assert statuses == [0, 1]


def test_the_cell_options_are_the_specs_declaration(capsys):
    """Every key of a spec's budget and execution (and its own scalar keys) is an option, from the one
    declaration (harness.params.add_options): its default is the spec's, an option not given is left out."""
    from harness import params
    from harness import spec as specs

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    run_help = " ".join(capsys.readouterr().out.split())
    for model in (specs.Budget, specs.Execution):
        for name, field in model.model_fields.items():
            assert params.option_name(name) in run_help, name
    assert "--threads" in run_help and "torch threads (default 2)" in run_help
    args = cli._parser().parse_args(["run", "--workload", "w", "--method", "m", "--batch-size", "2",
                                     "--threads", "3", "--rounds", "4", "--cuda-graph", "--epochs", "2"])
    spec = cli.spec_from_args(args)
    assert spec["execution"] == {"num_threads": 3, "rounds": 4, "cuda_graph": True}
    assert spec["budget"] == {"epochs": 2}
    assert specs.make(spec, specs.AS_WRITTEN).budget.warmup_steps == specs.Budget().warmup_steps


@pytest.mark.parametrize("argv, message", [
    (["--workload", "toy"], "--method, --batch-size must be given"),
    (["--workload", "toy", "--method", "toy", "--batch-size", "2", "--method-param", "lr"],
     "--method-param expects KEY=VALUE"),
])
def test_run_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit, match=message):
        cli.main(["run", *argv])


def test_run_bad_spec_is_named(tmp_path, capsys):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({**toy_spec(), "colour": "red"}))
    assert cli.main(["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.parquet")]) == 2
    assert "spec: unknown key 'colour'" in capsys.readouterr().err
    assert not (tmp_path / "r.parquet").exists()
    spec.write_text("{not json")
    assert cli.main(["run", "--spec", str(spec)]) == 2
    assert str(spec) in capsys.readouterr().err


@pytest.fixture
def runs_dir(tmp_path):
    rows = []
    for i, (method, status, t) in enumerate([("dense", "ok", 10.0), ("dense", "ok", 30.0),
                                             ("comera", "ok", 4.0), ("comera", "oom", None)]):
        row = {c: None for c in results.RUNS_COLUMNS}
        row.update(run_id=f"r{i}", workload="toy", method=method, variant="", batch_size=8, seed=i,
                   status=status, error="", step_time_ms=t, metric_value=0.5 + i / 10)
        rows.append(row)
    folder = tmp_path / "results" / "runs" / "cpu"
    for row in rows:
        results.write_parquet_atomic(results.to_frame([row], "runs"),
                                     folder / f"{row['run_id']}.runs.parquet", kind="runs")
    return tmp_path / "results"


def test_show_filters_groups_and_prints_csv(runs_dir, capsys):
    assert cli.main(["show", str(runs_dir)]) == 0
    out = capsys.readouterr().out
    assert "r3" in out and "oom" in out
    assert cli.main(["show", str(runs_dir), "--where", "method=comera", "--where", "status=ok", "--csv",
                     "--columns", "run_id,step_time_ms"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert df.to_dict("list") == {"run_id": ["r2"], "step_time_ms": [4.0]}
    table = cli.show_table([str(runs_dir)], group_by="method", columns="step_time_ms,metric_value")
    dense = table.set_index("method").loc["dense"]
    assert dense["n"] == 2 and dense["step_time_ms"] == 20.0
    assert cli.show_table([str(runs_dir)], where=["batch_size=8"]).shape[0] == 4


@pytest.mark.parametrize("where, ids", [
    (["step_time_ms>=10"], ["r0", "r1"]),
    (["step_time_ms<10"], ["r2"]),
    (["step_time_ms=null"], ["r3"]),
    (["step_time_ms!=null", "method!=dense"], ["r2"]),
    (["status~oo"], ["r3"]),
    (["seed>0", "seed<=2"], ["r1", "r2"]),
])
def test_show_where_ranges_and_nulls(runs_dir, where, ids):
    assert cli.show_table([str(runs_dir)], where=where, columns="run_id").run_id.tolist() == ids


@pytest.mark.parametrize("where, message", [
    ("method>dense", "compares numbers; method is text"),
    ("seed>=x", "seed is numeric, 'x' is not a number"),
    ("seed>null", "null takes = or != only"),
    ("=3", "expects COL=VALUE"),
])
def test_show_where_errors(runs_dir, where, message, capsys):
    assert cli.main(["show", str(runs_dir), "--where", where]) == 1
    assert message in capsys.readouterr().err


def test_show_group_by_never_pools_two_settings(runs_dir, capsys):
    """A --group-by summary groups by every setting column whose values differ inside a group it was asked
    for (README's command pooled default CoMERA with its rank sweep and printed seed 0.5), says so, lists
    the seeds instead of their median and counts status and timing_quality."""
    frame = results.read_parquet(next((runs_dir / "runs" / "cpu").glob("r0.*")), "runs")
    for rid, update in (("r4", dict(batch_size=32, purpose="quality")),
                        ("r5", dict(variant="rank-rank120", target_ratio=0.5, step_time_ms=99.0))):
        row = {**frame.iloc[0].to_dict(), "run_id": rid, **update}
        path = runs_dir / "runs" / "cpu" / f"{rid}.runs.parquet"
        results.write_parquet_atomic(results.to_frame([row], "runs"), path, kind="runs")
    table = cli.show_table([str(runs_dir)], group_by="method",
                           columns="seed,step_time_ms,status,timing_quality")
    err = capsys.readouterr().err
    assert "grouped by variant, batch_size too" in err, err  # target_ratio and purpose: apart by then
    assert list(table.columns) == ["method", "variant", "batch_size", "n", "seeds", "step_time_ms", "status",
                                   "timing_quality"]
    dense = table[(table.method == "dense") & (table.variant == "") & (table.batch_size == 8)].iloc[0]
    assert dense.n == 2 and dense.seeds == "0,1" and dense.step_time_ms == 20.0 and dense.status == "2 ok"
    assert table[table.variant == "rank-rank120"].step_time_ms.tolist() == [99.0]
    comera = table[table.method == "comera"].iloc[0]
    assert comera.status == "1 ok, 1 oom" and comera.seeds == "2,3"
    cli.show_table([str(runs_dir)], group_by="method,variant,batch_size", columns="step_time_ms")
    assert "too" not in capsys.readouterr().err


def test_show_group_by_keeps_graphed_compiled_and_tf32_cells_apart(runs_dir, capsys):
    """Cells that differ only in how they ran (same variant, another execution column) are never pooled."""
    frame = results.read_parquet(next((runs_dir / "runs" / "cpu").glob("r0.*")), "runs")
    for rid, update in (("r4", dict(cuda_graph=True, step_time_ms=1.0)), ("r5", dict(compile=True)),
                        ("r6", dict(matmul_precision="high"))):
        row = {**frame.iloc[0].to_dict(), "run_id": rid, **update}
        path = runs_dir / "runs" / "cpu" / f"{rid}.runs.parquet"
        results.write_parquet_atomic(results.to_frame([row], "runs"), path, kind="runs")
    table = cli.show_table([str(runs_dir)], group_by="method", columns="step_time_ms")
    assert "grouped by cuda_graph, compile, matmul_precision too" in capsys.readouterr().err
    assert len(table[table.method == "dense"]) == 4 and 1.0 in table.step_time_ms.tolist()


def test_show_prefers_merged_tables(runs_dir, capsys):
    results.merge([runs_dir / "runs"], runs_dir / "cpu" / "runs.parquet", "runs")
    (runs_dir / "runs" / "cpu" / "r0.runs.parquet").unlink()
    assert len(cli.show_table([str(runs_dir)])) == 4


@pytest.mark.parametrize("argv, message", [
    (["--where", "colour=red"], "unknown column 'colour'"),
    (["--columns", "run_id,colour"], "unknown column(s) ['colour']"),
])
def test_show_names_bad_columns(runs_dir, argv, message, capsys):
    assert cli.main(["show", str(runs_dir), *argv]) == 1
    assert message in capsys.readouterr().err


def test_show_missing_path(tmp_path, capsys):
    assert cli.main(["show", str(tmp_path / "nope.parquet")]) == 1
    assert "nope.parquet" in capsys.readouterr().err


@pytest.mark.parametrize("command, module", [("microbench", "harness.perf.microbench"),
                                             ("bench", "harness.perf.bench"),
                                             ("compare", "harness.reports.compare")])
def test_delegation(monkeypatch, command, module):
    seen = []
    fake = types.ModuleType(module)
    fake.cli = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, module, fake)
    assert cli.main([command, "--x", "1"]) == 7
    assert seen == [["--x", "1"]]


def test_merge_subcommand(runs_dir, tmp_path):
    out = tmp_path / "merged.parquet"
    assert cli.main(["merge", "--kind", "runs", "--out", str(out), str(runs_dir / "runs")]) == 0
    assert len(results.read_parquet(out, "runs")) == 4


@pytest.mark.slow
def test_console_script_writes_error_row_for_cuda_graph_on_cpu(tmp_path):
    """The installed command, in its own process: cuda_graph on CPU gives a clear error row."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(workload="transformer", method="dense",
                                        workload_params={"size": "tiny"}, execution={"cuda_graph": True})))
    runs = tmp_path / "r.runs.parquet"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--spec", str(spec),
                           "--runs-out", str(runs)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    df = results.read_parquet(runs, "runs")
    assert df.at[0, "status"] == "error" and "cuda_graph needs CUDA" in df.at[0, "error"]
    assert "cuda_graph needs CUDA" in proc.stderr


def test_version_and_known_names_in_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("comera-bench ")
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "one of dlrm, mlm, transformer" in out and "one of comera, dense, galore, lte" in out
    # the default output the help and the module docstring name is where a run writes (results/cli)
    assert "results/cli/<device>/<run_id>.runs.parquet" in " ".join(out.split())
    assert "results/runs" not in cli.__doc__ and "(defaults, results/cli/)" in cli.__doc__


@pytest.mark.parametrize("argv, message", [
    (["--workload", "nope", "--method", "dense", "--batch-size", "2"], "unknown workload 'nope'"),
    (["--workload", "transformer", "--method", "sgd", "--batch-size", "2"], "unknown method 'sgd'"),
    (["--workload", "transformer", "--method", "dense", "--batch-size", "2", "--method-param", "lr=-1"],
     "lr"),
    (["--workload", "transformer", "--method", "dense", "--batch-size", "2", "--workload-param", "size=huge"],
     "parameter 'size' must be one of ['tiny', 'small', 'paper'], got 'huge'"),
])
def test_run_usage_errors_exit_2_and_write_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_merge_without_inputs_leaves_the_output_alone(tmp_path, capsys):
    out = tmp_path / "all.parquet"
    out.write_bytes(b"keep me")
    assert cli.main(["merge", "--kind", "runs", "--out", str(out)]) == 2
    assert out.read_bytes() == b"keep me" and "no input files" in capsys.readouterr().err


def test_merge_of_folders_without_files_leaves_the_output_alone(tmp_path, capsys):
    out, empty = tmp_path / "keep.parquet", tmp_path / "empty"
    out.write_bytes(b"keep me")
    empty.mkdir()
    assert cli.main(["merge", "--kind", "runs", "--out", str(out), str(empty)]) == 2
    assert out.read_bytes() == b"keep me"
    assert f"no *.runs.parquet files in {empty}; {out} left as it is" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ('{"workload": "transformer", "method": "dense", "batch_size": 2, "method_params": "abc"}',
     "spec: key 'method_params' must be a mapping, got 'abc'"),
    ('{"workload": "transformer", "method": "dense", "batch_size": 2, "config_hash": "5"}',
     "spec: unknown key 'config_hash'"),
    (b"\xda\x00\xff binary", "cannot read spec"),
])
def test_run_bad_spec_values_are_named(tmp_path, capsys, content, message):
    spec = tmp_path / "s.json"
    spec.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert cli.main(["run", "--spec", str(spec), "--runs-out", str(tmp_path / "r.runs.parquet")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r.runs.parquet").exists()


def test_run_method_param_that_is_not_yaml_is_named():
    with pytest.raises(SystemExit, match=r"--method-param 'lr=\[1,': the value is not valid YAML"):
        cli.main(["run", "--workload", "toy", "--method", "toy", "--batch-size", "2",
                  "--method-param", "lr=[1,"])


@pytest.mark.parametrize("argv, message", [(["--threads", "0"], "--threads 0: need at least 1"),
                                           (["--step-timeout", "-1"], "--step-timeout -1: need a positive")])
def test_bench_bad_options_are_named(capsys, argv, message):
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("variable", ["COMERA_BENCH_CHECKPOINT_S", "COMERA_BENCH_STALL_LIMIT_S"])
def test_run_isolated_with_a_bad_environment_variable_names_it_and_writes_no_row(tmp_path, monkeypatch,
                                                                                 capsys, variable):
    """The supervisor checks the variables its child reads: a bad one is named, no child runs and no row
    says "exited with code 2" instead (a row would end the cell for good)."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(run_id="cell-1")))
    monkeypatch.setenv(variable, "ten minutes")
    runs = tmp_path / "cell-1.runs.parquet"
    assert cli.main(["run", "--isolate", "--spec", str(spec), "--runs-out", str(runs)]) == 2
    assert f"environment variable {variable}='ten minutes'" in capsys.readouterr().err
    assert not runs.exists()


def test_a_bad_pipeline_cells_variable_never_fails_a_cell_whose_row_is_written(tmp_path, monkeypatch, capsys):
    """COMERA_BENCH_PIPELINE_CELLS is the pipeline's own; set by hand to text it used to fail the job after
    the row was written (and Snakemake then deleted the row). The progress line names it instead."""
    from harness.running import eta

    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(run_id="cell-1", budget={"epochs": 1})))
    monkeypatch.setenv(eta.STARTED_ENV, "1000")
    monkeypatch.setenv(eta.CELLS_ENV, "abc")
    import harness.running.supervise as supervise

    monkeypatch.setattr(supervise, "supervise", lambda *a, **k: (0, "ok"))  # the child wrote its row
    runs = tmp_path / "cell-1.runs.parquet"
    assert cli.main(["run", "--isolate", "--spec", str(spec), "--runs-out", str(runs)]) == 0
    assert ("comera-bench: no progress line: environment variable COMERA_BENCH_PIPELINE_CELLS='abc': the "
            "grid's cell count must be a whole number") in capsys.readouterr().err


def test_run_with_runs_out_keeps_its_cache_beside_the_runs_file(tmp_path, toys, monkeypatch):
    """docs/usage.md: the data cache goes where the command writes, not to ./results/cli/cache."""
    from harness.data import cache

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    seen = []
    monkeypatch.setattr(cli, "_run_cell", lambda args: seen.append(os.environ.get(cache.CACHE_ENV)) or 0)
    out = tmp_path / "out" / "x.runs.parquet"
    assert cli.main(["run", "--spec", "s.json", "--runs-out", str(out)]) == 0
    assert cli.main(["run", "--spec", "s.json", "--runs-out", str(out), "--results-dir", "mine"]) == 0
    assert cli.main(["run", "--workload", "toy", "--method", "toy", "--batch-size", "4"]) == 0
    assert seen == [str(tmp_path / "out" / "cache"), str(Path("mine") / "cache"),
                    str(Path("results/cli/cache"))]
