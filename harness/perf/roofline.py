"""The machine's peak matmul rate and copy bandwidth: the roofline bound of a ratio."""
from __future__ import annotations

from dataclasses import dataclass
import torch

from harness.core.measure import call_ms


@dataclass
class Roofline:
    flops_per_s: float
    bytes_per_s: float

    def time_bound(self, flops: float, traffic: float) -> float:
        return max(flops / self.flops_per_s, traffic / self.bytes_per_s)

    def speedup_bound(self, slow_s: float, fast: tuple[float, float]) -> float:
        """The most ``slow_s / t_fast`` can be: ``fast`` (its flops, bytes) takes at least its roofline time,
        however far below the roofline the slow op ran in its measured ``slow_s`` seconds."""
        return slow_s / self.time_bound(*fast)


def measure_roofline(device: torch.device, num_threads: int, *, size: int = 2048,
                     copy_mb: int = 256) -> Roofline:
    """Peak matmul FLOP rate (float32 ``size``^3 matmul) and copy bandwidth (``copy_mb`` MiB) here."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    t_mm = call_ms(lambda: torch.mm(a, b), num_threads=num_threads, min_run_time_s=0.5) / 1e3
    src = torch.empty(copy_mb * 2**18, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = call_ms(lambda: dst.copy_(src), num_threads=num_threads, min_run_time_s=0.5) / 1e3
    return Roofline(2 * size**3 / t_mm, 2 * src.numel() * src.element_size() / t_copy)
