"""Running the chosen targets: each one's rows, or an error row naming what broke."""
from __future__ import annotations

from typing import Callable

import torch

from harness.core import allocator as allocator_lib
from harness.perf.config import Config
from harness.perf.layers import target_embedding, target_linear, target_linear_cuda, target_linear_ops
from harness.perf.plans import target_plans
from harness.perf.report import TARGET_NAMES, BenchRow, format_row, make_row
from harness.perf.roofline import measure_roofline
from harness.perf.steps import target_steps


def run_targets(targets: set[int], cfg: Config, *, step_timeout_s: float = 1800,
                progress: Callable[[str], None] = lambda line: None) -> list[BenchRow]:
    """Measure the chosen targets under ``cfg.allocator`` (this process; the step workers apply it to
    themselves); a target that fails becomes an error row naming the exception."""
    with allocator_lib.policy(cfg.allocator) as cfg.allocator_applied:
        progress(f"allocator: {cfg.allocator} ({cfg.allocator_applied})")
        return _run_targets(targets, cfg, step_timeout_s, progress)


def _run_targets(targets: set[int], cfg: Config, step_timeout_s: float,
                 progress: Callable[[str], None]) -> list[BenchRow]:
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(0)
    roof = measure_roofline(cfg.device, cfg.num_threads, size=512 if cfg.quick else 2048,
                            copy_mb=16 if cfg.quick else 256) if targets & {1, 3, 4} else None
    if roof:
        progress(f"roofline: {roof.flops_per_s / 1e9:.1f} GFLOP/s matmul, {roof.bytes_per_s / 1e9:.1f} "
                 "GB/s copy")
    jobs: list[tuple[set[int], Callable[[], list[BenchRow]]]] = [
        ({1}, lambda: target_linear(cfg, roof)),
        ({1}, lambda: target_linear_ops(cfg)),
        ({1}, lambda: target_linear_cuda(cfg, progress)),
        ({3}, lambda: target_embedding(cfg, roof)),
        ({2, 4}, lambda: target_steps(cfg, targets, step_timeout_s, progress, roof)),
        ({5}, lambda: target_plans(cfg)),
    ]
    rows: list[BenchRow] = []
    for covers, job in jobs:
        if not covers & targets:
            continue
        progress(f"targets {sorted(covers & targets)} ...")
        try:
            new = job()
        except Exception as exc:  # a broken part is reported in the table, not hidden
            new = [make_row(t, TARGET_NAMES[t], float("nan"), None, note=f"{type(exc).__name__}: {exc}")
                   for t in sorted(covers & targets)]
        for row in new:
            progress(format_row(row))
        rows += new
    rows.sort(key=lambda r: r.target)
    for row in rows:
        row.settings += f"; allocator {cfg.allocator} ({cfg.allocator_applied})"
        if roof:
            row.settings += (f"; roofline {roof.flops_per_s / 1e9:.1f} GFLOP/s, "
                             f"{roof.bytes_per_s / 1e9:.1f} GB/s")
    return rows
