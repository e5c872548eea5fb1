"""Claims, Fig 1 and the device comparison show one ratio for one pair of cells, and it counts periodic
work: two cells timed together in interleaved rounds, one of which spends 5x on every 5th step (as
pruning or GaLore's projection update do) and declares that period, so that its rounds hold whole periods
and its stability verdict (harness.core.timing.judge, not forced here) judges the spread of its round
means; a cell with an outlier step and no period is still noisy."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest

from harness.core import timing
from harness.reports import claims, compare, drawing, figures
from harness.results import analysis
from tests.harness.reports.test_claims import MEASURED, placed, run
from tests.harness.reports.test_reports import make_folder

ROUNDS, PERIOD, WARMUP, STEPS_PER_EPOCH = 4, 5, 1, 100
TOTAL = WARMUP + ROUNDS * (1 + PERIOD)
"""Steps a cell runs: warm-up, then per interleaved round a re-warm step (not counted) and one period."""
LOAD = (1.0, 1.1, 0.9, 1.2)
"""The machine's speed in each round: it changes between rounds and hits both cells alike."""


def counted_steps(period: int | None, periodic_ms: float, outlier: int | None = None
                  ) -> tuple[list[float], list[int], list[int], timing.Rounds]:
    """The counted step times, rounds and step indices of a cell as `comera-bench run` lays out its
    interleaved rounds (harness.core.timing.round_bounds, the cell's period declared): 10 ms steps, every
    ``period``-th ``periodic_ms``, step ``outlier`` 20x."""
    plan = timing.round_bounds(WARMUP, TOTAL, ROUNDS, steps_per_round=2, period=period)
    ends = plan.starts[1:] + [TOTAL]
    steps, rounds, index = [], [], []
    for r, (start, end) in enumerate(zip(plan.starts, ends)):
        for i in range(start + 1, end):  # the round's first step re-warms: not counted
            ms = periodic_ms if period and (i + 1) % period == 0 else 10.0
            steps.append(ms * (20 if i == outlier else 1) * LOAD[r])
            rounds.append(r)
            index.append(i)
    return steps, rounds, index, plan


def timed_cell(method: str, period: int | None = None, periodic_ms: float = 10.0,
               outlier: int | None = None) -> dict:
    """A transformer timing cell at batch 32 as `comera-bench run` writes it after its rounds: per-round
    medians and means, the median step time, the mean-based epoch time and the stability verdict of
    harness.core.timing.judge (not forced)."""
    steps, rounds, index, plan = counted_steps(period, periodic_ms, outlier)
    q1, median, q3 = timing.quartiles(steps)
    mean_ms = sum(steps) / len(steps)
    row = run("transformer", method, 32, time=mean_ms * STEPS_PER_EPOCH / 1e3)
    means = timing.round_means(steps, rounds)
    row.update(step_time_ms=median, step_time_ms_iqr=q3 - q1, steps_timed=len(steps),
               epoch_time_kind="extrapolated",
               timing_group="transformer_b32_s0", hostname="host", flops_per_step=1e9,
               round_step_ms=json.dumps(timing.round_medians(steps, rounds)),
               round_step_mean_ms=json.dumps(means),
               timing_quality=timing.judge(step_time_ms=median, step_time_ms_iqr=q3 - q1,
                                           steps_timed=len(steps),
                                           step_time_ms_mean=mean_ms, period=plan.period, round_means=means,
                                           step_ms=steps, step_index=index),
               extra=json.dumps({"round_alignment": plan.alignment, "step_time_ms_mean": mean_ms}))
    return row


@pytest.fixture
def cells(tmp_path):
    dense = timed_cell("dense")
    comera = timed_cell("comera", period=PERIOD, periodic_ms=50.0)  # every 5th step 5x, its period declared
    path = make_folder(tmp_path / "here", placed([dense, comera]))
    return path, analysis.load(path)


def test_the_periodic_cell_is_judged_stable_by_its_round_means(cells):
    _, res = cells
    comera = res.runs[res.runs.method == "comera"].iloc[0]
    assert comera.timing_quality == "stable"
    assert analysis.extra_of(comera)["round_alignment"] == f"{ROUNDS} rounds of whole periods of {PERIOD} " \
                                                          f"steps ({ROUNDS} periods in all)"
    # the mean / median test alone would have called it noisy
    assert analysis.extra_of(comera)["step_time_ms_mean"] / comera.step_time_ms > timing.MAX_MEAN_OVER_MEDIAN
    steps, _, _, _ = counted_steps(PERIOD, 50.0)
    assert timing.judge(step_time_ms=comera.step_time_ms, step_time_ms_iqr=comera.step_time_ms_iqr,
                        steps_timed=len(steps),
                        step_time_ms_mean=sum(steps) / len(steps)).startswith("noisy: mean")


def test_an_outlier_without_a_period_is_noisy_and_enters_no_ratio(tmp_path):
    dense = timed_cell("dense", outlier=WARMUP + 2)  # one step 20x
    comera = timed_cell("comera", period=PERIOD, periodic_ms=50.0)
    assert dense["timing_quality"].startswith("noisy: mean 1.") and "(> 1.5x)" in dense["timing_quality"]
    res = analysis.load(make_folder(tmp_path / "here", placed([dense, comera])))
    rows = [res.runs[res.runs.method == m].iloc[0] for m in ("dense", "comera")]
    assert analysis.ratio(*rows) is None


