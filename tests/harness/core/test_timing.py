"""Timing trust (harness/core/timing.py): the stability verdict's thresholds, rounds and their per-round
means and medians, quartiles, and the machine-state probe seeing a competitor for the CPU."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from harness.core import timing


@pytest.mark.parametrize("kwargs, reasons", [
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 1.0, "steps_timed": 20}, []),
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 1.0, "steps_timed": 4}, ["4 timed steps (< 5)"]),
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 3.0, "steps_timed": 20}, ["IQR 30% of the median (> 25%)"]),
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 1.0, "steps_timed": 20, "step_time_ms_mean": 16.0},
     ["mean 1.60x the median (> 1.5x)"]),
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 1.0, "steps_timed": 20, "run_queue_frac": 0.4},
     ["its threads waited for a CPU 40% of their runnable time (> 10%)"]),
    ({"step_time_ms": 10.0, "step_time_ms_iqr": 1.0, "steps_timed": 20, "cpu_pressure": 0.5},
     ["CPU pressure 50% (> 25%)"]),
    ({"step_time_ms": float("nan"), "step_time_ms_iqr": float("nan"), "steps_timed": 0},
     ["0 timed steps (< 5)"]),
])
def test_judge(kwargs, reasons):
    verdict = timing.judge(**kwargs)
    assert verdict == ("stable" if not reasons else "noisy: " + "; ".join(reasons))


def _periodic(rounds: int, load=(1.0, 1.1, 0.9, 1.2, 1.0)) -> tuple[list[float], list[int]]:
    """Counted steps of ``rounds`` rounds of one period of 5: every 5th step 5x, the machine's speed
    changing between rounds."""
    steps = [ms * load[r] for r in range(rounds) for ms in (10.0, 10.0, 10.0, 10.0, 50.0)]
    return steps, [r for r in range(rounds) for _ in range(5)]


def _judge_steps(steps, step_round, period=None):
    med, iqr = timing.quartiles(steps)[1], timing.quartiles(steps)[2] - timing.quartiles(steps)[0]
    return timing.judge(step_time_ms=med, step_time_ms_iqr=iqr, steps_timed=len(steps),
                        step_time_ms_mean=sum(steps) / len(steps), period=period,
                        round_means=timing.round_means(steps, step_round))


def test_periodic_work_in_whole_periods_is_stable_by_the_spread_of_its_round_means():
    steps, rounds = _periodic(4)
    assert _judge_steps(steps, rounds) == "noisy: mean 1.72x the median (> 1.5x)"  # without its period
    assert _judge_steps(steps, rounds, period=5) == "stable"
    # rounds that disagree: the per-round means spread, named with the period
    steps5, rounds5 = _periodic(5, load=(1.0, 1.3, 1.0, 1.3, 1.0))
    assert _judge_steps(steps5, rounds5, period=5) == (
        "noisy: per-round mean step times (rounds of whole periods of 5 steps) spread 30% of their median "
        "(> 25%)")
    # two rounds are too few for a spread: the mean / median test again
    steps2, rounds2 = _periodic(2)
    assert _judge_steps(steps2, rounds2, period=5).startswith("noisy: mean 1.")


def _short_period(period: int, rounds: int = 4, noise=(1.0,)) -> tuple[list[float], list[int], list[int]]:
    """Counted steps (times, rounds, indices) of ``rounds`` rounds of 3 periods each, a re-warm step before
    every round (not counted): every ``period``-th step 5x, step i's time x ``noise[i % len(noise)]``."""
    steps, step_round, index, i = [], [], [], 0
    for r in range(rounds):
        i += 1  # the round's re-warm step
        for _ in range(3 * period):
            steps.append((50.0 if (i + 1) % period == 0 else 10.0) * noise[i % len(noise)])
            step_round.append(r)
            index.append(i)
            i += 1
    return steps, step_round, index


def _judge_periodic(steps, step_round, index, period):
    q1, med, q3 = timing.quartiles(steps)
    return timing.judge(step_time_ms=med, step_time_ms_iqr=q3 - q1, steps_timed=len(steps),
                        step_time_ms_mean=sum(steps) / len(steps), period=period,
                        round_means=timing.round_means(steps, step_round), step_ms=steps, step_index=index)


