"""harness.perf.config: one invocation's settings."""
from __future__ import annotations

import pytest

from harness.perf.config import Config


def test_unknown_allocator_is_named():
    with pytest.raises(ValueError, match="--allocator 'tcmalloc'"):
        Config.make("cpu", 1, quick=True, allocator="tcmalloc")
    assert Config.make("cpu", 1, quick=True, allocator="system").allocator == "system"


def test_step_rounds_must_be_positive():
    with pytest.raises(ValueError, match="--step-rounds 0"):
        Config.make("cpu", 1, quick=False, step_rounds=0)
    assert Config.make("cpu", 1, quick=False).step_rounds == 3
    assert Config.make("cpu", 1, quick=True).step_rounds == 1
