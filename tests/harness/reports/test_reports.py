"""Tables, figures and the device comparison on hand-made result folders (known numbers in,
known ratios and verdicts out)."""
from __future__ import annotations

import json
import sys
import re
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from harness import spec as specs
from harness.reports import compare, drawing, feeds, figures, quality_figures, reference, shared, tables
from harness.results import RUNS_COLUMNS, ResultsError, analysis, merge, to_frame, write_parquet_atomic


def run_row(workload, method, batch, *, variant="default", target=None, time_s=10.0, mem=100e6,
            status="ok", metric=0.5, ranks=None, compression=1.0, graph=False, compiled=False,
            matmul="highest", **extra):
    """A finished runs row; ``graph``, ``compiled`` and ``matmul``: its execution (columns ``cuda_graph``,
    ``compile``, ``matmul_precision``, and the run_id's suffixes as a grid names them)."""
    suffix = ("_cg" if graph else "") + ("_compiled" if compiled else "") + (
        f"_matmul-{matmul}" if matmul != "highest" else "")
    rid = f"{workload}_{method}-{variant}_b{batch}_t{target}{suffix}"
    row = {c: None for c in RUNS_COLUMNS}
    row.update(run_id=rid, workload=workload, method=method, variant=variant, batch_size=batch,
               cuda_graph=graph, compile=compiled, matmul_precision=matmul,
               target_ratio=target, seed=0, status=status, error="" if status == "ok" else "boom",
               step_time_ms=time_s, epoch_time_s=time_s, epoch_time_kind="measured",
               peak_mem_bytes=None if mem is None else int(mem), peak_mem_kind="cpu_rss_delta",
               metric_name="accuracy",
               metric_value=metric, final_train_loss=1.0, params_total=1000, params_factorized_layers=800,
               compression_total=compression, compression_layers=compression, ranks=json.dumps(ranks or {}),
               device="cpu", device_name="Test CPU", num_threads=2, torch_version="x",
               extra=json.dumps({"eval": extra}), timing_quality="stable")
    return row


def spec_for(row):
    """The grid spec of a hand-made row: its identity (its execution columns as execution keys), and the
    params and budget of its settings (as a cell's row records its spec's) where it has them."""
    settings = json.loads(row.get("settings") or "{}")
    return specs.make({
        "purpose": row.get("purpose") or "timing", "workload": row["workload"],
        "workload_params": settings.get("workload_params", {"size": "small"}), "method": row["method"],
        "variant": row["variant"], "method_params": settings.get("method_params", {}),
        "batch_size": row["batch_size"], "target_ratio": row["target_ratio"], "seed": row["seed"],
        "budget": settings.get("budget", {"epochs": 1, "max_steps_per_epoch": 10}),
        "execution": {"device": "cpu", "num_threads": 2, "cuda_graph": bool(row["cuda_graph"]),
                      "compile": bool(row["compile"]),
                      "matmul_precision": row["matmul_precision"] or "highest"}}, specs.AS_WRITTEN)


def make_folder(path, rows, curves=(), sweeps=None):
    """A results folder: the rows (their cell hashes their specs', unless given), curves, grid.json."""
    path.mkdir(parents=True)
    rows = [{**r, "cell_hash": r.get("cell_hash") or spec_for(r).cell_hash} for r in rows]
    write_parquet_atomic(to_frame(rows, "runs"), path / "runs.parquet", kind="runs")
    write_parquet_atomic(to_frame(list(curves), "curves"), path / "curves.parquet", kind="curves")
    cells = {r["run_id"]: spec_for(r).to_dict() for r in rows}
    (path / "grid.json").write_text(json.dumps({"cells": cells, "sweeps": sweeps or {}}))
    return path


def ranks(block_ranks):
    return {f"encoder.layers.{b}.ffn.fc1": r for b, r in block_ranks.items()}


@pytest.fixture
def folder(tmp_path):
    rows = [
        run_row("transformer", "dense", 1, time_s=30), run_row("transformer", "dense", 32, time_s=90),
        run_row("transformer", "comera", 1, time_s=10, mem=10e6,
                ranks=ranks({0: [1, 8, 8, 1], 1: [1, 8, 6, 1]})),
        run_row("transformer", "comera", 32, time_s=30, ranks=ranks({0: [1, 8, 8, 1], 1: [1, 8, 6, 1]})),
        run_row("transformer", "comera", 32, target=0.5, time_s=20,
                ranks=ranks({0: [1, 4, 4, 1], 1: [1, 0, 2, 1]})),
        run_row("transformer", "galore", 1, time_s=25, mem=95e6),
        run_row("transformer", "galore", 32, status="oom", time_s=None, mem=None),
        run_row("transformer", "comera", 32, variant="rank-rank2", time_s=5, compression=40.0),
        run_row("dlrm", "dense", 256, time_s=1, mem=50e6, nce=0.9),
        run_row("dlrm", "comera", 256, time_s=2, mem=10e6, nce=0.95),
    ]
    rows[4]["settings"] = json.dumps({"method": {"switch": {"step": 6, "size": 500.0, "size_target": 250.0}}})
    sweep = {rows[7]["run_id"]: {"rank": 2}}
    curves = [{"run_id": rows[0]["run_id"], "step": s, "epoch": 0, "split": "eval", "metric_name": "accuracy",
               "value": 0.3 + 0.01 * s} for s in (0, 10, 20)]
    # the target run's rank records: before training, at the stage switch (step 6), at the end (step 10)
    for step, r in ((0, [1, 8, 8, 1]), (6, [1, 8, 6, 1]), (10, [1, 0, 2, 1])):
        curves += [{"run_id": rows[4]["run_id"], "step": step, "epoch": 0, "split": "ranks",
                    "metric_name": f"encoder.layers.1.ffn.fc1[{k}]", "value": v} for k, v in enumerate(r)]
    return make_folder(tmp_path / "cpu-test", rows, curves, sweep)


def test_tables(folder, tmp_path):
    res = analysis.load(folder)
    t1, note = tables.table1_ranks(res)
    assert "the last one (index 1)" in note
    assert list(t1.columns) == ["layer", "before training", "after early stage", "late stage, target 0.5"]
    assert t1.iloc[0]["before training"] == "8-8"
    assert t1.iloc[0]["after early stage"] == "8-6"
    assert t1.iloc[0]["late stage, target 0.5"] == "0-2 (removed: rank 0)"
    t2, _ = tables.table2_dlrm(res)
    assert t2["nce [timing cells]"].tolist() == [0.95, 0.9]  # no DLRM quality cell here: said in the header
    assert t2["model_MB [timing cells]"].tolist() == [0.004, 0.004]
    size, _ = tables.table_mnli_size(res)
    assert size.iloc[-1]["source"] == "paper (RTX 3090)"
    assert size.iloc[-1]["total_MB"] == pytest.approx(66957315 * 4 / 1e6, abs=1e-3)
    assert tables.main(["--results", str(folder), "--out", str(tmp_path / "out")]) == 0
    for name in tables.TABLES:
        assert (tmp_path / "out" / f"{name}.csv").exists()
        assert (tmp_path / "out" / f"{name}.md").read_text().startswith("# ")
        page = (tmp_path / "out" / f"{name}.html").read_text()  # what the Snakemake report shows
        assert page.startswith("<!DOCTYPE html>") and "<h1 id=" in page
    assert "oom" in (tmp_path / "out" / "table_runs.md").read_text()
    assert "<td>oom</td>" in (tmp_path / "out" / "table_runs.html").read_text().replace(
        ' style="text-align:left"', "")
    overview = dict(tables.overview(res)[0].values)
    assert overview["cells"].count("timing") >= 1 and "ok" in overview["cells"]
    assert overview["torch / CUDA / Python"].count(" / ") == 2


def test_table2_quality_columns_from_the_quality_cells(tmp_path):
    """Accuracy and NCE come from the DLRM cells trained to learn, time and memory from the timing cells,
    each column headed with its cells."""
    rows = [run_row("dlrm", "dense", 1024, time_s=3, mem=50e6, nce=1.01, accuracy=0.749),
            run_row("dlrm", "comera", 1024, time_s=6, mem=10e6, nce=1.02, accuracy=0.749)]
    for method, nce, acc in (("dense", 0.93, 0.753), ("comera", 0.87, 0.768)):
        row = run_row("dlrm", method, 1024, time_s=300, mem=999e6, nce=nce, accuracy=acc)
        rows.append({**row, "run_id": row["run_id"] + "_quality", "purpose": "quality"})
    table, note = tables.table2_dlrm(analysis.load(make_folder(tmp_path / "d", rows)))
    assert len(table) == 2 and "quality cells" in note
    by = table.set_index("method")
    assert by.loc["comera", "nce [quality cells]"] == 0.87
    assert by.loc["comera", "accuracy [quality cells]"] == 0.768
    assert by.loc["dense", "accuracy [quality cells]"] == 0.753
    assert by.loc["dense", "epoch_time_s [timing cells]"] == 3
    assert by.loc["comera", "peak_mem_MB [timing cells]"] == 10.0


def test_empty_grid_tables_say_not_measured(tmp_path):
    res = analysis.load(make_folder(tmp_path / "d", [run_row("mlm", "dense", 4)]))
    df, note = tables.table2_dlrm(res)
    tables.write_table(df, note, "T", tmp_path, "t", res.settings_line())
    assert "Not measured here: no DLRM run" in (tmp_path / "t.md").read_text()


def test_figures_written_and_failed_cell_marked(folder, tmp_path, monkeypatch):
    out = tmp_path / "figs"
    texts = []
    real_finish = drawing.finish

    def spy(fig, title, footer, out_dir, name, notes=""):
        texts.append((name, [t.get_text() for ax in fig.axes for t in ax.texts]))
        real_finish(fig, title, footer, out_dir, name, notes)

    monkeypatch.setattr(drawing, "finish", spy)
    assert figures.main(["--results", str(folder), "--out", str(out)]) == 0
    for name in figures.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").stat().st_size > 0
    found = dict(texts)
    assert "oom" in found["fig1_time_memory"]  # the failed GaLore cell at batch 32
    assert any(t.startswith("Not measured in this grid") for t in found["fig7_cuda_graph"])
    assert plt.get_fignums() == []


def test_compare_two_devices_and_paper(folder, tmp_path):
    rows = [run_row("transformer", "dense", 1, time_s=15),
            run_row("transformer", "comera", 1, time_s=2, mem=5e6),
            run_row("transformer", "galore", 1, time_s=12, mem=80e6)]
    other = make_folder(tmp_path / "gpu-x", rows)
    out = tmp_path / "cmp"
    assert compare.cli([str(folder), str(other), "--out", str(out)]) == 0
    table = pd.read_csv(out / "compare.csv")
    dense1 = table[(table.method == "dense") & (table.batch_size == 1)].iloc[0]
    assert dense1["epoch_time ratio gpu-x/cpu-test"] == pytest.approx(0.5)
    ratios = pd.read_csv(out / "compare_ratios.csv")
    assert {"cpu-test", "gpu-x", "paper (RTX 3090)", "paper (RTX 4090)"} <= set(ratios.device)
    gx = ratios[(ratios.device == "gpu-x") & (ratios.versus == "galore-default")
                & (ratios.quantity == "epoch_time")]
    assert gx.ratio.iloc[0] == pytest.approx(6.0)
    assert ((out / "compare_time_memory.png").exists()
            and "paper (RTX 4090)" in (out / "compare.md").read_text())


