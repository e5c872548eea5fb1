"""The Snakemake pipeline end to end on config/tiny.yaml (all rules, all four methods, one workload): a cell
killed mid-run becomes a row with its status and is not re-run; a second pipeline on the same results
folder is refused while the first runs (a dry run is not); a second call does nothing; the report builds;
the report and re-time commands the pipeline prints work typed as printed; cell logs show steps with an ETA
and the pipeline counts cells; timing jobs run alone and quality cells side by side; `figures` without
.snakemake/ metadata runs exactly the new cells; a quality cell stopped with the pipeline resumes from its
checkpoint; a truncated cell file fails the merge naming it; bad or unsafe configs fail before any job;
`lr: 1e-3` is a number; the busy warning's one-thread command gives every cell one thread. The tiny grid's
timing group timed again (the re-time hint typed as printed) beside a bounded CPU hog: every time ratio the
reports use is within 20% of the first run's, or its rows are flagged as not stable, left out of every
ratio and named in claims.md."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from harness import results
from harness.core import timing
from harness.reports import claims, compare, judging
from harness.results import analysis

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "tiny.yaml"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

pytestmark = pytest.mark.slow


def snakemake_cmd(workdir: Path, configfile: Path, *args: str) -> list[str]:
    """The README's command, run from the repository root (subprocesses get ``cwd=ROOT``): Snakemake finds
    the Snakefile and its default profile by itself; the results go to ``workdir``."""
    return [str(BIN / "snakemake"), "--directory", str(workdir), "--cores", "2", *args,
            "--configfile", str(configfile)]


def snakemake(workdir: Path, *args: str, configfile: Path = TINY, timeout: float = 600):
    return subprocess.run(snakemake_cmd(workdir, configfile, *args), capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=timeout)


def cells(workdir: Path) -> dict[str, Path]:
    return {p.name: p for p in (workdir / "results" / "runs" / "cpu-tiny").glob("*.parquet")}


def cmdline_of(process: psutil.Process) -> list[str]:
    """The process's command line, or [] once it has ended (a zombie between `children()` and here)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return []


def kill_first_cell(proc: subprocess.Popen, min_age_s: float = 1.0, timeout_s: float = 300,
                    method: str = "lte") -> str:
    """SIGKILL the worker process (`python -m harness.cli run`, the child of `comera-bench run --isolate`,
    as the OOM killer would pick it) of the first ``method`` cell under ``proc`` once it has run
    ``min_age_s``; returns its run_id. LTE by default: the uncompressed and CoMERA timing cells that
    claim C1 compares stay whole."""
    deadline = time.monotonic() + timeout_s
    parent = psutil.Process(proc.pid)
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                cmd = child.cmdline()
                spec = Path(cmd[cmd.index("--spec") + 1]) if "--spec" in cmd else None
                if "harness.cli" in cmd and spec is not None and f"_{method}-" in spec.name and \
                        time.time() - child.create_time() >= min_age_s:
                    child.send_signal(signal.SIGKILL)
                    return spec.name.removesuffix(".spec.json")
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                continue
        time.sleep(0.05)
    raise TimeoutError("no `comera-bench run` process appeared")


