"""The whole tree passes ruff with the settings in pyproject.toml ([tool.ruff]: the default rules and lines
of at most 110 characters). ruff comes with the ``test`` extra, which CI installs: without it this test
fails rather than skips, so a lint check cannot go missing unnoticed."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes_on_the_whole_tree():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: it comes with the test extra (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout}{proc.stderr}"