def test_compare_gives_a_ratio_between_devices_the_spread_of_each_sides_round_means(tmp_path):
    """Cells on two devices share no round: the ratio of their epoch times, its low-high from each device's
    round-mean quartiles over its median (harness.results.analysis.apart_ratio), in the csv, the md and
    the figure; a side with one round gives no spread."""
    def rows(dense_s, dense_rounds, comera_s, comera_rounds):
        found = [run_row("transformer", "dense", 1, time_s=dense_s),
                 run_row("transformer", "comera", 1, time_s=comera_s)]
        for row, means in zip(found, (dense_rounds, comera_rounds)):
            row["round_step_mean_ms"] = json.dumps(means)
        return found

    here = rows(30, [27.0, 30.0, 33.0], 10, [10.0])
    there = rows(15, [14.0, 15.0, 16.0, 15.0], 5, [5.0, 5.0])
    out = tmp_path / "cmp"
    folders = [str(make_folder(tmp_path / "here", here)), str(make_folder(tmp_path / "there", there))]
    assert compare.cli([*folders, "--out", str(out)]) == 0
    table = pd.read_csv(out / "compare.csv")
    dense, comera = (table[table.method == m].iloc[0] for m in ("dense", "comera"))
    col = "epoch_time ratio there/here"
    # there: quartiles 14.75 / 15 / 15.25; here: 28.5 / 30 / 31.5
    assert (dense[f"{col} low"], dense[col], dense[f"{col} high"]) == (
        pytest.approx(0.5 * 14.75 / 15 * 30 / 31.5), pytest.approx(0.5),
        pytest.approx(0.5 * 15.25 / 15 * 30 / 28.5))
    # one round here
    assert comera[f"{col} low"] == comera[col] == comera[f"{col} high"] == pytest.approx(0.5)
    md = (out / "compare.md").read_text()
    assert f"{col} low" in md and "round-mean quartiles over its median, combined the widest way" in md
    assert "peak_mem ratio there/here low" not in md  # a memory ratio has no spread


def _seq_rows(seq, time_s, **kw):
    rows = [run_row("mlm", "dense", 16, time_s=time_s, **kw),
            run_row("mlm", "comera", 16, time_s=time_s / 2, **kw)]
    for r in rows:
        r.update(run_id=f"{r['run_id']}_seq{seq}", seq_len=seq,
                 settings=json.dumps({
                     "workload_params": {"size": kw.pop("size", "small") if False else "small",
                                         "seq_len": seq},
                     "budget": {"epochs": 1}}))
    return rows


def test_compare_keeps_sweep_points_apart(tmp_path):
    a = make_folder(tmp_path / "a", _seq_rows(128, 92.0) + _seq_rows(512, 920.0))
    b = make_folder(tmp_path / "b", _seq_rows(128, 46.0) + _seq_rows(512, 460.0))
    table, labels, warnings = compare.side_by_side([a, b])
    dense = table[table.method == "dense"].sort_values("seq_len")
    assert dense["epoch_time@a"].tolist() == [92.0, 920.0]  # never pooled into one median
    assert dense["epoch_time ratio b/a"].tolist() == [pytest.approx(0.5), pytest.approx(0.5)]
    assert warnings == []


def test_compare_flags_and_refuses_what_differs(folder, tmp_path, capsys):
    rows = [run_row("transformer", "dense", 1, time_s=15),
            run_row("transformer", "comera", 1, time_s=2, mem=5e6)]
    rows[0].update(peak_mem_kind="cuda_allocated", num_threads=16)
    rows[1].update(timing_quality="noisy: CPU pressure 60% (> 25%)")
    other = make_folder(tmp_path / "gpu-y", rows)
    table, labels, _ = compare.side_by_side([folder, other])
    dense = table[(table.method == "dense") & (table.batch_size == 1)].iloc[0]
    assert pd.isna(dense["peak_mem ratio gpu-y/cpu-test"])  # cpu_rss_delta vs cuda_allocated: refused
    assert dense["epoch_time ratio gpu-y/cpu-test"] == pytest.approx(0.5)
    assert ("memory kind differs" in dense.differences
            and "torch threads differs (cpu-test 2 vs gpu-y 16)" in dense.differences)
    comera = table[(table.method == "comera") & (table.batch_size == 1) & table.target_ratio.isna()].iloc[0]
    assert pd.isna(comera["epoch_time ratio gpu-y/cpu-test"])
    assert "timing not stable on gpu-y: CPU pressure 60%" in comera.differences
    ratios = compare.method_ratios([other])
    left = ratios[(ratios.device == "gpu-y") & (ratios.quantity == "epoch_time")]
    assert left.ratio.isna().all() and (left.note == "left out: timing not stable").all()


def test_compare_does_not_pair_cells_whose_method_params_differ(tmp_path):
    """A CPU CoMERA cell with size_weight 10 and a GPU one with size_weight 1 are two cells (another cell
    hash), not one cell on two devices; size_weight 10 and 10.0 are one."""
    def comera(size_weight):
        row = run_row("transformer", "comera", 1, time_s=10)
        params = specs.registry_checks().method("comera", {"size_weight": size_weight})
        row["settings"] = json.dumps({"workload_params": {"size": "small"}, "method_params": params,
                                      "budget": {"epochs": 1}})
        return row

    cpu = make_folder(tmp_path / "cpu", [comera(10)])
    table, _, warnings = compare.side_by_side([cpu, make_folder(tmp_path / "gpu", [comera(1)])])
    assert len(table) == 2 and table["epoch_time ratio gpu/cpu"].isna().all()
    assert "no cell in common" in warnings[0] and "method_params" in warnings[0]
    table, _, warnings = compare.side_by_side([cpu, make_folder(tmp_path / "gpu-float", [comera(10.0)])])
    assert len(table) == 1 and table["epoch_time ratio gpu-float/cpu"].iloc[0] == pytest.approx(1.0)


