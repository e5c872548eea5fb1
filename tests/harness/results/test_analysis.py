"""The analysis layer (harness/results/analysis.py): the one time ratio and its fallbacks, stability, the
rows that may be compared, and the median over seeds."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.results import analysis


def _row(group, means, epoch_s, *, quality="stable", host="h", medians=None, **extra):
    return {"timing_group": group, "round_step_mean_ms": None if means is None else json.dumps(means),
            "round_step_ms": json.dumps(medians or []), "epoch_time_s": epoch_s, "timing_quality": quality,
            "hostname": host, "device_name": "cpu", **extra}


def test_ratio_per_round_of_mean_step_times_when_timed_together():
    a, b = _row("g", [30, 33, 60, 30, 36], 33.0), _row("g", [10, 11, 20, 12, 12], 12.0)
    r = analysis.ratio(a, b)
    assert r.interleaved and r.n == 5 and r.value == pytest.approx(3.0)  # per round 3, 3, 3, 2.5, 3
    assert (r.low, r.high) == (pytest.approx(3.0), pytest.approx(3.0))
    assert r.text() == "3.00x [3.00-3.00]" and r.basis == analysis.INTERLEAVED
    wide = analysis.ratio(_row("g", [10, 30, 10, 30], 1.0), _row("g", [10, 10, 10, 10], 1.0))
    assert (wide.low, wide.value, wide.high) == (pytest.approx(1.0), pytest.approx(2.0), pytest.approx(3.0))


def test_ratio_of_mean_based_epoch_times_otherwise():
    apart = analysis.ratio(_row("g1", [1.0], 33.0), _row("g2", [1.0], 11.0))
    assert not apart.interleaved and apart.value == pytest.approx(3.0) and apart.n == 1
    assert apart.basis == analysis.NO_SPREAD and apart.text() == "3.00x"  # one round a side: no spread
    # the same group name on two machines is two groups
    assert not analysis.ratio(_row("g", [3.0], 33.0, host="a"), _row("g", [1.0], 11.0, host="b")).interleaved
    # in one group without a round both have: the ratio of cells timed apart (medians are not used)
    unpaired = analysis.ratio(_row("g", None, 18.0, medians=[10.0]), _row("g", None, 10.0, medians=[10.0]))
    assert unpaired.value == pytest.approx(1.8) and unpaired.basis == analysis.NO_SPREAD
    assert analysis.ratio(_row(None, [], 1.0), {"epoch_time_s": None, "timing_quality": "stable"}) is None


def test_cells_timed_apart_get_the_spread_of_each_sides_round_means():
    """Two devices' cells share no round: the ratio of their epoch times, its spread from each side's
    round-mean quartiles over its median, the widest way (numerator's Q1 against the denominator's Q3)."""
    num, den = [27.0, 30.0, 33.0, 30.0, 30.0], [10.0, 9.0, 10.0, 11.0]  # quartiles 30/30/30 and 9.75/10/10.25
    apart = analysis.ratio(_row("g1", num, 3.0), _row("g2", den, 1.0))
    assert not apart.interleaved and apart.basis == analysis.NOT_INTERLEAVED and apart.n == 4
    assert (apart.low, apart.value, apart.high) == (pytest.approx(3.0 * 10 / 10.25), pytest.approx(3.0),
                                                    pytest.approx(3.0 * 10 / 9.75))
    assert apart.text() == "3.00x [2.93-3.08]"
    assert apart == analysis.apart_ratio(3.0, num, den)  # the one helper, whatever the rows
    # the spread always holds the value, also where it is not the ratio of the round means' medians
    skewed = analysis.apart_ratio(2.0, [10.0, 20.0, 30.0], [5.0, 5.0, 6.0])
    assert skewed.low < skewed.value < skewed.high
    assert (skewed.low, skewed.high) == (pytest.approx(2.0 * 15 / 20 * 5 / 5.5), pytest.approx(2.0 * 25 / 20))
    # a side with fewer than 2 finite, positive round means: no spread
    assert analysis.apart_ratio(2.0, [10.0, None, float("nan")], [5.0, 6.0]).basis == analysis.NO_SPREAD


def test_time_ratio_needs_stable_rows_and_memory_ratio_one_kind():
    assert analysis.ratio(_row("g", [2.0], 2.0, quality="noisy: x"), _row("g", [1.0], 1.0)) is None
    assert analysis.ratio(_row("g", [2.0], 2.0, quality=None), _row("g", [1.0], 1.0)) is None
    a = _row(None, None, 1.0, quality="noisy: x", peak_mem_bytes=300, peak_mem_kind="cuda_allocated")
    b = _row(None, None, 1.0, peak_mem_bytes=100, peak_mem_kind="cuda_allocated")
    assert analysis.ratio(a, b, analysis.MEMORY).value == pytest.approx(3.0)  # memory keeps noisy rows
    assert analysis.ratio(a, {**b, "peak_mem_kind": "cpu_rss_delta"}, analysis.MEMORY) is None


def test_the_round_statistic_is_one_helper_and_the_bench_may_ask_past_the_verdict():
    """rounds_ratio is what ratio uses for cells timed together (and what the bench uses on per-round
    times); require_stable=False gives the same number for rows that are not stable, whose verdict the bench
    shows beside it (verdict_of)."""
    a, b = _row("g", [30, 33, 60, 30, 36], 33.0), _row("g", [10, 11, 20, 12, 12], 12.0)
    assert analysis.ratio(a, b) == analysis.rounds_ratio([30, 33, 60, 30, 36], [10, 11, 20, 12, 12])
    assert analysis.ratio(a, b).per_round == pytest.approx((3.0, 3.0, 3.0, 2.5, 3.0))
    assert analysis.rounds_ratio([1.0], [0.0]) is None
    # a cell with fewer rounds (its rounds hold whole periods): the rounds both have, round r with round r
    fewer = analysis.ratio(_row("g", [18.0, 19.8, 16.2], 1.0), _row("g", [10.0, 11.0, 9.0, 12.0, 10.0], 1.0))
    assert fewer.interleaved and fewer.n == 3 and fewer.value == pytest.approx(1.8)
    noisy = {**a, "timing_quality": "noisy: CPU pressure 60% (> 25%)"}
    assert analysis.ratio(noisy, b) is None
    assert analysis.ratio(noisy, b, require_stable=False) == analysis.ratio(a, b)
    assert analysis.verdict_of({"a": a, "b": b}) == "stable"
    assert analysis.verdict_of({"a": noisy, "b": {}}) == ("noisy: a: CPU pressure 60% (> 25%); b: no timing verdict "
                                                         "(written before timing_quality existed)")


def test_pair_ratio_is_the_median_over_seeds_of_stable_rows():
    a = pd.DataFrame([_row(None, None, t, seed=s) for s, t in ((0, 2.0), (1, 4.0), (2, 3.0))])
    b = pd.DataFrame([_row(None, None, 1.0, seed=s) for s in (0, 1, 2)])
    assert analysis.pair_ratio(a, b).value == pytest.approx(3.0)
    noisy = a.assign(timing_quality=["stable", "noisy: x", "noisy: x"])
    assert analysis.pair_ratio(noisy, b).value == pytest.approx(2.0)
    assert analysis.pair_ratio(a.iloc[:0], b) is None


def test_is_stable_and_left_out_names_the_reason():
    rows = [{"run_id": "a", "timing_quality": "stable"}, {"run_id": "b", "timing_quality": "noisy: x"},
            {"run_id": "c", "timing_quality": None}]
    assert [analysis.is_stable(r) for r in rows] == [True, False, False]
    assert analysis.stable(pd.DataFrame(rows)).tolist() == [True, False, False]
    assert analysis.describe_left_out(rows) == ["b: x", "c: no timing verdict (written before timing_quality existed)"]


def test_on_gpu():
    assert analysis.on_gpu("cuda", "NVIDIA GeForce RTX 3090", "RTX 3090")
    assert analysis.on_gpu("cuda", "RTX 3090", "RTX 3090")
    assert not analysis.on_gpu("cuda", "NVIDIA GeForce RTX 3090 Ti", "RTX 3090")
    assert not analysis.on_gpu("cuda", "NVIDIA GeForce RTX 4090", "RTX 3090")
    assert not analysis.on_gpu("cpu", "RTX 3090", "RTX 3090")


def test_purpose_defaults_to_timing():
    runs = pd.DataFrame({"purpose": [None, "timing", "quality"]})
    assert analysis.is_timing(runs).tolist() == [True, True, False]


def test_load_names_a_folder_without_merged_runs_and_the_device_folders_below_it(tmp_path):
    from harness.results import ResultsError

    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "runs.parquet").write_bytes(b"")
    with pytest.raises(ResultsError, match=rf"{tmp_path} holds no merged runs.parquet.*below it: {tmp_path / 'cpu'}"):
        analysis.load(tmp_path)
    with pytest.raises(ResultsError, match=r"holds no merged runs.parquet: give a results/<device> folder"):
        analysis.load(tmp_path / "missing")


@pytest.mark.parametrize("steps, values, expected", [
    ([0, 200, 400, 600, 800, 1000], [0.3, 0.67, 0.9, 0.95, 0.98, 0.999], ""),  # rose 0.019: settled
    ([0, 200, 400, 600, 800, 1000], [0.3, 0.67, 0.9, 0.95, 0.95, 1.0], ""),  # at 1: nothing left to learn
    ([0, 200, 400, 600, 800, 1000], [0.3, 0.67, 0.9, 0.95, 0.95, 0.99], "0.950 -> 0.990"),
    ([0, 200, 400, 600, 800, 1000], [0.3, 0.67, 0.8, 0.85, 0.856, 0.976], "0.856 -> 0.976 over its last 20%"),
    ([0, 400, 450, 600, 800, 1000], [0.3, 0.99, 0.80, 0.9, 0.95, 0.99], ""),  # a dip after the switch, recovered
    ([0, 500, 1000], [0.3, 0.6, 0.7], "0.600 -> 0.700"),  # the tail starts after the last evaluation at 500
    ([0, 1000], [0.3, 0.9], "0.300 -> 0.900"),  # only the first evaluation precedes the tail
    ([0, 850, 900, 1000], [0.3, 0.5, 0.6, 0.7], "0.300 -> 0.700"),
    ([1000], [0.9], ""),  # one evaluation: nothing to say
    ([900, 950, 1000], [0.3, 0.5, 0.9], ""),  # none before the tail
])
def test_still_learning_compares_the_end_with_the_best_before_the_last_fifth(steps, values, expected):
    said = analysis.still_learning(pd.DataFrame({"step": steps, "value": values}))
    assert (expected in said) if expected else said == ""
    assert not expected or said.startswith("still learning at its end: validation accuracy")


def test_every_time_ratio_carries_a_confidence_interval_over_its_rounds():
    """Timed together: a t interval of the per-round log ratios; timed apart: of each side's round means
    (Welch); rounds that agree exactly, or no rounds, give the value itself (and no interval text)."""
    together = analysis.rounds_ratio([29, 30, 31], [10, 10, 10])
    assert together.ci_low < together.value == 3.0 < together.ci_high
    assert together.ci_text() == "95% CI 2.76-3.26"
    apart = analysis.apart_ratio(2.0, [9, 10, 11], [4, 5, 6])
    assert apart.ci_low < 2.0 < apart.ci_high
    assert apart.ci_high - apart.ci_low > together.ci_high - together.ci_low
    same = analysis.rounds_ratio([30, 30, 30], [10, 10, 10])
    assert same.ci_low == same.ci_high == same.value and same.ci_text() == ""
    assert analysis.apart_ratio(2.0, [10], [5]).ci_text() == ""
