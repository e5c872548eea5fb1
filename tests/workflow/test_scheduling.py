"""Which jobs may run side by side: every job that measures time (a timing group, a micro-benchmark,
`bench`) claims every core Snakemake is given, so it runs alone; a quality cell claims its torch threads,
so `--cores N` runs several at once. A timing job still runs with the execution's threads (the thread
variables Snakemake derives from `threads:` set back to them), so claiming the cores changes nothing it
measures. Read from the dry run's plan of config/tiny.yaml (one thread per cell) with three cores."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "tiny.yaml"
BIN = Path(sys.executable).parent
CORES = 3


def planned_jobs(text: str) -> list[dict[str, str]]:
    """The jobs of a dry run's output (``--printshellcmds``): rule name, ``threads`` ("1" where Snakemake
    prints none) and shell command of each."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \S+:\n)", text):
        head = re.match(r"(?:local)?rule (\S+):\n", block)
        if not head:
            continue
        threads = re.search(r"^\s+threads: (\d+)$", block, re.M)
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        jobs.append({"rule": head.group(1), "threads": threads.group(1) if threads else "1",
                     "shell": shell.group(1) if shell else ""})
    return jobs


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> list[dict[str, str]]:
    workdir = tmp_path_factory.mktemp("plan")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", str(CORES), "--printshellcmds", "figures",
                          "bench", "--directory", str(workdir), "--configfile", str(TINY)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    return planned_jobs(out.stdout)


def test_every_timing_job_claims_every_core(plan):
    timing = [job for job in plan if job["rule"].startswith("time_") or job["rule"] in ("microbench_cell",
                                                                                         "bench")]
    assert {job["rule"] for job in timing} >= {"time_transformer_b4_s0", "microbench_cell", "bench"}
    assert {(job["rule"], job["threads"]) for job in timing} == {(job["rule"], str(CORES)) for job in timing}


def test_quality_cells_claim_their_threads_and_run_side_by_side(plan):
    trained = [job for job in plan if job["rule"] == "train"]
    assert len(trained) == 4 and {job["threads"] for job in trained} == {"1"}  # tiny.yaml: threads 1


def test_a_timing_job_runs_with_the_executions_threads(plan):
    """Snakemake sets OMP_NUM_THREADS and its kin to a job's `threads:` (here every core): the timing
    jobs' commands set them back to the execution's 1, and `bench` is told 1 thread."""
    timing = [job for job in plan if job["rule"].startswith("time_") or job["rule"] in ("microbench_cell",
                                                                                         "bench")]
    for job in timing:
        assert re.search(r"\benv OMP_NUM_THREADS=1 .*MKL_NUM_THREADS=1 ", job["shell"]), job
    bench = next(job for job in timing if job["rule"] == "bench")
    assert "--threads 1 " in bench["shell"]


def ran_together(log: str) -> set[tuple[str, str]]:
    """The pairs of rules (sorted) that had jobs running at the same time in a Snakemake log: a job runs
    from its ``rule NAME:`` block (with its ``jobid:``) to its ``Finished jobid:`` line."""
    running: dict[str, str] = {}
    pairs = set()
    events = r"^(?:local)?rule (\S+):\n(?:\s+.*\n)*?\s+jobid: (\d+)$|^Finished jobid: (\d+)"
    for event in re.finditer(events, log, re.M):
        rule, started, finished = event.groups()
        if finished:
            running.pop(finished, None)
            continue
        pairs |= {tuple(sorted((rule, other))) for other in running.values()}
        running[started] = rule
    return pairs


def is_timing_rule(rule: str) -> bool:
    """Whether a rule's jobs measure time (a timing group, a micro-benchmark, `bench`)."""
    return rule.startswith("time_") or rule in ("microbench_cell", "bench")


def test_ran_together_reads_a_log():
    log = ("[t]\nlocalrule train:\n    output: a\n    jobid: 3\n[t]\nrule train:\n    jobid: 4\n"
           "[t]\nFinished jobid: 3 (Rule: train)\n[t]\nFinished jobid: 4 (Rule: train)\n"
           "[t]\nlocalrule time_g:\n    jobid: 5\nFinished jobid: 5 (Rule: time_g)\n"
           "[t]\nlocalrule merge:\n    jobid: 6\n")
    assert ran_together(log) == {("train", "train")}


def test_planned_jobs_reads_threads_and_commands():
    text = ("rule a:\n    output: x\n    threads: 3\nShell command: do x\n\n"
            "localrule b:\n    output: y\nShell command: do y\n")
    assert planned_jobs(text) == [{"rule": "a", "threads": "3", "shell": "do x"},
                                  {"rule": "b", "threads": "1", "shell": "do y"}]