def wait_for_lock(results: Path, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    lock = results / ".pipeline.lock"
    deadline = time.monotonic() + timeout_s
    while not (lock.exists() and lock.stat().st_size) and proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the pipeline never took its results lock")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Run the tiny pipeline: first call with one cell SIGKILLed and, while it runs, a second pipeline
    (another checkout) on the same results folder; then the full pipeline."""
    workdir = tmp_path_factory.mktemp("pipeline")
    proc = subprocess.Popen(snakemake_cmd(workdir, TINY, "runs"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)
    wait_for_lock(workdir / "results", proc)
    # Killed first, while its timing group runs: the group can end while the pipeline is held below (its
    # jobs go on), the sooner the slower a Snakemake start is (9 s where Slurm's client waits for a
    # controller)
    killed = kill_first_cell(proc)
    other = tmp_path_factory.mktemp("other-checkout")
    shared = other / "shared.yaml"
    shared.write_text(yaml.safe_dump({**yaml.safe_load(TINY.read_text()),
                                      "results_dir": str(workdir / "results")}))
    target = str(workdir / "results" / "runs" / "cpu-tiny" / "microbench" / "tiny.spec.json")  # one quick job
    # The first pipeline is held (SIGSTOP: it keeps its lock, its running jobs go on) while the second one
    # starts, so that it cannot end and release the lock first on a fast machine
    proc.send_signal(signal.SIGSTOP)
    try:
        concurrent = [subprocess.Popen(snakemake_cmd(other, shared, target, *dry), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)
                      for dry in ([], ["-n"])]
        blocked, dry = (p.communicate(timeout=300)[0] for p in concurrent)
    finally:
        proc.send_signal(signal.SIGCONT)
    blocked_ran_its_job = Path(target).exists()  # only the refused pipeline asks for this file
    first_log, _ = proc.communicate(timeout=600)
    after_kill = {name: p.stat().st_mtime_ns for name, p in cells(workdir).items()}
    second = snakemake(workdir, "all")
    return {"workdir": workdir, "killed": killed, "first_rc": proc.returncode, "first_log": first_log,
            "after_kill": after_kill, "second": second, "blocked": (concurrent[0].returncode, blocked),
            "dry": (concurrent[1].returncode, dry), "blocked_ran_its_job": blocked_ran_its_job}


def test_timing_jobs_ran_alone_and_quality_cells_side_by_side(pipeline):
    """README's --cores 2 (tests/workflow/test_scheduling.py: what each job claims): no job ran beside a
    timing group or a micro-benchmark, and two quality cells ran at once."""
    from tests.workflow.test_scheduling import is_timing_rule, ran_together

    pairs = set()
    for log in (pipeline["first_log"], pipeline["second"].stdout + pipeline["second"].stderr):
        pairs |= ran_together(log)
    assert not {pair for pair in pairs if any(map(is_timing_rule, pair))}, pairs
    assert ("train", "train") in pairs


def test_killed_cell_is_a_row_and_not_rerun(pipeline):
    killed, after_kill, workdir = pipeline["killed"], pipeline["after_kill"], pipeline["workdir"]
    assert pipeline["first_rc"] == 0, pipeline["first_log"][-3000:]  # the job of the killed cell succeeds
    assert f"{killed}.runs.parquet" in after_kill and f"{killed}.curves.parquet" in after_kill
    grid = json.loads((workdir / "results" / "cpu-tiny" / "grid.json").read_text())["cells"]
    expected = {f"{run_id}.{table}.parquet" for run_id in grid for table in ("runs", "curves")}
    assert set(after_kill) == expected, "keep-going: the other cells must finish"
    row = pd.read_parquet(workdir / "results" / "runs" / "cpu-tiny" / f"{killed}.runs.parquet").iloc[0]
    assert row["run_id"] == killed and row["status"] in ("error", "oom"), row["status"]
    assert "signal 9 (SIGKILL)" in row["error"] and row["hostname"] and row["workload"] == "transformer"
    assert len(pd.read_parquet(workdir / "results" / "runs" / "cpu-tiny" / f"{killed}.curves.parquet")) == 0
    assert pipeline["second"].returncode == 0, pipeline["second"].stderr[-3000:]
    now = cells(workdir)
    for name, mtime in after_kill.items():
        assert now[name].stat().st_mtime_ns == mtime, f"{name} was re-run"


def test_second_pipeline_on_the_same_results_refused(pipeline):
    workdir = pipeline["workdir"]
    rc, out = pipeline["blocked"]
    assert rc != 0 and f"results folder {workdir / 'results'} is in use by another pipeline: pid" in out, \
        out[-2000:]
    assert not pipeline["blocked_ran_its_job"]
    rc, out = pipeline["dry"]
    assert rc == 0 and "This was a dry-run" in out, out[-2000:]  # a dry run takes no lock
    assert (workdir / "results" / ".pipeline.lock").read_text() == ""  # released at the end


def test_merged_tables_complete(pipeline):
    merged = pipeline["workdir"] / "results" / "cpu-tiny"
    runs = pd.read_parquet(merged / "runs.parquet")
    grid = yaml.safe_load((merged / "grid.json").read_text())
    assert sorted(runs.run_id) == sorted(grid["cells"])
    assert set(runs.method) == {"dense", "comera", "galore", "lte"}
    assert set(runs.status) <= {"ok", "oom", "diverged", "error", "timeout"}
    curves = pd.read_parquet(merged / "curves.parquet")
    assert set(curves.run_id) == set(runs.run_id) - {pipeline["killed"]}  # a killed cell has no curves
    assert len(pd.read_parquet(merged / "microbench.parquet")) > 0
    # the size-matched models (Fig 14): matched to the size CoMERA's target-0.5 quality cell reached
    (source,) = runs[(runs.method == "comera") & (runs.target_ratio == 0.5) & (runs.purpose == "quality")
                     ].itertuples()
    for variant in ("size-matched", "fixed-rank"):
        (matched,) = runs[runs.variant == variant].itertuples()
        method = json.loads(matched.settings)["method"]
        record = method["matched"]
        assert matched.status == "ok", matched.error
        assert record["run"] == source.run_id and record["params"] == source.params_total
        assert matched.compression_total > 1 and pd.isna(matched.target_ratio)
    assert method["prune_every"] == 0 and record["rank"] >= 1  # the fixed-rank TT model
    dense = json.loads(runs[runs.variant == "size-matched"].settings.iloc[0])["method"]["selection"]
    # the tiny preset: one layer, every token id of its vocabulary used: one shape (width) x three rates
    assert [c["shape"] for c in dense["candidates"]] == ["width"] * 3 and dense["shape"] == "width"


HOG = "import os, time\nos.nice(19)\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"
"""A CPU-bound loop at the lowest priority: it fills the run queue and the CPU pressure the cells record
without taking the CPUs from the rest of the test suite."""


@pytest.fixture(scope="module")
def quiet_and_loaded(pipeline, tmp_path_factory):
    """The tiny pipeline's results (the quiet run; its killed LTE cell has no timing) and, in a copy of
    them, the re-time the pipeline's hint asks for: one timing cell made noisy, `figures` run (it prints
    the hint), then the hint typed as printed beside two busy processes of this test's own (the loaded
    run: the cell's whole timing group is timed again). Returns the folders, their results, the victim and
    the outputs of both commands."""
    quiet_dir, loaded_dir = tmp_path_factory.mktemp("quiet"), tmp_path_factory.mktemp("loaded")
    shutil.copytree(pipeline["workdir"] / "results", quiet_dir / "results")  # before a later test changes it
    for folder in ("results", "figures"):
        shutil.copytree(pipeline["workdir"] / folder, loaded_dir / folder)
    quiet = analysis.load(quiet_dir / "results" / "cpu-tiny")
    cells_dir = loaded_dir / "results" / "runs" / "cpu-tiny"
    victim = quiet.runs[(quiet.runs.status == "ok") & (quiet.runs.purpose != "quality")].run_id.iloc[0]
    row = results.read_parquet(cells_dir / f"{victim}.runs.parquet", "runs")
    row["timing_quality"] = "noisy: made so by the test"
    results.write_parquet_atomic(row, cells_dir / f"{victim}.runs.parquet", kind="runs")
    first = snakemake(loaded_dir, "figures")
    hint = first.stdout + first.stderr
    assert first.returncode == 0, hint[-3000:]
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=300)]) for _ in range(2)]
    try:
        time.sleep(0.5)
        typed = subprocess.run(_printed(hint, "on a quieter machine:"), shell=True, capture_output=True,
                               text=True, env=ENV, cwd=ROOT, timeout=900)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert typed.returncode == 0, (typed.stdout + typed.stderr)[-3000:]
    loaded = analysis.load(loaded_dir / "results" / "cpu-tiny")
    return {"quiet": (quiet_dir, quiet), "loaded": (loaded_dir, loaded), "victim": victim, "hint": hint,
            "typed": typed.stdout + typed.stderr}


def _time_ratios(res) -> dict:
    """Every time ratio the reports use: CoMERA vs each method in the claims engine, and compare's."""
    runs = judging.annotate(res, claims.runs_of(res, ["transformer"], timing=True))
    out = {}
    for method in ("dense", "galore", "lte"):
        for batch, r in judging.ratios_vs(runs, method, analysis.TIME).items():
            out[("claims", method, batch)] = r.value
    return out


