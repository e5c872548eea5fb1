"""The interface of a workload: a model, its data and its metric (:class:`Workload`).

Models are built dense; a method may tensorize them with ``comera.convert`` using the workload's ``tt_spec``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

Batch = dict[str, torch.Tensor]


@dataclass
class Workload:
    name: str
    model: nn.Module
    """The dense model, already on the target device."""
    tt_spec: dict[str, dict[str, Any]]
    """Module name -> TT spec for comera.convert.tensorize:
    {"kind": "linear", "in_shape": [...], "out_shape": [...], "rank": int | list[int]} or
    {"kind": "embedding", "row_shape": [...], "col_shape": [...], "rank": int | list[int]}."""
    train_batches: Callable[[int], Iterator[Batch]]
    """epoch -> iterator over training batches (tensors on the device), deterministic for a seed."""
    eval_batches: Callable[[], Iterator[Batch]]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    """Mean task loss of one batch."""
    evaluate: Callable[[nn.Module], dict[str, float]]
    """Runs the eval split in eval mode under no_grad: {"metric_name": str, "metric_value": float, ...}."""
    steps_per_epoch: int
    metric_name: str
    seq_len: int | None = None
    lr: dict[str, float] = field(default_factory=dict)
    """The learning rates for this workload: {"dense", "cores", "other", "gates"} and optionally
    "embedding_cores"."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything worth recording (data source, vocabulary size, number of samples)."""
    official_init: Callable[[nn.Module], None] | None = None
    """Re-initializes the parameters that stay dense after tensorizing as the official CoMERA code does
    (the CoMERA method's ``dense_init: official``); None: they keep the workload's own init."""
    sized_model: Callable[[int], tuple[nn.Module, dict[str, Any]]] | None = None
    """``n`` -> a smaller dense model of the same kind whose parameter count is the nearest to ``n`` the
    workload's rule gives, seeded and placed as ``model``, and the params that set its size (e.g.
    ``{"d_model": 16, "d_ff": 64}``); the dense method's size-matched baseline trains it. None: the
    workload has no such rule."""


def seeded_model(build_model: Callable[[dict[str, Any]], nn.Module], params: dict[str, Any], seed: int,
                 device: torch.device | str) -> nn.Module:
    """``build_model(params)`` initialised from ``seed`` without touching the global RNG stream, on
    ``device``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(params)
    return model.to(device)


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """The block runs with ``model`` in eval mode and gradients off; its training mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
