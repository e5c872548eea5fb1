"""The settings of one bench invocation."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core import allocator as allocator_lib
from harness.core import measure
from harness.perf import goals as goals_lib


@dataclass
class Config:
    """Sizes, repeats and goals of one bench invocation (``quick`` shrinks everything)."""

    device: torch.device
    num_threads: int
    quick: bool
    rounds: int
    min_run_time_s: float
    allocator: str = "reuse"
    """Policy of harness.core.allocator for this process and the step workers."""
    allocator_applied: str = ""
    """What applying it did here (set by run_targets)."""
    step_rounds: int = 1
    """Rounds of the transformer-step processes of targets 2 and 4 (every configuration once per round)."""
    goals: dict[str, Any] = field(default_factory=goals_lib.load)
    """The goals file (harness.perf.goals)."""

    @classmethod
    def make(cls, device: str, num_threads: int, quick: bool, allocator: str = "reuse",
             step_rounds: int | None = None, goals: str | Path = goals_lib.DEFAULT_PATH, *,
             rounds: int | None = None, min_run_time_s: float | None = None) -> "Config":
        if allocator not in allocator_lib.POLICIES:
            raise ValueError(f"--allocator {allocator!r}: expected one of {list(allocator_lib.POLICIES)}")
        step_rounds = (1 if quick else 3) if step_rounds is None else step_rounds
        if step_rounds < 1:
            raise ValueError(f"--step-rounds {step_rounds}: need at least 1")
        rounds = (2 if quick else 3) if rounds is None else rounds
        if rounds < 1:
            raise ValueError(f"--rounds {rounds}: need at least 1")
        min_run_time_s = (0.05 if quick else 0.5) if min_run_time_s is None else min_run_time_s
        if not min_run_time_s > 0:
            raise ValueError(f"--block-s {min_run_time_s:g}: need a positive number of seconds")
        return cls(measure.resolve_device(device, "bench --device"), num_threads, quick, rounds,
                   min_run_time_s, allocator, step_rounds=step_rounds, goals=goals_lib.load(goals))

    def label(self) -> str:
        return f"{'quick, ' if self.quick else ''}{self.rounds} rounds x {self.min_run_time_s}s blocks"