def test_claims_fig1_and_compare_give_one_ratio_with_the_periodic_work(cells, monkeypatch):
    path, res = cells
    assert set(res.runs.timing_quality) == {"stable"}  # judged, not forced
    dense, comera = (res.runs[res.runs.method == m].iloc[0] for m in ("dense", "comera"))
    r = analysis.ratio(dense, comera)
    assert r.interleaved and r.n == ROUNDS
    assert r.value == pytest.approx(10 / 18)  # CoMERA's mean step is 1.8x dense's: the periodic work counts
    assert r.text() == "0.56x [0.56-0.56]"
    medians = [a / b for a, b in zip(json.loads(dense.round_step_ms), json.loads(comera.round_step_ms))]
    assert medians == pytest.approx([1.0] * ROUNDS)  # the per-round medians would have dropped it

    c1 = claims.evaluate(res).set_index("claim").loc["C1", MEASURED]
    assert "dense/CoMERA epoch time (extrapolated): opposite direction, 0.56x [0.56-0.56] @ batch 32" in c1

    footers = {}
    monkeypatch.setattr(drawing, "finish", lambda fig, title, footer, out, name, notes="":
                        footers.update({name: footer}) or plt.close(fig))
    figures.fig1_time_memory(res, path)
    assert "Uncompressed / CoMERA time" in footers["fig1_time_memory"]
    assert "0.56x [0.56-0.56] @ batch 32" in footers["fig1_time_memory"]

    ratios = compare.method_ratios([path])
    time = ratios[(ratios.source == "measured") & (ratios.quantity == "epoch_time")].iloc[0]
    assert time.versus == "dense-default" and time.interleaved and time.rounds == ROUNDS
    assert (time.ratio == pytest.approx(r.value)
            and (time.low, time.high) == (pytest.approx(r.low), pytest.approx(r.high)))


def test_cells_timed_apart_give_the_same_number_from_their_mean_based_epoch_times(cells):
    _, res = cells
    apart = res.runs.assign(timing_group=None)
    dense, comera = (apart[apart.method == m].iloc[0] for m in ("dense", "comera"))
    r = analysis.ratio(dense, comera)
    assert not r.interleaved and r.basis == analysis.NOT_INTERLEAVED
    assert r.value == pytest.approx(10 / 18)


def test_two_folders_of_one_machine_are_never_timed_together(cells, tmp_path):
    """The same grid run twice on one machine: the same group name and host, but no shared rounds."""
    path, res = cells
    rows = [{**r, "round_step_mean_ms": json.dumps([40.0] * ROUNDS)} if r["method"] == "dense" else r
            for r in res.runs.to_dict("records")]
    again = make_folder(tmp_path / "again", [{k: (None if v != v else v) for k, v in r.items()}
                                             for r in rows])
    table, _, _ = compare.side_by_side([path, again])
    dense = table[table.method == "dense"].iloc[0]
    assert dense["epoch_time ratio again/here"] == pytest.approx(1.0)  # epoch times, not the rounds' 4x


def test_a_period_that_leaves_fewer_rounds_pairs_the_rounds_both_cells_have(tmp_path):
    """Every 6th step 5x: the 24 timed steps hold 3 rounds of (re-warm + 6), the plain cell has 4 rounds;
    round r of both ran in the group's round r, so the ratio pairs rounds 0-2 and counts the periodic
    work ((5 x 10 + 50) / 6 = 16.7 ms against 10 ms)."""
    dense = timed_cell("dense")
    comera = timed_cell("comera", period=6, periodic_ms=50.0)
    assert ("3 rounds (fewer than the 4 asked) of whole periods of 6 steps"
            in json.loads(comera["extra"])["round_alignment"])
    assert comera["timing_quality"] == "stable"
    res = analysis.load(make_folder(tmp_path / "here", placed([dense, comera])))
    rows = [res.runs[res.runs.method == m].iloc[0] for m in ("comera", "dense")]
    r = analysis.ratio(*rows)
    assert r.interleaved and r.n == 3 and r.value == pytest.approx(100 / 6 / 10)


@pytest.mark.parametrize("period", [2, 3, 4])
def test_a_short_period_is_stable_and_its_ratio_counts_the_periodic_work(tmp_path, period):
    """Every 2nd, 3rd or 4th step 5x: the steps' IQR holds the periodic work (judged without it), the ratio
    counts it (10 ms against (period - 1 + 5) x 10 / period ms)."""
    dense = timed_cell("dense")
    comera = timed_cell("comera", period=period, periodic_ms=50.0)
    assert comera["step_time_ms_iqr"] / comera["step_time_ms"] > timing.MAX_IQR_OVER_MEDIAN
    assert comera["timing_quality"] == "stable"
    res = analysis.load(make_folder(tmp_path / "here", placed([dense, comera])))
    r = analysis.ratio(*(res.runs[res.runs.method == m].iloc[0] for m in ("dense", "comera")))
    assert r.interleaved and r.n == ROUNDS
    assert r.value == pytest.approx(period / (period + 4))  # every round holds whole periods