def test_compare_of_different_model_sizes_warns(folder, tmp_path, capsys):
    rows = [run_row("transformer", "dense", 1, time_s=15)]
    rows[0]["settings"] = json.dumps({"workload_params": {"size": "paper"}, "budget": {"epochs": 1}})
    other = make_folder(tmp_path / "paper-gpu", rows)
    assert compare.cli([str(folder), str(other), "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "no cell in common" in err and "paper" in err
    assert "no cell in common" in (tmp_path / "c" / "compare.md").read_text()


def test_compare_same_folder_names_need_names(folder, tmp_path, capsys):
    assert compare.cli([str(folder), str(folder), "--out", str(tmp_path / "c")]) == 2
    assert "two result folders named 'cpu-test'" in capsys.readouterr().err
    assert compare.cli([str(folder), str(folder), "--names", "a,b", "--out", str(tmp_path / "c")]) == 0
    assert "epoch_time ratio b/a" in pd.read_csv(tmp_path / "c" / "compare.csv").columns


def test_truncated_cell_file_fails_merge_naming_it(tmp_path):
    rows = [run_row("transformer", "dense", 1)]
    good = write_parquet_atomic(to_frame(rows, "runs"), tmp_path / "a.runs.parquet", kind="runs")
    bad = tmp_path / "b.runs.parquet"
    bad.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ResultsError, match="b.runs.parquet"):
        merge([good, bad], tmp_path / "merged.parquet", "runs")


def test_reference_sources_complete():
    data = reference.load()
    assert set(reference.CLAIM_IDS) == set(data["claims"])
    labels = [d["label"] for d in reference.paper_devices().values()]
    assert labels == ["paper (RTX 3090)", "paper (RTX 4090)"]


SWITCH, SWITCH_SIZE = 4, 1000.0  # every quality CoMERA cell's stage switch: step and TT size right after it
RANKS_BEFORE, RANKS_AT_SWITCH = [1, 8, 8, 1], [1, 8, 7, 1]
RANKS_END = {0.8: [1, 6, 6, 1], 0.5: [1, 4, 4, 1], 0.2: [1, 0, 2, 1]}


def quality_cell(method, target=None, *, end_acc=0.9, variant="default", switched=True, status="ok"):
    """(runs row, curves) of a transformer quality cell (batch 32): eval accuracy at steps 0, 4, 8; a
    CoMERA cell with a target also the TT size after steps 1, 4, 8 (1200, the switch's 1000, then 1050 x
    its target) and the ranks of blocks 3 and 4 before training, at the switch and at the end."""
    end = RANKS_END.get(target, RANKS_AT_SWITCH) if switched else RANKS_AT_SWITCH
    row = run_row("transformer", method, 32, variant=variant, target=target, metric=end_acc, status=status,
                  ranks=ranks({3: [1, 5, 5, 1], 4: end}), loss=round(2 * (1 - end_acc), 2))
    row.update(run_id=row["run_id"] + "_quality", purpose="quality")
    rid, curves = row["run_id"], []
    for step, acc in ((0, 0.3), (4, 0.92), (8, end_acc)):
        curves += [{"run_id": rid, "step": step, "epoch": 0, "split": "eval", "metric_name": metric,
                    "value": value}
                   for metric, value in (("accuracy", acc), ("loss", round(2 * (1 - acc), 2)))]
    if target is not None:
        row["settings"] = json.dumps({"method": {
            "late_start_step": SWITCH, "target_ratio": target,
            "switch": ({"step": SWITCH, "size": SWITCH_SIZE, "size_target": SWITCH_SIZE * target}
                       if switched else {})}})
        end_size = 1050.0 * target if switched else SWITCH_SIZE
        row["target_reached"] = switched  # 1.05 x the target: within the library's 5%
        for step, size in ((1, 1200.0), (SWITCH, SWITCH_SIZE), (8, end_size)):
            curves.append({"run_id": rid, "step": step, "epoch": 0, "split": "method",
                           "metric_name": "params_tt", "value": size})
        for step, r in ((0, RANKS_BEFORE), (SWITCH, RANKS_AT_SWITCH), (8, end)):
            curves += [{"run_id": rid, "step": step, "epoch": 0, "split": "ranks",
                        "metric_name": f"encoder.layers.4.ffn.fc1[{k}]", "value": v} for k, v in enumerate(r)]
    return row, curves


def quality_folder(path, *cells, with_timing=True):
    """Quality cells (default: dense, CoMERA at targets 0.2 / 0.8 / 0.5, deliberately out of order, GaLore,
    LTE-tuned) plus timing cells whose numbers must not reach the quality outputs: dense (accuracy 0.1,
    99 s per epoch) and CoMERA at target 0.5 (ranks 9-9, switch at step 2)."""
    cells = cells or (quality_cell("dense", end_acc=0.95), quality_cell("comera", 0.2, end_acc=0.90),
                      quality_cell("comera", 0.8, end_acc=0.97), quality_cell("comera", 0.5, end_acc=0.94),
                      quality_cell("galore", end_acc=0.93), quality_cell("lte", variant="tuned", end_acc=0.6))
    rows = [row for row, _ in cells]
    curves = [c for _, cell_curves in cells for c in cell_curves]
    if with_timing:
        comera = run_row("transformer", "comera", 32, target=0.5, metric=0.2, ranks=ranks({4: [1, 9, 9, 1]}))
        comera["settings"] = json.dumps({"method": {"switch": {"step": 2, "size": 10.0}}})
        rows += [run_row("transformer", "dense", 32, metric=0.1, time_s=99.0), comera]
        curves += [{"run_id": comera["run_id"], "step": s, "epoch": 0, "split": "ranks",
                    "metric_name": f"encoder.layers.4.ffn.fc1[{k}]", "value": v}
                   for s in (0, 2, 4) for k, v in enumerate([1, 9, 9, 1])]
    return analysis.load(make_folder(path, rows, curves))


@pytest.fixture
def drawn(monkeypatch):
    """name -> (axes' labelled lines as {label: y data} in drawing order, texts, footer) of every figure
    drawn while it is in use (not written); (name, "notes") -> its notes."""
    found = {}

    def spy(fig, title, footer, out, name, notes=""):
        found[(name, "notes")] = notes
        lines = [{**{ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()
                     if not ln.get_label().startswith("_")},
                  **{c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers
                     if hasattr(c, "lines") and not c.get_label().startswith("_")}}
                 for ax in fig.axes]
        found[name] = (lines, [t.get_text() for ax in fig.axes for t in ax.texts], footer)
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    return found


def test_timing_outputs_ignore_quality_cells(tmp_path, drawn):
    res = quality_folder(tmp_path / "q")
    assert res.main_runs("transformer").metric_value.tolist() == [0.1, 0.2]
    figures.fig1_time_memory(res, tmp_path)
    (times, _), _, footer = drawn["fig1_time_memory"]
    assert times == {"uncompressed": [99.0]}  # the quality cells' 10 s epochs are not drawn
    overview, _ = tables.overview(res)
    notes = drawn[("fig1_time_memory", "notes")]  # the cells' budget: in the notes, not the footer
    assert "<= 10 steps/epoch" in notes and "<= 10 steps/epoch" not in footer
    runs = res.runs.assign(cuda_graph=res.runs.method == "dense")  # Fig 7 draws the timing one only
    write_parquet_atomic(runs, tmp_path / "q" / "runs.parquet", kind="runs")
    figures.fig7_cuda_graph(analysis.load(tmp_path / "q"), tmp_path)
    assert drawn["fig7_cuda_graph"][0][0]["uncompressed + CUDA graph"] == [99.0]
    runs, _ = tables.table_runs(res)
    assert runs.purpose.value_counts().to_dict() == {"quality": 6, "timing": 2}
    assert set(runs.resumed_at) == {""} and "cells resumed from a checkpoint" not in set(overview.iloc[:, 0])
    ratios = compare.method_ratios([res_dir := tmp_path / "q"])
    assert ratios[ratios.source == "measured"].empty  # no timing CoMERA row without a target to compare with
    table, _, _ = compare.side_by_side([res_dir])
    assert sorted(table[table.method == "dense"].purpose) == ["quality", "timing"]


def test_a_resumed_cell_is_named_in_the_overview_and_the_runs_table(tmp_path):
    row, curves = quality_cell("comera", 0.5)
    row["extra"] = json.dumps({"resumed": [{"step": 3, "checkpoint_written_at": "t"},
                                           {"step": 7, "checkpoint_written_at": "u"}]})
    res = quality_folder(tmp_path / "q", (row, curves), quality_cell("dense"), with_timing=False)
    runs, note = tables.table_runs(res)
    assert dict(zip(runs.run_id, runs.resumed_at)) == {
        row["run_id"]: "3, 7", res.runs.run_id[res.runs.method == "dense"].iloc[0]: ""}
    assert "resumed_at" in note
    overview = dict(tables.overview(res)[0].values)
    assert overview["cells resumed from a checkpoint"] == f"1 (table_runs: resumed_at): {row['run_id']}"


def test_a_cell_timed_alone_and_each_groups_gpu_memory_are_in_the_overview(tmp_path):
    gib = 2 ** 30
    rows = [run_row("transformer", method, 128, variant=variant) for method, variant in
            (("dense", "default"), ("comera", "default"), ("galore", "default"), ("dense", "b"))]
    for row, group, used, alone in zip(rows, ("g128", "g128", None, "g32"), (20, 23, 9, 5),
                                       (False, False, True, False)):
        row.update(timing_group=group, device="cuda", extra=json.dumps(
            {"memory": {"device_in_use_bytes": used * gib, "device_total_bytes": 24 * gib},
             **({"timed_alone": "it ran out of memory beside its group (test)"} if alone else {})}))
    res = analysis.load(make_folder(tmp_path / "r", rows))
    runs, note = tables.table_runs(res)
    assert dict(zip(runs.run_id, runs.timed_alone))[rows[2]["run_id"]] == "yes" and "timed_alone" in note
    assert sorted(runs.timed_alone) == ["", "", "", "yes"]
    overview = dict(tables.overview(res)[0].values)
    assert overview["cells timed alone after running out of memory beside their timing group"] == (
        f"1 (table_runs: timed_alone; their ratios are of cells timed apart): {rows[2]['run_id']}")
    memory = [v for k, v in overview.items() if k.startswith("GPU memory in use by each timing group")]
    assert memory == ["g128 23.0 of 24.0 GiB; g32 5.0 of 24.0 GiB"]  # the largest reading of each group


COMPILE_TROUBLE = "compiled cells with graph breaks or an eager fallback"


@pytest.mark.parametrize("report, text, named", [
    (None, "", False),
    ({"graphs": 1, "graph_breaks": 0, "eager_fallbacks": []}, "1 graph, 0 breaks", False),
    ({"graphs": 3, "graph_breaks": 1, "eager_fallbacks": []}, "3 graphs, 1 break", True),
    ({"graphs": 1, "graph_breaks": 0, "eager_fallbacks": ["Dynamo recompile limit exceeded"]},
     "1 graph, 0 breaks; eager fallback: Dynamo recompile limit exceeded", True),
])
def test_a_compiled_cells_graphs_are_in_the_runs_table_and_breaks_or_fallbacks_in_the_overview(
        tmp_path, report, text, named):
    """An eager cell beside a compiled one (extra.compile: harness.running.compiled): the runs table says
    what the compiler made of the compiled one; the overview names it when steps ran outside its graphs."""
    eager, cell = (run_row("transformer", "dense", 8),
                   run_row("transformer", "dense", 8, compiled=True))
    if report is not None:
        cell["extra"] = json.dumps({"compile": report})
    res = analysis.load(make_folder(tmp_path / "r", [eager, cell]))
    runs, note = tables.table_runs(res)
    assert dict(zip(runs.run_id, runs.compiled)) == {eager["run_id"]: "", cell["run_id"]: text}
    assert "compiled: " in note and "eager fallbacks" in note
    overview = dict(tables.overview(res)[0].values)
    assert overview.get(COMPILE_TROUBLE) == (f"1 (table_runs: compiled; their steps ran partly or wholly "
                                             f"outside compiled graphs): {cell['run_id']}" if named else None)


def test_table1_reads_quality_cells_in_target_order(tmp_path):
    t1, note = tables.table1_ranks(quality_folder(tmp_path / "q"))
    assert list(t1.columns) == ["layer", "before training", "after early stage", "late stage, target 0.8",
                                "late stage, target 0.5", "late stage, target 0.2"]
    assert t1.layer.tolist() == ["encoder.layers.4.ffn.fc1", "TT size of the model (scalars)"]
    assert t1.iloc[0, 1:].tolist() == ["8-8", "8-7", "6-6", "4-4", "0-2 (removed: rank 0)"]  # no timing "9-9"
    assert t1.iloc[1, 1:].tolist() == ["1200", "1000", "840", "525", "210"]
    assert "5th encoder block" in note and "from the quality cells" in note and "step 4" in note


def test_table1_shows_the_project_rules_with_and_without_reach_target(tmp_path):
    """The library's defaults and its reach_target variant side by side, the latter's columns named so;
    the paper's rules are not Table 1's."""
    res = quality_folder(tmp_path / "q", quality_cell("dense"), quality_cell("comera", 0.2),
                         quality_cell("comera", 0.5, variant="reach"),
                         quality_cell("comera", 0.2, variant="reach"),
                         quality_cell("comera", 0.2, variant="paper"))
    t1, _ = tables.table1_ranks(res)
    assert list(t1.columns) == ["layer", "before training", "after early stage", "late stage, target 0.2",
                                "late stage, target 0.5 (project rules with reach_target)",
                                "late stage, target 0.2 (project rules with reach_target)"]


def test_table1_says_when_the_early_stage_pruned_no_rank(tmp_path, monkeypatch):
    """Ranks at the switch equal to those before training: the note says why (the early stage's default)."""
    _, note = tables.table1_ranks(quality_folder(tmp_path / "q"))
    assert "pruned no rank" not in note  # 8-8 -> 8-7
    monkeypatch.setattr(sys.modules[__name__], "RANKS_AT_SWITCH", RANKS_BEFORE)
    _, note = tables.table1_ranks(quality_folder(tmp_path / "same"))
    assert "the early stage pruned no rank" in note and "The early stage" in note


def test_size_table_orders_targets_and_takes_end_over_switch_from_curves_and_settings(tmp_path):
    size, note = tables.table_mnli_size(quality_folder(tmp_path / "q"))
    ours = size[size.source != "paper (RTX 3090)"].set_index("method")
    assert ours.index.tolist() == ["dense", "comera (target 0.8)", "comera (target 0.5)",
                                   "comera (target 0.2)", "galore", "lte-tuned"]
    assert ours.accuracy.tolist() == [0.95, 0.97, 0.94, 0.90, 0.93, 0.6]  # not the timing cell's 0.1
    assert ours.eval_loss.tolist() == [0.1, 0.06, 0.12, 0.2, 0.14, 0.8]  # the same evaluation's loss
    assert list(size.columns[4:6]) == ["accuracy", "eval_loss"] and "eval_loss = its cross-entropy" in note
    comera = ours.loc[ours.target.notna()]
    assert comera.accuracy_at_switch.tolist() == [0.92] * 3
    assert comera.tt_size_at_switch.tolist() == [SWITCH_SIZE] * 3
    assert comera["end/switch"].tolist() == pytest.approx([0.84, 0.525, 0.21])
    assert ours.loc["dense", "end/switch"] != ours.loc["dense", "end/switch"]  # NaN: no TT size
    assert size.iloc[-1]["source"] == "paper (RTX 3090)" and "quality cells" in note


def test_quality_cells_still_learning_at_their_end_are_noted_and_named(tmp_path):
    """A quality cell whose accuracy rose by more than 0.02 over its last fifth of steps (0.92 at step 4
    -> its end at step 8) gets a note and an overview row; a timing cell's rising curve does not."""
    timing_row, timing_curves = quality_cell("lte", variant="tuned", end_acc=0.99)
    timing_row["purpose"] = "timing"
    res = quality_folder(tmp_path / "q", quality_cell("dense", end_acc=0.95),
                         quality_cell("galore", end_acc=0.93), (timing_row, timing_curves), with_timing=False)
    size, note = tables.table_mnli_size(res)
    notes = dict(zip(size.method, size.note))
    assert notes["dense"] == ("still learning at its end: validation accuracy 0.920 -> 0.950 over its "
                              "last 20% of steps")
    assert notes["galore"] == "" and "a note \"still learning\": its accuracy rose by more than 0.02" in note
    overview = dict(tables.overview(res)[0].values)
    assert overview["quality cells still learning at their end (accuracy not settled: train longer)"] == (
        "1 (table_mnli_size: note): transformer_dense-default_b32_tNone_quality")


def test_quality_figures_draw_one_line_per_method_and_target(tmp_path, drawn):
    res = quality_folder(tmp_path / "q")
    quality_figures.fig6_accuracy(res, tmp_path)
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    (acc, loss), _, footer = drawn["fig6_accuracy"]
    assert list(acc)[:6] == list(loss)[:6] == ["dense", "comera (target 0.8)", "comera (target 0.5)",
                                               "comera (target 0.2)", "galore", "lte-tuned"]
    switch = "stage switch, seed 0"
    assert acc["comera (target 0.2)"] == [0.3, 0.92, 0.9] and switch in acc
    assert loss["comera (target 0.2)"] == [1.4, 0.16, 0.2] and switch in loss
    assert "quality cells, batch 32" in footer
    (size, acc13), _, _ = drawn["fig13_rank_adaptation"]
    targets = ["comera (target 0.8)", "comera (target 0.5)", "comera (target 0.2)"]
    assert list(size)[:3] == targets and list(acc13)[:3] == targets
    assert size["comera (target 0.2)"] == pytest.approx([1.2, 1.0, 0.21])  # TT size / the size at the switch
    assert acc13["comera (target 0.5)"] == [0.3, 0.92, 0.94]


@pytest.mark.parametrize("end_acc, scale", [(0.95, "log"), (0.5, "linear")])
def test_fig6_draws_the_loss_on_a_log_scale_only_where_it_spans_a_decade(tmp_path, monkeypatch, end_acc,
                                                                         scale):
    """Losses 2 x (1 - accuracy): 1.4, 0.16 and 0.1 span 14x (log scale); 1.4, 0.16 and 1.0 span 8.75x."""
    seen = {}
    monkeypatch.setattr(drawing, "finish", lambda fig, *_: seen.update(
        scale=fig.axes[1].get_yscale(), label=fig.axes[1].get_ylabel()))
    res = quality_folder(tmp_path / "q", quality_cell("dense", end_acc=end_acc))
    quality_figures.fig6_accuracy(res, tmp_path)
    assert seen["scale"] == scale and seen["label"].endswith(", log scale)") == (scale == "log")


def test_missing_late_stage_and_failed_cell_are_named(tmp_path, drawn):
    res = quality_folder(tmp_path / "q", quality_cell("dense"), quality_cell("comera", 0.8),
                         quality_cell("comera", 0.5, switched=False),
                         quality_cell("comera", 0.2, status="oom"))
    t1, note = tables.table1_ranks(res)
    assert list(t1.columns)[-1] == "late stage, target 0.8"
    assert ("not measured here: target 0.5: late stage never started (late_start_step 4); target 0.2: oom: "
            "boom" in note)
    size, _ = tables.table_mnli_size(res)
    assert size.note.tolist()[1:4] == ["target reached", "late stage never started (late_start_step 4)",
                                       "oom: boom"]
    # the oom cell failed after its switch
    assert size["end/switch"].notna().tolist()[1:4] == [True, False, True]
    quality_figures.fig6_accuracy(res, tmp_path)
    (acc, _), texts, _ = drawn["fig6_accuracy"]
    assert "comera (target 0.5) [late stage never started (late_start_step 4)]" in acc
    assert "comera (target 0.2): oom" in texts  # the failed cell's red cross
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    (size13, _), texts, _ = drawn["fig13_rank_adaptation"]
    assert [k for k in size13 if k.startswith("comera")] == ["comera (target 0.8)"]
    assert [t.replace("\n", " ") for t in texts] == [
        "not measured here: target 0.5: late stage never started (late_start_step 4); target 0.2: oom: boom"]


def test_quality_outputs_without_quality_cells(tmp_path, drawn):
    """Timing cells stand in (said so), one line per cell even when methods repeat over batch sizes;
    without CoMERA targets Table 1 and fig13 say what is missing."""
    rows = [run_row("transformer", "dense", 1), run_row("transformer", "dense", 32)]
    curves = [{"run_id": r["run_id"], "step": s, "epoch": 0, "split": "eval", "metric_name": "accuracy",
               "value": 0.3 + r["batch_size"] / 100} for r in rows for s in (0, 10)]
    res = analysis.load(make_folder(tmp_path / "d", rows, curves))
    t1, note = tables.table1_ranks(res)
    assert t1.empty and "no finished CoMERA run" in note and "timing cells" in note
    size, note = tables.table_mnli_size(res)
    assert size.method.tolist() == ["dense", "dense", "dense (paper shapes)"] and "timing cells" in note
    quality_figures.fig6_accuracy(res, tmp_path)
    (acc, loss), texts, footer = drawn["fig6_accuracy"]
    assert acc["dense, batch 1"] == [0.31, 0.31] and acc["dense, batch 32"] == [0.62, 0.62]
    assert "dense, batch 1" not in loss and "no validation loss recorded by these runs" in texts
    assert "timing cells (this grid has no quality cells)" in footer
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    assert drawn["fig13_rank_adaptation"][1][0].startswith("Not measured in this grid: CoMERA runs with a "
                                                           "target")
    empty = analysis.load(make_folder(tmp_path / "e", [run_row("dlrm", "dense", 4)]))
    quality_figures.fig6_accuracy(empty, tmp_path)
    assert drawn["fig6_accuracy"][1][0].startswith("Not measured in this grid: eval accuracy curves")


def test_size_table_prints_whole_scalar_counts_and_names_its_data(tmp_path):
    res = quality_folder(tmp_path / "q")
    for i, row in res.runs.iterrows():  # the quality cells ran on the synthetic task
        res.runs.at[i, "settings"] = json.dumps({**json.loads(row.settings or "{}"),
                                                 "workload_info": {"data": "synthetic"}})
    df, note = tables.table_mnli_size(res)
    sizes = [v for v in df.tt_size_at_switch if pd.notna(v)]
    assert sizes and all(float(v).is_integer() for v in sizes)
    tables.write_table(df, note, tables.TITLES["table_mnli_size"], tmp_path, "t", res.settings_line())
    text = (tmp_path / "t.md").read_text()
    assert "e+0" not in text and "the synthetic NLI task, not MNLI" in text
    assert "(MNLI task)" not in tables.TITLES["table_mnli_size"]


def _cells(*rows):
    cols = ("run_id", "workload", "method", "variant", "batch_size", "target_ratio", "status", "epoch_time_s",
            "flops_per_step")
    return pd.DataFrame([dict(zip(cols, r)) for r in rows]).assign(
        seed=0, timing_quality="stable", cuda_graph=False, compile=False, matmul_precision="highest")


def test_speedup_note_gives_the_ratio_and_flops_where_comera_is_slower():
    df = _cells(("d1", "transformer", "dense", "default", 1, None, "ok", 4.0, 1e9),
                ("c1", "transformer", "comera", "default", 1, None, "ok", 12.0, 2e8),
                ("d32", "transformer", "dense", "default", 32, None, "ok", 100.0, 3e10),
                ("c32", "transformer", "comera", "default", 32, None, "ok", 40.0, 6e9))
    note = figures.speedup_note(df)
    assert note.startswith("Uncompressed / CoMERA time (stable cells;")
    assert "0.33x @ batch 1, 2.50x @ batch 32" in note
    assert "CoMERA slower than uncompressed at batch 1: 5.0x fewer FLOPs, 3.00x the time" in note
    assert "batch 32:" not in note
    assert "slower" not in figures.speedup_note(df[df.batch_size == 32])
    noisy = df.assign(timing_quality=["stable", "noisy: x", "stable", "stable"])
    assert "@ batch 1" not in figures.speedup_note(noisy)  # a noisy cell gives no ratio


def test_ramp_text_names_the_target_ramp():
    runs = pd.DataFrame({"settings": [json.dumps({"method": {"target_ramp": 0.8}})]})
    assert "over 80% of the late stage" in quality_figures.ramp_text(runs)
    fixed = pd.DataFrame({"settings": [json.dumps({"method": {"target_ramp": 0.0}})]})
    assert "fixed" in quality_figures.ramp_text(fixed)


@pytest.mark.parametrize("last_nce, noted", [(0.999, True), (0.7, False)])
def test_base_rate_note_when_no_dlrm_run_learned(last_nce, noted):
    nce = pd.DataFrame({"run_id": ["a", "a", "b"], "step": [10, 20, 20], "value": [0.5, last_nce, 1.0]})
    note = figures.base_rate_note(nce, "timing cells")
    assert ("No run learned more than the click base rate in its 20 steps" in note) is noted


def test_fig7_draws_the_pipelines_cuda_graph_cells_beside_their_eager_twins(tmp_path, drawn):
    """A CUDA-graph cell's row has the config's variant and ``cuda_graph`` true (harness.running.cell): one
    series per method and mode, labelled by the mode from the columns, at each batch size."""
    rows = [run_row("transformer", method, b, time_s=time, **how)
            for b in (32, 128) for method, how, time in (
                ("dense", {}, 50.0), ("dense", {"graph": True}, 40.0), ("comera", {}, 30.0),
                ("comera", {"graph": True}, 10.0), ("dense", {"matmul": "high"}, 20.0),
                ("comera", {"compiled": True}, 25.0))]
    path = make_folder(tmp_path / "g", rows)
    figures.fig7_cuda_graph(analysis.load(path), tmp_path)
    series = drawn["fig7_cuda_graph"][0][0]
    assert series == {"comera": [30.0, 30.0], "comera + CUDA graph": [10.0, 10.0],
                      "comera (compiled)": [25.0, 25.0], "uncompressed": [50.0, 50.0],
                      "uncompressed + CUDA graph": [40.0, 40.0], "uncompressed TF32 (high)": [20.0, 20.0]}


def test_fig1_and_its_speedups_tell_tf32_and_compiled_cells_from_fp32_ones(tmp_path, drawn):
    """config/gpu.yaml runs uncompressed training at matmul precision high beside full FP32, with the same
    variant: Fig 1 draws it as its own series (labelled from ``matmul_precision``) and its footer's
    uncompressed / CoMERA ratio is the FP32 cells' (a compiled CoMERA cell is not the reference either)."""
    rows = [run_row("transformer", "dense", 32, time_s=20.0, matmul="high"),  # first: read first if at all
            run_row("transformer", "comera", 32, time_s=5.0, compiled=True),
            run_row("transformer", "dense", 32, time_s=60.0),
            run_row("transformer", "comera", 32, time_s=30.0)]
    res = analysis.load(make_folder(tmp_path / "t", rows))
    assert {r.variant for r in res.runs.itertuples()} == {"default"}
    figures.fig1_time_memory(res, tmp_path)
    series, _, footer = drawn["fig1_time_memory"]
    assert set(series[0]) == {"comera", "comera (compiled)", "uncompressed", "uncompressed TF32 (high)"}
    assert "Uncompressed / CoMERA time 2.00x" in footer, footer


def test_curve_lines_part_by_size_data_and_sequence_length_where_they_vary(tmp_path, drawn):
    """Fig 10 on paper.yaml's MLM cells: CodeBERT on code at seq 128 and 512 and BERT-large on text are
    separate lines, not one line per method and batch."""
    rows, curves = [], []
    for entry, size, data, seq in (("mlm", "paper", "stdlib", 128), ("mlm", "paper", "stdlib", 512),
                                   ("bert", "bert-large", "text", 128)):
        row = run_row("mlm", "dense", 32)
        row.update(run_id=f"{entry}_dense_s{seq}", seq_len=seq,
                   settings=json.dumps({"workload_params": {"size": size}, "workload_info": {"data": data}}))
        rows.append(row)
        curves += [{"run_id": row["run_id"], "step": s, "epoch": 0, "split": "train", "metric_name": "loss",
                    "value": seq / 100 + s} for s in (1, 2)]
    figures.fig10_mlm_loss(analysis.load(make_folder(tmp_path / "m", rows, curves)), tmp_path)
    (lines,), _, footer = drawn["fig10_mlm_loss"]
    # the paper's CodeBERT-large loss is another model's: stated in the footer, never on this axis
    assert "CoMERA's final loss 0.36 on CodeBERT-large" in footer and "not drawn" in footer
    drawn_lines = {k: pytest.approx(v) for k, v in lines.items()}
    assert drawn_lines == {"dense, batch 32, size paper, data stdlib, seq 128": [2.28, 3.28],
                           "dense, batch 32, size paper, data stdlib, seq 512": [6.12, 7.12],
                           "dense, batch 32, size bert-large, data text, seq 128": [2.28, 3.28]}


def test_a_long_curve_is_drawn_as_a_rolling_mean_over_its_faint_steps(tmp_path, monkeypatch):
    """300 per-step losses alternating 1 and 2 (one seed): the labelled line is their 10-step centred rolling
    mean (1.5 inside), each step is drawn faint behind it, and the footer says so; a short curve is drawn
    as it is (the other curve tests)."""
    row = run_row("mlm", "dense", 16)
    row.update(run_id=f"{row['run_id']}_s0_quality", seed=0, purpose="quality")
    curves = [{"run_id": row["run_id"], "step": s, "epoch": 0, "split": "train", "metric_name": "loss",
               "value": 1.0 + s % 2} for s in range(300)]
    found = {}

    def spy(fig, title, footer, out, name, notes=""):
        (ax,) = fig.axes
        found.update(lines=[(ln.get_label(), list(ln.get_ydata()), ln.get_alpha()) for ln in ax.get_lines()],
                     footer=footer)
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    figures.fig10_mlm_loss(analysis.load(make_folder(tmp_path / "c", [row], curves)), tmp_path)
    (faint,) = [ys for label, ys, alpha in found["lines"] if alpha is not None and alpha < 1]
    assert faint == [1.0 + s % 2 for s in range(300)]
    (smooth,) = [ys for label, ys, _ in found["lines"] if "batch 16" in label]
    assert smooth[10:290] == pytest.approx([1.5] * 280)
    assert "10-step rolling means (each step faint)" in found["footer"]


@pytest.mark.parametrize("workload, split, metric, figure", [
    ("dlrm", "eval", "nce", "fig9_dlrm_nce"), ("mlm", "train", "loss", "fig10_mlm_loss")])
def test_curve_figures_draw_the_quality_cells_seeds_as_mean_and_range(tmp_path, monkeypatch, workload, split,
                                                                      metric, figure):
    """Fig 9 and Fig 10 draw a workload's quality cells where the grid has them, not its short timing cells
    (value 5.0 here): one line per method, the mean over the seeds, the seeds' range shaded."""
    rows, curves = [], []
    values = {("dense", 0): [1.0, 0.9, 0.8], ("dense", 1): [1.0, 0.8, 0.6],
              ("comera", 0): [1.0, 0.95, 0.9], ("comera", 1): [1.0, 0.85, 0.7]}
    for method in ("dense", "comera"):
        timing = run_row(workload, method, 64)
        rows.append(timing)
        curves += [{"run_id": timing["run_id"], "step": s, "epoch": 0, "split": split, "metric_name": metric,
                    "value": 5.0} for s in (10, 20)]
        for seed in (0, 1):
            row = run_row(workload, method, 64)
            row.update(run_id=f"{row['run_id']}_s{seed}_quality", seed=seed, purpose="quality")
            rows.append(row)
            curves += [{"run_id": row["run_id"], "step": s, "epoch": 0, "split": split, "metric_name": metric,
                        "value": v} for s, v in zip((0, 10, 20), values[method, seed])]
    found = {}

    def spy(fig, title, footer, out, name, notes=""):
        (ax,) = fig.axes
        found.update(lines={ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()
                            if "batch" in ln.get_label()},
                     bands=len(ax.collections), footer=footer)
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    getattr(figures, figure)(analysis.load(make_folder(tmp_path / "c", rows, curves)), tmp_path)
    assert found["lines"] == {"comera, batch 64, mean of seeds 0, 1": pytest.approx([1.0, 0.9, 0.8]),
                              "dense, batch 64, mean of seeds 0, 1": pytest.approx([1.0, 0.85, 0.7])}
    assert found["bands"] == 2 and "; quality cells; shaded: the range over the seeds" in found["footer"]


def lookup_folder(path):
    """A results folder with C6's small-table lookups, the naive TTM one at 20000 indices not stable."""
    from tests.harness.reports.test_claims import SMALL_TABLE, lookup_rows

    path = make_folder(path, [run_row("transformer", "dense", 1)])
    rows = lookup_rows(SMALL_TABLE, device="cpu", name="Test CPU", ttm_extra=1000)
    noisy = next(r for r in rows if r["variant"] == "ttm_naive" and r["tokens"] == 20000)
    noisy["timing_quality"] = "noisy: rounds: 1 round(s) (< 2)"
    prov = {c: None for c in ("torch_version", "cuda_version", "python_version", "comera_bench_version",
                              "git_commit", "git_dirty", "hostname", "started_at", "matmul_precision")}
    write_parquet_atomic(to_frame([{**prov, "num_threads": 1, **r} for r in rows], "microbench"),
                         path / "microbench.parquet", kind="microbench")
    return path


def test_fig5_rings_the_lookups_whose_timing_is_not_stable(tmp_path, drawn):
    """Each lookup's time with the IQR of its rounds; a case whose rounds were not stable is ringed, as a
    cell's point is."""
    path = lookup_folder(tmp_path / "m")
    rings = []
    real_plot = plt.Axes.plot

    def plot(ax, *args, **kw):
        if kw.get("markerfacecolor") == "white":
            rings.append((list(args[0]), list(args[1])))
        return real_plot(ax, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Axes, "plot", plot)
        figures.fig5_ttm_lookup(analysis.load(path), tmp_path)
    assert [ring for ring in rings if ring[0]] == [([20000], [10.0])]
    assert "black-ringed: timing not stable, left out of C6" in drawn["fig5_ttm_lookup"][2]


def test_fig5_gives_each_lookup_one_colour_in_both_panels(tmp_path, monkeypatch):
    """The legend beside the memory panel names the time panel's lines too: a ring (which takes a colour
    from the cycle) must not shift the time panel's colours."""
    path = lookup_folder(tmp_path / "m")
    seen = {}

    def spy(fig, *_args, **_kw):
        time_ax, memory_ax = fig.axes[:2]
        seen["time"] = {c.get_label(): c.lines[0].get_color() for c in time_ax.containers}
        seen["memory"] = {ln.get_label(): ln.get_color() for ln in memory_ax.get_lines()}
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    figures.fig5_ttm_lookup(analysis.load(path), tmp_path)
    assert len(seen["time"]) > 2 and seen["time"] == seen["memory"]


def test_a_target_not_reached_is_drawn_and_named_not_left_out(tmp_path, drawn):
    """A late stage that ran and stopped short of its target (its rank adaptation's shortfall) is drawn in
    Fig 13 and counted in Table 1, marked "target not reached", and never listed as not measured."""
    row, curves = quality_cell("comera", 0.2)
    settings = json.loads(row["settings"])
    settings["method"]["outcome"] = {"shortfall": "stopped at 0.400 of the size at the switch, target 0.2: "
                                                  "the late stage (40 steps) ended first"}
    row["settings"] = json.dumps(settings)
    row["target_reached"] = False
    res = quality_folder(tmp_path / "q", quality_cell("dense"), quality_cell("comera", 0.5), (row, curves))
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    (sizes, _), texts, _ = drawn["fig13_rank_adaptation"]
    assert "comera (target 0.2) [target not reached]" in sizes and "comera (target 0.5)" in sizes
    assert not any("not measured" in t for t in texts)
    assert "the late stage (40 steps) ended first" in drawn[("fig13_rank_adaptation", "notes")]
    t1, note = tables.table1_ranks(res)
    assert list(t1.columns)[-1] == "late stage, target 0.2" and "not measured here" not in note
    assert ("targets not reached (the late stage's ranks where it stopped): target 0.2: stopped at 0.400"
            in note)
    size, _ = tables.table_mnli_size(res)
    assert size.note.tolist()[2].startswith("target not reached: stopped at 0.400")
    assert size.note.tolist()[1] == "target reached" and size.note.tolist()[0] == ""


def test_reached_is_the_rows_verdict_not_the_curve(tmp_path, drawn):
    """Fig 13, Table 1 and the size table read the row's target_reached (the library's rule: within 5% or
    one rank's saving), not a rule of their own: a curve ending 20% above its target with the row's
    target_reached true (no rank could go) is not a miss; one ending on it with target_reached false is."""
    above, above_curves = quality_cell("comera", 0.5)
    above_curves = [{**c, "value": 1.2 * SWITCH_SIZE * 0.5}
                    if c["metric_name"] == "params_tt" and c["step"] == 8 else c for c in above_curves]
    short, short_curves = quality_cell("comera", 0.2)
    short["target_reached"] = False
    res = quality_folder(tmp_path / "q", quality_cell("dense"), (above, above_curves), (short, short_curves))
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    (sizes, _), texts, _ = drawn["fig13_rank_adaptation"]
    assert "comera (target 0.5)" in sizes and "comera (target 0.2) [target not reached]" in sizes
    missed = [t.replace("\n", " ") for t in texts if "targets not reached" in t]
    assert missed and "target 0.2" in missed[0] and "target 0.5" not in missed[0]
    size, _ = tables.table_mnli_size(res)
    by_target = {t: note.split(":")[0] for t, note in zip(size.target, size.note) if t == t}
    assert by_target == {0.5: "target reached", 0.2: "target not reached"}
    _, note = tables.table1_ranks(res)
    assert "targets not reached (the late stage's ranks where it stopped): target 0.2" in note
    assert "target 0.5" not in note.split("targets not reached")[1]


def test_unfed_figures_of_a_transformer_only_grid():
    timing = spec_for(run_row("transformer", "comera", 4, target=0.5)).to_dict()
    quality = spec_for(run_row("transformer", "dense", 4)).to_dict()
    quality["purpose"] = "quality"
    cells = {"a": {**timing, "purpose": None}, "b": quality}
    assert list(feeds.unfed(cells, {}, {"tiny": {"embedding": {}}})) == [
        "fig1_time_memory", "fig7_cuda_graph", "fig8_dlrm_time_memory", "fig9_dlrm_nce", "fig10_mlm_loss",
        "fig12_time_vs_compression"]  # the only timing cell has a target: no Fig 1
    cells["c"] = spec_for(run_row("transformer", "dense", 4)).to_dict()
    cells["c"]["execution"]["cuda_graph"] = True
    unfed = feeds.unfed(cells, {"a": {"rank": 4}}, {})
    assert "fig7_cuda_graph" not in unfed and "fig12_time_vs_compression" not in unfed
    # the sweep's cell is no Fig 13 cell
    assert "fig5_ttm_lookup" in unfed and "fig13_rank_adaptation" in unfed


def test_quality_cells_alone_feed_the_curve_figures():
    cells = {}
    for workload in ("dlrm", "mlm"):
        spec = spec_for(run_row(workload, "dense", 64)).to_dict()
        cells[workload] = {**spec, "purpose": "quality"}
    unfed = feeds.unfed(cells, {}, {})
    assert "fig9_dlrm_nce" not in unfed and "fig10_mlm_loss" not in unfed
    assert "fig8_dlrm_time_memory" in unfed  # a quality cell is never timed for a figure


def test_not_drawn_figures_are_named_once_in_the_overview(folder, tmp_path):
    out = tmp_path / "figs"
    assert figures.main(["--results", str(folder), "--out", str(out), "--not-drawn", "fig7_cuda_graph"]) == 0
    assert not (out / "fig7_cuda_graph.png").exists() and (out / "fig1_time_memory.png").exists()
    assert tables.main(["--results", str(folder), "--out", str(out), "--not-drawn", "fig7_cuda_graph",
                        "fig12_time_vs_compression"]) == 0
    text = (out / "overview.md").read_text()
    assert text.count("fig7_cuda_graph: needs transformer cells with execution.cuda_graph true") == 1
    assert "fig12_time_vs_compression: needs a CoMERA sweep" in text
    with pytest.raises(SystemExit):
        figures.main(["--results", str(folder), "--out", str(out), "--not-drawn", "fig99"])


def test_fig6_draws_the_paper_line_on_mnli_only_and_fig13_names_a_missed_target(tmp_path, drawn):
    row, curves = quality_cell("comera", 0.5)
    curves = [{**c, "value": SWITCH_SIZE} if c["metric_name"] == "params_tt" and c["step"] == 8 else c
              for c in curves]  # no rank was pruned after the switch
    row["target_reached"] = False
    res = analysis.load(make_folder(tmp_path / "syn", [quality_cell("dense")[0], row],
                                  quality_cell("dense")[1] + curves))
    quality_figures.fig6_accuracy(res, tmp_path)
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    (acc, _), _, footer = drawn["fig6_accuracy"]
    assert not any(label.startswith("paper") for label in acc) and "~64% (real MNLI) not drawn" in footer
    texts = drawn["fig13_rank_adaptation"][1]
    missed = "targets not reached: comera target 0.5 (seed 0) ends at 1.00x"
    assert any(missed in t.replace("\n", " ") for t in texts), texts
    settings = json.loads(row["settings"])
    mnli = [{**r, "settings": json.dumps({**settings, "workload_info": {"data": "mnli"}})}
            for r in (quality_cell("dense")[0], row)]
    quality_figures.fig6_accuracy(analysis.load(make_folder(tmp_path / "mnli", mnli, curves)), tmp_path)
    (acc, _), _, _ = drawn["fig6_accuracy"]
    assert "paper (RTX 3090): final MNLI accuracy ~64%" in acc


def test_distinct_styles_keep_coinciding_lines_visible():
    first, second = quality_figures.distinct(0), quality_figures.distinct(1)
    assert first["ls"] != second["ls"] and first["lw"] > second["lw"] and first["color"] != second["color"]


def test_compare_figure_says_the_shared_workload_once_and_names_left_out_ratios(tmp_path, monkeypatch):
    rows = [run_row("transformer", m, 4, time_s=t) for m, t in (("dense", 2.0), ("comera", 5.0))]
    rows[0]["timing_quality"] = "noisy"
    folder = make_folder(tmp_path / "cpu-a", rows)
    table, labels, _ = compare.side_by_side([folder])
    cells, common = compare.short_labels(table)
    assert common == "transformer[size=small]" and sorted(cells) == ["comera-default/b4", "dense-default/b4"]
    saved = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: saved.update(
        size=tuple(fig.get_size_inches()), titles=[ax.get_title() for ax in fig.axes]))
    compare.plot(table, labels, compare.method_ratios([folder]), tmp_path)
    assert saved["size"][0] == 14 and saved["size"][1] < 10  # two panels a row, not a 24-inch strip
    assert "not drawn: 1 measured ratio(s) (timing not stable)" in saved["titles"]


