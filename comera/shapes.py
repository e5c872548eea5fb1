"""Factorizing a dimension into tensor-train mode sizes."""
from __future__ import annotations

import itertools
import math


def _spread(factors: tuple[int, ...]) -> float:
    """Sum of squared log-distances from the geometric mean: 0 for perfectly balanced factors."""
    logs = [math.log(f) for f in factors]
    mean = sum(logs) / len(logs)
    return sum((v - mean) ** 2 for v in logs)


def _exact_factorizations(n: int, num_modes: int, smallest: int = 1):
    """All non-decreasing tuples of ``num_modes`` integers >= ``smallest`` whose product is ``n``."""
    if num_modes == 1:
        if n >= smallest:
            yield (n,)
        return
    f = smallest
    while f ** num_modes <= n:
        if n % f == 0:
            for rest in _exact_factorizations(n // f, num_modes - 1, f):
                yield (f, *rest)
        f += 1


def factorize(n: int, num_modes: int, *, allow_larger: bool = False) -> tuple[int, ...]:
    """Balanced mode sizes for a dimension of size ``n``, largest first.

    With ``allow_larger=False`` the product is exactly ``n`` (a prime ``n`` gives ``(n, 1, ...)``).
    With ``allow_larger=True`` (embedding rows, which may be padded) the product is the smallest
    value >= ``n`` reachable with factors within a few units of ``n ** (1 / num_modes)``, the exact
    balanced factorization being preferred when it is no less balanced.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"factorize: n must be a positive integer, got {n!r}")
    if isinstance(num_modes, bool) or not isinstance(num_modes, int) or num_modes < 1:
        raise ValueError(f"factorize: num_modes must be a positive integer, got {num_modes!r}")
    exact = min(_exact_factorizations(n, num_modes), key=_spread)
    if not allow_larger:
        return tuple(sorted(exact, reverse=True))
    root = n ** (1.0 / num_modes)
    values = range(max(1, math.floor(root) - 2), math.ceil(root) + 3)
    candidates = [c for c in itertools.combinations_with_replacement(values, num_modes)
                  if math.prod(c) >= n]
    padded = min(candidates, key=lambda c: (math.prod(c), _spread(c)))
    best = exact if _spread(exact) <= _spread(padded) else padded
    return tuple(sorted(best, reverse=True))
