"""Claims, Fig 1 and the device comparison show one ratio for one pair of cells, and it counts periodic
work: two cells timed together in interleaved rounds, one of which spends 5x on every 5th step (as
pruning or GaLore's projection update do)."""
from __future__ import annotations

import json

import pytest

from harness.core import timing
from harness.reports import claims, compare, figures
from harness.results import analysis
from tests.workflow.test_claims import MEASURED, placed, run
from tests.workflow.test_reports import make_folder

ROUNDS, STEPS_PER_ROUND, STEPS_PER_EPOCH = 4, 5, 100
LOAD = (1.0, 1.1, 0.9, 1.2)
"""The machine's speed in each round: it changes between rounds and hits both cells alike."""


def timed_cell(method: str, step_ms: list[float]) -> dict:
    """A transformer timing cell at batch 32 as `comera-bench run` writes it after its rounds: per-round
    medians and means (harness.core.timing), the median step time, the mean-based epoch time."""
    steps = [ms * LOAD[r] for r in range(ROUNDS) for ms in step_ms]
    rounds = [r for r in range(ROUNDS) for _ in step_ms]
    mean_ms = sum(steps) / len(steps)
    row = run("transformer", method, 32, time=mean_ms * STEPS_PER_EPOCH / 1e3)
    row.update(step_time_ms=timing.quartiles(steps)[1], epoch_time_kind="extrapolated",
               timing_group="transformer_b32_s0", hostname="host", flops_per_step=1e9,
               round_step_ms=json.dumps(timing.round_medians(steps, rounds)),
               round_step_mean_ms=json.dumps(timing.round_means(steps, rounds)))
    return row


@pytest.fixture
def cells(tmp_path):
    dense = timed_cell("dense", [10.0] * STEPS_PER_ROUND)
    comera = timed_cell("comera", [10.0] * (STEPS_PER_ROUND - 1) + [50.0])  # every 5th step 5x
    path = make_folder(tmp_path / "here", placed([dense, comera]))
    return path, analysis.load(path)


def test_claims_fig1_and_compare_give_one_ratio_with_the_periodic_work(cells, monkeypatch):
    path, res = cells
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
    monkeypatch.setattr(figures, "_finish", lambda fig, title, footer, out, name: footers.update({name: footer}))
    figures.fig1_time_memory(res, path)
    assert "Uncompressed / CoMERA time" in footers["fig1_time_memory"]
    assert "0.56x [0.56-0.56] @ batch 32" in footers["fig1_time_memory"]
    assert "1.80x the time" in footers["fig1_time_memory"]

    ratios = compare.method_ratios([path])
    time = ratios[(ratios.source == "measured") & (ratios.quantity == "epoch_time")].iloc[0]
    assert time.versus == "dense-default" and time.interleaved and time.rounds == ROUNDS
    assert time.ratio == pytest.approx(r.value) and (time.low, time.high) == (pytest.approx(r.low), pytest.approx(r.high))


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
    again = make_folder(tmp_path / "again", [{k: (None if v != v else v) for k, v in r.items()} for r in rows])
    table, _, _ = compare.side_by_side([path, again])
    dense = table[table.method == "dense"].iloc[0]
    assert dense["epoch_time ratio again/here"] == pytest.approx(1.0)  # epoch times, not the rounds' 4x
