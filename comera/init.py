"""Initialization of TT / TTM cores: per-core stds that give the full weight's entries a target std.

:func:`core_stds` splits it the ``"default"`` or the ``"official"`` way (formulas: docs/design-notes.md;
where each is used: docs/library-reference.md).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

INIT_SCHEMES = ("default", "official")


def core_stds(ranks: Sequence[int], target_std: float, scheme: str = "default") -> list[float]:
    """Std of each core for bond sizes ``ranks = [1, r_1, ..., r_{d-1}, 1]`` (a zero bond counts as 1)."""
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init scheme {scheme!r}, expected one of {INIT_SCHEMES}")
    d = len(ranks) - 1
    bonds = [max(int(r), 1) for r in ranks]
    if scheme == "official":
        return [target_std ** (1.0 / d) / math.sqrt(bonds[k + 1]) for k in range(d)]
    return [(target_std ** 2 / math.prod(bonds[1:-1])) ** (1.0 / (2 * d))] * d
