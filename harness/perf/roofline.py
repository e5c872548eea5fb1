"""The machine's peak matmul rate and copy bandwidth (the roofline bound of a ratio), and paired timing
(the ratio of two runs' per-round times is harness.results.analysis.rounds_ratio)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.perf import microbench as mb


@dataclass
class Roofline:
    flops_per_s: float
    bytes_per_s: float

    def time_bound(self, flops: float, traffic: float) -> float:
        return max(flops / self.flops_per_s, traffic / self.bytes_per_s)

    def speedup_bound(self, slow: tuple[float, float], fast: tuple[float, float]) -> float:
        """Roofline bound on how much faster ``fast`` (flops, bytes) can be than ``slow``."""
        return self.time_bound(*slow) / self.time_bound(*fast)


def measure_roofline(device: torch.device, num_threads: int, *, size: int = 2048,
                     copy_mb: int = 256) -> Roofline:
    """Peak matmul FLOP rate (float32 ``size``^3 matmul) and copy bandwidth (``copy_mb`` MiB) here."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    t_mm = mb.time_call(lambda: torch.mm(a, b), num_threads=num_threads, min_run_time_s=0.5)[0] / 1e3
    src = torch.empty(copy_mb * 2**18, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = mb.time_call(lambda: dst.copy_(src), num_threads=num_threads, min_run_time_s=0.5)[0] / 1e3
    return Roofline(2 * size**3 / t_mm, 2 * src.numel() * src.element_size() / t_copy)


def paired_rounds(runs: dict[str, Callable[[], Any]], *, rounds: int, num_threads: int,
                  min_run_time_s: float) -> dict[str, list[float]]:
    """Each run's blocked_autorange median (ms) in each of ``rounds`` rounds, the runs alternating."""
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            per_round[name].append(mb.time_call(run, num_threads=num_threads, min_run_time_s=min_run_time_s)[0])
    return per_round
