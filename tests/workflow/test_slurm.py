"""The slurm profile for real: a one-node SLURM cluster (scripts/slurm_cluster.sh) runs jobs of each kind
of the tiny grid through snakemake-executor-plugin-slurm; the daemons are stopped by their PID files
afterwards."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import settings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PATH = [d for d in os.environ.get("PATH", "").split(os.pathsep)
        if not Path(d).name.startswith("comera-bench-tests-bin-")]  # the real scontrol (tests/conftest.py)
ENV = {**os.environ, "PATH": os.pathsep.join([str(BIN), *PATH])}
SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


OPT_IN = "COMERA_BENCH_SLURM_TESTS"
"""Starting the cluster installs packages, writes /etc/slurm and starts daemons: only when this is 1
(.ci/run sets it)."""


def _skip_reason() -> str | None:
    if not settings.read(OPT_IN):
        return f"set {OPT_IN}=1 to start a real one-node SLURM cluster (apt-get, /etc/slurm, daemons)"
    if os.geteuid() != 0:
        return "needs root to install and start slurmctld/slurmd/munged"
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        return "SLURM is not installed and apt-get is unavailable"
    return None


@pytest.fixture(scope="module")
def cluster():
    reason = _skip_reason()
    if reason:
        print(f"test_slurm skipped: {reason}")
        pytest.skip(reason)
    start = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if start.returncode == 3:
        print(f"test_slurm skipped: {start.stderr.strip()}")
        pytest.skip(start.stderr.strip())
    if start.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop"], timeout=60)
        pytest.fail(f"slurm_cluster.sh start failed:\n{start.stdout}\n{start.stderr}")
    yield
    subprocess.run(["bash", str(SCRIPT), "stop"], check=True, timeout=60)


def test_fake_gpu_gres_sets_cuda_visible_devices(cluster):
    out = subprocess.run(["srun", "--gpus=1", "-n1", "printenv", "CUDA_VISIBLE_DEVICES"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("0", "1")


CELLS = "results/runs/cpu-tiny"
TARGETS = [f"{CELLS}/transformer_dense-default_b4_tnone_s0.runs.parquet",  # the timing group: every method
           f"{CELLS}/transformer_dense-default_b8_tnone_s0_quality.runs.parquet",  # a quality cell
           f"{CELLS}/microbench/tiny.microbench.parquet"]
"""Jobs of each kind the tiny grid submits (the matched quality cells, which wait for CoMERA's, add time and
no kind)."""


def test_tiny_grid_through_the_slurm_plugin(cluster, tmp_path):
    cmd = ["timeout", "-k", "10", "900", str(BIN / "snakemake"), "--snakefile", str(ROOT / "Snakefile"),
           "--directory", str(tmp_path), "--profile", str(ROOT / "profiles" / "slurm"),
           "--configfile", str(ROOT / "config" / "tiny.yaml"), "--", *TARGETS]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=960)
    if res.returncode != 0:  # a job SLURM can never run (more CPUs than the node has) pends until the timeout
        queue = subprocess.run(["squeue", "-o", "%i %j %T %r %C"], capture_output=True, text=True, timeout=30)
        pytest.fail(f"{(res.stdout + res.stderr)[-4000:]}\nsqueue at the end:\n{queue.stdout}{queue.stderr}")
    log = res.stdout + res.stderr
    assert "sbatch" in log or "SLURM" in log or "slurm" in log
    files = sorted((tmp_path / CELLS).glob("*.runs.parquet"))
    rows = pd.concat([pd.read_parquet(f) for f in files])
    assert set(rows.method) == {"dense", "comera", "galore", "lte"}
    assert set(rows.purpose) == {"timing", "quality"}
    assert set(rows.status) <= {"ok", "oom", "diverged", "error", "timeout"}
    assert all((tmp_path / target).exists() for target in TARGETS)


def test_the_script_never_overwrites_a_foreign_slurm_conf(tmp_path):
    """Without root or SLURM: the overwrite guard alone, on files of this test's own."""
    ours = tmp_path / "ours.conf"
    ours.write_text("# written by comera-bench scripts/slurm_cluster.sh\nClusterName=ci\n")
    foreign = tmp_path / "foreign.conf"
    foreign.write_text("ClusterName=production\nSlurmctldHost=head01\n")
    new = tmp_path / "new.conf"
    new.write_text("# written by comera-bench scripts/slurm_cluster.sh\nClusterName=ci\nNodeName=x\n")
    same = tmp_path / "same.conf"  # an earlier version's file: the same settings, no mark
    same.write_text("ClusterName=ci\nNodeName=x\n")

    def may_write(target):
        return subprocess.run(["bash", str(SCRIPT), "may-write", str(target), str(new)], capture_output=True,
                              text=True)

    assert may_write(tmp_path / "absent.conf").returncode == 0
    assert may_write(ours).returncode == 0 and may_write(same).returncode == 0
    refused = may_write(foreign)
    assert refused.returncode == 4 and "was not written by this script" in refused.stderr
