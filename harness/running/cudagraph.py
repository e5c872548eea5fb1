"""Whole-training-step CUDA graph capture (``execution.cuda_graph``): :class:`GraphedStep`.

One call is one training step: eager warm-up calls, then capture and replay; other batch shapes run eagerly,
:meth:`GraphedStep.invalidate` forces a re-capture; optimizers that cannot be captured raise
:class:`CudaGraphUnsupported`. Why: docs/design-notes.md.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

Batch = dict[str, torch.Tensor]


class CudaGraphUnsupported(RuntimeError):
    """The run cannot be captured as a CUDA graph; the message says why."""


def require_cuda(device: torch.device) -> None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise CudaGraphUnsupported(f"cuda_graph needs CUDA; the run's device is {device}")


def make_capturable(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """Switch ``capturable=True`` on every optimizer before its first step, or refuse."""
    optimizers = list(optimizers)
    if not optimizers and any(p.requires_grad for p in model.parameters()):
        raise CudaGraphUnsupported(
            "cuda_graph: the method steps its parameters outside Prepared.optimizers (layer-wise "
            "optimizers in backward hooks), which cannot be captured")
    for opt in optimizers:
        if "capturable" not in opt.defaults:
            raise CudaGraphUnsupported(
                f"cuda_graph needs optimizers that support capturable=True; {type(opt).__name__} does not")
        if opt.state:
            raise CudaGraphUnsupported(
                f"cuda_graph: {type(opt).__name__} already has state; enable capture before the first step")
        opt.defaults["capturable"] = True
        for group in opt.param_groups:
            group["capturable"] = True


def state_signature(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> tuple:
    """Addresses and shapes of every parameter and optimizer-state tensor: a captured graph is valid
    only while this stays the same."""
    sig: list[tuple] = [(p.data_ptr(), tuple(p.shape)) for p in model.parameters()]
    for opt in optimizers:
        for state in opt.state.values():
            sig.extend((t.data_ptr(), tuple(t.shape)) for t in state.values()
                       if isinstance(t, torch.Tensor))
    return tuple(sig)


class StaticBatch:
    """Static input buffers for a captured graph: allocated like the first batch, then filled in place."""

    def __init__(self, batch: Batch):
        self.tensors: Batch = {k: v.detach().clone() for k, v in batch.items()}

    def matches(self, batch: Batch) -> bool:
        """Same keys, shapes, dtypes and devices as the buffers."""
        return batch.keys() == self.tensors.keys() and all(
            v.shape == self.tensors[k].shape and v.dtype == self.tensors[k].dtype
            and v.device == self.tensors[k].device for k, v in batch.items())

    def load(self, batch: Batch) -> bool:
        """Copy ``batch`` into the buffers; False (nothing copied) when it does not match them."""
        if not self.matches(batch):
            return False
        for k, v in batch.items():
            self.tensors[k].copy_(v, non_blocking=True)
        return True


class GraphedStep:
    """A training step's capturable part (``step_fn(batch, step) -> (task_loss, loss)`` doing forward,
    backward and the optimizer steps: the runner passes ``Prepared.update``) run through a CUDA graph; see
    the module docstring. An instance is the ``update`` argument of ``Prepared.train_step``."""

    def __init__(self, step_fn: Callable[[Batch, int], tuple[torch.Tensor, torch.Tensor]],
                 model: nn.Module, optimizers: list[torch.optim.Optimizer], device: torch.device, *,
                 warmup: int = 3):
        require_cuda(device)
        make_capturable(model, optimizers)
        self.step_fn, self.model, self.optimizers = step_fn, model, optimizers
        self.device = torch.device(device)
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: StaticBatch | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self.eager_since_invalidate = 0
        self.captures = 0
        self.replays = 0
        self.eager_steps = 0

    def invalidate(self) -> None:
        """Drop the graph; the next steps warm up again and re-capture."""
        self.graph, self.static, self.outputs = None, None, None
        self.eager_since_invalidate = 0

    def _eager(self, batch: Batch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.eager_steps += 1
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for opt in self.optimizers:  # grads may still be the graph's static tensors
                opt.zero_grad(set_to_none=True)
            task_loss, loss = self.step_fn(batch, step)
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        torch.cuda.current_stream(self.device).wait_stream(side)
        return task_loss, loss

    def _capture(self, batch: Batch, step: int) -> None:
        self.static = StaticBatch(batch)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = self.step_fn(self.static.tensors, step)
        self.graph = graph
        self.captures += 1

    def __call__(self, batch: Batch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One real training step; returns (task_loss, loss) tensors (static ones when replayed)."""
        if self.graph is None and self.eager_since_invalidate < self.warmup:
            self.eager_since_invalidate += 1
            return self._eager(batch, step)
        if self.graph is None:
            self._capture(batch, step)
        elif not self.static.load(batch):
            return self._eager(batch, step)
        self.graph.replay()
        self.replays += 1
        return self.outputs

    def stats(self) -> dict[str, int]:
        return {"captures": self.captures, "replays": self.replays, "eager_steps": self.eager_steps}
