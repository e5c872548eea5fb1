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


def test_rounds_and_block_seconds_default_and_must_be_positive():
    cfg = Config.make("cpu", 1, quick=False)
    assert (cfg.rounds, cfg.min_run_time_s) == (3, 0.5)
    cfg = Config.make("cpu", 1, quick=False, rounds=7, min_run_time_s=0.2)
    assert (cfg.rounds, cfg.min_run_time_s) == (7, 0.2) and "7 rounds x 0.2s blocks" in cfg.label()
    with pytest.raises(ValueError, match="--rounds 0"):
        Config.make("cpu", 1, quick=False, rounds=0)
    with pytest.raises(ValueError, match="--block-s 0"):
        Config.make("cpu", 1, quick=False, min_run_time_s=0.0)