def test_compare_axes_label_only_1_2_5_ticks_and_rows_without_a_batch_size():
    """A short log range labels 1, 2 and 5 per decade as plain numbers (minor ticks unlabelled: they
    overlapped as "3x10^-1 4x10^-1"); a paper ratio for every batch size is said so, not "ball"."""
    fig, (ax, ax2) = plt.subplots(1, 2)
    ax.barh([0, 1], [0.3, 4.0])
    compare._log_x_if_positive(ax, [pd.Series([0.3, 4.0])], "time")
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()] == []
    assert {t.get_text() for t in ax.get_xticklabels() if t.get_text()} >= {"0.5", "1", "2"}
    ratios = pd.DataFrame({"quantity": ["epoch_time"], "ratio": [2.3], "low": [2.3], "high": [2.3],
                           "workload": ["mlm"], "batch_size": [None], "versus": ["dense-default"],
                           "device": ["paper (RTX 3090)"], "source": ["paper"], "note": [""]})
    compare._speedups(ax2, ratios)
    assert [t.get_text() for t in ax2.get_yticklabels()] == ["mlm/every batch: dense-default"]
    assert ax2.get_ylim() == (-0.6, 0.6)
    plt.close(fig)


def test_compare_prints_paper_batch_sizes_whole(folder, tmp_path):
    out = tmp_path / "cmp"
    assert compare.cli([str(folder), "--out", str(out)]) == 0
    text = (out / "compare.md").read_text()
    assert re.search(r"\|\s*10000\s*\|", text) and "1e+04" not in text  # the paper's DLRM batch