def test_every_timing_row_has_the_machine_state_and_a_verdict(quiet_and_loaded):
    for run, ok in (("quiet", 4), ("loaded", 5)):  # the quiet run's LTE cell is the one killed: no timing
        rows = analysis.timing_cells(quiet_and_loaded[run][1].runs)
        rows = rows[rows.status == "ok"]
        assert len(rows) == ok and rows.timing_group.nunique() == 1
        assert rows.timing_quality.str.match(r"^(stable|noisy: .+)$").all()
        assert rows.load_avg_1m.notna().all() and rows.cpu_time_ratio.notna().all()
        assert rows.round_step_mean_ms.notna().all()


EXPECTED_RATIOS = {"quiet": {("claims", m, 4) for m in ("dense", "galore")},  # its LTE cell is killed
                   "loaded": {("claims", m, 4) for m in ("dense", "galore", "lte")}}
"""CoMERA's time ratios each run can form (tiny.yaml's timing cells, batch 4): each is there, or refused
because a row of its pair is not stable."""


def _refused(res, ratios: dict, expected: set) -> set:
    """The expected ratios a run did not form, each checked to have a row of its pair that is not stable;
    a ratio beyond the expected ones fails."""
    assert set(ratios) <= expected, set(ratios) - expected
    rows = analysis.timing_cells(res.runs)
    unstable = rows[(rows.status == "ok") & (rows.timing_quality != "stable")]
    refused = expected - set(ratios)
    for _, method, batch in refused:
        pair = unstable[unstable.method.isin(["comera", method]) & (unstable.batch_size == batch)]
        assert len(pair), f"no {method} / CoMERA ratio at batch {batch}, and no unstable row to say why"
    return refused


