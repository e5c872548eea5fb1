"""Bench-only layers that cost what the official CoMERA layers cost (targets 1 and 3, side by side).

:class:`OfficialTTLinear` reimplements (no code copied) the official layer and its ``TT_forward`` for three
input and three output modes; :class:`OfficialTTMEmbedding` the official order-4 TTM embedding's unique
lookup (``TensorizedEmbedding_order4.TTM_select_ind`` with ``use_unique=True``). Not part of ``comera``.
The official TT algorithm: docs/design-notes.md; the lookup: the class docstring.
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


class OfficialTTMEmbedding(nn.Module):
    """The official CoMERA order-4 TTM embedding lookup with ``use_unique=True`` on the parameters of a
    :class:`comera.ttm.TTMEmbedding` (shared, not copied; gates applied to the cores first, as the official
    ``get_factors(prune_mask=True)`` does).

    Per call, as the official ``TTM_select_ind``: both half tables are formed in full under autograd
    (cores 0-1 as ``(m0 m1, n0 n1, r2)``, cores 2-3 as ``(r2, m2 m3, n2 n3)``), the unique indices are
    looked up in a row-to-coordinates table made once, their half-table rows gathered and multiplied by
    one batched ``einsum``, and every index's row is gathered from the unique rows through a persistent
    index-to-position buffer. Autograd differentiates it all (no custom backward, as there).

    Shape:
        - Input: integer tensor ``(*)``.
        - Output: ``(*, embedding_dim)``.
    """

    def __init__(self, ttm: nn.Module):
        super().__init__()
        if len(ttm.row_shape) != 4:
            raise ValueError(f"OfficialTTMEmbedding: the official optimized TTM lookup takes 4 cores, got "
                             f"row_shape={list(ttm.row_shape)}")
        self.ttm = ttm
        rows = ttm.row_shape
        right_rows = rows[2] * rows[3]
        ids = torch.arange(ttm.num_embeddings, device=ttm.cores[0].device)
        self.register_buffer("ind2coord", torch.stack([ids // right_rows, ids % right_rows], 1),
                             persistent=False)
        self.register_buffer("dict_tensor", torch.zeros_like(ids), persistent=False)
        self.register_buffer("dict_range", ids.clone(), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        f0, f1, f2, f3 = self.ttm.gated_cores()
        m, n = [f.shape[1] for f in (f0, f1, f2, f3)], [f.shape[2] for f in (f0, f1, f2, f3)]
        out1 = torch.tensordot(f0, f1, [[-1], [0]]).movedim([3], [2]).reshape(m[0] * m[1], n[0] * n[1], -1)
        out2 = torch.tensordot(f2, f3, [[-1], [0]]).movedim([3], [2]).reshape(f2.shape[0], m[2] * m[3],
                                                                              n[2] * n[3])
        flat = idx.reshape(-1)
        unique = torch.unique(flat)
        self.dict_tensor[unique] = self.dict_range[:unique.shape[0]]
        targets = self.ind2coord[unique, :]
        rows = torch.einsum("abc,cad->abd", out1[targets[:, 0], :, :], out2[:, targets[:, 1], :]).flatten(1)
        return rows[self.dict_tensor[flat], :].reshape(*idx.shape, self.ttm.embedding_dim)
