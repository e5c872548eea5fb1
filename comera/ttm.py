"""TT-matrix (TTM) embedding table with diagonal rank gates and the optimized lookup of CoMERA Sec. 4.1.

:class:`TTMEmbedding`: ``lookup="naive"`` contracts each index's chain of core slices, ``"optimized"``
computes the unique rows from two half tables in chunks (:class:`HalfTableRows`). The table's formula and
the lookups: docs/design-notes.md.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from comera import plain
from comera.init import core_stds
from comera.reload import ResizeOnLoad
from comera.tt import bond_sizes, forward_gates, outside_autocast, parameter_entries
from comera.ttsvd import relative_error, tt_svd

LOOKUP_MODES = ("naive", "optimized")
CHUNK_BYTES = 4 * 2 ** 20
"""Default ``chunk_bytes`` of :class:`TTMEmbedding`: bytes of gathered half-table rows per
``HalfTableRows`` chunk (forward and backward alike). A constant; pass ``chunk_bytes`` to change it."""


class TTMEmbedding(ResizeOnLoad, nn.Module):
    """Embedding table in TT-matrix format with rank gates (drop-in for ``nn.Embedding``'s forward).

    Args:
        num_embeddings: rows of the table.
        embedding_dim: size of each embedding vector.
        row_shape: modes whose product is at least ``num_embeddings`` (default: automatic, three modes).
        col_shape: modes whose product is ``embedding_dim``, as many as ``row_shape`` (default: automatic).
        rank: one int for every internal bond (clipped to the maximal TT rank) or ``[1, r_1, ..., 1]``.
        padding_idx: a row that is always zero and gets no gradient, as in ``nn.Embedding``.
        lookup: "optimized" (both lookup levels, docs/design-notes.md) or "naive" (neither).
        tensor_index_level: overrides the tensor-index level of ``lookup``.
        unique_rows: overrides the row level of ``lookup``.
        init_std: std of the full table's entries at initialization (``nn.Embedding``: 1).
        init: "default" or "official": how ``init_std`` is split among the cores (:mod:`comera.init`).
        chunk_bytes: bytes of gathered half-table rows per chunk of the tensor-index lookup (default
            :data:`CHUNK_BYTES`); smaller chunks bound the lookup's working memory, larger ones launch fewer
            products.
        device, dtype: factory arguments of the parameters.

    Attributes:
        gate_threshold: None (raw gates) or a threshold below which the forward zeroes gate entries, see
            :func:`comera.tt.forward_gates`.
        reconstruction_error: set by :meth:`from_embedding`.

    Indices are range-checked on CPU only (a check on CUDA would sync with the host).

    Shape:
        - Input: integer tensor ``(*)`` (int32 or int64).
        - Output: ``(*, embedding_dim)``.

    Example::

        >>> table = TTMEmbedding(30000, 768, row_shape=(30, 40, 25), col_shape=(12, 8, 8), rank=30)
        >>> table(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3, 768])
    """

    gate_threshold: float | None = None

    def __init__(self, num_embeddings: int, embedding_dim: int, *, row_shape: Sequence[int] | None = None,
                 col_shape: Sequence[int] | None = None, rank: int | Sequence[int],
                 padding_idx: int | None = None, lookup: str = "optimized",
                 tensor_index_level: bool | None = None, unique_rows: bool | None = None,
                 init_std: float = 1.0, init: str = "default", chunk_bytes: int = CHUNK_BYTES, device=None,
                 dtype=None):
        super().__init__()
        if chunk_bytes <= 0:
            raise ValueError(f"TTMEmbedding: chunk_bytes={chunk_bytes} must be positive")
        self.chunk_bytes = int(chunk_bytes)
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(f"TTMEmbedding: num_embeddings={num_embeddings} and "
                             f"embedding_dim={embedding_dim} must be positive")
        if lookup not in LOOKUP_MODES:
            raise ValueError(f"TTMEmbedding: lookup={lookup!r}, expected one of {LOOKUP_MODES}")
        row_shape, col_shape = _resolve_shapes(num_embeddings, embedding_dim, row_shape, col_shape)
        if padding_idx is not None:
            if padding_idx < 0:
                padding_idx += num_embeddings
            if not 0 <= padding_idx < num_embeddings:
                raise ValueError(f"TTMEmbedding: padding_idx={padding_idx} outside [0, {num_embeddings})")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.row_shape = row_shape
        self.col_shape = col_shape
        self.padding_idx = padding_idx
        self.lookup = lookup
        optimized = lookup == "optimized"
        self.tensor_index_level = optimized if tensor_index_level is None else bool(tensor_index_level)
        self.unique_rows = optimized if unique_rows is None else bool(unique_rows)
        ranks = _resolve_ranks(rank, [m * n for m, n in zip(row_shape, col_shape)])
        factory = {"device": device, "dtype": dtype}
        self.init_std, self.init = init_std, init
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(ranks[k], row_shape[k], col_shape[k], ranks[k + 1], **factory))
            for k in range(len(row_shape)))
        self.gates = nn.ParameterList(nn.Parameter(torch.empty(ranks[k + 1], **factory))
                                      for k in range(len(row_shape) - 1))
        self.reset_parameters()
        self.reconstruction_error: float | None = None  # set by the TT-SVD constructor

    def reset_parameters(self) -> None:
        """Cores normal with the stds :func:`comera.init.core_stds` gives for ``init_std`` and ``init`` at
        the current ranks; gates to ones (as at construction; also after ``to_empty``)."""
        with torch.no_grad():
            for core, std in zip(self.cores, core_stds(self.ranks, self.init_std, self.init)):
                core.normal_(0.0, std)
            for gate in self.gates:
                gate.fill_(1.0)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, *, rank: int | Sequence[int],
                       row_shape: Sequence[int] | None = None, col_shape: Sequence[int] | None = None,
                       lookup: str = "optimized") -> "TTMEmbedding":
        """A TTMEmbedding holding the TT-SVD (TT-matrix format) of a trained ``embedding``'s table at
        ``rank`` (rows beyond ``num_embeddings`` padded with zeros; ``padding_idx`` kept).

        A bond keeps fewer ranks than asked where the table's unfolding has fewer singular values.
        ``reconstruction_error`` on the result is ``||T - T_tt||_F / ||T||_F`` of the table as looked up
        (the padding row zero in both)."""
        table = embedding.weight.detach()
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, row_shape=row_shape,
                    col_shape=col_shape,
                    rank=rank, padding_idx=embedding.padding_idx, lookup=lookup, device=table.device,
                    dtype=table.dtype)
        rows, cols, d = layer.row_shape, layer.col_shape, len(layer.row_shape)
        padded = table.new_zeros(math.prod(rows), math.prod(cols))
        padded[: embedding.num_embeddings] = table
        if layer.padding_idx is not None:
            padded[layer.padding_idx] = 0
        # (m_1..m_d, n_1..n_d) -> (m_1, n_1, ..., m_d, n_d): TT-SVD over the paired modes m_k n_k
        paired = padded.reshape(*rows, *cols).permute(*[i for k in range(d) for i in (k, d + k)])
        cores = tt_svd(paired.contiguous(), [m * n for m, n in zip(rows, cols)], layer.ranks)
        layer.cores = nn.ParameterList(
            nn.Parameter(c.reshape(c.shape[0], m, n, c.shape[-1]).to(table))
            for c, m, n in zip(cores, rows, cols))
        layer.gates = nn.ParameterList(nn.Parameter(table.new_ones(c.shape[-1])) for c in cores[:-1])
        with torch.no_grad():
            layer.reconstruction_error = relative_error(padded[: embedding.num_embeddings],
                                                        layer.dense_weight())
        return layer

    @property
    def ranks(self) -> list[int]:
        """Current TT ranks ``[1, r_1, ..., r_{d-1}, 1]`` (read from the core shapes)."""
        return list(bond_sizes(parameter_entries(self.cores)))

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, row_shape={self.row_shape}, "
                f"col_shape={self.col_shape}, ranks={self.ranks}, padding_idx={self.padding_idx}, "
                f"tensor_index_level={self.tensor_index_level}, unique_rows={self.unique_rows}")

    def gated_cores(self) -> list[torch.Tensor]:
        """Cores with each gate folded into the last axis of the core before its bond."""
        cores, gates = parameter_entries(self.cores), forward_gates(self)
        return [core * gates[k] if k < len(gates) else core for k, core in enumerate(cores)]

    def dense_weight(self) -> torch.Tensor:
        """The table as the layer uses it, ``(num_embeddings, embedding_dim)``; the padding row is zero."""
        full = _merge(self.gated_cores())  # (1, M, N, 1)
        weight = full.reshape(full.shape[1], full.shape[2])[: self.num_embeddings]
        if self.padding_idx is not None:
            keep = torch.ones(self.num_embeddings, 1, device=weight.device, dtype=weight.dtype)
            keep[self.padding_idx] = 0
            weight = weight * keep
        return weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"TTMEmbedding: indices must be int32/int64, got {idx.dtype}")
        plain_ops, compiling = plain.active(), torch.compiler.is_compiling()
        if compiling and not idx.is_cuda:  # reading the bounds would break the graph: a traced check
            torch._assert_async(((idx >= 0) & (idx < self.num_embeddings)).all(),
                                f"TTMEmbedding: index out of range [0, {self.num_embeddings})")
        bounds = _index_bounds(idx, plain_ops) if not (idx.is_cuda or compiling) and idx.numel() else None
        if bounds is not None and (bounds[0] < 0 or bounds[1] >= self.num_embeddings):
            raise IndexError(f"TTMEmbedding: index out of range [0, {self.num_embeddings}): "
                             f"min {bounds[0]}, max {bounds[1]}")
        flat = idx.reshape(-1).long()
        if self.unique_rows and not (plain_ops or compiling or _capturing(flat)):
            # torch.unique syncs with the host (its size depends on the data): a CUDA graph being captured,
            # or torch.compile's graph, computes every row instead, which gives the same values
            rows, inverse = torch.unique(flat, return_inverse=True)
        else:
            rows, inverse = flat, None
        cores = self.gated_cores()
        out = (self._rows_by_halves(cores, rows) if self.tensor_index_level
               else self._rows_by_chain(cores, rows))
        if inverse is not None:
            out = out.index_select(0, inverse)  # faster than out[inverse] on CPU, forward and backward
        if self.padding_idx is not None:
            out = out * (flat != self.padding_idx).unsqueeze(-1).to(out.dtype)
        return out.reshape(*idx.shape, self.embedding_dim)

    def _mode_indices(self, rows: torch.Tensor, shape: Sequence[int]) -> list[torch.Tensor]:
        digits = []
        for size in reversed(shape):
            digits.append(rows % size)
            rows = torch.div(rows, size, rounding_mode="floor")
        return digits[::-1]

    def _rows_by_chain(self, cores: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Naive lookup: contract the chain of core slices of every row."""
        digits = self._mode_indices(rows, self.row_shape)
        acc = cores[0][0].index_select(0, digits[0])  # (B, n_1, r_1)
        for core, digit in zip(cores[1:], digits[1:]):
            piece = core.permute(1, 0, 2, 3).index_select(0, digit)  # (B, r_k, n_k, r_{k+1})
            batch, cols, rank = acc.shape
            _, _, width, next_rank = piece.shape
            acc = torch.bmm(acc, piece.reshape(batch, rank, width * next_rank))
            acc = acc.reshape(batch, cols * width, next_rank)
        return acc.reshape(rows.shape[0], self.embedding_dim)

    def _rows_by_halves(self, cores: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Tensor-index level: two half tables once per call, then one small matmul per row."""
        half = max(1, len(cores) // 2)
        left = _merge(cores[:half])  # (1, M_L, N_L, r)
        right_rows = math.prod(self.row_shape[half:])
        left_index = torch.div(rows, right_rows, rounding_mode="floor")
        if half == len(cores):
            return left[0].index_select(0, left_index).reshape(rows.shape[0], self.embedding_dim)
        right = _merge(cores[half:])  # (r, M_R, N_R, 1)
        right_table = right[..., 0].permute(1, 0, 2).contiguous()  # (M_R, r, N_R); gathers copy whole rows
        right_index = rows % right_rows
        out = outside_autocast(lambda lt, rt: _half_table_rows(lt, rt, left_index, right_index,
                                                               self.chunk_bytes),
                               rows.device.type, left[0], right_table)  # both tables in one dtype
        return out.reshape(rows.shape[0], self.embedding_dim)


class HalfTableRows(torch.autograd.Function):
    """Rows ``left[left_index[b]] @ right[right_index[b]]``, ``(B, N_L, N_R)``, computed ``chunk`` rows at a
    time; ``left`` is ``(M_L, N_L, r)``, ``right`` is ``(M_R, r, N_R)``. Saves the two tables and the index
    vectors only; backward gathers each chunk's rows again and adds their gradients into the tables."""

    @staticmethod
    def forward(ctx, left, right, left_index, right_index, chunk):
        if chunk <= 0:
            raise ValueError(f"HalfTableRows: chunk={chunk} must be positive")
        ctx.save_for_backward(left, right, left_index, right_index)
        ctx.chunk = chunk
        out = left.new_empty(left_index.shape[0], left.shape[1], right.shape[2])
        for start, stop in _spans(left_index.shape[0], chunk):
            torch.bmm(left.index_select(0, left_index[start:stop]),
                      right.index_select(0, right_index[start:stop]), out=out[start:stop])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        left, right, left_index, right_index = ctx.saved_tensors
        need_left, need_right = ctx.needs_input_grad[:2]
        grad_left = torch.zeros_like(left, memory_format=torch.contiguous_format) if need_left else None
        grad_right = torch.zeros_like(right, memory_format=torch.contiguous_format) if need_right else None
        for start, stop in _spans(left_index.shape[0], ctx.chunk):
            grad = grad_out[start:stop]
            left_pos, right_pos = left_index[start:stop], right_index[start:stop]
            if need_left:  # no names: one gathered block and one gradient block alive at a time
                grad_left.index_add_(0, left_pos, torch.bmm(grad, right.index_select(0, right_pos).mT))
            if need_right:
                grad_right.index_add_(0, right_pos, torch.bmm(left.index_select(0, left_pos).mT, grad))
        return grad_left, grad_right, None, None, None


def _index_bounds(idx: torch.Tensor, plain_ops: bool) -> tuple[int, int] | None:
    """``(min, max)`` of the indices; None inside :func:`comera.plain_autograd` where they cannot be read
    (under ``torch.func.vmap``: there an index out of range fails in the gather, or, below the table's
    padded size, is not caught)."""
    try:
        return int(idx.min()), int(idx.max())
    except RuntimeError:
        if plain_ops:
            return None
        raise


def _capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s CUDA stream is capturing a CUDA graph (never on a CPU tensor)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _half_table_rows(left: torch.Tensor, right: torch.Tensor, left_index: torch.Tensor,
                     right_index: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
    """``HalfTableRows`` with chunks whose gathered left and right rows fill ``chunk_bytes``."""
    if plain.active():  # every gathered row saved by autograd: no chunks
        return torch.bmm(left.index_select(0, left_index), right.index_select(0, right_index))
    row_bytes = (left[0].numel() + right[0].numel()) * left.element_size()
    return plain.apply(HalfTableRows, left, right, left_index, right_index,
                       max(1, chunk_bytes // max(1, row_bytes)))


def _spans(total: int, chunk: int):
    """``(start, stop)`` of consecutive blocks of ``chunk`` rows covering ``range(total)``."""
    return ((start, min(start + chunk, total)) for start in range(0, total, chunk))


def _merge(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract consecutive TTM cores ``(r_a, m, n, r_b)`` into one ``(r_a, prod m, prod n, r_last)``."""
    out = cores[0]
    for core in cores[1:]:
        ra, m1, n1, _ = out.shape
        _, m2, n2, rc = core.shape
        out = torch.einsum("aijb,bklc->aikjlc", out, core).reshape(ra, m1 * m2, n1 * n2, rc)
    return out


def _resolve_shapes(num_embeddings: int, embedding_dim: int, row_shape, col_shape) -> tuple[tuple, tuple]:
    if row_shape is None or col_shape is None:
        from comera.shapes import factorize  # only needed for automatic shapes
        order = len(row_shape if row_shape is not None else col_shape) if (row_shape or col_shape) else 3
        if row_shape is None:
            row_shape = factorize(num_embeddings, order, allow_larger=True)
        if col_shape is None:
            col_shape = factorize(embedding_dim, order)
    row_shape, col_shape = tuple(int(m) for m in row_shape), tuple(int(n) for n in col_shape)
    if len(row_shape) != len(col_shape) or not row_shape:
        raise ValueError(f"TTMEmbedding: row_shape {row_shape} and col_shape {col_shape} need the same "
                         "non-zero number of modes")
    if min(row_shape + col_shape) <= 0:
        raise ValueError(f"TTMEmbedding: mode sizes must be positive, got {row_shape}, {col_shape}")
    if math.prod(row_shape) < num_embeddings:
        raise ValueError(f"TTMEmbedding: prod(row_shape={row_shape}) = {math.prod(row_shape)} "
                         f"< num_embeddings={num_embeddings}")
    if math.prod(col_shape) != embedding_dim:
        raise ValueError(f"TTMEmbedding: prod(col_shape={col_shape}) = {math.prod(col_shape)} "
                         f"!= embedding_dim={embedding_dim}")
    return row_shape, col_shape


def _resolve_ranks(rank: int | Sequence[int], mode_sizes: Sequence[int]) -> list[int]:
    """``[1, r_1, ..., r_{d-1}, 1]``; an int is clipped per bond to the maximal TT rank."""
    d = len(mode_sizes)
    max_ranks = [min(math.prod(mode_sizes[:k]), math.prod(mode_sizes[k:])) for k in range(1, d)]
    if isinstance(rank, int):
        if rank < 0:
            raise ValueError(f"rank={rank} must be >= 0")
        return [1] + [min(rank, top) for top in max_ranks] + [1]
    ranks = [int(r) for r in rank]
    if len(ranks) != d + 1 or ranks[0] != 1 or ranks[-1] != 1 or min(ranks) < 0:
        raise ValueError(f"rank list {list(rank)} must be [1, r_1, ..., r_{d - 1}, 1] with {d + 1} "
                         "non-negative entries")
    return ranks