def test_loaded_ratios_match_the_quiet_ones_or_their_rows_are_named(quiet_and_loaded, tmp_path):
    (quiet_dir, quiet), (loaded_dir, loaded) = quiet_and_loaded["quiet"], quiet_and_loaded["loaded"]
    q, loaded_ratios = _time_ratios(quiet), _time_ratios(loaded)
    refused = (_refused(quiet, q, EXPECTED_RATIOS["quiet"])
               | _refused(loaded, loaded_ratios, EXPECTED_RATIOS["loaded"]))
    compared = [key for key in loaded_ratios if key in q]
    assert len(compared) == len((EXPECTED_RATIOS["quiet"] & EXPECTED_RATIOS["loaded"]) - refused)
    for key in compared:
        assert loaded_ratios[key] == pytest.approx(q[key], rel=0.2), key
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
    (_, loaded), log = quiet_and_loaded["loaded"], quiet_and_loaded["typed"]
    rows = analysis.timing_cells(loaded.runs)
    assert (rows.run_queue_frac > timing.MAX_RUN_QUEUE_FRAC).any() or (rows.timing_quality != "stable").any()
    assert "were not timed stably" in log and "comera-bench noisy" in log


def test_outputs_and_claims(pipeline):
    figs = pipeline["workdir"] / "figures" / "tiny"
    for name in ("fig1_time_memory", "fig5_ttm_lookup", "fig6_accuracy", "fig13_rank_adaptation",
                 "fig14_accuracy_vs_compression"):
        assert (figs / f"{name}.png").stat().st_size > 0 and (figs / f"{name}.pdf").stat().st_size > 0
    assert not (figs / "fig12_time_vs_compression.png").exists()  # no sweep in this grid: named instead
    assert "fig12_time_vs_compression: needs a CoMERA sweep" in (figs / "overview.md").read_text()
    for name in ("table1_ranks", "table2_dlrm", "table_mnli_size", "table_runs"):
        assert (figs / f"{name}.md").exists() and (figs / f"{name}.csv").exists()
    assert ((figs / "compare" / "compare.md").exists()
            and (figs / "compare" / "compare_time_memory.png").exists())
    text = (figs / "claims.md").read_text().splitlines()
    header = [c.strip() for c in text[2].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in text if ln.startswith("| C")]
    assert [r[0] for r in rows] == [f"C{i}" for i in range(1, 11)]
    verdicts = {r[0]: r[header.index("verdict")] for r in rows}
    # a CPU run of the tiny model judges no claim; what it measured is shown as "not comparable here"
    assert set(verdicts.values()) <= {"not comparable here", "not measured here",
                                      "not judged: timing not stable"}
    # C1 is measured here: a ratio from stable rows, or its rows named as not stable (a busy machine)
    assert verdicts["C1"] in ("not comparable here", "not judged: timing not stable")
    assert verdicts["C9"] == "not measured here"  # tiny.yaml has no MLM cell on text


def test_second_call_does_nothing_and_report_builds(pipeline):
    again = snakemake(pipeline["workdir"], "all")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    report = snakemake(pipeline["workdir"], "--report", "report.html")
    assert report.returncode == 0, report.stderr[-3000:]
    figures_only = snakemake(pipeline["workdir"], "--report", "figures.html", "figures")  # README's command
    assert figures_only.returncode == 0 and (pipeline["workdir"] / "figures.html").stat().st_size > 0
    html = (pipeline["workdir"] / "report.html").read_text(errors="replace")
    assert "fig1_time_memory.png" in html and "claims.md" in html


def _printed(output: str, marker: str) -> str:
    """The command after ``marker`` on the pipeline's line that holds it."""
    (line,) = [ln for ln in output.splitlines() if marker in ln]
    return line.split(marker, 1)[1].strip()


