"""TT-SVD: a dense tensor as a tensor train at given ranks (sequential truncated SVDs, in float64).

``TTLinear.from_linear`` and ``TTMEmbedding.from_embedding`` start from a trained weight with it and report
the result's relative Frobenius error.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def tt_svd(full: torch.Tensor, modes: Sequence[int], ranks: Sequence[int]) -> list[torch.Tensor]:
    """Cores ``(r_k, modes[k], r_{k+1})`` (float64) of ``full`` (``prod(modes)`` entries in C order).

    ``ranks = [1, r_1, ..., r_{d-1}, 1]`` are upper bounds: bond ``k`` keeps the ``r_k`` largest singular
    values of the k-th unfolding, fewer when the unfolding has fewer (the cores' shapes say which)."""
    modes = [int(n) for n in modes]
    if full.numel() != math.prod(modes):
        raise ValueError(f"tt_svd: a tensor of {full.numel()} entries cannot have modes {modes}")
    if len(ranks) != len(modes) + 1:
        raise ValueError(f"tt_svd: ranks {list(ranks)} need {len(modes) + 1} entries for modes {modes}")
    rest = full.detach().to(torch.float64).reshape(-1)
    cores, left = [], 1
    for k, n in enumerate(modes[:-1]):
        u, s, vh = torch.linalg.svd(rest.reshape(left * n, -1), full_matrices=False)
        r = min(int(ranks[k + 1]), s.numel())
        cores.append(u[:, :r].reshape(left, n, r))
        rest = s[:r, None] * vh[:r]
        left = r
    cores.append(rest.reshape(left, modes[-1], 1))
    return cores


def relative_error(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """``||reference - approximation||_F / ||reference||_F`` in float64 (0 for two zero tensors)."""
    ref, approx = reference.detach().double(), approximation.detach().double()
    norm = float(torch.linalg.vector_norm(ref))
    diff = float(torch.linalg.vector_norm(ref - approx))
    return diff / norm if norm else (0.0 if diff == 0 else math.inf)