def test_compare_gives_a_noisy_quality_cell_no_time_ratio(tmp_path):
    row, _ = quality_cell("dense")
    noisy = {**row, "timing_quality": "noisy: IQR 51% of the median (> 25%)", "epoch_time_s": 20.0}
    table, labels, _ = compare.side_by_side([make_folder(tmp_path / "a", [row]),
                                             make_folder(tmp_path / "b", [noisy])])
    cell = table[table.purpose == "quality"].iloc[0]
    assert pd.isna(cell["epoch_time ratio b/a"]) and cell["differences"] == compare.QUALITY_TIME
    assert cell["peak_mem ratio b/a"] == 1.0


def test_fig1_footer_fits_two_lines_and_memory_points_carry_their_seeds_range(folder, tmp_path, drawn):
    """Fig 1's footer is two lines at most (its details are in its notes); a memory point is one cell's
    peak (said so: one seed, no spread) or, with several seeds, their median with a min-max bar."""
    res = analysis.load(folder)
    figures.fig1_time_memory(res, tmp_path)
    _, _, footer = drawn["fig1_time_memory"]
    fig, _ = drawing.panels(2)
    width = int(fig.get_figwidth() * drawing.FOOTER_CHARS_PER_INCH)
    shown = drawing.short_footer(footer, "Notes: fig1_time_memory.md.", width)
    assert len(drawing.textwrap.wrap(shown, width)) <= 2
    plt.close(fig)
    assert "memory: cpu_rss_delta of one cell (one seed: no spread)" in footer
    # the figure's ratios stay
    assert "Uncompressed / CoMERA time 3.00x @ batch 1, 3.00x @ batch 32." in footer
    rows = [run_row("transformer", "dense", 4, mem=mem) for mem in (100e6, 140e6, 110e6)]
    for seed, row in enumerate(rows):
        row["seed"], row["run_id"] = seed, f"{row['run_id']}_s{seed}"
    res = analysis.load(make_folder(tmp_path / "seeds", rows))
    figures.fig1_time_memory(res, tmp_path)
    (_, memory), _, footer = drawn["fig1_time_memory"]
    assert memory == {"uncompressed": [110.0]}  # the median of the three seeds
    fig, (ax,) = drawing.panels(1)
    figures._per_batch(ax, res.main_runs("transformer"), "peak_mem_bytes", shared.MB, "peak memory (MB)")
    (bar,) = [c for c in ax.containers]
    segment = bar.lines[2][0].get_segments()[0]
    assert [y for _, y in segment] == [100.0, 140.0]  # min to max
    assert ax.get_ylim()[1] > 140.0  # the top marker is not cut by the frame
    plt.close(fig)
    assert "memory: cpu_rss_delta, median and min-max bar over 3 seeds" in footer


