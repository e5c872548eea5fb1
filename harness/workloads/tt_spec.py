"""TT / TTM shapes and ranks for the ``tt_spec`` of a workload (format: comera.convert.tensorize).

Linear layers take three input modes and the reversed output modes (768 -> [12, 8, 8]), ranks clipped on
each bond to what the modes allow (the paper's [1, 12, r, r, r, 12, 1]).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from comera.shapes import factorize

#: The paper's mode sizes (transformer and, for 1024/4096, CodeBERT-large); others are factorized.
PAPER_MODES = {768: (12, 8, 8), 3072: (16, 16, 12), 1024: (16, 8, 8), 4096: (16, 16, 16)}


def linear_modes(n: int, num_modes: int = 3) -> tuple[int, ...]:
    """Mode sizes of a linear layer's input dimension ``n`` (its output uses them reversed)."""
    if num_modes == 3 and n in PAPER_MODES:
        return PAPER_MODES[n]
    return tuple(factorize(n, num_modes))


def clipped_ranks(mode_sizes: Sequence[int], rank: int) -> list[int]:
    """[1, r_1, ..., r_{d-1}, 1] with r_k = min(rank, prod(modes[:k]), prod(modes[k:]))."""
    d = len(mode_sizes)
    inner = [min(rank, math.prod(mode_sizes[:k]), math.prod(mode_sizes[k:])) for k in range(1, d)]
    return [1, *inner, 1]


def linear_spec(in_features: int, out_features: int, rank: int) -> dict[str, Any]:
    in_shape = list(linear_modes(in_features))
    out_shape = list(reversed(linear_modes(out_features)))
    return {"kind": "linear", "in_shape": in_shape, "out_shape": out_shape,
            "rank": clipped_ranks(in_shape + out_shape, rank)}


def embedding_spec(num_embeddings: int, embedding_dim: int, rank: int, *,
                   row_shape: Sequence[int] | None = None, col_shape: Sequence[int] | None = None,
                   num_modes: int = 3) -> dict[str, Any]:
    """A TTM embedding; rows padded up (prod(row_shape) >= num_embeddings), columns exact."""
    rows = list(row_shape) if row_shape else list(factorize(num_embeddings, num_modes, allow_larger=True))
    cols = list(col_shape) if col_shape else list(factorize(embedding_dim, len(rows)))
    if len(rows) != len(cols) or math.prod(rows) < num_embeddings or math.prod(cols) != embedding_dim:
        raise ValueError(f"TTM shapes rows={rows} cols={cols} do not fit a "
                         f"{num_embeddings}x{embedding_dim} table")
    return {"kind": "embedding", "row_shape": rows, "col_shape": cols,
            "rank": clipped_ranks([m * n for m, n in zip(rows, cols)], rank), "lookup": "optimized"}


def tt_parameter_count(spec: dict[str, Any]) -> int:
    """Scalars in the cores of one spec entry (gates and bias excluded)."""
    if spec["kind"] == "linear":
        modes = [*spec["in_shape"], *spec["out_shape"]]
    else:
        modes = [m * n for m, n in zip(spec["row_shape"], spec["col_shape"])]
    r = spec["rank"]
    return sum(r[k] * modes[k] * r[k + 1] for k in range(len(modes)))


def embedding_shapes(p: dict[str, Any], known: dict[tuple[int, int], tuple[list[int], list[int]]]
                     ) -> tuple[list[int] | None, list[int] | None]:
    """The params' TTM shapes, else the ``known`` table's for this (vocab_size, d_model), else None
    (factorized automatically)."""
    if p["embedding_row_shape"] or p["embedding_col_shape"]:
        return p["embedding_row_shape"], p["embedding_col_shape"]
    return known.get((p["vocab_size"], p["d_model"]), (None, None))
