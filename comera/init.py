"""Initialization of TT / TTM cores: per-core standard deviations that give the full weight's entries a
target standard deviation.

With ``d`` independent zero-mean Gaussian cores of std ``s_k`` and internal bonds ``r_1 .. r_{d-1}``,
an entry of the full tensor has variance ``prod_k s_k^2 * prod_j r_j``. Two ways to split it:

* ``"default"``: the same std for every core, ``(target^2 / prod_j r_j) ** (1 / 2d)``.
* ``"official"``: the official code's (ziyangjoy/CoMERA ``TensorTrain.build_factors_Gaussian``):
  ``s_k = target ** (1/d) / sqrt(r_{k+1})``, so the first cores are larger than the last.

Both give the same full-weight variance; they differ in the cores' magnitudes, which the gate and core
penalties of rank adaptation see.
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
