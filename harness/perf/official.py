"""A bench-only TT linear layer that costs what the official CoMERA layer costs (target 1's side-by-side row).

:class:`OfficialTTLinear` reimplements (no code copied) the official layer and its ``TT_forward`` for three
input and three output modes; not part of ``comera``. The official algorithm: docs/design-notes.md.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from comera.tt import forward_gates

MODES = 3
"""Input modes and output modes the official ``TT_forward`` supports (its ``d``)."""


class _OfficialTTFunction(torch.autograd.Function):
    """``y = x (G0 G1 G2)(G3 G4 G5)`` over the last axis of ``x``, following the official ``TT_forward``
    (leading axes flattened inside the function, as there)."""

    @staticmethod
    def forward(ctx, x, *cores):
        with torch.no_grad():
            g0, g1, g2, g3, g4, g5 = cores
            n_in = g0.shape[1] * g1.shape[1] * g2.shape[1]
            n_out = g3.shape[1] * g4.shape[1] * g5.shape[1]
            ctx.x_shape = x.shape
            lead = x.shape[:-1]
            x = x.flatten(0, -2)
            # input side: (n0, r1) -> (n0, n1, r2) -> (n0, n1, n2, r3); z = x A through a transposed view
            l0 = g0.reshape(g0.shape[1], g0.shape[2])
            l1 = torch.tensordot(l0, g1, dims=([-1], [0]))
            l2 = torch.tensordot(l1, g2, dims=([-1], [0]))
            z = F.linear(x, l2.reshape(n_in, -1).movedim(-1, 0))
            # output side: (r3, n3, r4) -> (r3, n3, n4, r5) -> (r3, n3, n4, n5, 1); y = z B likewise
            r0 = g3
            r1 = torch.tensordot(r0, g4, dims=([-1], [0]))
            r2_full = torch.tensordot(r1, g5, dims=([-1], [0]))
            r2 = r2_full.reshape(r2_full.shape[:-1])
            y = F.linear(z, r2_full.reshape(g3.shape[0], n_out).movedim(0, -1)).reshape(*lead, n_out)
        ctx.save_for_backward(x, *cores, z, l0, l1, l2, r0, r1, r2)
        return y

    @staticmethod
    def backward(ctx, dy):
        with torch.no_grad():
            x, g0, g1, g2, g3, g4, g5, z, l0, l1, l2, r0, r1, r2 = ctx.saved_tensors
            in_modes = [g.shape[1] for g in (g0, g1, g2)]
            dy = dy.flatten(0, -2).reshape(-1, *r2.shape[1:])                    # (T, n3, n4, n5)
            dz = torch.tensordot(dy, r2, dims=[[1, 2, 3], [1, 2, 3]])            # (T, r3)
            dx = torch.tensordot(dz, l2, dims=[[-1], [-1]])                      # (T, n0, n1, n2)
            # output cores, from the last one back
            t = torch.tensordot(z, dy, dims=[[0], [0]])                          # (r3, n3, n4, n5)
            d5 = torch.tensordot(r1, t, dims=[[0, 1, 2], [0, 1, 2]])[:, :, None]  # (r5, n5, 1)
            t = torch.tensordot(t, g5.reshape(g5.shape[0], g5.shape[1]), [[-1], [1]])  # (r3, n3, n4, r5)
            d4 = torch.tensordot(r0, t, dims=[[0, 1], [0, 1]])                   # (r4, n4, r5)
            d3 = torch.tensordot(t, g4, [[-2, -1], [1, 2]])                      # (r3, n3, r4)
            # input cores, from the last one back
            u = torch.tensordot(dz, x, [[0], [0]]).reshape(-1, *in_modes).movedim(0, -1)  # (n0, n1, n2, r3)
            d2 = torch.tensordot(l1, u, dims=[[0, 1], [0, 1]])                   # (r2, n2, r3)
            u = torch.tensordot(u, g2, dims=[[-2, -1], [1, 2]])                  # (n0, n1, r2)
            d1 = torch.tensordot(l0, u, dims=[[0], [0]])                         # (r1, n1, r2)
            d0 = torch.tensordot(u, g1, dims=[[-2, -1], [1, 2]])[None, :, :]     # (1, n0, r1)
        return dx.reshape(ctx.x_shape), d0, d1, d2, d3, d4, d5


class OfficialTTLinear(nn.Module):
    """The official CoMERA ``TensorizedLinear_module`` forward on the parameters of a
    :class:`comera.tt.TTLinear`.

    The cores, gates and bias are the TTLinear's own ``Parameter`` objects (shared, not copied), so both
    layers compute the same ``y = x W + b`` and their gradients land in the same tensors. The gates are
    applied as the official ``get_factors(prune_mask=True)`` does, one ``U * g[None, None, :]`` per core
    outside the autograd function (thresholded at ``tt.gate_threshold`` first when that is set, like
    ``get_rank_mask``; raw otherwise, like the TTLinear); the bias is added after the function.
    """

    def __init__(self, tt: nn.Module):
        super().__init__()
        in_shape, out_shape = tuple(tt.in_shape), tuple(tt.out_shape)
        if len(in_shape) != MODES or len(out_shape) != MODES:
            raise ValueError(f"OfficialTTLinear: the official TT_forward handles {MODES} input and {MODES} "
                             f"output modes, got in_shape={list(in_shape)}, out_shape={list(out_shape)}")
        self.in_shape, self.out_shape = in_shape, out_shape
        self.in_features, self.out_features = math.prod(in_shape), math.prod(out_shape)
        self.cores = nn.ParameterList(list(tt.cores))
        self.gates = nn.ParameterList(list(tt.gates))
        self.bias = tt.bias
        self.gate_threshold = tt.gate_threshold

    def factors(self) -> list[torch.Tensor]:
        """The gated cores, as the official ``get_factors(prune_mask=True)``: ``U * D[None, None, :]``."""
        cores = list(self.cores)
        return [u * g[None, None, :] for u, g in zip(cores[:-1], forward_gates(self))] + [cores[-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"OfficialTTLinear: expected input with last dimension {self.in_features}, "
                             f"got shape {tuple(x.shape)}")
        y = _OfficialTTFunction.apply(x, *self.factors())
        return y + self.bias if self.bias is not None else y
