"""harness.perf.steps and harness.perf.worker: the step worker, the jobs and the rows of targets 2 and 4."""
from __future__ import annotations

import json

import pytest
import torch

from harness.core import allocator
from harness.perf import steps, worker
from harness.perf.config import Config


def test_halve_ranks_shrinks_every_bond():
    from comera.tt import TTLinear

    model = torch.nn.Sequential(TTLinear(64, 64, in_shape=(4, 4, 4), out_shape=(4, 4, 4), rank=8))
    before = model[0].ranks
    after = worker.halve_ranks(model, 1e-2)["0"]
    assert after == [1] + [max(1, r // 2) for r in before[1:-1]] + [1]
    assert model[0].ranks == after


def test_step_worker_times_and_halves_in_process(monkeypatch):
    """The code path of targets 2 and 4 (one configuration, run here instead of in a subprocess): an
    ordinary cell (run_cell: its timer, memory monitor and step), then the profile and the halving."""
    from harness.running import run

    cells = []
    real = run.run_cell
    monkeypatch.setattr(run, "run_cell", lambda spec, **kw: cells.append(spec) or real(spec, **kw))
    job = {"method": "comera", "batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu",
           "seed": 0, "threads": 1, "warmup": 1, "steps": 2, "halve": True, "threshold": 1e-2,
           "allocator": "reuse"}
    out = worker.step_worker(job)
    assert cells == [worker.cell_spec(job)]
    # one round without a coordinator: its first step is timed too
    assert out["step_time_ms"] > 0 and out["step_time_ms_halved"] > 0 and out["steps_timed"] == 3
    assert out["round_step_ms"] == [pytest.approx(out["step_time_ms"])]
    # the full-rank model and its halved copy alternate in rounds (at least two)
    pairs = out["step_time_ms_halving_rounds"]
    assert len(pairs) == 2 and all(before > 0 and after > 0 for before, after in pairs)
    assert out["step_time_ms_before_halving"] == pytest.approx(sum(b for b, _ in pairs) / 2)
    assert len(out["tt_layers_ms_halving_rounds"]) == 2 and out["tt_layers_ms_before_halving"] > 0
    assert out["peak_mem_bytes"] > 0 and out["peak_mem_kind"] == "cpu_rss_delta"
    assert out["allocator"].startswith(("glibc", "unavailable"))
    assert not allocator.current().startswith("glibc")  # undone when the cell ends
    assert out["method_settings"]["optimizer_impl"] == "fused"
    for name, ranks in out["ranks"].items():
        assert out["ranks_halved"][name] == [1] + [max(1, r // 2) for r in ranks[1:-1]] + [1]
    assert out["tt_layers_seen"] == out["tt_layers"] == len(out["ranks"]) > 0
    plain = worker.step_worker({**job, "halve": False, "steps": 1})
    assert (plain["tt_layers_ms"] > 0 and "step_time_ms_halved" not in plain
            and "tt_layers_ms_halved" not in plain)
    assert out["tt_layers_ms"] > 0 and out["tt_layers_ms_halved"] > 0
    # halving cuts the counted layer FLOPs (not more than 4x: the products scale with r or r^2)
    assert 1 < out["tt_layers_flops"] / out["tt_layers_flops_halved"] <= 4
    assert out["tt_layers_traffic"] >= out["tt_layers_traffic_halved"] > 0
    assert "tt_layers_flops" not in plain
    assert "Amdahl estimate 1/((1-f)+f/s)" in steps.amdahl_note(out)
    assert out["tensor_peak_bytes"] > 0


def test_a_step_job_of_an_unknown_method_is_refused():
    job = {"method": "no-such-method", "batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu",
           "seed": 0, "threads": 1, "warmup": 1, "steps": 1, "halve": False, "threshold": 1e-2}
    with pytest.raises(ValueError, match="no-such-method"):  # refused as its spec is made (harness.spec)
        worker.step_worker(job)


def test_a_step_target_cell_and_a_pipeline_cell_of_the_same_settings_are_one_measurement():
    """The bench's step configuration is an ordinary cell: run through run_cell as the pipeline runs a
    cell, its row has the runs columns, the same memory kind (of the one vocabulary) and the same step
    counts, and the worker reports those columns as they are."""
    from harness import results
    from harness.core import measure
    from harness.running import run

    job = {"method": "dense", "batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu",
           "seed": 0, "threads": 1, "warmup": 1, "steps": 2, "halve": False, "threshold": 1e-2}
    spec = worker.cell_spec(job)
    bench = worker.step_worker(job)
    pipeline, _ = run.run_cell({**spec, "run_id": "pipeline-cell"}, progress=False)
    assert list(pipeline) == results.RUNS_COLUMNS and pipeline["status"] == "ok"
    assert set(results.RUNS_COLUMNS) - set(worker.LEFT_OUT) <= set(bench)  # the cell's columns, named so
    assert {c: bench[c] for c in ("workload", "method", "batch_size", "seed", "peak_mem_kind",
                                  "steps_timed")} \
        == {c: pipeline[c] for c in ("workload", "method", "batch_size", "seed", "peak_mem_kind",
                                     "steps_timed")}
    assert bench["peak_mem_kind"] == pipeline["peak_mem_kind"] in measure.MEMORY_KINDS
    assert bench["steps_timed"] == pipeline["steps_timed"] == 3
    assert bench["state_bytes"] == pipeline["state_bytes"]
    assert bench["ranks"] == json.loads(pipeline["ranks"]) and len(bench["round_step_ms"]) == 1
    assert "error" not in bench  # an ok cell: the table notes only the configurations that failed


def test_state_tensor_bytes_counts_parameters_buffers_and_optimizer_state_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model[1].weight = model[0].bias  # a shared tensor counts once
    opt = torch.optim.AdamW(model.parameters())
    before = worker._state_tensor_bytes(model, [opt])
    assert before == 4 * (12 + 3 + 3) + 4 * (3 + 3) + 8  # weight, shared bias, bn bias; running stats; count
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    params = 12 + 3 + 3
    assert worker._state_tensor_bytes(model, [opt]) == before + 4 * 2 * params + sum(
        st["step"].numel() * st["step"].element_size() for st in opt.state.values())


@pytest.mark.parametrize("share, speedup, bound", [(0.0, 3.0, 1.0), (1.0, 2.0, 2.0), (0.5, 2.0, 4 / 3)])
def test_amdahl_bound(share, speedup, bound):
    assert steps.amdahl_bound(share, speedup) == pytest.approx(bound)
    assert steps.amdahl_note({"step_time_ms": 1.0}) == ""  # not measured: no note


@pytest.mark.slow
def test_step_workers_take_turns_and_a_failure_is_reported():
    """Two tiny configurations in their own processes under the round coordinator, and one that fails:
    per-round medians come back, the failure is named (fresh interpreters importing torch: slow)."""
    job = {"batch_size": 2, "workload_params": {"size": "tiny"}, "device": "cpu", "seed": 0, "threads": 1,
           "warmup": 1, "steps": 2, "halve": False, "threshold": 1e-2, "allocator": "reuse"}
    jobs = {"dense": {**job, "method": "dense"}, "comera": {**job, "method": "comera"},
            "broken": {**job, "method": "no-such-method"}}
    seen = []
    res = steps.run_step_rounds(jobs, 2, timeout_s=300, progress=seen.append)
    for name in ("dense", "comera"):
        assert len(res[name]["round_step_ms"]) == 2 and res[name]["step_time_ms"] > 0
    assert res["broken"]["error"].startswith("exit 1") and "no-such-method" in res["broken"]["error"]
    assert any("round 2/3" in line for line in seen)
    assert {res[name]["timing_group"] for name in ("dense", "comera")} == {steps.TIMING_GROUP}
    speed = steps.step_ratio(res, "dense", "comera", "step_time_ms")  # the analysis layer's, round by round
    assert speed.interleaved and speed.n == 2 and len(speed.per_round) == 2
    assert steps.step_ratio(res, "dense", "broken", "step_time_ms") is None


def _cell(ms: float, mem: int, rounds: list[float] | None = None, **more) -> dict:
    """A step worker's result: its cell's runs columns (a stable cell of the bench's timing group, its
    mean step time ``ms`` in each of ``rounds``), as harness.perf.worker.cell_result reports them."""
    return {"peak_mem_kind": "cpu_rss_delta", "peak_mem_bytes": 2 * mem, "tensor_peak_bytes": mem,
            "step_time_ms": ms, "epoch_time_s": ms / 1e3,
            "timing_quality": "stable", "timing_group": steps.TIMING_GROUP, "hostname": "host",
            "device_name": "cpu", "round_step_mean_ms": json.dumps(rounds or [ms]), **more}


def _rounds(row: dict, rounds: list[float]) -> None:
    row["round_step_mean_ms"] = json.dumps(rounds)


def _fake_results(dense_ms: float = 800.0, **comera_b32) -> dict:
    """Worker results of every configuration of target 2 (comera_b1 failed)."""
    return {"dense_b32": _cell(dense_ms, 1000),
            "comera_b32": _cell(100.0, 500, **comera_b32),
            "galore_b1": _cell(60.0, 2400),
            "comera_b1": {"error": "exit 1: boom"},
            "small_dense_b32": _cell(50.0, 100),
            "small_comera_b32": _cell(40.0, 100),
            "small_dense_b1": _cell(10.0, 100),
            "small_comera_b1": _cell(16.0, 100)}


def test_step_table_from_worker_results(monkeypatch):
    """Targets 2 and 4 turn the per-configuration results into ratios judged against the goals file
    (subprocess replaced); the bound of a speed row is the ratio free tensorized layers would give."""
    fake = _fake_results(step_time_ms_halved=80.0, ranks={"l": [1, 8, 1]}, ranks_halved={"l": [1, 4, 1]},
                         tt_layers_ms=40.0, tt_layers_ms_halved=20.0, tt_layers_seen=1, tt_layers=1,
                         tt_layers_flops=9e9, tt_layers_flops_halved=5e9, tt_layers_traffic=4e8,
                         tt_layers_traffic_halved=3.2e8, allocator="glibc x")
    monkeypatch.setattr(steps, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: fake)
    rows = steps.target_steps(Config.make("cpu", 1, quick=True), {2, 4}, 10)
    got = {r.goal_key: (r.measured, r.verdict) for r in rows if r.goal_key}
    assert got == {"step.paper.speedup_vs_dense_b32": (8.0, "pass"),
                   "step.paper.memory_vs_dense_b32": (0.5, "pass"),
                   "step.paper.speedup_vs_galore_b1": (None, "error"),
                   "step.paper.memory_saving_vs_galore_b1": (None, "error"),
                   "step.small.speedup_vs_dense_b32": (1.25, "pass"),
                   "step.small.speedup_vs_dense_b1": (0.625, "short"),
                   "halving.layers_speedup": (2.0, "impossible"),  # above its FLOP bound 1.8
                   "halving.amdahl_fraction": (1.0, "pass")}
    assert all("comera_b1: exit 1: boom" in r.note for r in rows)
    assert all("worker allocator glibc x" in r.settings for r in rows)  # differs from this process
    by_key = {r.goal_key: r for r in rows}
    speed = by_key["step.paper.speedup_vs_dense_b32"]
    # 40 of 100 ms in the tensorized layers: the other 60 ms bound the ratio by 800 / 60
    assert speed.bound == pytest.approx(800 / 60) and speed.bound_basis == "free tensorized layers"
    assert "f=0.40" in speed.note and "uncompressed model" in speed.note and "size=tiny" in speed.settings
    assert "timing" not in speed.note and speed.stability == "stable"  # both cells stable: nothing to say
    assert by_key["step.paper.memory_vs_dense_b32"].stability == ""  # memory divides no times
    # on the CPU the goal is the tensor-allocation peak (cuda_allocated's analogue), RSS growth an info row
    memory = by_key["step.paper.memory_vs_dense_b32"]
    assert ("(cpu_allocated)" in memory.what
            and "memory cpu_allocated (info rows: cpu_rss_delta)" in memory.settings)
    fake["comera_b32"]["peak_mem_bytes"] = 1500
    again = steps.target_steps(Config.make("cpu", 1, quick=True), {2}, 10)
    rss = next(r for r in again if "peak RSS growth" in r.what and "b8" not in r.what and "batch 8" in r.what)
    assert rss.measured == pytest.approx(0.75) and not rss.goal_key and rss.verdict == "info"
    assert next(r for r in again if r.goal_key == "step.paper.memory_vs_dense_b32").measured == 0.5
    fake["comera_b32"]["peak_mem_bytes"] = 1000
    assert by_key["step.paper.speedup_vs_galore_b1"].stability == ""  # comera_b1 failed: no verdict
    fake["dense_b32"]["timing_quality"] = "noisy: 2 timed steps (< 5)"
    noisy = next(r for r in steps.target_steps(Config.make("cpu", 1, quick=True), {2}, 10)
                 if r.goal_key == "step.paper.speedup_vs_dense_b32")
    assert ("tiny dense b8 timing noisy: 2 timed steps (< 5)" in noisy.note
            and "comera b8 timing" not in noisy.note)
    # the number is still the analysis layer's, shown but not judged against the goal
    assert noisy.measured == 8.0 and noisy.verdict == "noisy"
    assert noisy.stability == "noisy: tiny dense b8: 2 timed steps (< 5)"
    fake["dense_b32"]["timing_quality"] = "stable"
    small = by_key["step.small.speedup_vs_dense_b1"]
    assert "tiny preset" in small.what and small.goal == 0.667 and small.bound is None  # --quick runs tiny
    assert "tiny preset, batch 8" in speed.what and "tiny dense b8 800.0 ms" in speed.medians
    halving = by_key["halving.amdahl_fraction"]  # f=0.4, s=2: 1/(0.6+0.2) = 1.25 = the step's 100/80
    assert "= 1.25x" in halving.note and "1.25x; Amdahl estimate 1.25x" in halving.medians
    assert "l: [1, 8, 1] -> [1, 4, 1]" in halving.settings
    # with the alternated rounds of the full-rank model and its halved copy, each speedup is the median of
    # the per-round ratios (steps 1.5, 1.25, 1.6 -> 1.5; layers 2, 2.5, 1.5 -> 2) and the full model's medians
    # (step 120 ms, layers 40 ms) give the share f = 1/3: s = 2, estimate 1.2x
    fake["comera_b32"].update(step_time_ms_halving_rounds=[(120.0, 80.0), (100.0, 80.0), (128.0, 80.0)],
                              step_time_ms_before_halving=120.0,
                              tt_layers_ms_halving_rounds=[(40.0, 20.0), (50.0, 20.0), (30.0, 20.0)],
                              tt_layers_ms_before_halving=40.0)
    alternated = {r.goal_key: r for r in steps.target_steps(Config.make("cpu", 1, quick=True), {4}, 10)}
    row = alternated["halving.amdahl_fraction"]
    assert (row.measured == pytest.approx(1.5 / 1.2) and "f=0.33" in row.note
            and "40.0 of 120.0 ms" in row.note)
    assert "before 120.0 ms, after 80.0 ms (the full-rank model and its halved copy alternating in 3 " \
           "rounds; per round 1.50, 1.25, 1.60): 1.50x; Amdahl estimate 1.20x" in row.medians
    lone = alternated["halving.layers_speedup"]
    assert lone.measured == 2.0 and lone.medians == (
        "before 40.0 ms, after 20.0 ms (1 modules, each re-run alone on its step input; the full-rank model "
        "and its halved copy alternating in 3 rounds; per round 2.00, 2.50, 1.50)")
    layers = by_key["halving.layers_speedup"]  # the FLOP ratio bounds the layers' speedup
    assert layers.flop_ratio == layers.bound == pytest.approx(1.8) and layers.bound_basis == "FLOPs"
    assert layers.traffic_ratio == pytest.approx(1.25) and "FLOPs 1.80x" in layers.note


def test_halving_bound_is_the_roofline_of_the_counted_costs():
    """With the machine's roofline the layer row's bound is the measured time before over the halved
    layers' roofline time (traffic-bound here: 40 ms over 32 ms), the FLOP ratio stays in its column."""
    from harness.perf.roofline import Roofline

    result = {"tt_layers_ms": 40.0, "tt_layers_ms_halved": 30.0, "tt_layers_flops": 9e9,
              "tt_layers_flops_halved": 5e9, "tt_layers_traffic": 4e8, "tt_layers_traffic_halved": 3.2e8}
    cfg = Config.make("cpu", 1, quick=True)
    layers = steps.halving_rows(cfg, result, 32, "", "", Roofline(flops_per_s=1e12, bytes_per_s=1e10))[0]
    assert layers.bound == pytest.approx(1.25) and layers.bound_basis == "roofline"
    assert layers.flop_ratio == pytest.approx(1.8) and layers.measured == pytest.approx(40 / 30)
    flops_only = steps.halving_rows(cfg, result, 32, "", "")[0]
    assert flops_only.bound == pytest.approx(1.8) and flops_only.bound_basis == "FLOPs"


def test_step_goals_come_from_the_goals_file(monkeypatch, tmp_path):
    """A changed goal in the file changes the verdict; the code holds none."""
    from harness.perf import goals

    text = goals.DEFAULT_PATH.read_text().replace("speedup_vs_dense_b32: 4.0", "speedup_vs_dense_b32: 9.0")
    (tmp_path / "bench.yaml").write_text(text)
    monkeypatch.setattr(steps, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: _fake_results())
    rows = steps.target_steps(Config.make("cpu", 1, quick=True, goals=tmp_path / "bench.yaml"), {2}, 10)
    speed = next(r for r in rows if r.goal_key == "step.paper.speedup_vs_dense_b32")
    assert (speed.goal, speed.measured, speed.verdict) == (9.0, 8.0, "short")


@pytest.mark.parametrize("quick", [True, False])
def test_step_jobs_cover_both_presets_and_halve_only_comera_b32_for_target_4(quick):
    cfg = Config.make("cpu", 2, quick)
    jobs = steps.step_jobs(cfg, {2, 4})
    assert {n for n, j in jobs.items() if j["halve"]} == {"comera_b32"}
    assert not any(j["halve"] for j in steps.step_jobs(cfg, {2}).values())
    assert set(steps.step_jobs(cfg, {4})) == {"comera_b32"}
    sizes = {n: j["workload_params"]["size"] for n, j in jobs.items()}
    assert sizes == {n: "tiny" if quick else "small" if n.startswith("small_") else "paper" for n in jobs}
    assert {n: j["batch_size"] for n, j in jobs.items()} == {
        n: 1 if n.endswith("_b1") else 8 if quick else 32 for n in jobs}
    assert {k for _, a, b, _, _ in steps.STEP_ROWS for k in (a, b)} == set(jobs)
    if not quick:
        assert jobs["dense_b32"]["steps"] == 3 and jobs["small_comera_b1"]["steps"] == 20


def test_step_ratios_are_medians_of_per_round_ratios(monkeypatch):
    """Several rounds: each time ratio is the median of the within-round ratios (not the ratio of the
    medians); a failed configuration is named; memory is one reading per process."""
    per_round = {"dense_b32": [800.0, 1200.0, 900.0], "comera_b32": [100.0, 400.0, 300.0],
                 "galore_b1": [60.0, 60.0, 60.0], "comera_b1": [10.0, 20.0, 20.0]}
    fake = {name: _cell(sorted(ms)[1], 1000, ms) for name, ms in per_round.items()}
    fake["galore_b1"] = {"error": "exit 1: flaky"}
    monkeypatch.setattr(steps, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: fake)
    cfg = Config.make("cpu", 1, quick=True, step_rounds=3)
    got = {r.goal_key: r for r in steps.target_steps(cfg, {2}, 10)}
    speed = got["step.paper.speedup_vs_dense_b32"]
    assert speed.measured == 3.0 and "per round 8.00, 3.00, 3.00" in speed.medians  # not 900/300
    assert "tiny dense b8 900.0 ms" in speed.medians and "tiny comera b8 300.0 ms" in speed.medians
    assert got["step.paper.speedup_vs_galore_b1"].measured is None
    assert "galore_b1: exit 1: flaky" in speed.note and "3 interleaved round(s)" in speed.settings
    assert steps.step_ratio(fake, "dense_b32", "comera_b32", "peak_mem_bytes").value == 1.0
    # the same number as the claims' and figures' for the same pair of rows
    from harness.results import analysis

    assert analysis.ratio(fake["dense_b32"], fake["comera_b32"]) == steps.step_ratio(
        fake, "dense_b32", "comera_b32", "step_time_ms")



def test_a_step_speedup_above_its_own_bound_is_impossible_not_a_pass(monkeypatch):
    """Injected times of a busy machine: per round uncompressed 800 and 800 ms, CoMERA 10 and 400 ms (5 ms
    in its tensorized layers, median step 205 ms): the per-round ratios 80 and 2 give 41x, while even free
    tensorized layers would give 800 / 200 = 4x: impossible (noise), never a pass of the 4x goal."""
    fake = _fake_results()
    fake["dense_b32"].update(step_time_ms=800.0)
    _rounds(fake["dense_b32"], [800.0, 800.0])
    fake["comera_b32"].update(step_time_ms=205.0, tt_layers_ms=5.0)
    _rounds(fake["comera_b32"], [10.0, 400.0])
    monkeypatch.setattr(steps, "run_step_rounds", lambda jobs, rounds, timeout_s, progress: fake)
    rows = {r.goal_key: r
            for r in steps.target_steps(Config.make("cpu", 1, quick=True, step_rounds=2), {2}, 10)}
    speed = rows["step.paper.speedup_vs_dense_b32"]
    assert speed.measured == pytest.approx(41.0) and speed.bound == pytest.approx(4.0)
    assert speed.verdict == "impossible" and "above its own bound 4.00 (free tensorized layers)" in speed.note
    _rounds(fake["comera_b32"], [190.0, 210.0])  # a quiet machine: 4.2x and 3.8x, median 4x
    rows = {r.goal_key: r
            for r in steps.target_steps(Config.make("cpu", 1, quick=True, step_rounds=2), {2}, 10)}
    assert rows["step.paper.speedup_vs_dense_b32"].verdict == "pass"


@pytest.mark.parametrize("layers", [205.0, 300.0])
def test_a_profile_whose_lone_layers_outlast_the_step_gives_no_bound_and_says_why(layers):
    """Lone layers timed at another moment (a busy machine) can add up to more than the step they are part
    of: no free-layers bound (it was 6e12 on such a run), no Amdahl estimate, and the note says why."""
    comera = {"step_time_ms": 205.0, "tt_layers_ms": layers, "tt_layers_seen": 38}
    assert steps.free_layers_cap(comera, {"step_time_ms": 900.0}) is None
    assert steps.share_note(comera, "the uncompressed model").startswith("profile not used")
    halving = {**comera, "tt_layers_ms_halved": layers / 2}
    assert steps.amdahl_estimate(halving) is None
    assert steps.amdahl_note(halving).startswith("profile not used")
    consistent = {**comera, "tt_layers_ms": 100.0}
    assert steps.free_layers_cap(consistent, {"step_time_ms": 900.0}) == pytest.approx(900.0 / 105.0)
    assert steps.share_note(consistent, "x").startswith("profile: tensorized layers fwd+bwd 100.0")
