"""How a ``runs`` row ran: its execution columns (``cuda_graph``, ``compile``, ``matmul_precision``) read
as the reports tell executions apart -- :func:`graphed`, :func:`paper_execution` and the label
:func:`execution_label` adds to a method's name. A row's variant is its config's; these columns alone say how
it ran (docs/schema.md)."""
from __future__ import annotations

from typing import Any

import pandas as pd

PRECISION_NAMES = {"high": "TF32", "medium": "bfloat16"}
"""What a matmul precision other than ``highest`` (full FP32) computes in, as a label names it."""


def graphed(runs: pd.DataFrame) -> pd.Series:
    """Which rows ran their step in a CUDA graph (the ``cuda_graph`` column; null reads as no)."""
    return runs.cuda_graph.fillna(False).astype(bool)


def paper_execution(runs: pd.DataFrame, *, graphs: bool = False) -> pd.Series:
    """Which rows ran as the paper's: eagerly (with ``graphs`` also in a CUDA graph), not under
    torch.compile, at full FP32 matmul precision (``highest``; null reads as such)."""
    plain = ~runs["compile"].fillna(False).astype(bool) & runs.matmul_precision.fillna("highest").eq("highest")
    return plain if graphs else plain & ~graphed(runs)


def execution_label(row: Any) -> str:
    """What a row's execution adds to its method's label: " + CUDA graph", " (compiled)", " TF32 (high)"
    (or " bfloat16 (medium)") for each setting it ran with; "" for an eager FP32 row.

    Args:
        row: a runs row (a Series or ``itertuples`` tuple) with ``cuda_graph``, ``compile`` and
            ``matmul_precision``; a missing or null value reads as the eager FP32 default.

    Example:
        >>> execution_label(pd.Series({"cuda_graph": True, "compile": False, "matmul_precision": "high"}))
        ' + CUDA graph TF32 (high)'
    """
    def on(name: str) -> bool:
        value = getattr(row, name, None)
        return bool(value) if value is not None and not pd.isna(value) else False

    precision = getattr(row, "matmul_precision", None)
    label = (" + CUDA graph" if on("cuda_graph") else "") + (" (compiled)" if on("compile") else "")
    if isinstance(precision, str) and precision != "highest":
        label += f" {PRECISION_NAMES.get(precision, 'matmul')} ({precision})"
    return label
