"""A cell with periodic work (every 5th step 5x, declared as its ``time_window_steps``) run by the cell
runner: its rounds hold whole periods, it is judged stable by the spread of its round means, and its
ratio to a plain cell counts the periodic work (about 1.8x); so with every 2nd, 3rd or 4th step 5x, whose
steps' IQR is judged without the periodic steps."""
from __future__ import annotations

import json
import time
import types

import pytest
import torch

from harness.core import measure, timing
from harness.results import analysis
from harness.running import run as runner
from harness.running.registry import Registry
from tests.harness.running import run_toys
from tests.harness.running.run_toys import TOY_REGISTRY, toy_spec

BASE_S, PERIODIC_S, PERIOD, ROUNDS = 0.01, 0.04, 5, 4


@pytest.fixture
def quiet_machine(monkeypatch):
    """A step takes exactly the toy's work (its pauses), on a clock of the step timer's own that only they
    advance, and the machine-state readings are left out: these tests judge the rounds, not the load of
    the machine they run on (real sleeps of 10 ms overshoot by more than the thresholds under load)."""
    now = [0.0]
    monkeypatch.setattr(run_toys, "pause", lambda seconds: now.__setitem__(0, now[0] + seconds))
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: now[0],
                                                               process_time=time.process_time))
    monkeypatch.setattr(timing.MachineState, "columns",
                        lambda self: {"load_avg_1m": None, "cpu_pressure": None, "run_queue_frac": None})


def _cell(steps_per_round: int = PERIOD, **method_params):
    spec = toy_spec(method_params={"sleep_s": BASE_S, **method_params}, workload_params={"samples": 1024},
                    budget={"epochs": 1, "max_steps_per_epoch": 1 + ROUNDS * steps_per_round,
                            "warmup_steps": 1, "eval_every_steps": None},
                    execution={"rounds": ROUNDS})
    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "ok", row["error"]
    return row


def test_a_periodic_cell_is_stable_and_its_ratio_counts_the_periodic_work(quiet_machine):
    periodic = _cell(period=PERIOD, period_sleep_s=PERIODIC_S)
    plain = _cell()
    extra = json.loads(periodic["extra"])
    assert extra["round_alignment"] == (f"{ROUNDS} rounds of whole periods of {PERIOD} steps "
                                        f"({ROUNDS} periods in all)")
    assert "no periodic work declared" in json.loads(plain["extra"])["round_alignment"]
    means = json.loads(periodic["round_step_mean_ms"])
    assert len(means) == ROUNDS and max(means) / min(means) < 1.2  # every round holds one periodic step
    # the old test's "noisy"
    assert extra["step_time_ms_mean"] / periodic["step_time_ms"] > timing.MAX_MEAN_OVER_MEDIAN
    assert periodic["timing_quality"] == plain["timing_quality"] == "stable"
    r = analysis.ratio(periodic, plain)
    assert r is not None and r.value == pytest.approx(1.8)  # (4 x 10 + 50) / 5 / 10 ms, on its clock


@pytest.mark.parametrize("period", [2, 3, 4])
def test_a_short_period_is_stable_and_its_ratio_counts_the_periodic_work(quiet_machine, period):
    """Every 2nd, 3rd or 4th step 5x: the periodic steps reach the third quartile of all steps, so only the
    steps without them are judged by their IQR; 4 rounds of 12 steps each."""
    periodic = _cell(12, period=period, period_sleep_s=PERIODIC_S)
    plain = _cell(12)
    assert json.loads(periodic["extra"])["round_alignment"] == (
        f"{ROUNDS} rounds of whole periods of {period} steps ({ROUNDS * 12 // period} periods in all)")
    assert periodic["step_time_ms_iqr"] / periodic["step_time_ms"] > timing.MAX_IQR_OVER_MEDIAN  # all steps
    assert periodic["timing_quality"] == plain["timing_quality"] == "stable"
    r = analysis.ratio(periodic, plain)
    assert r is not None and r.value == pytest.approx((period - 1 + 5) / period)


def test_an_outlier_step_is_still_noisy_where_the_rounds_hold_no_whole_period(quiet_machine):
    """One step 20x (the 12th, declared as a period of 12, which 20 timed steps in 4 rounds cannot hold
    twice): the rounds are not aligned, so the mean / median test judges, as without a period."""
    row = _cell(period=12, period_sleep_s=19 * BASE_S)
    assert json.loads(row["extra"])["round_alignment"].startswith("not aligned")
    assert row["timing_quality"].startswith("noisy: mean 1.")


