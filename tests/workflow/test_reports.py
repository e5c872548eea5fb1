"""Tables, figures and the device comparison on hand-made result folders (known numbers in,
known ratios and verdicts out)."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from harness import compare, figures, reference, tables
from harness.results import RUNS_COLUMNS, ResultsError, merge, to_frame, write_parquet_atomic


def run_row(workload, method, batch, *, variant="default", target=None, time_s=10.0, mem=100e6,
            status="ok", metric=0.5, ranks=None, compression=1.0, **extra):
    rid = f"{workload}_{method}-{variant}_b{batch}_t{target}"
    row = {c: None for c in RUNS_COLUMNS}
    row.update(run_id=rid, workload=workload, method=method, variant=variant, batch_size=batch,
               target_ratio=target, seed=0, status=status, error="" if status == "ok" else "boom",
               step_time_ms=time_s, epoch_time_s=time_s, epoch_time_kind="measured",
               peak_mem_bytes=None if mem is None else int(mem), peak_mem_kind="cpu_rss_delta", metric_name="accuracy",
               metric_value=metric, final_train_loss=1.0, params_total=1000, params_factorized_layers=800,
               compression_total=compression, compression_layers=compression, ranks=json.dumps(ranks or {}),
               device="cpu", device_name="Test CPU", num_threads=2, torch_version="x", extra=json.dumps({"eval": extra}))
    return row


def spec_for(row):
    return {"run_id": row["run_id"], "workload": row["workload"], "workload_params": {"size": "small"},
            "method": row["method"], "variant": row["variant"], "method_params": {},
            "batch_size": row["batch_size"], "target_ratio": row["target_ratio"], "seed": 0,
            "budget": {"epochs": 1, "max_steps_per_epoch": 10},
            "execution": {"device": "cpu", "num_threads": 2, "cuda_graph": False, "compile": False}}


def make_folder(path, rows, curves=(), sweeps=None):
    path.mkdir(parents=True)
    write_parquet_atomic(to_frame(rows, "runs"), path / "runs.parquet", kind="runs")
    write_parquet_atomic(to_frame(list(curves), "curves"), path / "curves.parquet", kind="curves")
    cells = {r["run_id"]: spec_for(r) for r in rows}
    (path / "grid.json").write_text(json.dumps({"cells": cells, "sweeps": sweeps or {}}))
    return path


def ranks(block_ranks):
    return {f"encoder.layers.{b}.ffn.fc1": r for b, r in block_ranks.items()}


@pytest.fixture
def folder(tmp_path):
    rows = [
        run_row("transformer", "dense", 1, time_s=30), run_row("transformer", "dense", 32, time_s=90),
        run_row("transformer", "comera", 1, time_s=10, mem=10e6, ranks=ranks({0: [1, 8, 8, 1], 1: [1, 8, 6, 1]})),
        run_row("transformer", "comera", 32, time_s=30, ranks=ranks({0: [1, 8, 8, 1], 1: [1, 8, 6, 1]})),
        run_row("transformer", "comera", 32, target=0.5, time_s=20, ranks=ranks({0: [1, 4, 4, 1], 1: [1, 0, 2, 1]})),
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
    res = tables.load(folder)
    t1, note = tables.table1_ranks(res)
    assert "the last one (index 1)" in note
    assert list(t1.columns) == ["layer", "before training", "after early stage", "late stage, target 0.5"]
    assert t1.iloc[0]["before training"] == "8-8"
    assert t1.iloc[0]["after early stage"] == "8-6"
    assert t1.iloc[0]["late stage, target 0.5"] == "0-2 (removed: rank 0)"
    t2, _ = tables.table2_dlrm(res)
    assert t2.nce.tolist() == [0.95, 0.9] and t2.model_MB.tolist() == [0.004, 0.004]
    size, _ = tables.table_mnli_size(res)
    assert size.iloc[-1]["source"] == "paper (RTX 3090)"
    assert size.iloc[-1]["total_MB"] == pytest.approx(66957315 * 4 / 1e6, abs=1e-3)
    assert tables.main(["--results", str(folder), "--out", str(tmp_path / "out")]) == 0
    for name in tables.TABLES:
        assert (tmp_path / "out" / f"{name}.csv").exists()
        assert (tmp_path / "out" / f"{name}.md").read_text().startswith("# ")
    assert "oom" in (tmp_path / "out" / "table_runs.md").read_text()


def test_empty_grid_tables_say_not_measured(tmp_path):
    res = tables.load(make_folder(tmp_path / "d", [run_row("mlm", "dense", 4)]))
    df, note = tables.table2_dlrm(res)
    tables.write_table(df, note, "T", tmp_path, "t", res.settings_line())
    assert "Not measured here: no DLRM run" in (tmp_path / "t.md").read_text()


def test_figures_written_and_failed_cell_marked(folder, tmp_path, monkeypatch):
    out = tmp_path / "figs"
    texts = []
    real_finish = figures._finish

    def spy(fig, title, footer, out_dir, name):
        texts.append((name, [t.get_text() for ax in fig.axes for t in ax.texts]))
        real_finish(fig, title, footer, out_dir, name)

    monkeypatch.setattr(figures, "_finish", spy)
    assert figures.main(["--results", str(folder), "--out", str(out)]) == 0
    for name in figures.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").stat().st_size > 0
    found = dict(texts)
    assert "oom" in found["fig1_time_memory"]  # the failed GaLore cell at batch 32
    assert any(t.startswith("Not measured in this grid") for t in found["fig7_cuda_graph"])
    assert plt.get_fignums() == []


def test_compare_two_devices_and_paper(folder, tmp_path):
    rows = [run_row("transformer", "dense", 1, time_s=15), run_row("transformer", "comera", 1, time_s=2, mem=5e6),
            run_row("transformer", "galore", 1, time_s=12, mem=80e6)]
    other = make_folder(tmp_path / "gpu-x", rows)
    out = tmp_path / "cmp"
    assert compare.cli([str(folder), str(other), "--out", str(out)]) == 0
    table = pd.read_csv(out / "compare.csv")
    dense1 = table[(table.method == "dense") & (table.batch_size == 1)].iloc[0]
    assert dense1["epoch_time ratio gpu-x/cpu-test"] == pytest.approx(0.5)
    ratios = pd.read_csv(out / "compare_ratios.csv")
    assert {"cpu-test", "gpu-x", "paper (RTX 3090)", "paper (RTX 4090)"} <= set(ratios.device)
    gx = ratios[(ratios.device == "gpu-x") & (ratios.versus == "galore-default") & (ratios.quantity == "epoch_time")]
    assert gx.ratio.iloc[0] == pytest.approx(6.0)
    assert (out / "compare_time_memory.png").exists() and "paper (RTX 4090)" in (out / "compare.md").read_text()


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


def quality_folder(path, *, with_timing=True):
    """Quality cells: dense and CoMERA at targets 0.2 / 0.8 (switch at step 4, TT size 1000 there), with
    eval and params_tt curves; plus a timing dense cell whose numbers must not reach quality outputs."""
    rows, curves = [], []
    for method, target, end_acc, end_size in (("dense", None, 0.95, None), ("comera", 0.2, 0.9, 210.0),
                                               ("comera", 0.8, 0.97, 800.0)):
        row = run_row("transformer", method, 32, target=target, metric=end_acc)
        row.update(run_id=row["run_id"] + "_quality", purpose="quality")
        if target is not None:
            row["settings"] = json.dumps({"method": {"switch": {"step": 4, "size": 1000.0,
                                                                 "size_target": 1000.0 * target}}})
            for step, size in ((1, 1200.0), (4, 1000.0), (8, end_size)):
                curves.append({"run_id": row["run_id"], "step": step, "epoch": 0, "split": "method",
                               "metric_name": "params_tt", "value": size})
        for step, acc in ((0, 0.3), (4, 0.92), (8, end_acc)):
            curves.append({"run_id": row["run_id"], "step": step, "epoch": 0, "split": "eval",
                           "metric_name": "accuracy", "value": acc})
        rows.append(row)
    if with_timing:
        rows.append(run_row("transformer", "dense", 32, metric=0.1, time_s=99.0))
    return tables.load(make_folder(path, rows, curves))


def test_size_table_reads_quality_cells_in_target_order(tmp_path):
    res = quality_folder(tmp_path / "q")
    size, note = tables.table_mnli_size(res)
    ours = size[size.source != "paper (RTX 3090)"]
    assert ours.method.tolist() == ["dense", "comera (target 0.8)", "comera (target 0.2)"]
    assert ours.accuracy.tolist() == [0.95, 0.97, 0.9]  # not the timing cell's 0.1
    assert ours["accuracy_at_switch"].tolist()[1:] == [0.92, 0.92]
    assert ours["end/switch"].tolist()[1:] == pytest.approx([0.8, 0.21])
    assert "quality cells" in note


def test_timing_figures_ignore_quality_cells(tmp_path):
    res = quality_folder(tmp_path / "q")
    assert res.main_runs("transformer").metric_value.tolist() == [0.1]
    runs, source = quality_folder(tmp_path / "t", with_timing=True).quality_runs("transformer")
    assert len(runs) == 3 and source == "quality cells"


@pytest.mark.parametrize("name, lines", [("fig6_accuracy", 3), ("fig13_rank_adaptation", 2)])
def test_quality_figures_draw_a_line_per_method_or_target(tmp_path, monkeypatch, name, lines):
    res = quality_folder(tmp_path / "q")
    drawn = {}

    def spy(fig, title, footer, out_dir, fig_name):
        drawn[fig_name] = [[line for line in ax.get_lines() if not line.get_label().startswith("_")]
                           for ax in fig.axes]
        plt.close(fig)

    monkeypatch.setattr(figures, "_finish", spy)
    figures.FIGURES[name](res, tmp_path)
    data = [line for ax in drawn[name] for line in ax if line.get_label().startswith(("comera", "dense", "target"))]
    assert len(data) == lines * len(drawn[name])
    if name == "fig13_rank_adaptation":
        left = {line.get_label(): list(line.get_ydata()) for line in drawn[name][0]}
        assert left["target 0.2"] == pytest.approx([1.2, 1.0, 0.21])  # sizes / the size at the switch


def test_quality_outputs_without_quality_cells_fall_back_or_say_not_measured(tmp_path, monkeypatch):
    res = tables.load(make_folder(tmp_path / "d", [run_row("transformer", "dense", 32)]))
    _, note = tables.table1_ranks(res)
    assert "no finished CoMERA run" in note and "timing cells" in note
    texts = []
    monkeypatch.setattr(figures, "_finish", lambda fig, title, footer, out, name: texts.append(
        [t.get_text() for ax in fig.axes for t in ax.texts]))
    figures.fig13_rank_adaptation(res, tmp_path)
    assert "Not measured" in texts[0][0]
