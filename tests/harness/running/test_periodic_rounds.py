"""A cell with periodic work (every 5th step 5x, declared as its ``time_window_steps``) run by the cell
runner: its rounds hold whole periods, it is judged stable by the spread of its round means, and its
ratio to a plain cell counts the periodic work (about 1.8x); so with every 2nd, 3rd or 4th step 5x, whose
steps' IQR is judged without the periodic steps."""
from __future__ import annotations

import json
import time
import types

import pytest

from harness.core import measure, timing
from harness.results import analysis
from harness.running import run as runner
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
