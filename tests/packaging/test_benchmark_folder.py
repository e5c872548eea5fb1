"""benchmarks/ (pytest-benchmark, outside the default test run) still collects and runs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_layer_benchmark_folder_collects_and_its_smallest_cases_run():
    """All 11 cases collect; the 128-token linear trio (nn.Linear, TTLinear, official) and both lookups run
    once (--benchmark-disable), the larger shapes only differ by size."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "--benchmark-disable", "-q",
                           "-p", "no:cacheprovider", "-k", "128tok or lookup", "--torch-threads", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "5 passed, 6 deselected" in proc.stdout, proc.stdout[-2000:]
