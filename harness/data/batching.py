"""Deterministic batching of in-memory tensor data sets (all tensors share the first dimension)."""
from __future__ import annotations

from typing import Callable, Iterator

import torch

Batch = dict[str, torch.Tensor]


def epoch_generator(seed: int, epoch: int, salt: int = 0) -> torch.Generator:
    """A CPU generator for one epoch of one run: same (seed, epoch) -> same stream."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919 + salt) % (2**63 - 1))


def num_rows(data: Batch) -> int:
    sizes = {t.shape[0] for t in data.values()}
    if len(sizes) != 1:
        lengths = {k: t.shape[0] for k, t in data.items()}
        raise ValueError(f"tensors of one data set differ in length: {lengths}")
    return sizes.pop()


def train_steps(n: int, batch_size: int) -> int:
    """Full batches per epoch (at least one: a data set smaller than a batch is cycled to fill it)."""
    return max(1, n // batch_size)


def train_batches(data: Batch, batch_size: int, seed: int, epoch: int, device: torch.device,
                  transform: Callable[[Batch, torch.Generator], Batch] | None = None) -> Iterator[Batch]:
    """Shuffled full batches (static shapes, as CUDA graphs need); the order depends on (seed, epoch).

    ``transform`` (e.g. MLM masking) gets each CPU batch and the epoch's generator.
    """
    n = num_rows(data)
    gen = epoch_generator(seed, epoch)
    steps = train_steps(n, batch_size)
    order = torch.randperm(n, generator=gen)
    if n < batch_size:
        order = order.repeat(-(-batch_size // n))
    for step in range(steps):
        idx = order[step * batch_size:(step + 1) * batch_size]
        batch = {k: t[idx] for k, t in data.items()}
        if transform is not None:
            batch = transform(batch, gen)
        yield {k: t.to(device, non_blocking=True) for k, t in batch.items()}


def eval_batches(data: Batch, batch_size: int, device: torch.device) -> Iterator[Batch]:
    """The whole split in order, the last batch possibly smaller."""
    n = num_rows(data)
    for start in range(0, n, batch_size):
        yield {k: t[start:start + batch_size].to(device, non_blocking=True) for k, t in data.items()}
