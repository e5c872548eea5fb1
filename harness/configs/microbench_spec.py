"""The micro-benchmark spec (docs/usage.md, ``comera-bench microbench``): its keys, defaults and checks.

:func:`check_spec` lives here so the config check need not import the benchmark (torch, the profiler).
"""
from __future__ import annotations

import math
from typing import Any

from harness.core import allocator
from harness.spec import MAX_ROUNDS, MAX_SEED, MAX_THREADS

DIRECTIONS = ("fwd", "fwd_bwd")
LINEAR_VARIANTS = ("dense", "tt")
EMBEDDING_VARIANTS = ("dense_grad", "sparse_grad", "ttm_naive", "ttm_order", "ttm_unique", "ttm_optimized")

_SPEC_KEYS = {"device", "num_threads", "min_run_time_s", "rounds", "seed", "memory", "allocator", "linear",
              "embedding"}
_LINEAR_KEYS = {"layers", "ranks", "tokens", "directions", "variants"}
_EMBEDDING_KEYS = {"tables", "indices", "zipf_exponent", "variants", "directions"}
_TABLE_KEYS = {"num_embeddings", "embedding_dim", "row_shape", "col_shape", "rank"}
_DEFAULTS = {"device": "auto", "num_threads": 2, "min_run_time_s": 0.5, "rounds": 5, "seed": 0,
             "memory": True, "allocator": "reuse"}


def check_spec(spec: Any, *, source: str = "spec") -> dict[str, Any]:
    """The spec with defaults filled; unknown keys or bad values (a NaN or infinite number anywhere among
    them) raise ValueError naming them.

    Args:
        spec: the spec as read (a mapping: device, num_threads, min_run_time_s (each timing round's blocks),
            rounds, seed, memory, allocator, linear, embedding).
        source: what the messages call it (a file, a config key).
    """
    if not isinstance(spec, dict):
        raise ValueError(f"microbench {source}: expected a mapping, got {type(spec).__name__}")
    _check_keys(spec, _SPEC_KEYS, source)
    out = {**_DEFAULTS, **spec}
    if out["device"] not in ("cpu", "cuda", "auto"):
        raise ValueError(f"microbench {source}: device={out['device']!r}, expected cpu, cuda or auto")
    if out["allocator"] not in allocator.POLICIES:
        raise ValueError(f"microbench {source}: allocator={out['allocator']!r}, expected one of "
                         f"{list(allocator.POLICIES)}")
    for key, least, most in (("num_threads", 1, MAX_THREADS), ("rounds", 1, MAX_ROUNDS),
                             ("seed", 0, MAX_SEED)):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or not least <= out[key] <= most:
            raise ValueError(f"microbench {source}: {key}={out[key]!r} must be an integer from {least} to "
                             f"{most}")
    if not _finite(out["min_run_time_s"]) or out["min_run_time_s"] <= 0:
        raise ValueError(f"microbench {source}: min_run_time_s={out['min_run_time_s']!r} must be a finite "
                         "number > 0")
    if "linear" in out:
        lin = out["linear"]
        _check_keys(lin, _LINEAR_KEYS, f"{source}: linear")
        out["linear"] = lin = {"directions": list(DIRECTIONS), "variants": list(LINEAR_VARIANTS), **lin}
        for layer in lin.get("layers", []):
            _check_keys(layer, {"in_shape", "out_shape"}, f"{source}: linear.layers")
        _check_choices(lin["directions"], DIRECTIONS, f"{source}: linear.directions")
        _check_choices(lin["variants"], LINEAR_VARIANTS, f"{source}: linear.variants")
        _check_positive_ints(lin.get("tokens", []), f"{source}: linear.tokens")
        _check_positive_ints(lin.get("ranks", []), f"{source}: linear.ranks")
    if "embedding" in out:
        emb = out["embedding"]
        _check_keys(emb, _EMBEDDING_KEYS, f"{source}: embedding")
        out["embedding"] = emb = {"zipf_exponent": 1.05, "directions": list(DIRECTIONS),
                                  "variants": list(EMBEDDING_VARIANTS), **emb}
        for table in emb.get("tables", []):
            _check_keys(table, _TABLE_KEYS, f"{source}: embedding.tables")
        _check_choices(emb["directions"], DIRECTIONS, f"{source}: embedding.directions")
        _check_choices(emb["variants"], EMBEDDING_VARIANTS, f"{source}: embedding.variants")
        _check_positive_ints(emb.get("indices", []), f"{source}: embedding.indices")
        if not _finite(emb["zipf_exponent"]) or emb["zipf_exponent"] < 0:
            raise ValueError(f"microbench {source}: embedding.zipf_exponent={emb['zipf_exponent']!r} must "
                             "be a finite number >= 0")
    _check_finite(out, "", source)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_finite(value: Any, where: str, source: str) -> None:
    """ValueError naming the key (``linear.layers[0].in_shape[0]``) of a NaN or infinite number in it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"microbench {source}: {where}={value!r} must be a finite number")
    if isinstance(value, dict):
        items = [(f"{where}.{key}" if where else str(key), item) for key, item in value.items()]
    else:
        items = [(f"{where}[{i}]", item) for i, item in enumerate(value)] if isinstance(value, list) else []
    for key, item in items:
        _check_finite(item, key, source)


def _check_keys(mapping: Any, allowed: set[str], where: str) -> None:
    if not isinstance(mapping, dict):
        raise ValueError(f"microbench {where}: expected a mapping, got {mapping!r}")
    for key in mapping:
        if key not in allowed:
            raise ValueError(f"microbench {where}: unknown key {key!r}; allowed keys: {sorted(allowed)}")


def _check_choices(values: Any, allowed: tuple[str, ...], where: str) -> None:
    for value in values:
        if value not in allowed:
            raise ValueError(f"microbench {where}: unknown value {value!r}; allowed: {list(allowed)}")


def _check_positive_ints(values: Any, where: str) -> None:
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"microbench {where}: {value!r} must be a positive integer")