def test_compare_marks_unstable_times_and_says_they_were_measured(tmp_path, monkeypatch):
    """Every cell's timing unstable on one device: its bars are hatched, the device-ratio panel draws each
    cell's raw ratio hollow and says the ratios were measured, none stable (not "nothing measured"); a
    row's differences name the reasons in a few words."""
    reason = ("noisy: IQR 94% of the median of the steps without the periodic work (every 10 steps; > 25%); "
              "its threads waited for a CPU 74% of their runnable time (> 10%); CPU pressure 100% (> 25%)")
    rows = [run_row("transformer", m, 4, time_s=t) for m, t in (("dense", 2.0), ("comera", 5.0))]
    noisy = [{**r, "timing_quality": reason, "epoch_time_s": 2 * r["epoch_time_s"]} for r in rows]
    folders = [str(make_folder(tmp_path / name, data)) for name, data in (("cpu-a", rows), ("cpu-b", noisy))]
    drawn = {}
    monkeypatch.setattr(compare, "save", lambda fig, out: drawn.update(fig=fig))
    assert compare.cli([*folders, "--out", str(tmp_path / "out")]) == 0
    time_ax, _, ratio_ax = drawn["fig"].axes[:3]
    assert sum(bar.get_hatch() == compare.UNSTABLE_HATCH for bar in time_ax.patches) == 2
    assert "log scale: 2 measured, none stable (hollow: no ratio)" in ratio_ax.get_xlabel()
    hollow = [list(line.get_xdata()) for line in ratio_ax.get_lines() if "not stable" in line.get_label()]
    assert hollow == [[2.0, 2.0]]
    plt.close(drawn["fig"])
    table = pd.read_csv(tmp_path / "out" / "compare.csv")
    assert set(table.differences) == {"timing not stable on cpu-b: IQR 94%, its threads waited for a CPU "
                                      "74%, CPU pressure 100%"}


def seeded_cell(cell, seed, compression=1.0, matched=None, **method):
    """A quality cell of ``seed`` with its whole-model compression; ``matched``: a size-matched record;
    ``method``: more of its method settings (a CoMERA cell's outcome, a dense model's selection)."""
    row, curves = cell
    rid = f"{row['run_id']}_s{seed}"
    row = {**row, "run_id": rid, "seed": seed, "compression_total": compression}
    if matched or method:
        settings = json.loads(row.get("settings") or "{}")
        settings.setdefault("method", {}).update(method, **({"matched": matched} if matched else {}))
        row["settings"] = json.dumps(settings)
    return row, [{**c, "run_id": rid} for c in curves]


SELECTED = {"shape": "task-vocabulary", "dims": {"d_model": 48, "d_ff": 192, "num_layers": 2,
                                                 "task_vocabulary": 102},
            "lr": 0.001, "params": 67203, "candidates": [{}] * 9, "metric": "accuracy", "tied": 1}


def _reached(cell, reached):
    row, curves = cell
    return {**row, "target_reached": reached}, curves


