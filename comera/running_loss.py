"""Running statistics of the task loss that CoMERA's rank adaptation reads: :class:`RunningLoss`."""
from __future__ import annotations

import torch


class RunningLoss:
    """Running statistics of the task loss as tensors on its device (no host sync, CUDA-graph safe).

    ``slow`` (EMA factor ``slow_factor``) and its lowest value so far ``best``; ``fast`` (``fast_factor``)
    for the late stage's branch test; ``variance``, the EMA of ``(loss - slow)^2``. A non-finite loss (a
    step a GradScaler skips) leaves them as they were.
    """

    def __init__(self, slow_factor: float, fast_factor: float):
        self.slow_factor, self.fast_factor = slow_factor, fast_factor
        self.slow: torch.Tensor | None = None
        self.fast: torch.Tensor | None = None
        self.best: torch.Tensor | None = None
        self.variance: torch.Tensor | None = None
        self.first: torch.Tensor | None = None

    def update(self, loss: torch.Tensor) -> None:
        """Fold one step's (detached) task loss in."""
        if self.slow is None:
            self.slow, self.fast, self.first = loss.clone(), loss.clone(), loss.clone()
            self.variance = torch.zeros_like(loss)
        else:
            deviation = (loss - self.slow).square()
            self.variance = _blend(self.variance, deviation, self.slow_factor)
            self.slow = _blend(self.slow, loss, self.slow_factor)
            self.fast = _blend(self.fast, loss, self.fast_factor)
            self.first = torch.where(torch.isfinite(self.first), self.first, loss)
        # fmin: a NaN best (from a first NaN loss) gives way to the first number
        self.best = self.slow.clone() if self.best is None else torch.fmin(self.best, self.slow)

    def fast_noise(self) -> torch.Tensor:
        """Standard deviation of ``fast`` from the loss's noise: ``sqrt(variance (1 - b) / (1 + b))``."""
        b = self.fast_factor
        return (self.variance.clamp_min(0) * (1 - b) / (1 + b)).sqrt()

    def state_dict(self) -> dict[str, float | None]:
        return {key: None if value is None else float(value)
                for key, value in (("slow", self.slow), ("fast", self.fast), ("best", self.best),
                                   ("variance", self.variance), ("first", self.first))}

    def load_state_dict(self, state: dict[str, float | None], like: torch.Tensor) -> None:
        for key in ("slow", "fast", "best", "variance", "first"):
            value = state.get(key)
            setattr(self, key, None if value is None else torch.tensor(value, dtype=like.dtype,
                                                                      device=like.device))


def _blend(average: torch.Tensor, value: torch.Tensor, factor: float) -> torch.Tensor:
    """``factor average + (1 - factor) value``; a non-finite value leaves it, a finite one replaces a
    non-finite average."""
    blended = torch.where(torch.isfinite(average), factor * average + (1 - factor) * value, value)
    return torch.where(torch.isfinite(value), blended, average)
