"""FLOPs that FlopCounterMode counts for one call, with the native ops and with the Python kernels."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

import comera
from comera import native


def native_and_python_flops(run: Callable[[], object]) -> tuple[int, int]:
    """``run``'s FLOPs as counted natively (the ops' registered formulas) and inside ``native.disabled()``."""
    comera.register_flop_formulas()
    counts = []
    for off in (False, True):
        with native.disabled() if off else torch.enable_grad(), FlopCounterMode(display=False) as counter:
            run()
        counts.append(counter.get_total_flops())
    return counts[0], counts[1]
