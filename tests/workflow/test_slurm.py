"""The slurm profile for real: a one-node SLURM cluster (scripts/slurm_cluster.sh) runs the tiny grid
through snakemake-executor-plugin-slurm; the daemons are stopped by their PID files afterwards."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _skip_reason() -> str | None:
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


def test_tiny_grid_through_the_slurm_plugin(cluster, tmp_path):
    cmd = ["timeout", "-k", "10", "900", str(BIN / "snakemake"), "--snakefile", str(ROOT / "workflow" / "Snakefile"),
           "--directory", str(tmp_path), "--profile", str(ROOT / "workflow" / "profiles" / "slurm"),
           "runs", "microbench", "--configfile", str(ROOT / "config" / "tiny.yaml")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=960)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    log = res.stdout + res.stderr
    assert "sbatch" in log or "SLURM" in log or "slurm" in log
    files = sorted((tmp_path / "results" / "runs" / "cpu-tiny").glob("*.runs.parquet"))
    rows = pd.concat([pd.read_parquet(f) for f in files])
    assert set(rows.method) == {"dense", "comera", "galore", "lte"}
    assert set(rows.status) <= {"ok", "oom", "diverged", "error", "timeout"}
    assert (tmp_path / "results" / "runs" / "cpu-tiny" / "microbench" / "tiny.microbench.parquet").exists()