def fig14_cells():
    """Two seeds of dense, CoMERA at 0.5 and 0.2 (seed 1 stops short of 0.2) and, matched to CoMERA 0.2's
    reached size of each seed, the size-matched dense and fixed-rank TT models."""
    cells = []
    for seed, shift in ((0, 0.0), (1, 0.02)):
        source = f"{quality_cell('comera', 0.2)[0]['run_id']}_s{seed}"
        record = {"run": source, "params": 70000, "target": 0.2, "target_reached": seed == 0}
        short = {"outcome": {"shortfall": "the loss guard held it back"}} if seed else {}
        cells += [seeded_cell(quality_cell("dense", end_acc=0.93 + shift), seed),
                  seeded_cell(quality_cell("comera", 0.5, end_acc=0.92 + shift), seed, 7.7),
                  _reached(seeded_cell(quality_cell("comera", 0.2, end_acc=0.83 + shift), seed, 7.9, **short),
                           seed == 0),
                  seeded_cell(quality_cell("dense", variant="size-matched", end_acc=0.75 + shift), seed, 8.2,
                              record, selection=SELECTED),
                  seeded_cell(quality_cell("comera", variant="fixed-rank", end_acc=0.79 + shift), seed, 7.8,
                              {**record, "rank": 6, "embedding_rank": 12, "fixed_params": 71000}),
                  seeded_cell(quality_cell("galore", end_acc=0.90 + shift), seed)]
    cells[0][0]["params_total"] = 553219
    return cells


def test_fig14_places_every_point_at_its_size_hollow_where_a_target_was_missed_and_pairs_the_matched(
        tmp_path, monkeypatch):
    """A small marker per seed and a large one at their mean, at the measured compression; CoMERA 0.2's
    seed 1 missed its target: that seed's marker and the mean are hollow; each size-matched model is joined
    to the CoMERA point it matches, and the footer compares them at equal size."""
    kept = {}
    monkeypatch.setattr(drawing, "finish",
                        lambda fig, title, footer, *a, **k: kept.update(fig=fig, footer=footer))
    res = quality_folder(tmp_path / "q", *fig14_cells())
    quality_figures.fig14_accuracy_vs_compression(res, tmp_path)
    (ax,) = kept["fig"].axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    missed = lines["comera (target 0.2) [target not reached: 1 of 2]"]
    assert missed.get_markerfacecolor() == "none" and missed.get_ydata()[0] == pytest.approx(0.84)
    assert lines["comera (target 0.5)"].get_markerfacecolor() != "none"
    hollow = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")
              and ln.get_markerfacecolor() == "none" and len(ln.get_xdata())]
    assert [list(ln.get_ydata()) for ln in hollow] == [[pytest.approx(0.85)]]  # seed 1 of target 0.2 only
    dense = lines["uncompressed, size-matched to CoMERA target 0.2"]
    fixed = lines["comera-fixed-rank, size-matched to CoMERA target 0.2"]
    assert dense.get_xdata()[0] == pytest.approx(8.2, rel=0.1) and dense.get_ydata()[0] == pytest.approx(0.76)
    assert fixed.get_ydata()[0] == pytest.approx(0.80)
    joins = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and len(ln.get_xdata()) == 2]
    assert sorted(sorted(ln.get_ydata()) for ln in joins) == [[pytest.approx(0.76), pytest.approx(0.84)],
                                                               [pytest.approx(0.80), pytest.approx(0.84)]]
    assert "At equal size: comera target 0.2 (7.9x) 0.840, dense (8.2x) 0.760, fixed-rank TT (7.8x) 0.800" \
        in kept["footer"]
    assert "hollow: target not reached" in kept["footer"]
    plt.close(kept["fig"])
    size, _ = tables.table_mnli_size(res)
    notes = set(size[size.method == "dense, size-matched to CoMERA target 0.2"].note)
    assert notes == {"matches CoMERA target 0.2 (reached): 70000 parameters; chosen on held-out training "
                     "data of 9: task-vocabulary (d_model 48, d_ff 192, num_layers 2, task_vocabulary 102), "
                     "lr 0.001",
                     "matches CoMERA target 0.2 (not reached): 70000 parameters; chosen on held-out training "
                     "data of 9: task-vocabulary (d_model 48, d_ff 192, num_layers 2, task_vocabulary 102), "
                     "lr 0.001"}
    fixed_notes = set(size[size.method == "comera-fixed-rank, size-matched to CoMERA target 0.2"].note)
    assert fixed_notes == {"matches CoMERA target 0.2 (reached): 70000 parameters; rank 6 (TTM 12)",
                           "matches CoMERA target 0.2 (not reached): 70000 parameters; rank 6 (TTM 12)"}


def test_fig14_gives_the_gaps_per_target_and_draws_the_uncompressed_line(tmp_path, drawn):
    res = quality_folder(tmp_path / "q", *fig14_cells())
    quality_figures.fig14_accuracy_vs_compression(res, tmp_path)
    (points,), texts, footer = drawn["fig14_accuracy_vs_compression"]
    assert points["uncompressed"] == [pytest.approx(0.94)]  # the mean of the seeds' 0.93 and 0.95
    assert points["uncompressed, mean 0.940 (seeds' range shaded)"] == [pytest.approx(0.94)] * 2
    assert points["galore"] == [pytest.approx(0.91)]
    assert footer.startswith("Accuracy minus the uncompressed mean (0.940), per target: comera -0.010 / "
                             "-0.100 at 7.7x / 7.9x")  # the figure's finding first
    assert "2 seeds" in footer and "quality cells" in footer
    size, note = tables.table_mnli_size(res)
    tables.write_table(size, note, "t", tmp_path, "t", "")
    text = (tmp_path / "t.md").read_text()
    assert " 553219 |" in text and "e+05" not in text  # the dense rows' count, whole


def test_fig14_joins_each_comera_variants_targets_and_names_its_gaps_and_matched_models(tmp_path,
                                                                                      monkeypatch):
    """A black line through each CoMERA variant's targets, of its own pattern, in the legend; the footer
    gives each variant's gap to the uncompressed model per target and names the variant the size-matched
    models match."""
    kept = {}
    monkeypatch.setattr(drawing, "finish",
                        lambda fig, title, footer, *a, **k: kept.update(fig=fig, footer=footer))
    record = {"run": f"{quality_cell('comera', 0.2, variant='reach')[0]['run_id']}_s0", "variant": "reach",
              "params": 30000, "target": 0.2, "target_reached": True}
    cells = [seeded_cell(quality_cell("dense", end_acc=0.94), 0),
             seeded_cell(quality_cell("comera", 0.2, end_acc=0.93), 0, 5.0),
             seeded_cell(quality_cell("comera", 0.5, variant="reach", end_acc=0.93), 0, 8.0),
             seeded_cell(quality_cell("comera", 0.2, variant="reach", end_acc=0.90), 0, 18.0),
             seeded_cell(quality_cell("dense", variant="size-matched", end_acc=0.75), 0, 18.5, record,
                         selection=SELECTED)]
    res = quality_folder(tmp_path / "q", *cells)
    quality_figures.fig14_accuracy_vs_compression(res, tmp_path)
    (ax,) = kept["fig"].axes
    points = {ln.get_label(): ln for ln in ax.get_lines()}
    joined = points["comera-reach: its targets joined"]
    assert sorted(joined.get_ydata()) == [pytest.approx(0.90), pytest.approx(0.93)]
    assert joined.get_linestyle() == "--" and joined.get_color() == "black"
    assert "comera: its targets joined" not in points  # one target: no line
    assert "uncompressed, size-matched to comera-reach target 0.2" in points
    footer = kept["footer"]
    assert footer.startswith("Accuracy minus the uncompressed mean (0.940), per target: comera -0.010 at "
                             "5.0x; comera-reach -0.010 / -0.040 at 8.0x / 18.0x. ")
    assert "At equal size: comera-reach target 0.2 (18.0x) 0.900, dense (18.5x) 0.750" in footer


def test_gaps_are_each_targets_accuracy_minus_uncompressed_from_the_least_compression():
    points = pd.DataFrame({"compression": [22.7, 7.7], "accuracy": [0.80, 0.96], "target": [0.2, 0.5]})
    assert (quality_figures.gaps_text(points, 0.95, "comera-paper")
            == "comera-paper +0.010 / -0.150 at 7.7x / 22.7x")
    assert quality_figures.gaps_text(points.iloc[:0], 0.95, "comera") == ""


def test_a_log_axis_spanning_decades_is_labelled_in_plain_numbers():
    """Fig 1 and Fig 8's time panels (drawing.log_if_spread): 1.6 to 24 s gives plain tick labels, never
    "2x10^1" beside "3x10^1"."""
    fig, (ax,) = drawing.panels(1)
    values = pd.Series([1.6, 4.7, 24.0])
    ax.plot([1, 2, 3], values, marker="o")
    drawing.log_if_spread(ax, values)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()]
    plt.close(fig)
    assert ax.get_yscale() == "log" and labels
    assert not any("times" in label or "^" in label for label in labels), labels


@pytest.mark.parametrize("column, value", [("epoch_time_s", -1.6), ("epoch_time_s", 0.0),
                                           ("step_time_ms", float("inf")),
                                           ("round_step_mean_ms", json.dumps([5.0, -2.0]))])
