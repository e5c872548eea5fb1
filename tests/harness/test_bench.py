"""harness.bench: verdicts, table output, the opt_einsum reference and each target's code path (quick)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from harness import bench
from harness.results import file_metadata


@pytest.mark.parametrize("measured, goal, better, expected", [
    (7.2, 7.0, ">=", "pass"), (7.0, 7.0, ">=", "pass"), (6.9, 7.0, ">=", "short"),
    (0.5, 0.7, "<=", "pass"), (0.71, 0.7, "<=", "short"), (None, 4.0, ">=", "error"),
    (float("nan"), 4.0, ">=", "error"), (3.0, None, ">=", "info"), (None, None, ">=", "error"),
])
def test_verdict(measured, goal, better, expected):
    assert bench.verdict(measured, goal, better) == expected
    assert bench.make_row(1, "x", goal, measured, better=better).verdict == expected


def test_roofline_bound_takes_the_slower_resource():
    roof = bench.Roofline(flops_per_s=100.0, bytes_per_s=10.0)
    # slow op is compute bound (10 s), fast op is memory bound (2 s): bound 5x, not the FLOP ratio 100x
    assert roof.speedup_bound((1000.0, 10.0), (10.0, 20.0)) == pytest.approx(5.0)


def test_markdown_table_has_every_row_and_escapes_pipes():
    rows = [bench.make_row(1, "a | b", 7.0, 8.0, flop_ratio=18.0, medians="x 1 ms"),
            bench.make_row(5, "plans", 1.0, 1.2, better="<=")]
    text = bench.to_markdown(rows)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| target | what | measured | goal | verdict")
    assert len(lines) == 4
    assert "a \\| b" in lines[2] and "| pass |" in lines[2] and "18.00" in lines[2]
    assert "<= 1.00" in lines[3] and "| short |" in lines[3]


@pytest.mark.parametrize("text, message", [("1,9", "unknown target"), ("a", "comma-separated"), ("", "unknown")])
def test_parse_targets_rejects_bad_lists(text, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_targets(text)
    assert bench.parse_targets("5, 1") == {1, 5}


def test_unknown_allocator_is_named():
    with pytest.raises(ValueError, match="--allocator 'tcmalloc'"):
        bench.Config.make("cpu", 1, quick=True, allocator="tcmalloc")
    assert bench.Config.make("cpu", 1, quick=True, allocator="system").allocator == "system"


def test_optimal_sum_matches_hand_count_for_two_cores():
    # x[T,a] G0[a,r] G1[r,b]; T=100, a=4, r=2, b=6
    T, a, r, b = 100, 4, 2, 6
    y = min(2 * T * a * r + 2 * T * r * b, 2 * a * r * b + 2 * T * a * b)
    dx = min(2 * T * b * r + 2 * T * r * a, 2 * a * r * b + 2 * T * a * b)
    dg0 = min(2 * T * b * r + 2 * T * a * r, 2 * T * a * b + 2 * a * b * r)
    dg1 = min(2 * T * a * r + 2 * T * r * b, 2 * T * a * b + 2 * a * b * r)
    assert bench.optimal_sum_flops((a,), (b,), (1, r, 1), T) == y + dx + dg0 + dg1


def test_plan_contraction_flops_leave_out_gate_scaling():
    from comera.contraction import make_plan

    plan = make_plan((4, 4), (4, 8), (1, 4, 4, 4, 1), 64, False)
    gated_core_sizes = 1 * 4 * 4 + 4 * 4 * 4 + 4 * 4 * 4  # cores 0..d-2 carry a gate
    # per gated core: H = G * g (1 per element), dg (2), dG = dH * g (1)
    assert bench.plan_contraction_flops(plan) == plan.flops - 4 * gated_core_sizes


def test_plan_sweep_covers_orders_and_is_distinct():
    full = bench.plan_sweep(quick=False)
    assert {len(i) + len(o) for i, o, _, _ in full} == set(range(2, 9))
    assert {t for *_, t in full} == {1, 16, 256, 4096}
    assert len(full) == len(set(full))
    for in_shape, out_shape, ranks, _ in full:
        assert len(ranks) == len(in_shape) + len(out_shape) + 1 and ranks[0] == ranks[-1] == 1


def test_halve_ranks_shrinks_every_bond():
    from comera.tt import TTLinear

    model = torch.nn.Sequential(TTLinear(64, 64, in_shape=(4, 4, 4), out_shape=(4, 4, 4), rank=8))
    before = model[0].ranks
    after = bench.halve_ranks(model, 1e-2)["0"]
    assert after == [1] + [max(1, r // 2) for r in before[1:-1]] + [1]
    assert model[0].ranks == after


def test_quick_targets_produce_a_table(tmp_path, monkeypatch):
    """Targets 1, 3 and 5 run their code paths at reduced size and end in the written table."""
    monkeypatch.setattr(bench, "LINEAR_TARGETS", [("16->32 r4", (4, 4), (4, 8), 4, (64, 8), 1.0)])
    monkeypatch.setitem(bench.EMBEDDING_TABLE, "quick", {"num_embeddings": 1000, "embedding_dim": 8,
                                                        "row_shape": [10, 10, 10], "col_shape": [2, 2, 2],
                                                        "rank": 2})
    monkeypatch.setitem(bench.EMBEDDING_INDICES, "quick", [300])
    monkeypatch.setattr(bench, "measure_roofline", lambda *a, **k: bench.Roofline(1e10, 1e9))
    assert bench.cli(["--quick", "--targets", "1,3,5", "--threads", "1", "--out-dir", str(tmp_path)]) == 0
    frame = pd.read_parquet(tmp_path / "bench_cpu.parquet")
    assert list(frame["target"]) == [1, 3, 3, 3, 3, 5]
    assert set(frame["verdict"]) <= {"pass", "short", "info"}
    assert frame["measured"].map(math.isfinite).all()
    table_rows = frame[frame["what"].str.contains("table memory")]
    info_rows = frame[frame["verdict"] == "info"]
    assert len(table_rows) == len(info_rows) == 1 and table_rows["goal"].item() == 15.0
    assert "footprint" in info_rows["what"].item() and info_rows["goal"].isna().all()
    assert "params" in table_rows["medians"].item() and "working" in table_rows["medians"].item()
    assert frame["settings"].str.contains("allocator reuse").all()
    linear = frame.iloc[0]
    assert linear["flop_ratio"] > 0 and linear["roofline_bound"] > 0 and "TTLinear" in linear["medians"]
    assert "on 1 token takes" in linear["note"] and "at most" in linear["note"]
    assert file_metadata(tmp_path / "bench_cpu.parquet")["provenance"]["device"] == "cpu"
    text = (tmp_path / "bench_cpu.md").read_text()
    assert text.count("\n| 3 |") == 4 and "| 5 |" in text and "Allocator: reuse" in text


def test_a_failing_target_becomes_an_error_row(monkeypatch):
    def broken(cfg):
        raise RuntimeError("plan exploded")

    monkeypatch.setattr(bench, "target_plans", broken)
    rows = bench.run_targets({5}, bench.Config.make("cpu", 1, quick=True))
    assert [r.verdict for r in rows] == ["error"] and "plan exploded" in rows[0].note


def test_step_worker_times_and_halves_in_process(monkeypatch):
    """The code path of targets 2 and 4 (one configuration, run here instead of in a subprocess)."""
    events = []
    release, reset = bench.allocator_lib.release_free_memory, bench._reset_rss_peak
    monkeypatch.setattr(bench.allocator_lib, "release_free_memory", lambda: events.append("release") or release())
    monkeypatch.setattr(bench, "_reset_rss_peak", lambda: events.append("reset") or reset())
    job = {"method": "comera", "batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu",
           "seed": 0, "threads": 1, "warmup": 1, "steps": 2, "halve": True, "threshold": 1e-2,
           "allocator": "reuse"}
    out = bench.step_worker(job)
    # before the baseline, before the mark is reset, and when the "reuse" policy is undone at the end
    assert events == ["release", "release", "reset", "release"]
    assert out["step_ms"] > 0 and out["step_ms_halved"] > 0 and len(out["step_ms_all"]) == 2
    assert out["peak_bytes"] > 0 and out["peak_kind"].startswith("cpu_rss_delta")
    assert out["allocator"].startswith(("glibc", "unavailable"))
    assert not bench.allocator_lib.current().startswith("glibc")  # undone when the worker returns
    assert out["method_settings"]["optimizer_impl"] == "fused"
    for name, ranks in out["ranks"].items():
        assert out["ranks_halved"][name] == [1] + [max(1, r // 2) for r in ranks[1:-1]] + [1]
    assert out["tt_layers_seen"] == out["tt_layers"] == len(out["ranks"]) > 0
    plain = bench.step_worker({**job, "halve": False, "steps": 1})
    assert plain["tt_layers_ms"] > 0 and "step_ms_halved" not in plain and "tt_layers_ms_halved" not in plain
    assert out["tt_layers_ms"] > 0 and out["tt_layers_ms_halved"] > 0
    assert "Amdahl estimate 1/((1-f)+f/s)" in bench.amdahl_note(out)
    assert out["tensor_peak_bytes"] > 0


def test_state_tensor_bytes_counts_parameters_buffers_and_optimizer_state_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model[1].weight = model[0].bias  # a shared tensor counts once
    opt = torch.optim.AdamW(model.parameters())
    before = bench._state_tensor_bytes(model, [opt])
    assert before == 4 * (12 + 3 + 3) + 4 * (3 + 3) + 8  # weight, shared bias, bn bias; running stats; count
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    params = 12 + 3 + 3
    assert bench._state_tensor_bytes(model, [opt]) == before + 4 * 2 * params + sum(
        st["step"].numel() * st["step"].element_size() for st in opt.state.values())


def test_step_table_from_worker_results(monkeypatch):
    """Targets 2 and 4 turn the per-configuration results into ratios (subprocess replaced)."""
    fake = {"dense_b32": {"step_ms": 800.0, "peak_bytes": 1000, "peak_kind": "cpu_rss_delta"},
            "comera_b32": {"step_ms": 100.0, "peak_bytes": 500, "peak_kind": "cpu_rss_delta",
                           "step_ms_halved": 80.0, "ranks": {"l": [1, 8, 1]}, "ranks_halved": {"l": [1, 4, 1]},
                           "tt_layers_ms": 40.0, "tt_layers_ms_halved": 20.0, "tt_layers_seen": 1, "tt_layers": 1,
                           "allocator": "glibc x"},
            "galore_b1": {"step_ms": 60.0, "peak_bytes": 2400},
            "comera_b1": {"error": "exit 1: boom"}}
    monkeypatch.setattr(bench, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: fake)
    rows = bench.target_steps(bench.Config.make("cpu", 1, quick=True), {2, 4}, 10)
    got = {(r.target, r.what.split(",")[0]): (r.measured, r.verdict) for r in rows}
    assert got[(2, "CoMERA vs uncompressed step speedup")] == (8.0, "pass")
    assert got[(2, "CoMERA / uncompressed peak memory")] == (0.5, "pass")
    assert got[(2, "CoMERA vs GaLore step speedup")] == (None, "error")
    assert got[(4, "CoMERA step speedup after halving every rank")] == (1.25, "short")
    assert all("comera_b1: exit 1: boom" in r.note for r in rows)
    halving = next(r for r in rows if r.target == 4)
    assert "f=0.40" in halving.note and "s=2.00x" in halving.note and "= 1.25x" in halving.note  # 1/(0.6+0.2)
    assert all("worker allocator glibc x" in r.settings for r in rows)  # differs from this process
    speed = next(r for r in rows if r.what.startswith("CoMERA vs uncompressed step speedup"))
    # 40 of 100 ms in the tensorized layers: the other 60 ms bound the ratio by 800 / 60
    assert "f=0.40" in speed.note and "at most 13.33x" in speed.note and "uncompressed model" in speed.note


@pytest.mark.parametrize("share, speedup, bound", [(0.0, 3.0, 1.0), (1.0, 2.0, 2.0), (0.5, 2.0, 4 / 3)])
def test_amdahl_bound(share, speedup, bound):
    assert bench.amdahl_bound(share, speedup) == pytest.approx(bound)
    assert bench.amdahl_note({"step_ms": 1.0}) == ""  # not measured: no note


def test_table_memory_counts_params_grads_and_working_memory_beyond_the_output():
    from harness import microbench as mb

    emb = torch.nn.Embedding(1000, 8)
    idx = torch.randint(0, 1000, (300,))
    run, reset = mb._call(emb, idx, "fwd_bwd", wrt_input=False)
    peak, _ = mb.peak_memory(run, torch.device("cpu"), reset)
    memory = bench.TableMemory.of(emb, peak, 300 * 8 * 4)
    assert memory.params == memory.grads == 1000 * 8 * 4
    assert 0 <= memory.working < memory.params  # the dense backward needs little beyond its gradient
    assert memory.total == memory.params + memory.grads + memory.working == 32000 + peak - 300 * 8 * 4


@pytest.mark.slow
def test_step_workers_take_turns_and_a_failure_is_reported():
    """Two tiny configurations in their own processes under the round coordinator, and one that fails:
    per-round medians come back, the failure is named (fresh interpreters importing torch: slow)."""
    job = {"batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu", "seed": 0, "threads": 1,
           "warmup": 1, "steps": 2, "halve": False, "threshold": 1e-2, "allocator": "reuse"}
    jobs = {"dense": {**job, "method": "dense"}, "comera": {**job, "method": "comera"},
            "broken": {**job, "method": "no-such-method"}}
    seen = []
    res = bench.run_step_rounds(jobs, 2, timeout_s=300, progress=seen.append)
    for name in ("dense", "comera"):
        assert len(res[name]["step_ms_rounds"]) == 2 and res[name]["step_ms"] > 0
    assert res["broken"]["error"].startswith("exit 1") and "no-such-method" in res["broken"]["error"]
    assert any("round 2/3" in line for line in seen)
    assert len(bench.round_ratios(res, ("dense", "step_ms"), ("comera", "step_ms"))) == 2


@pytest.mark.parametrize("quick", [True, False])
def test_step_jobs_halve_only_comera_b32_for_target_4(quick):
    cfg = bench.Config.make("cpu", 2, quick)
    jobs = bench.step_jobs(cfg, {2, 4})
    assert {n for n, j in jobs.items() if j["halve"]} == {"comera_b32"}
    assert not any(j["halve"] for j in bench.step_jobs(cfg, {2}).values())
    steps = {n: j["steps"] for n, j in jobs.items()}
    assert steps == ({n: 2 for n in jobs} if quick else {"dense_b32": 3, "comera_b32": 3, "galore_b1": 10,
                                                          "comera_b1": 10})


def test_step_ratios_are_medians_of_per_round_ratios(monkeypatch):
    """Several rounds: each time ratio is the median of the within-round ratios (not the ratio of the
    medians); a failed configuration is named; memory is one reading per process."""
    per_round = {"dense_b32": [800.0, 1200.0, 900.0], "comera_b32": [100.0, 400.0, 300.0],
                 "galore_b1": [60.0, 60.0, 60.0], "comera_b1": [10.0, 20.0, 20.0]}
    fake = {name: {"step_ms": sorted(ms)[1], "step_ms_rounds": ms, "peak_bytes": 1000,
                   "peak_kind": "cpu_rss_delta"} for name, ms in per_round.items()}
    fake["galore_b1"] = {"error": "exit 1: flaky"}
    monkeypatch.setattr(bench, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: fake)
    cfg = bench.Config.make("cpu", 1, quick=True, step_rounds=3)
    rows = bench.target_steps(cfg, {2}, 10)
    got = {r.what.split(",")[0]: r for r in rows}
    speed = got["CoMERA vs uncompressed step speedup"]
    assert speed.measured == 3.0 and "per round 8.00, 3.00, 3.00" in speed.medians  # not 900/300
    assert "dense_b32 900.0 ms" in speed.medians and "comera_b32 300.0 ms" in speed.medians
    assert got["CoMERA vs GaLore step speedup"].measured is None
    assert "galore_b1: exit 1: flaky" in speed.note and "3 interleaved round(s)" in speed.settings
    assert bench.round_ratios(fake, ("dense_b32", "peak_bytes"), ("comera_b32", "peak_bytes")) == [1.0]


def test_step_rounds_must_be_positive():
    with pytest.raises(ValueError, match="--step-rounds 0"):
        bench.Config.make("cpu", 1, quick=False, step_rounds=0)
    assert bench.Config.make("cpu", 1, quick=False).step_rounds == 3
    assert bench.Config.make("cpu", 1, quick=True).step_rounds == 1


def test_fixed_cost_note_bounds_the_ratio_by_the_one_token_time():
    note = bench.fixed_cost_note(dense_ms=2.0, tt_ms=1.0, one_token_ms=0.5)
    assert "0.500 ms (50% of its time here" in note and "at most 4.00x" in note