def _short_cell(**method_params):
    """16 steps, 2 of warm-up, 5 rounds: 14 timed steps, too few for two rounds of a period of 10 or 50."""
    spec = toy_spec(method_params={"sleep_s": BASE_S, "declare": True, **method_params},
                    workload_params={"samples": 1024},
                    budget={"epochs": 1, "max_steps_per_epoch": 16, "warmup_steps": 2,
                            "eval_every_steps": None},
                    execution={"rounds": 5})
    row, _ = runner.run_cell(spec, registry=TOY_REGISTRY)
    assert row["status"] == "ok", row["error"]
    return row, json.loads(row["extra"])


@pytest.mark.parametrize("period, forceable, how", [(10, False, timing.NATURAL), (50, True, timing.FORCED)])
def test_periodic_work_outside_whole_periods_is_timed_apart_at_its_rate(quiet_machine, period, forceable,
                                                                         how):
    """A periodic step 10 ms + 100 ms every ``period`` steps: on its schedule in the timed steps (step 9 of
    16, period 10) or, where none falls there (period 50), made to run once; either way timed apart and
    added at 1/period: mean 10 + 100 / period ms, every round's mean the same, stable."""
    run_toys.ToyMethod.forced = 0
    row, extra = _short_cell(period=period, period_sleep_s=0.1, forceable=forceable)
    plan = extra["periodic"]["toy work"]
    assert plan["how"] == how and len(plan["steps"]) == 1 and plan["every"] == period
    assert run_toys.ToyMethod.forced == (how == timing.FORCED)
    assert plan["step_ms"] == [pytest.approx(110)] and plan["extra_ms"] == pytest.approx(100)
    expected = 10 + 100 / period
    assert extra["step_time_ms_mean"] == pytest.approx(expected)
    assert json.loads(row["round_step_mean_ms"]) == [pytest.approx(expected)] * 5
    assert row["epoch_time_s"] == pytest.approx(expected * 1024 / 16 / 1e3)  # extrapolated from the mean
    assert row["timing_quality"] == "stable"


def test_periodic_work_that_can_neither_fall_nor_be_forced_makes_the_row_noisy(quiet_machine):
    row, extra = _short_cell(period=50, period_sleep_s=0.1)
    assert extra["periodic"]["toy work"]["how"] == timing.NOT_TIMED
    assert "toy work every 50 steps: on no counted step" in row["timing_quality"]


def test_a_galore_timing_cell_times_one_svd_at_its_rate(monkeypatch):
    """GaLore (galore-torch) with update_proj_gap 20 in a 16-step timing cell: its SVD runs at step 0
    (warm-up) and, forced, at one counted step, whose time the row adds at 1/20 per step and names."""
    from baselines.galore import GaLoreMethod, import_galore_torch

    projector = import_galore_torch().galore_projector.GaLoreProjector
    real, svd_steps = projector.get_orthogonal_matrix, []
    monkeypatch.setattr(projector, "get_orthogonal_matrix",
                        lambda self, *a, **k: svd_steps.append(len(svd_steps)) or real(self, *a, **k))
    registry = Registry(build_workload=run_toys.toy_workload, get_method=lambda name: GaLoreMethod())
    spec = toy_spec(method="galore", method_params={"rank": 2, "update_proj_gap": 20},
                    workload_params={"samples": 1024},
                    budget={"epochs": 1, "max_steps_per_epoch": 16, "warmup_steps": 2,
                            "eval_every_steps": None},
                    execution={"rounds": 5})
    row, _ = runner.run_cell(spec, registry=registry)
    assert row["status"] == "ok", row["error"]
    plan = json.loads(row["extra"])["periodic"]["galore projection"]
    assert plan["how"] == timing.FORCED and plan["every"] == 20 and len(plan["step_ms"]) == 1
    assert plan["steps"][0] >= 2 and "extra_ms" in plan
    layers = sum(1 for m in run_toys.toy_workload("toy", {"samples": 1024}, batch_size=16, seed=0,
                                                  device=torch.device("cpu")).model.modules()
                 if isinstance(m, torch.nn.Linear))
    # one per projected weight at: the warm-up's throwaway step (harness.running.warmup), step 0, the
    # forced step
    assert len(svd_steps) == 3 * layers
