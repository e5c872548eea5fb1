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
    assert timing.round_bounds(first, total, rounds) == bounds


def test_round_bounds_leave_a_counted_step_after_each_rewarm_step():
    assert timing.round_bounds(1, 8, 5, steps_per_round=2) == [1, 3, 5]  # 7 timed steps: 3 rounds of >= 2


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
    assert text.startswith("the machine is busy (1-minute load average 8.0 on 2 CPUs) while each cell asks for "
                           "2 thread(s): every cell, and so the run, will take about 5x its time on a quiet "
                           "machine or longer")
    assert text.endswith(f"run it anyway with one thread per cell, which waits less for a CPU (the cells record "
                         f"1 thread; cells timed with 2 run again): {command}.")
    assert "Stop it (Ctrl-C)" in timing.busy_warning(1) and "one thread per cell" not in timing.busy_warning(1)
    monkeypatch.setattr(timing, "load_avg_1m", lambda: 0.5)
    assert timing.busy_warning(2, command=command) == ""
