"""harness.perf.bench (the ``comera-bench bench`` command): options, the quick end-to-end table and its
files."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.perf import bench
from harness.perf import goals, layers, targets
from harness.perf.config import Config
from harness.perf.roofline import Roofline
from harness.results import PROVENANCE_COLUMNS, file_metadata


@pytest.mark.parametrize("text, message", [("1,9", "unknown target"), ("a", "comma-separated"),
                                           ("", "unknown")])
def test_parse_targets_rejects_bad_lists(text, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_targets(text)
    assert bench.parse_targets("5, 1") == {1, 5}


@pytest.mark.parametrize("env, device, expected", [("", "cpu", "results/cpu/bench.parquet"),
                                                   ("my-vm", "cpu", "results/my-vm/bench.parquet")])
def test_default_out_is_the_pipeline_folder_of_this_machine(monkeypatch, env, device, expected):
    monkeypatch.setenv("COMERA_BENCH_DEVICE", env)
    assert str(bench.default_out(device)) == expected


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "--rounds 0: need at least 1"),
                                           (["--block-s", "0"], "--block-s 0: need a positive")])
def test_bad_rounds_or_block_seconds_stop_before_measuring(tmp_path, capsys, argv, message):
    assert bench.cli(["--targets", "1", *argv, "--out", str(tmp_path / "b.parquet")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "b.parquet").exists()


def test_rounds_and_block_seconds_reach_the_timed_targets(tmp_path, monkeypatch):
    """--rounds and --block-s are the rounds and block seconds every single-layer timing uses."""
    seen = []
    monkeypatch.setattr(bench, "run_targets", lambda targets, cfg, **kw: seen.append(cfg) or [])
    monkeypatch.setattr(bench, "write", lambda *a: ("", tmp_path / "b.parquet"))
    monkeypatch.setattr(bench.figure, "draw", lambda *a: [])
    assert bench.cli(["--targets", "1,3", "--rounds", "7", "--block-s", "0.2", "--out",
                      str(tmp_path / "b.parquet")]) == 0
    assert (seen[0].rounds, seen[0].min_run_time_s) == (7, 0.2)


def test_a_bad_goals_file_stops_before_measuring(tmp_path, capsys):
    path = tmp_path / "bench.yaml"
    path.write_text(goals.DEFAULT_PATH.read_text().replace("table_memory: 15.0", "table_memory: many"))
    assert bench.cli(["--quick", "--targets", "5", "--goals", str(path), "--out",
                      str(tmp_path / "b.parquet")]) == 2
    assert "key lookup.table_memory" in capsys.readouterr().err and not (tmp_path / "b.parquet").exists()


def test_quick_targets_produce_a_table(tmp_path, monkeypatch, capsys):
    """Targets 1, 3 and 5 run their code paths at reduced size and end in the written files: one Parquet
    row per table row with the provenance columns, the Markdown table next to it; target 1's CUDA rows
    are skipped on the CPU, saying why."""
    path = tmp_path / "bench.yaml"
    small = ("  - {in_shape: [2, 2, 4], out_shape: [2, 4, 4], rank: 4, tokens: 64, quick_tokens: 8, "
             "goal: 1.0, vs_official: 0.5}\n")
    lines = goals.DEFAULT_PATH.read_text().splitlines(keepends=True)
    path.write_text("".join(small if line.startswith("  - {in_shape") and "graph:" not in line else line
                            for line in lines))
    monkeypatch.setitem(layers.EMBEDDING_CASES, "quick", [
        ({"num_embeddings": 1000, "embedding_dim": 8, "row_shape": [5, 5, 5, 8], "col_shape": [2, 2, 2, 1],
          "rank": 2}, [300], True),
        ({"num_embeddings": 100, "embedding_dim": 4, "row_shape": [5, 5, 2, 2], "col_shape": [1, 2, 2, 1],
          "rank": 2}, [50], False)])
    monkeypatch.setattr(targets, "measure_roofline", lambda *a, **k: Roofline(1e10, 1e9))
    out = tmp_path / "cpu" / "bench.parquet"
    assert bench.cli(["--quick", "--targets", "1,3,5", "--threads", "1", "--goals", str(path),
                      "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert list(frame["target"]) == [1] * 12 + [3] * 8 + [5, 5]
    assert set(PROVENANCE_COLUMNS) <= set(frame.columns) and (frame["device"] == "cpu").all()
    # real times: maybe noisy
    assert set(frame["verdict"]) <= {"pass", "short", "noisy", "impossible", "info"}
    # every timed ratio has a stability verdict (the spread of its per-round times); op counts and FLOPs none
    timed = frame["what"].str.contains("speedup|vs official")
    assert frame[timed]["stability"].str.match(r"^(stable|noisy: .+)$").all()
    assert (frame[~timed]["stability"] == "").all()
    assert ((frame["verdict"] == "noisy") <= frame["stability"].str.startswith("noisy")).all()
    assert frame["measured"].map(math.isfinite).all()
    assert list(frame["goal_key"]) == [key for i in range(3) for key in (f"linear[{i}]",
                                                                         f"linear[{i}].vs_official", "")] + [
                                       "linear_ops.goal"] * 3 + [
                                       "lookup.speedup", "lookup.memory", "lookup.vs_official",
                                       "lookup.table_memory", "", "lookup.speedup", "lookup.memory",
                                       "lookup.vs_official", "plans.flops_vs_optimal", ""]
    kernel = frame.iloc[-1]
    assert kernel["verdict"] == "info" and kernel["measured"] > 0 and "KERNEL_COST" in kernel["what"]
    assert "measured" in kernel["medians"] and "default" in kernel["medians"]
    table_rows = frame[frame["what"].str.contains("table memory")]
    info_rows = frame[(frame["verdict"] == "info") & (frame["target"] == 3)]
    assert len(table_rows) == len(info_rows) == 1 and table_rows["goal"].item() == 15.0
    assert "footprint" in info_rows["what"].item() and info_rows["goal"].isna().all()
    assert "params" in table_rows["medians"].item() and "working" in table_rows["medians"].item()
    assert frame["settings"].str.contains("allocator reuse").all()
    linear = frame.iloc[0]
    assert linear["flop_ratio"] > 0 and linear["bound"] > 0 and linear["bound_basis"] == "roofline"
    assert ("TTLinear" in linear["medians"] and "on 1 token takes" in linear["note"]
            and "at most" in linear["note"])
    assert ("per round" in linear["medians"]
            and "median over rounds of the ratio within a round" in linear["settings"])
    dense_vs_official = frame.iloc[2]
    assert dense_vs_official["what"].startswith("nn.Linear / official TT_forward fwd+bwd speedup, 16->32 r4")
    assert dense_vs_official["verdict"] == "info" and "per round" in dense_vs_official["medians"]
    assert "TTLinear's plan: x @ (G0 G1 G2) -> z" in dense_vs_official["note"]
    lookup_official = frame[frame["goal_key"] == "lookup.vs_official"].iloc[0]
    assert lookup_official["goal"] == 1.0 and "official unique" in lookup_official["medians"]
    assert "1000x8 rank 2, 300 indices" in lookup_official["what"]
    assert not frame["what"].str.contains("table memory.*100x4 rank 2").any()  # that table: no memory rows
    official = frame.iloc[1]
    assert official["what"].startswith("TTLinear vs official TT_forward, 16->32 r4, 8 tokens")
    assert official["goal"] == 0.5 and official["flop_ratio"] > 0 and math.isnan(official["bound"])
    assert all(name in official["medians"] for name in ("nn.Linear", "TTLinear", "official TT_forward"))
    assert "gates" in official["settings"] and "bias" in official["settings"]
    ops = frame[frame["goal_key"] == "linear_ops.goal"]
    assert list(ops["what"].str.extract(r"(\d+) tokens")[0]) == ["1", "128", "4096"]
    assert (ops["goal"] == 48).all() and (ops["better"] == "<=").all() and (ops["measured"] > 0).all()
    assert ops["medians"].str.contains("nn.Linear 13 ops").all()
    assert "target 1 CUDA rows skipped: they need a CUDA device, this run's is cpu" in capsys.readouterr().err
    assert file_metadata(out)["provenance"]["device"] == "cpu"
    text = out.with_suffix(".md").read_text()
    assert text.count("\n| 3 |") == 8 and "| 5 |" in text and "Allocator: reuse" in text
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(".pdf").stat().st_size > 0


def test_a_failing_target_becomes_an_error_row(monkeypatch):
    def broken(cfg):
        raise RuntimeError("plan exploded")

    monkeypatch.setattr(targets, "target_plans", broken)
    rows = targets.run_targets({5}, Config.make("cpu", 1, quick=True))
    assert [r.verdict for r in rows] == ["error"] and "plan exploded" in rows[0].note


def test_a_busy_machine_is_warned_about_on_stderr_and_in_the_table(tmp_path, monkeypatch, capsys):
    from harness.core import timing

    monkeypatch.setattr(timing, "load_avg_1m", lambda: 50.0)
    out = tmp_path / "b.parquet"
    assert bench.cli(["--quick", "--targets", "5", "--threads", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: the machine was busy (1-minute load average 50.0 on" in err
    assert "a ratio above its own bound is marked impossible" in err
    assert "**Warning:** the machine was busy" in out.with_suffix(".md").read_text()
    monkeypatch.setattr(timing, "load_avg_1m", lambda: 0.0)
    assert bench.cli(["--quick", "--targets", "5", "--threads", "1", "--out", str(out)]) == 0
    assert "busy" not in capsys.readouterr().err and "Warning" not in out.with_suffix(".md").read_text()
