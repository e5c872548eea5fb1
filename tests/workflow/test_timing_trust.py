"""The tiny grid's timing cells timed twice, on a quiet machine and beside a bounded CPU hog (two busy
processes of this test's own for the cells' duration): every time ratio the claims, the figures' data or
compare report from the loaded run is within 20% of the quiet run's, or its rows are flagged as not
stable, left out of every ratio and named in claims.md."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from harness.core import timing
from harness.reports import claims, compare, judging
from harness.results import analysis
from tests.workflow.test_pipeline import TINY, snakemake

pytestmark = pytest.mark.slow
HOG = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def _timed(workdir, hog: bool):
    """The tiny grid's timing cells (its quality cells and micro-benchmarks left out: nothing here reads
    them), beside two busy processes with ``hog``."""
    config = yaml.safe_load(TINY.read_text())
    del config["workloads"]["transformer"]["quality"], config["microbench"]
    path = workdir / "timing.yaml"
    path.write_text(yaml.safe_dump(config))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=300)]) for _ in range(2 if hog else 0)]
    try:
        time.sleep(0.5 if hog else 0)
        proc = snakemake(workdir, "results/cpu-tiny/runs.parquet", configfile=path)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return analysis.load(workdir / "results" / "cpu-tiny"), proc.stdout + proc.stderr


def _time_ratios(res) -> dict:
    """Every time ratio the reports use: CoMERA vs each method in the claims engine, and compare's."""
    runs = judging.annotate(res, claims.runs_of(res, ["transformer"], timing=True))
    out = {}
    for method in ("dense", "galore", "lte"):
        for batch, r in judging.ratios_vs(runs, method, analysis.TIME).items():
            out[("claims", method, batch)] = r.value
    return out


@pytest.fixture(scope="module")
def quiet_and_loaded(tmp_path_factory):
    quiet_dir, loaded_dir = tmp_path_factory.mktemp("quiet"), tmp_path_factory.mktemp("loaded")
    quiet, _ = _timed(quiet_dir, hog=False)
    loaded, log = _timed(loaded_dir, hog=True)
    return (quiet_dir, quiet), (loaded_dir, loaded), log


def test_every_timing_row_has_the_machine_state_and_a_verdict(quiet_and_loaded):
    for _, res in quiet_and_loaded[:2]:
        rows = analysis.timing_cells(res.runs)
        assert len(rows) == 5 and (rows.status == "ok").all()
        assert rows.timing_quality.str.match(r"^(stable|noisy: .+)$").all()
        assert rows.load_avg_1m.notna().all() and rows.cpu_time_ratio.notna().all()
        assert rows.timing_group.nunique() == 1 and rows.round_step_mean_ms.notna().all()


def test_loaded_ratios_match_the_quiet_ones_or_their_rows_are_named(quiet_and_loaded, tmp_path):
    (quiet_dir, quiet), (loaded_dir, loaded), _ = quiet_and_loaded
    q, loaded_ratios = _time_ratios(quiet), _time_ratios(loaded)
    for key, value in loaded_ratios.items():
        if key in q:
            assert value == pytest.approx(q[key], rel=0.2), key
    # compare's CoMERA-vs-method ratios come from the same stable rows
    for folder, ratios in ((quiet_dir, q), (loaded_dir, loaded_ratios)):
        cmp = compare.method_ratios([folder / "results" / "cpu-tiny"])
        measured = cmp[(cmp.source == "measured") & (cmp.quantity == "epoch_time")]
        assert measured.ratio.notna().sum() == len(ratios)
    # every row left out of the loaded run's ratios is named, with its reason, in claims.md
    out = tmp_path / "claims.md"
    assert claims.main(["--results", str(loaded_dir / "results" / "cpu-tiny"), "--out", str(out)]) == 0
    text = out.read_text()
    rows = analysis.timing_cells(loaded.runs)
    for _, row in rows[rows.timing_quality != "stable"].iterrows():
        assert f"{row.run_id}: {analysis.noisy_reason(row)}" in text


def test_the_hog_is_seen(quiet_and_loaded):
    _, (_, loaded), log = quiet_and_loaded
    rows = analysis.timing_cells(loaded.runs)
    assert (rows.run_queue_frac > timing.MAX_RUN_QUEUE_FRAC).any() or (rows.timing_quality != "stable").any()
    assert "were not timed stably" in log and "comera-bench noisy" in log
