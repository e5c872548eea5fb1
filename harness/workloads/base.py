"""The interface of a workload: a model, its data and its metric (:class:`Workload`).

Models are built dense; a method may tensorize them with ``comera.convert`` using the workload's ``tt_spec``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn

Batch = dict[str, torch.Tensor]


class SizedModel(NamedTuple):
    """One candidate shape of a smaller dense model (:attr:`Workload.sized_models`)."""

    shape: str
    """What was made smaller, e.g. "width", "depth", "task-vocabulary"."""
    dims: dict[str, Any]
    """The params that set its size, e.g. ``{"d_model": 32, "d_ff": 128, "num_layers": 2}``."""
    params: int
    """Its parameter count."""
    build: Callable[[], nn.Module]
    """A fresh model of this shape, seeded and placed as :attr:`Workload.model`."""


class Holdout(NamedTuple):
    """The training data split for model selection (:attr:`Workload.holdout`)."""

    train_batches: Callable[[int], Iterator[Batch]]
    """epoch -> batches of the training data without the held-out slice."""
    steps_per_epoch: int
    evaluate: Callable[[nn.Module], dict[str, float]]
    """As :attr:`Workload.evaluate`, on the held-out slice of the training data (never the eval split)."""


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
    sized_models: Callable[[int], list[SizedModel]] | None = None
    """``n`` -> candidate smaller dense models of the same kind (one per shape the workload can shrink),
    each with the parameter count nearest ``n`` its rule gives; the dense method's size-matched model is
    chosen among them (docs/workloads.md). None: the workload has no such rule."""
    holdout: Callable[[float], Holdout] | None = None
    """``fraction`` -> the training data without its last ``fraction`` of samples, and an evaluation on
    that slice: what a model is chosen on without seeing the eval split. None: the workload has none."""


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
