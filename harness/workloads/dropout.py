"""Dropout for CPU training with cheap keep masks, and self-attention whose probability dropout uses them.

Keep masks come from 16-bit random lanes (``E[out] == x`` exactly) and backward saves a boolean mask; CUDA
and compiled graphs use torch's own. How: docs/design-notes.md; timings: docs/performance.md.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

LANE_LEVELS = 1 << 16
"""Number of values of one 16-bit lane: keep probabilities are multiples of 1 / LANE_LEVELS."""
_INT16_OFFSET = 1 << 15


def keep_levels(p: float) -> int:
    """How many of the ``LANE_LEVELS`` lane values keep an element at drop probability ``p``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return round((1.0 - p) * LANE_LEVELS)


def keep_mask(shape: torch.Size | tuple[int, ...], levels: int,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean mask of ``shape``, each element True with probability ``levels / LANE_LEVELS``.

    ``levels`` is in [0, LANE_LEVELS): a mask that keeps everything needs no draws (and its threshold
    would not fit the 16-bit comparison).
    """
    if not 0 <= levels < LANE_LEVELS:
        raise ValueError(f"keep_mask: levels={levels} is outside [0, {LANE_LEVELS})")
    numel = math.prod(shape)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(1 << 63), None)  # the full 64-bit range (random_() alone leaves the top bit 0)
    lanes = words.view(torch.int16)[:numel].view(shape)  # uniform over [-2^15, 2^15)
    return lanes < levels - _INT16_OFFSET


def replaces_torch(x: torch.Tensor, p: float, training: bool) -> bool:
    """Whether this module's masks replace torch's dropout for ``x``: eager CPU training with ``p > 0``.

    Other devices keep torch's fused dropout; compiled graphs keep it too, so the compiler fuses its own
    random numbers instead of breaking the graph at ``random_``.
    """
    return training and p > 0.0 and x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of ``x`` (as ``F.dropout``); on CPU with the 16-bit keep mask of this module."""
    if not replaces_torch(x, p, training):
        return F.dropout(x, p, training)
    levels = keep_levels(p)
    if levels == LANE_LEVELS:  # p < 2^-17 rounds to keeping everything
        return x
    return _apply(x, keep_mask(x.shape, levels, x.device)).mul_(_scale(levels))


def _apply(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x`` with the elements where ``keep`` is False zeroed, as ``x * keep`` in torch's dropout (NaN stays
    NaN). The bool mask is read as uint8 (a view): float x uint8 runs a vectorized kernel, faster on CPU than
    ``torch.where(keep, x, 0)`` or ``x * keep`` (which casts the mask to x's dtype first; docs/performance.md
    has the timings); autograd saves the 1-byte mask."""
    return torch.mul(x, keep.view(torch.uint8))


def _scale(levels: int) -> float:
    """Inverted-dropout scale for a keep probability of ``levels / LANE_LEVELS`` (any value when none is
    kept)."""
    return LANE_LEVELS / max(levels, 1)


class Dropout(nn.Dropout):
    """``nn.Dropout(p)`` whose CPU training path uses :func:`dropout` (16-bit keep masks)."""

    def __init__(self, p: float = 0.5):
        super().__init__(p)  # no ``inplace``: the output is always a new tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
              dropout_p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) masked) with :func:`dropout`, times v: SDPA's math path, written out.

    ``q, k, v``: (..., seq, d); ``key_mask``: bool, broadcastable to (..., seq_q, seq_k), True where a
    query may attend a key. As in ``F.scaled_dot_product_attention``, a query with no key to attend gets
    a zero output (and zero gradients), not NaN.
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))
    out_scale = None  # factor of each output row: dropout's inverse keep rate, 0 for rows without keys
    if key_mask is not None:
        has_key = key_mask.any(-1, keepdim=True)
        blocked = ~key_mask & has_key  # rows without keys attend uniformly (finite); zeroed below
        bias = torch.zeros(blocked.shape, dtype=scores.dtype, device=scores.device)
        scores = scores.add_(bias.masked_fill_(blocked, float("-inf")))
        out_scale = has_key.to(scores.dtype)  # applied always: no host sync to test for such rows
    probs = torch.softmax(scores, dim=-1)
    levels = keep_levels(dropout_p)
    if levels < LANE_LEVELS:
        out = _DroppedMatmul.apply(probs, keep_mask(probs.shape, levels, probs.device), v)
        out_scale = _scale(levels) if out_scale is None else out_scale * _scale(levels)
    else:
        out = torch.matmul(probs, v)
    return out if out_scale is None else out.mul_(out_scale)


class _DroppedMatmul(torch.autograd.Function):
    """``(probs * keep) @ v`` saving ``probs`` (which softmax saves anyway) and the boolean mask instead
    of the dropped copy: 4 bytes less per attention probability, for one masking more in backward."""

    @staticmethod
    def forward(ctx, probs: torch.Tensor, keep: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(probs, keep, v)
        return torch.matmul(_apply(probs, keep), v)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        probs, keep, v = ctx.saved_tensors
        grad_probs = _apply(torch.matmul(grad_out, v.transpose(-2, -1)), keep)
        grad_v = torch.matmul(_apply(probs, keep).transpose(-2, -1), grad_out)
        return grad_probs, None, grad_v
