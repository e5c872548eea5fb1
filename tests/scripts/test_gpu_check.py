"""scripts/gpu_check.sh on the CPU (DEVICE=cpu QUICK=1: config/gpu-tiny.yaml, the quick bench): its dry
run packs the runs, merged tables, figures and claims into 7 files, a SIGTERM in the middle of its grid
still brings back the cells that finished with their tables, figures and claims, and WHEELS installs the
wheels the environment lacks into the run's own folder."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cpu-gpu-check"  # config/gpu-tiny.yaml's device_name
CELLS = 7


def start(tmp_path: Path, **env: str) -> subprocess.Popen:
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PYTHON": sys.executable,
           "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "TMPDIR": str(tmp_path), **env}
    return subprocess.Popen(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def members(tar: Path) -> dict[str, tarfile.TarFile]:
    return {m.name: m for m in tarfile.open(tar).getmembers()}


def merged_runs(out: Path) -> pd.DataFrame:
    with tarfile.open(out / "results.tar.gz") as tar:
        data = tar.extractfile(f"results/{DEVICE}/runs.parquet").read()
    return pd.read_parquet(io.BytesIO(data))


@pytest.mark.slow
def test_dry_run_packs_runs_tables_figures_and_claims(tmp_path):
    proc = start(tmp_path)
    output, _ = proc.communicate(timeout=600)  # a safety net: 85-190 s on the 2-core VM, busy
    out = tmp_path / "out"
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.txt", "env.txt", "figures.tar.gz", "gpu_check.log", "pipeline.txt", "pytest.txt",
                     "results.tar.gz"]
    for phase in ("tests", "bench", "grid"):
        assert f"{phase}: exit status 0" in log, log
    assert "figures: started" not in log  # the grid drew them itself
    assert "float32 matmul precision highest" in (out / "env.txt").read_text()
    assert "wheels:" not in log  # nothing installed without WHEELS
    assert "needs CUDA" in (out / "pytest.txt").read_text()  # -m cuda: selected, skipped here
    results = members(out / "results.tar.gz")
    assert len([n for n in results if n.endswith(".runs.parquet")]) == CELLS
    assert "results/bench/bench.parquet" in results and f"results/{DEVICE}/grid.json" in results
    runs = merged_runs(out)
    assert len(runs) == CELLS and (runs.status == "ok").all(), runs[["run_id", "status", "error"]]
    assert sorted(runs.matmul_precision) == ["high"] + ["highest"] * (CELLS - 1)
    figures = members(out / "figures.tar.gz")
    assert {"figures/claims.md", "figures/fig1_time_memory.png", "figures/fig6_accuracy.png",
            "figures/table_runs.md"} <= set(figures)
    assert "figures/fig7_cuda_graph.png" not in figures  # the CPU stand-in has no CUDA graph cell


@pytest.mark.slow
def test_sigterm_mid_grid_still_brings_back_what_finished(tmp_path):
    """A SIGTERM in the middle of the grid still brings back the finished cells with their tables, figures
    and claims."""
    # straight to the grid; the figures after the stop get the time a busy test machine needs (30 s on
    # the device), so that what is checked is what the stop leaves, not how fast this machine draws
    proc = start(tmp_path, TESTS_S="0", BENCH_S="0", STOP_FIGURES_S="400")
    cells = tmp_path / "work" / "results" / "runs" / DEVICE
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not list(cells.glob("*.runs.parquet")):
        time.sleep(0.1)
    assert proc.poll() is None, "the script ended before its grid could be stopped"
    time.sleep(2)  # the second timing group starts
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=600)
    out = tmp_path / "out"
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 1 and "SIGTERM received" in log, output[-3000:]
    assert "figures: exit status 0" in log, log
    runs = merged_runs(out)
    assert 2 <= len(runs) < CELLS and (runs.status == "ok").all(), runs[["run_id", "status", "error"]]
    assert len(runs.timing_group.unique()) == 1  # the finished group; the stopped one left no row
    finished = [n for n in members(out / "results.tar.gz") if n.endswith(".runs.parquet") and "/runs/" in n]
    assert len(finished) == len(runs)
    assert "figures/claims.md" in members(out / "figures.tar.gz")


def _wheel(folder: Path, name: str) -> Path:
    """A pure-Python wheel of package ``name`` (version 1.0) in ``folder``."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for f, text in {**files, f"{info}/RECORD": record}.items():
            zf.writestr(f, text)
    return path


def test_wheels_go_into_the_runs_own_folder_where_missing(tmp_path):
    """WHEELS=DIR: the wheels of packages this environment lacks are installed into WORK/site (the
    environment is left alone); the others are not. No phase runs with BUDGET_S=0."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "comera_gpu_check_probe")
    _wheel(wheels, "pytest")  # installed here already
    output, _ = start(tmp_path, WHEELS=str(wheels), BUDGET_S="0").communicate(timeout=120)
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "wheels: 1 of 2 installed into" in log, output[-3000:]
    assert (tmp_path / "work" / "site" / "comera_gpu_check_probe" / "__init__.py").is_file()
    assert not (tmp_path / "work" / "site" / "pytest").exists()


def test_a_wheels_folder_without_wheels_is_named(tmp_path):
    proc = start(tmp_path, WHEELS=str(tmp_path / "nowhere"), BUDGET_S="0")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output[-3000:]
    assert f"WHEELS={tmp_path / 'nowhere'}: no *.whl file there" in output
