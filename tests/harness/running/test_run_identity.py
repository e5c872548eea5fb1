"""A run's identity: run_id is a plain file name (it names the cell's files), the variant is the config's
with the execution in columns of its own, and the rank column is the rank of the model as built (a
requested rank the shapes cannot hold is clipped; rank 0 is refused)."""
from __future__ import annotations

import json

import pytest
import torch

from baselines.comera import CoMERAMethod, check_params
from harness import cli, results, workloads
from harness import spec as specs
from harness.running import cell
from tests.harness.running.run_toys import toy_spec


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "/abs", ".hidden", "..", "-rf", "a b", 7])
def test_run_id_must_be_a_plain_file_name(run_id):
    with pytest.raises(specs.SpecError, match=r"run_id' must be a plain file name.*" + repr(run_id)[:3]):
        specs.make(toy_spec(run_id=run_id), specs.AS_WRITTEN)


def test_run_with_an_escaping_run_id_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(toy_spec(run_id="../../escaped")))
    assert cli.main(["run", "--spec", str(spec)]) == 2
    assert "run_id' must be a plain file name" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not list(tmp_path.parent.glob("escaped*"))


def test_derived_and_grid_run_ids_accepted():
    derived = specs.make(toy_spec(), specs.AS_WRITTEN)
    assert derived.run_id == f"toy_toy-default_b16_tnone_s0_c{derived.cell_hash[:8]}"
    assert specs.make(toy_spec(run_id="transformer_comera-default_b4_t0.5_s0"), specs.AS_WRITTEN)


@pytest.mark.parametrize("execution, suffix", [
    ({"cuda_graph": True}, "_cg"), ({"compile": True}, "_compiled"),
    ({"matmul_precision": "high"}, "_matmul-high"),
    ({"cuda_graph": True, "compile": True, "matmul_precision": "medium"}, "_cg_compiled_matmul-medium")])
def test_the_rows_variant_is_the_configs_and_its_execution_is_in_columns(execution, suffix):
    """A cell run in a CUDA graph, compiled or at another matmul precision keeps its config's variant; the
    columns cuda_graph, compile and matmul_precision say how it ran (the run_id keeps its suffixes)."""
    raw = toy_spec(variant="paper", execution=execution)
    raw["run_id"] = specs.run_id(raw)  # the grid's name
    row = cell.build_row(cell.CellState(specs.make(raw, specs.AS_WRITTEN)), "error", "stopped")
    assert row["variant"] == "paper" and row["run_id"].endswith(suffix)
    assert (row["cuda_graph"], row["compile"], row["matmul_precision"]) == (
        execution.get("cuda_graph", False), execution.get("compile", False),
        execution.get("matmul_precision", "highest"))
    back = results.to_frame([row], "runs").iloc[0]  # typed columns of the runs table
    assert (bool(back.cuda_graph), bool(back["compile"])) == (row["cuda_graph"], row["compile"])


def test_comera_rank_below_one_refused():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="'rank' must be an integer >= 1 or null"):
            check_params({"rank": bad})


def test_rank_column_is_the_rank_as_built():
    """tiny (d_model 32): no internal bond of its TT layers can exceed 32."""
    params = {"rank": 100000}
    workload = workloads.build_workload("transformer",
                                        workloads.check_params("transformer", {"size": "tiny"}),
                                        batch_size=2, seed=0, device=torch.device("cpu"))
    prepared = CoMERAMethod().prepare(workload.model, workload, params, target_ratio=None, total_steps=4)
    assert cell._rank_setting(prepared.settings, params, prepared, workload) == 32
    assert prepared.settings["rank"] == 100000  # the request stays in the row's settings
