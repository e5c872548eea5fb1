"""docs/schema.md describes every column of the result tables (harness/results/__init__.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import results

SCHEMA = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
DOCUMENTED = set(re.findall(r"`([a-z_0-9]+)`", SCHEMA))


@pytest.mark.parametrize("kind", results.KINDS)
def test_every_column_is_documented(kind):
    missing = [c for c in results.TYPES[kind] if c not in DOCUMENTED]
    assert not missing, f"docs/schema.md does not describe {kind} columns {missing}"