def test_compare_refuses_a_time_that_is_not_positive_and_finite_naming_the_file_and_column(
        tmp_path, capsys, column, value):
    """An ok row's negative, zero or infinite time would give a negative or infinite ratio (and a figure
    pyplot cannot draw): the folder is refused, naming its runs file, the cell and the column."""
    here = make_folder(tmp_path / "here", [run_row("transformer", "dense", 1, time_s=10.0),
                                           run_row("transformer", "comera", 1, time_s=5.0)])
    rows = [run_row("transformer", "dense", 1, time_s=10.0), run_row("transformer", "comera", 1, time_s=5.0)]
    rows[1][column] = value
    there = make_folder(tmp_path / "there", rows)
    out = tmp_path / "cmp"
    assert compare.cli([str(here), str(there), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{there / 'runs.parquet'}: cell {rows[1]['run_id']}: column {column!r} holds" in err
    assert "a time must be a finite number > 0" in err
    assert not (out / "compare.csv").exists()
    with pytest.raises(ResultsError, match=column):
        compare.method_ratios([there])


def test_the_runs_table_says_how_periodic_work_was_timed(tmp_path):
    row = run_row("transformer", "galore", 1)
    row["extra"] = json.dumps({"periodic": {"galore projection": {
        "every": 20, "how": "forced", "steps": [9], "step_ms": [80.0], "extra_ms": 41.25, "timed": "..."}}})
    rows = [row, run_row("dlrm", "dense", 4)]
    runs, note = tables.table_runs(analysis.load(make_folder(tmp_path / "d", rows)))
    assert runs.periodic_work.tolist() == ["", "galore projection every 20: forced (step 9, +41.2 ms)"]
    assert "periodic_work" in note


RATIO_TEXT = re.compile(r"(\d+\.\d+)x \[(\d+\.\d+)-(\d+\.\d+)\] @ batch (\d+)")


def test_dividing_two_plotted_points_gives_the_footers_ratio(tmp_path, drawn):
    """On a synthetic default-grid folder (interleaved rounds whose per-round ratios differ from the
    quotient of the cells' mean-based epoch times): Fig 1's uncompressed point over its CoMERA point is the
    footer's ratio, within its printed interval, at every batch size the footer names; so is Fig 8's and
    each Fig 12 point over its uncompressed line; and the ratio is the claims' (analysis.pair_ratio)."""
    from tests.harness.reports import synthetic

    folder = synthetic.results_folder(synthetic.ROOT / "config" / "config.yaml", tmp_path / "r")
    runs = analysis.load(folder).runs.assign(timing_quality="stable")  # every pair has its ratio
    write_parquet_atomic(to_frame(runs.to_dict("records"), "runs"), folder / "runs.parquet", kind="runs")
    res = analysis.load(folder)
    for name in ("fig1_time_memory", "fig8_dlrm_time_memory"):
        getattr(figures, name)(res, tmp_path)
        (times, _), _, footer = drawn[name]
        found = RATIO_TEXT.findall(footer)
        assert found, footer
        workload = "transformer" if name.startswith("fig1") else "dlrm"
        batches = sorted(res.main_runs(workload).batch_size.unique())
        for value, low, high, batch in found:
            at = batches.index(int(batch))
            quotient = times["uncompressed"][at] / times["comera"][at]
            assert f"{quotient:.2f}" == value and float(low) <= quotient <= float(high)
            runs = res.main_runs(workload)
            runs = runs[(runs.batch_size == int(batch)) & runs.target_ratio.isna()]
            dense, comera = runs[runs.method == "dense"], runs[(runs.method == "comera")
                                                               & (runs.variant == "default")]
            assert quotient == pytest.approx(analysis.pair_ratio(dense, comera).value)
            mean_based = dense.epoch_time_s.iloc[0] / comera.epoch_time_s.iloc[0]
            assert quotient != pytest.approx(mean_based, rel=1e-6)  # what was drawn before
    figures.fig12_time_vs_compression(res, tmp_path)
    (lines,), _, footer = drawn["fig12_time_vs_compression"]
    (line_y, *_), points = lines["uncompressed, batch 4"], lines["CoMERA, batch 4"]
    slower = [y / line_y for y in points if y > line_y]  # the footer names each point slower than the line
    assert slower and all(f"{q:.2f}x [" in footer for q in slower)


def test_every_notes_file_states_model_settings_methods_and_measurement(folder, tmp_path):
    """README: each figure's notes file gives the model, the settings, the methods and how it was measured
    (drawing.NOTE_PARTS): every figure drawn from a folder, and every one with nothing to draw; finish
    refuses notes without them."""
    nothing = make_folder(tmp_path / "none", [])
    for results, out in ((folder, tmp_path / "drawn"), (nothing, tmp_path / "empty")):
        assert figures.main(["--results", str(results), "--out", str(out)]) == 0
        written = sorted(out.glob("fig*.md"))
        assert len(written) == len(figures.FIGURES)
        for path in written:
            assert drawing.missing_note_parts(path.read_text()) == [], path.name
    fig, _ = drawing.panels(1)
    with pytest.raises(ValueError, match=r"fig99: its notes lack Methods, Measured"):
        drawing.finish(fig, "t", "footer", tmp_path, "fig99", "Model: m.\n\nSettings: s.")
    with pytest.raises(ValueError, match="Measured left empty"):
        drawing.notes(model="m", settings="s", methods="x", measured=" ")


def test_fig6_gives_each_method_its_colour_and_each_seed_its_line_style(tmp_path, drawn, monkeypatch):
    """Two seeds of dense, GaLore and CoMERA: one colour per method configuration (never shared), the seed
    as the dash pattern; each stage-switch line says whose switch it is."""
    cells = [quality_cell(m, t) for m, t in (("dense", None), ("galore", None), ("comera", 0.5))]
    seeded = []
    for row, curves in cells:
        for seed in (0, 1):
            rid = f"{row['run_id']}_s{seed}"
            seeded.append(({**row, "run_id": rid, "seed": seed}, [{**c, "run_id": rid} for c in curves]))
    res = quality_folder(tmp_path / "q", *seeded, with_timing=False)
    styles = quality_figures.line_styles(res.quality_runs("transformer")[0])
    by_run = {rid.split("_quality")[0].split("_")[1] + rid[-3:]: s for rid, s in styles.items()}
    colours = {key: s["color"] for key, s in by_run.items()}
    assert len(set(colours.values())) == 3  # one per method configuration
    for method in {key[:-3] for key in by_run}:
        assert colours[method + "_s0"] == colours[method + "_s1"]
        assert by_run[method + "_s0"]["ls"] == "-" and by_run[method + "_s1"]["ls"] == "--"
    quality_figures.fig6_accuracy(res, tmp_path)
    (acc, _), _, _ = drawn["fig6_accuracy"]
    switches = [label for label in acc if label.startswith("stage switch")]
    assert switches == ["stage switch, seed 0/1"]
    assert "line style: seed 0 solid, seed 1 dashed" in drawn[("fig6_accuracy", "notes")]


def test_method_legend_merges_seeds_and_keeps_their_marks():
    """One entry per method and target: the seeds' entries merge, each keeping its mark and seed; stage
    switches stay as drawn (whose switch it is); then one entry per seed's line style."""
    fig, ax = plt.subplots()
    for label in ("comera (target 0.5), seed 0 [target not reached]", "comera (target 0.5), seed 1",
                  "comera (target 0.2), seed 0 [target not reached]",
                  "comera (target 0.2), seed 1 [target not reached]", "dense, seed 0", "dense, seed 1",
                  "stage switch, seed 1", "stage switch, seed 0/1"):
        ax.plot([0, 1], [0, 1], label=label)
    runs = pd.DataFrame({"seed": [0, 1]})
    _, labels = quality_figures.method_legend(ax, runs)
    plt.close(fig)
    assert labels == ["comera (target 0.5) [target not reached: seed 0]",
                      "comera (target 0.2) [target not reached: seeds 0, 1]", "dense",
                      "stage switch, seed 1", "stage switch, seed 0/1", "seed 0", "seed 1"]


def test_fig13_legend_sits_beside_the_plots(tmp_path, monkeypatch):
    """Fig 13's one legend is outside both panels, so it hides none of their lines."""
    seen = {}

    def spy(fig, title, footer, out, name, notes=""):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        seen["legends"] = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
        seen["plots"] = [ax.get_window_extent(renderer) for ax in fig.axes]
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    row, curves = quality_cell("comera", 0.5)
    res = analysis.load(make_folder(tmp_path / "syn", [row], curves))
    quality_figures.fig13_rank_adaptation(res, tmp_path)
    assert len(seen["legends"]) == 1
    assert not any(seen["legends"][0].overlaps(plot) for plot in seen["plots"])


def test_fig14_legend_sits_beside_the_plot(tmp_path, monkeypatch):
    """Fig 14's legend is outside its plot: inside it had hidden the uncompressed methods' points at 1x."""
    seen = {}

    def spy(fig, title, footer, out, name, notes=""):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (ax,) = fig.axes
        seen.update(legend=ax.get_legend().get_window_extent(renderer), plot=ax.get_window_extent(renderer))
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    quality_figures.fig14_accuracy_vs_compression(quality_folder(tmp_path / "q", *fig14_cells()), tmp_path)
    assert not seen["legend"].overlaps(seen["plot"])


def test_fig12_has_a_tick_near_its_leftmost_point(tmp_path, monkeypatch):
    """A sweep from 1.6x to 100x: the log axis' 1-3 ticks (1 out of view, 3 at 1.9x the point) leave its
    least compressed point without a tick near it, so one is added there."""
    seen = {}

    def spy(fig, title, footer, out, name, notes=""):
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        seen["ticks"] = [t for t in ax.get_xticks() if lo <= t <= hi]
        plt.close(fig)

    monkeypatch.setattr(drawing, "finish", spy)
    rows = [run_row("transformer", "dense", 4, time_s=30),
            run_row("transformer", "comera", 4, time_s=10, compression=100.0),
            run_row("transformer", "comera", 4, variant="rank-rank600", time_s=40, compression=1.6)]
    res = analysis.load(make_folder(tmp_path / "s", rows, sweeps={rows[2]["run_id"]: {"rank": 600}}))
    figures.fig12_time_vs_compression(res, tmp_path)
    assert any(1.6 / drawing.NEAR_TICK <= t <= 1.6 * drawing.NEAR_TICK for t in seen["ticks"]), seen


def test_fig5_explains_its_ops_and_states_the_table(tmp_path, drawn):
    figures.fig5_ttm_lookup(analysis.load(lookup_folder(tmp_path / "m")), tmp_path)
    (time_lines, _memory_lines), _, footer = drawn["fig5_ttm_lookup"]
    notes = drawn[("fig5_ttm_lookup", "notes")]
    from harness.configs.microbench_spec import EMBEDDING_VARIANTS

    assert set(figures.EMBEDDING_VARIANTS) == set(EMBEDDING_VARIANTS)  # ttm_order, ttm_unique: explained
    assert time_lines
    for variant in time_lines:  # the legend names the op; the notes say what it is
        assert f"{variant}: {figures.EMBEDDING_VARIANTS[variant]}" in notes
    assert re.search(r"table \d+x\d+ \(TTM row modes [\dx]+, column modes [\dx]+", footer), footer


def test_switch_lines_name_the_targets_where_they_switched_apart(tmp_path, drawn):
    early, early_curves = quality_cell("comera", 0.2)
    settings = json.loads(early["settings"])
    settings["method"]["switch"]["step"] = SWITCH - 2
    early["settings"] = json.dumps(settings)
    res = quality_folder(tmp_path / "q", quality_cell("comera", 0.8), quality_cell("comera", 0.5),
                         (early, early_curves), with_timing=False)
    quality_figures.fig6_accuracy(res, tmp_path)
    (acc, _), _, _ = drawn["fig6_accuracy"]
    assert [label for label in acc if label.startswith("stage switch")] == [
        "stage switch, target 0.2, seed 0", "stage switch, targets 0.8/0.5, seed 0"]


def test_a_size_matched_note_says_when_the_held_out_scores_tied():
    selection = {**SELECTED, "tied": 9}
    row = SimpleNamespace(settings=json.dumps({"method": {"selection": selection, "matched": {
        "run": "c", "params": 70000, "target": 0.2, "target_reached": True}}}))
    assert tables.matched_note(row).endswith(
        "lr 0.001 (held-out accuracy tied for 9: chosen by held-out loss)")


def test_the_runs_table_labels_a_quality_cells_times_as_no_timing_result(tmp_path):
    """Quality cells run beside other cells (`--cores N`): their step times are shown, their timing verdict
    says they are no timing result; a timing cell keeps its own verdict."""
    res = quality_folder(tmp_path / "q")
    runs, note = tables.table_runs(res)
    verdicts = runs.groupby("purpose").timing_quality.agg(set).to_dict()
    assert verdicts == {"quality": {tables.NOT_TIMED}, "timing": {"stable"}}
    assert runs[runs.purpose == "quality"].step_time_ms.notna().all()
    assert f"'{tables.NOT_TIMED}': a quality cell's step_time_ms, epoch_time_s" in note


def test_devices_compared_show_no_time_of_a_quality_cell(tmp_path):
    """A quality cell's epoch time (stable or not) is no timing result: no time, bar or device ratio, and
    its row says why; the timing cells beside it keep theirs."""
    quality_folder(tmp_path / "a")
    quality_folder(tmp_path / "b")
    table, labels, _ = compare.side_by_side([tmp_path / "a", tmp_path / "b"])
    assert labels == ["a", "b"]
    quality, timing = table[table.purpose == "quality"], table[table.purpose == "timing"]
    assert len(quality) == 6 and len(timing) == 2
    assert quality["epoch_time@a"].isna().all() and quality["epoch_time ratio b/a"].isna().all()
    assert set(quality.differences) == {compare.QUALITY_TIME}
    assert quality["peak_mem ratio b/a"].tolist() == [1.0] * 6  # memory is the cell's own
    assert timing["epoch_time ratio b/a"].tolist() == [1.0, 1.0] and set(timing.differences) == {""}