@pytest.mark.parametrize("period", [2, 3, 4])
def test_a_short_period_is_stable_by_the_steps_without_its_periodic_work(period):
    steps, step_round, index = _short_period(period)
    q1, med, q3 = timing.quartiles(steps)
    assert (q3 - q1) / med > timing.MAX_IQR_OVER_MEDIAN  # all steps' IQR holds the periodic work
    assert timing.ordinary_steps(steps, index, period) == [10.0] * (len(steps) - len(steps) // period)
    assert _judge_periodic(steps, step_round, index, period) == "stable"


@pytest.mark.parametrize("period", [2, 3, 4])
def test_a_noisy_cell_with_a_short_period_is_still_noisy(period):
    """Its ordinary steps take 10 or 16 ms, changing every step (period 2: at every place in the period)."""
    noise = (1.0, 1.0, 1.6, 1.6, 1.0)
    steps, step_round, index = _short_period(period, noise=noise)
    verdict = _judge_periodic(steps, step_round, index, period)
    assert verdict.startswith("noisy: IQR ") and (
        f"of the median of the steps without the periodic work (every {period} steps; > 25%)") in verdict


def test_ordinary_steps_leave_out_the_costly_place_in_the_period():
    # the periodic work at the second place of 3; the step times in any order
    assert timing.ordinary_steps([1.0, 5.0, 1.1, 1.2, 5.1, 0.9], [0, 1, 2, 3, 4, 5], 3) == [1.0, 1.1, 1.2,
                                                                                            0.9]
    assert timing.ordinary_steps([], [], 3) == []


def test_an_outlier_without_a_period_is_still_noisy():
    steps = [10.0] * 19 + [200.0]  # one step 20x
    assert _judge_steps(steps, [i // 5 for i in range(20)]) == "noisy: mean 1.95x the median (> 1.5x)"


def test_relative_iqr_and_spread_reason():
    assert timing.relative_iqr([10.0, 10.0, 10.0]) == 0.0
    assert timing.relative_iqr([1.0]) is None and timing.relative_iqr([None, 2.0]) is None
    assert timing.relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 3)
    assert timing.spread_reason([1.0, 2.0, 3.0, 4.0, 5.0], "x") == "x spread 67% of their median (> 25%)"
    assert timing.spread_reason([10.0, 11.0, 10.5], "x") == ""


def test_things_timed_in_rounds_are_judged_by_the_cells_thresholds():
    """One round has no spread (an IQR of 0 is no evidence of stability); a spread or a busy machine is
    named, as in a cell's verdict."""
    assert timing.judge_rounds([2.0, 2.1, 2.05]) == "stable"
    assert timing.judge_rounds([16.0]) == "noisy: per-round times: 1 round(s) (< 2)"
    assert timing.judge_rounds([1.0, None]).startswith("noisy: per-round times: 1 round(s)")
    assert timing.judge_rounds([1.0, 2.0, 3.0, 4.0, 5.0], "x") == \
        "noisy: x spread 67% of their median (> 25%)"
    assert timing.judge_rounds([2.0, 2.0], run_queue_frac=0.3, cpu_pressure=0.5) == (
        "noisy: its threads waited for a CPU 30% of their runnable time (> 10%); CPU pressure 50% (> 25%)")


def test_thresholds_at_the_boundary_are_stable():
    assert timing.judge(step_time_ms=10.0, step_time_ms_iqr=2.5, steps_timed=5, step_time_ms_mean=15.0,
                        run_queue_frac=0.10, cpu_pressure=0.25) == "stable"


@pytest.mark.parametrize("first, total, rounds, bounds", [
    (3, 30, 5, [3, 8, 13, 19, 24]),
    (1, 4, 5, [1, 2, 3]),       # fewer timed steps than rounds: one step per round
    (2, 2, 5, [2]),             # no timed step: one (empty) round
    (0, 10, 1, [0]),
])
def test_round_bounds(first, total, rounds, bounds):
    got = timing.round_bounds(first, total, rounds)
    assert got.starts == bounds and got.period is None and "no periodic work" in got.alignment


def test_round_bounds_leave_a_counted_step_after_each_rewarm_step():
    # 7 timed steps: 3 rounds of >= 2
    assert timing.round_bounds(1, 8, 5, steps_per_round=2).starts == [1, 3, 5]


def _counted(rounds: timing.Rounds, total: int, rewarm: int) -> list[list[int]]:
    """The counted step indices of each round (its first ``rewarm`` steps are not counted)."""
    ends = rounds.starts[1:] + [total]
    return [list(range(start + rewarm, end)) for start, end in zip(rounds.starts, ends)]


@pytest.mark.parametrize("first, total, rounds, steps_per_round, period, starts, used", [
    # interleaved: 4 rounds of a re-warm step + one period of 5 counted steps
    (1, 25, 4, 2, 5, [1, 7, 13, 19], 4),
    # 5 asked, 3 whole periods after the re-warm steps: 3 rounds; 3 left-over steps join the warm-up
    (2, 23, 5, 2, 5, [5, 11, 17], 3),
    # alone (no re-warm step): 22 timed steps, 4 periods of 5 in 4 rounds, 2 steps to the warm-up
    (0, 22, 4, 1, 5, [2, 7, 12, 17], 4),
    # more periods than rounds: 5 periods in 2 rounds, 2 and 3 (10 and 15 counted steps)
    (0, 27, 2, 2, 5, [0, 11], 2),
])
def test_round_bounds_align_rounds_to_whole_periods(first, total, rounds, steps_per_round, period,
                                                    starts, used):
    got = timing.round_bounds(first, total, rounds, steps_per_round, period=period)
    assert got.starts == starts and got.period == period
    assert f"{used} rounds" in got.alignment and f"whole periods of {period} steps" in got.alignment
    counted = _counted(got, total, steps_per_round - 1)
    assert all(len(c) % period == 0 and c for c in counted)
    # whatever the phase of the periodic step, every round holds it at the same rate
    for phase in range(period):
        per_round = [sum((i + phase) % period == 0 for i in c) / len(c) for c in counted]
        assert per_round == [1 / period] * used
    assert ("fewer than the" in got.alignment) == (used < rounds)


def test_round_bounds_without_two_whole_periods_split_evenly_and_say_so():
    got = timing.round_bounds(1, 12, 5, 2, period=5)  # 11 timed steps: no 2 rounds of 1 + 5
    assert got.period is None and got.starts == timing.round_bounds(1, 12, 5, 2).starts
    assert got.alignment.startswith("not aligned: 11 timed steps hold fewer than 2 round(s) "
                                    "of a whole period")
    assert (timing.round_bounds(0, 10, 1, period=5).starts == [0]
            and timing.round_bounds(0, 10, 1, period=5).period == 5)
    assert timing.round_bounds(0, 10, 4, period=1).period is None  # every step: no periodic work


def test_round_medians():
    assert timing.round_medians([1, 3, 2, 10, 20], [0, 0, 0, 2, 2]) == [2, None, 15]
    assert timing.round_medians([], []) == []


def test_round_means_count_the_periodic_step():
    steps = [10.0, 10.0, 10.0, 10.0, 50.0] * 2
    assert timing.round_means(steps, [0] * 5 + [1] * 5) == [18.0, 18.0]
    assert timing.round_medians(steps, [0] * 5 + [1] * 5) == [10.0, 10.0]
    assert timing.round_means([1.0, 3.0], [0, 2]) == [1.0, None, 3.0]


def test_quartiles():
    assert timing.quartiles([4.0]) == (4.0, 4.0, 4.0)
    assert timing.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_cpu_time_ratio():
    assert timing.cpu_time_ratio([20.0, 20.0], [10.0, 10.0], 2) == pytest.approx(1.0)
    assert timing.cpu_time_ratio([], [], 2) is None


def _spin(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or timing.schedstat_ns() is None,
                    reason="needs CPU affinity and /proc/self/task/*/schedstat")
def test_machine_state_sees_a_competitor_on_our_cpu():
    """A busy process pinned to the CPU this test is pinned to: our thread waits about half its
    runnable time, so run_queue_frac is far above the noisy threshold."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\n"
                            "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the hog is spinning
        state = timing.MachineState()
        state.begin()
        _spin(1.0)
        state.end()
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    cols = state.columns()
    assert cols["run_queue_frac"] > 2 * timing.MAX_RUN_QUEUE_FRAC
    assert cols["load_avg_1m"] is not None and math.isfinite(cols["load_avg_1m"])
    if cols["cpu_pressure"] is not None:
        assert 0 < cols["cpu_pressure"] <= 1


def test_slowdown_from_load_and_cpus():
    assert timing.slowdown(0.0, 2, 2) == 1.0  # a quiet machine
    assert timing.slowdown(8.0, 2, 2) == 5.0  # 2 threads among 10 runnable tasks on 2 CPUs
    assert timing.slowdown(8.0, 2, 1) == 4.5
    assert timing.slowdown(1.0, 16, 2) == 1.0


def test_busy_warning_says_how_much_longer_and_what_to_type(monkeypatch):
    monkeypatch.setattr(timing, "load_avg_1m", lambda: 8.0)
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    command = "snakemake --cores 1 figures --config 'execution={threads: 1}'"
    text = timing.busy_warning(2, command=command)
    assert text.startswith("the machine is busy (1-minute load average 8.0 on 2 CPUs) while each cell "
                           "asks for 2 thread(s): every cell, and so the run, will take about 5x its time on "
                           "a quiet machine or longer")
    assert text.endswith("run it anyway with one thread per cell, which waits less for a CPU (the cells "
                         f"record 1 thread; cells timed with 2 run again): {command}.")
    assert ("Stop it (Ctrl-C)" in timing.busy_warning(1)
            and "one thread per cell" not in timing.busy_warning(1))
    monkeypatch.setattr(timing, "load_avg_1m", lambda: 0.5)
    assert timing.busy_warning(2, command=command) == ""