def test_the_printed_report_command_works_as_printed(pipeline):
    """After the tiny run (--directory, --configfile), the pipeline prints its report command; typed as
    printed, from where the run was started, it builds the report. The README's command without the
    options fails naming that command (not Snakemake's "marked for report but does not exist")."""
    workdir, out = pipeline["workdir"], pipeline["second"].stdout + pipeline["second"].stderr
    command = _printed(out, "The HTML report of this run:")
    assert command == shlex.join(["snakemake", "--report", "report.html", "figures", "--directory",
                                  str(workdir), "--configfile", str(TINY)])
    plain = subprocess.run([str(BIN / "snakemake"), "--directory", str(workdir), "--report", "plain.html",
                            "figures"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert plain.returncode != 0 and f"Its report: {command}" in plain.stdout + plain.stderr
    assert "marked for report but does not exist" not in plain.stdout + plain.stderr
    (workdir / "report.html").unlink(missing_ok=True)
    typed = subprocess.run(command, shell=True, capture_output=True, text=True, env=ENV,
                           cwd=ROOT, timeout=600)
    assert typed.returncode == 0, typed.stderr[-3000:]
    assert "fig1_time_memory.png" in (workdir / "report.html").read_text(errors="replace")


CLOCK = r"(?:\d+h\d\dm|\d+m\d\ds|\d+s)"
"""A duration as harness.core.clock.clock writes it (a busy machine takes minutes where a quiet one takes
seconds)."""


def test_cell_logs_show_steps_with_an_eta_and_the_pipeline_counts_cells(pipeline):
    """Each cell's log (stderr not a terminal) has its step lines with elapsed time and ETA; the pipeline
    prints the cells done of the grid's, with the time left at this run's rate."""
    logs = pipeline["workdir"] / "results" / "runs" / "cpu-tiny" / "logs"
    grid = json.loads((pipeline["workdir"] / "results" / "cpu-tiny" / "grid.json").read_text())["cells"]
    for run_id in set(grid) - {pipeline["killed"]}:
        text = (logs / f"{run_id}.log").read_text()
        line = rf"^{re.escape(run_id)}: step \d+ of \d+, elapsed {CLOCK}, ETA {CLOCK}$"
        assert re.search(line, text, re.M), text
    out = pipeline["first_log"] + pipeline["second"].stderr
    assert re.search(rf"^comera-bench: cells \d+ of 9 done \(\d+ in this run, {CLOCK}\); about \S+ left", out,
                     re.M), out


def test_the_retime_hint_works_as_printed(quiet_and_loaded):
    """A timing cell that was not timed stably: the pipeline's hint, typed as printed, deletes it and times
    its group again, printing the group's rounds with the time left and the cells done."""
    loaded_dir, victim = quiet_and_loaded["loaded"][0], quiet_and_loaded["victim"]
    folder = loaded_dir / "results" / "runs" / "cpu-tiny"
    assert f"  {victim}: made so by the test" in quiet_and_loaded["hint"]
    assert _printed(quiet_and_loaded["hint"], "on a quieter machine:") == (
        f"comera-bench noisy {shlex.quote(str(folder))} --delete && "
        + shlex.join(["snakemake", "--cores", "1", "figures", "--directory", str(loaded_dir),
                      "--configfile", str(TINY)]))
    out = quiet_and_loaded["typed"]
    assert "rule time_transformer_b4_s0" in out or "time_transformer_b4_s0" in out
    assert (pd.read_parquet(folder / f"{victim}.runs.parquet").timing_quality.iloc[0]
            != "noisy: made so by the test")
    assert re.search(r"round 1/5: \d+ cells \(\d+ s\); about \S+ left in this group's "
                     r"rounds", out), out[-3000:]
    assert re.search(r"^comera-bench: cells 9 of 9 done", out, re.M), out[-3000:]


def test_figures_without_metadata_runs_exactly_the_new_cells(pipeline, tmp_path):
    """Results copied into a fresh checkout (no .snakemake/), one more cell in the config."""
    for folder in ("results", "figures"):
        shutil.copytree(pipeline["workdir"] / folder, tmp_path / folder)
    config = yaml.safe_load(TINY.read_text())
    config["workloads"]["transformer"]["methods"].append({"name": "dense", "batch_sizes": [2]})
    path = tmp_path / "more.yaml"
    path.write_text(yaml.safe_dump(config))
    before = {name: p.stat().st_mtime_ns for name, p in cells(tmp_path).items()}
    figure = tmp_path / "figures" / "tiny" / "fig1_time_memory.png"
    figure_mtime = figure.stat().st_mtime_ns
    res = snakemake(tmp_path, "figures", configfile=path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    new = "transformer_dense-default_b2_tnone_s0"
    assert [ln.split("run_id=")[1] for ln in out.splitlines() if "wildcards: run_id=" in ln] == [new] * 2
    assert out.count("rule train:") == 1 and "merge_runs: the files of" in out and "plots: " in out
    now = cells(tmp_path)
    assert set(now) == set(before) | {f"{new}.runs.parquet", f"{new}.curves.parquet"}
    assert all(now[name].stat().st_mtime_ns == mtime for name, mtime in before.items())
    assert new in set(pd.read_parquet(tmp_path / "results" / "cpu-tiny" / "runs.parquet").run_id)
    assert figure.stat().st_mtime_ns > figure_mtime


def test_a_results_folder_from_the_future_is_set_back_and_its_new_cell_kept(tmp_path):
    """A results folder copied from a machine whose clock is an hour ahead, holding the spec.json of a cell
    not run yet (a stopped run): without setting its files back, Snakemake takes the cell's new runs file
    as older than that spec and deletes it, run after run. The pipeline sets them back at its start,
    saying how many; the cell's files stay, and the progress line counts one cell done in this run."""
    config = yaml.safe_load(TINY.read_text())
    config["workloads"]["transformer"].update(methods=["dense"], targets=[None])
    del config["workloads"]["transformer"]["quality"]
    config["microbench"] = {"specs": {}}
    path = tmp_path / "one-cell.yaml"
    path.write_text(yaml.safe_dump(config))
    cell = "results/runs/cpu-tiny/transformer_dense-default_b4_tnone_s0"
    res = snakemake(tmp_path, f"{cell}.spec.json", configfile=path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    ahead = time.time() + 3600
    files = [p for p in (tmp_path / "results").rglob("*") if p.is_file() and not p.is_symlink()]
    for p in files:
        os.utime(p, (ahead, ahead))
    res = snakemake(tmp_path, "runs", configfile=path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    # every file but the lock, which the pipeline rewrote when it took it
    assert f"comera-bench: warning: {len(files) - 1} file(s) in results were modified in the future" in out
    assert (tmp_path / f"{cell}.runs.parquet").exists() and (tmp_path / f"{cell}.curves.parquet").exists()
    assert "comera-bench: cells 1 of 1 done (1 in this run" in out
    assert all(p.stat().st_mtime < time.time() for p in (tmp_path / "results").rglob("*") if p.is_file())


def test_truncated_cell_file_fails_merge_with_its_path(pipeline):
    victim = next(p for p in sorted(cells(pipeline["workdir"]).values()) if p.name.endswith(".runs.parquet"))
    victim.write_bytes(victim.read_bytes()[:64])
    res = snakemake(pipeline["workdir"], "results/cpu-tiny/runs.parquet")
    assert res.returncode != 0
    assert str(victim.name) in res.stdout + res.stderr


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c.update(unknown_key=1), "unknown_key"),  # the schema
    (lambda c: c["methods"]["dense"].update(method="adam"), "methods.dense.method"),  # the cross-key checks
])
def test_bad_config_rejected_before_any_job(tmp_path, mutate, key):
    """The pipeline runs the config checks before any job; each check's cases are in test_grid.py."""
    config = yaml.safe_load(TINY.read_text())
    mutate(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    res = snakemake(tmp_path, "all", configfile=path, timeout=300)
    assert res.returncode != 0
    assert "invalid config" in res.stderr and key in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("variable", ["COMERA_BENCH_PIPELINE_CELLS", "COMERA_BENCH_CHECKPOINT_S"])
def test_a_bad_environment_variable_is_refused_before_any_job(tmp_path, variable):
    """Every cell reads these (the first is the pipeline's own; the second is checked with the stall limit,
    harness.running.check_environment): a bad value is named by a dry run, before any job could fail on it
    (a job failing after its row is written loses the row)."""
    res = subprocess.run(snakemake_cmd(tmp_path, TINY, "-n", "runs"), capture_output=True, text=True,
                         env={**ENV, variable: "abc"}, cwd=ROOT, timeout=300)
    assert res.returncode != 0
    said = res.stdout + res.stderr
    assert f"environment variable {variable}='abc'" in said, said[-2000:]


def test_a_bad_threads_variable_is_refused_naming_it(tmp_path):
    """``threads: auto`` takes the first Snakemake process's choice from COMERA_BENCH_THREADS: a value past
    the config's cap of 1024 is named (harness/settings.py), not given to every cell."""
    res = subprocess.run(snakemake_cmd(tmp_path, TINY, "-n", "runs", "--config",
                                       "execution={device: cpu, threads: auto}"), capture_output=True,
                         text=True, env={**ENV, "COMERA_BENCH_THREADS": "4294967296"}, cwd=ROOT, timeout=300)
    assert res.returncode != 0
    said = res.stdout + res.stderr
    assert ("invalid environment: environment variable COMERA_BENCH_THREADS='4294967296': the threads of "
            "every cell must be a whole number from 1 to 1024") in said, said[-2000:]


def test_exponent_numbers_in_a_config_are_numbers(tmp_path):
    """`lr: 1e-3` (YAML 1.1, which Snakemake reads, makes it text) passes the methods' own checks."""
    path = tmp_path / "exp.yaml"
    path.write_text(TINY.read_text().replace("dense: {method: dense}",
                                             "dense: {method: dense, params: {lr: 1e-3}}"))
    res = snakemake(tmp_path, "-n", "runs", configfile=path, timeout=300)
    assert res.returncode == 0 and "This was a dry-run" in res.stdout, res.stderr[-2000:]


def test_the_busy_warnings_one_thread_command_gives_every_cell_one_thread(tmp_path):
    """`--config execution='{threads: 1}'` (what the busy warning says to type): Snakemake's base loader
    reads the 1 as text; the pipeline reads it as a number, and every cell of the default grid gets it."""
    res = subprocess.run([str(BIN / "snakemake"), "--directory", str(tmp_path), "--cores", "1", "-n",
                          "figures", "--config", "execution={threads: 1}"], capture_output=True, text=True,
                         env=ENV, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    specs = [line for line in res.stdout.splitlines() if '"run_id"' in line]
    assert len(specs) == 41 and all(re.search(r'"num_threads": 1[,}]', line) for line in specs)


@pytest.mark.parametrize("case", ["injected results_dir", "injected device variable", "duplicated key"])
def test_unsafe_config_runs_nothing(tmp_path, case):
    """Rejected while the config is read: no job, no shell command, no file (a path with a space is
    rejected by the same schema rule: tests/harness/configs/test_grid.py)."""
    marker = tmp_path / "injected"
    text, env, key = TINY.read_text(), dict(ENV), "key results_dir"
    if case == "injected results_dir":
        text = text.replace("results_dir: results", f"results_dir: 'res$(touch {marker})'")
    elif case == "injected device variable":
        text = text.replace("device_name: cpu-tiny", "device_name: null")
        env["COMERA_BENCH_DEVICE"], key = f"x$(touch {marker})", "environment variable COMERA_BENCH_DEVICE"
    else:
        text, key = text + "seeds: [1]\n", "key 'seeds' appears twice"
    path = tmp_path / "unsafe.yaml"
    path.write_text(text)
    res = subprocess.run(snakemake_cmd(tmp_path, path, "runs"), capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode != 0
    assert "invalid config" in res.stderr and key in res.stderr, res.stderr[-2000:]
    assert case != "duplicated key" or str(path) in res.stderr
    assert not marker.exists() and {p.name for p in tmp_path.iterdir()} <= {"unsafe.yaml", ".snakemake"}


def test_sigterm_to_the_pipeline_leaves_no_failure_and_a_rerun_finishes(tmp_path):
    """`timeout`, scancel or a closed session send SIGTERM to the pipeline's process group: the cell that
    was running is interrupted (no row), the README's command run again finishes every cell ok, and the
    cells whose jobs had finished keep their numbers (their files are not rewritten). The tiny grid with
    one timing group of two cells beside its four quality cells."""
    config = yaml.safe_load(TINY.read_text())
    config["workloads"]["transformer"].update(methods=["dense", "comera"], targets=[None])
    config_path = tmp_path / "two-groups.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(snakemake_cmd(tmp_path, config_path, "runs"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT, start_new_session=True)
    folder = tmp_path / "results" / "runs" / "cpu-tiny"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        running = [cmd for cmd in map(cmdline_of, psutil.Process(proc.pid).children(recursive=True))
                   if "harness.cli" in " ".join(cmd) and "--spec" in cmd]
        if list(folder.glob("*.runs.parquet")) and running:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the pipeline ended before a cell could be interrupted"
    os.killpg(proc.pid, signal.SIGTERM)
    log, _ = proc.communicate(timeout=300)
    kept = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.parquet")}
    for path in folder.glob("*.runs.parquet"):
        row = pd.read_parquet(path).iloc[0]
        assert row["status"] == "ok", (path.name, row["error"])  # no "killed by signal 15" row
    again = snakemake(tmp_path, "runs", configfile=config_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = pd.concat(pd.read_parquet(p) for p in folder.glob("*.runs.parquet"))
    assert len(rows) == 6 and (rows.status == "ok").all(), rows[["run_id", "status", "error"]]
    for name, mtime in kept.items():
        assert (folder / name).stat().st_mtime_ns == mtime, f"{name} was rewritten"


def test_a_quality_cell_stopped_with_the_pipeline_resumes_from_its_checkpoint(tmp_path):
    """A long quality cell writes checkpoints (here after every step); the pipeline stopped by SIGTERM in
    mid-cell, the same command resumes the cell at its checkpoint's step and ends it ok."""
    config = yaml.safe_load(TINY.read_text())
    transformer = config["workloads"]["transformer"]
    transformer.update(methods=["dense"], targets=[None])
    transformer["quality"].update(methods=["comera"])
    # long enough to stop
    transformer["quality"]["budget"].update(max_steps_per_epoch=150, eval_every_steps=50)
    path = tmp_path / "quality.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**ENV, "COMERA_BENCH_CHECKPOINT_S": "0.000001"}
    proc = subprocess.Popen(snakemake_cmd(tmp_path, path, "runs"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True)
    folder = tmp_path / "results" / "runs" / "cpu-tiny"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and _steps_checkpointed(folder) < 2:
        time.sleep(0.05)  # in its steps, whatever the machine's load: a stop then waits for the step's end
    assert proc.poll() is None, "the pipeline ended before its quality cell wrote a checkpoint"
    os.killpg(proc.pid, signal.SIGTERM)
    log, _ = proc.communicate(timeout=300)
    (saved,) = folder.glob("*_quality.checkpoint.pt")  # a timing cell outside a group may have one too
    run_id = saved.name.removesuffix(".checkpoint.pt")
    assert not (folder / f"{run_id}.runs.parquet").exists(), log[-3000:]
    stopped_log = (folder / "logs" / f"{run_id}.log").read_text()  # the rerun writes its own
    again = subprocess.run(snakemake_cmd(tmp_path, path, "runs"), capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    row = pd.read_parquet(folder / f"{run_id}.runs.parquet").iloc[0]
    assert row["status"] == "ok" and row["purpose"] == "quality", row["error"]
    extra = json.loads(row["extra"])
    resumed, steps = extra["resumed"], extra["steps_done"]
    assert len(resumed) == 1 and 0 < resumed[0]["step"] < steps, resumed
    assert not saved.exists()
    assert f"resuming at step {resumed[0]['step']}" in (folder / "logs" / f"{run_id}.log").read_text()
    # the stop reached the cell twice (from Snakemake and from its supervisor): one stop, at a step's end
    assert f"stopped by SIGTERM after step {resumed[0]['step']}; its checkpoint is written" in stopped_log
    curves = pd.read_parquet(folder / f"{run_id}.curves.parquet")
    losses = curves[(curves.split == "train") & (curves.metric_name == "loss")]
    assert sorted(losses.step) == list(range(1, steps + 1))  # every step once, from both processes


def _steps_checkpointed(folder: Path) -> int:
    """The steps done in the quality cell's checkpoint in ``folder`` (0 while it has none)."""
    import torch

    for path in folder.glob("*_quality.checkpoint.pt"):
        try:
            return torch.load(path, weights_only=True)["cell"]["steps_done"]
        except (OSError, RuntimeError, EOFError):  # replaced while read
            return 0
    return 0


def test_bench_is_its_own_target_writing_to_the_device_folder(tmp_path):
    """`snakemake bench` plans one `comera-bench bench` job into results/<device>/ with its log; the
    default target does not include it."""
    res = snakemake(tmp_path, "-n", "-p", "bench", timeout=300)
    assert res.returncode == 0 and "This was a dry-run" in res.stdout, res.stderr[-2000:]
    assert "comera-bench bench --device cpu" in res.stdout and "harness/perf/goals.yaml" in res.stdout
    assert "--out results/cpu-tiny/bench.parquet > results/cpu-tiny/logs/bench.log" in res.stdout
    everything = snakemake(tmp_path, "-n", timeout=300)
    assert everything.returncode == 0 and "comera-bench bench" not in everything.stdout + everything.stderr


def _group_config(tmp_path: Path) -> Path:
    """config/tiny.yaml cut to one timing group of two cells (no quality cells): a quick run and rerun."""
    config = yaml.safe_load(TINY.read_text())
    transformer = config["workloads"]["transformer"]
    transformer.update(methods=["dense", "comera"], targets=[None])
    del transformer["quality"]
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _alive(processes: list[psutil.Process]) -> list[list[str]]:
    """The command lines of those still running (a zombie has ended)."""
    left = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(process.cmdline())
        except psutil.NoSuchProcess:
            continue
    return left


def default_stop_signals() -> None:
    """The default action of SIGINT and SIGHUP in a child: under nohup or `pytest &` the test process
    ignores them, and an ignored signal stays ignored in its children (Snakemake keeps it so)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_to_the_snakemake_process_alone_is_prompt(tmp_path, sig):
    """`timeout` and schedulers signal the Snakemake process alone: the pipeline ends within 10 s (not
    after its running timing group), leaves no process and no row behind, and (after SIGTERM) the rerun
    finishes."""
    config = _group_config(tmp_path)
    proc = subprocess.Popen(snakemake_cmd(tmp_path, config, "runs"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT, start_new_session=True,
                            preexec_fn=default_stop_signals)
    deadline, below = time.monotonic() + 300, []
    while time.monotonic() < deadline and proc.poll() is None:
        below = psutil.Process(proc.pid).children(recursive=True)
        commands = [" ".join(cmdline_of(p)) for p in below]
        if any("harness.running.group" in c for c in commands) and \
                sum("harness.cli run --spec" in c for c in commands) == 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the pipeline ended before its timing group ran"
    time.sleep(1)  # the cells import torch and build their models
    below = psutil.Process(proc.pid).children(recursive=True)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        log, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{sig.name} to the Snakemake process: still running after 10 s")
    took = time.monotonic() - sent
    assert proc.returncode != 0 and took < 10, (took, log[-3000:])
    assert not _alive(below), _alive(below)
    folder = tmp_path / "results" / "runs" / "cpu-tiny"
    assert not list(folder.glob("*.parquet")), "an interrupted cell wrote a file"
    # the cells get the stop or, from their coordinator's cleanup, SIGTERM
    assert re.search(f"interrupted by (SIGTERM|{sig.name}); no row written", log), log[-3000:]
    if sig != signal.SIGTERM:
        return  # both stops leave the same state
    again = snakemake(tmp_path, "runs", configfile=config)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = pd.concat(pd.read_parquet(p) for p in folder.glob("*.runs.parquet"))
    assert len(rows) == 2 and (rows.status == "ok").all(), rows[["run_id", "status", "error"]]
