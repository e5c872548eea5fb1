"""A cell's spec: its keys, their defaults and checks (:func:`normalize_spec`), its hash, reading it.

A spec is the JSON object that defines one cell (docs/usage.md); the pipeline writes one per cell, the
CLI builds one from its options. The defaults here are the config schema's (a test keeps them equal).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from harness.configs.grid import DEFAULT_PURPOSE, PURPOSES
from harness.configs.grid import MAX_MAGNITUDE, run_id as grid_run_id
from harness.core import allocator

SPEC_KEYS = ("run_id", "purpose", "workload", "workload_params", "method", "variant", "method_params",
             "batch_size", "target_ratio", "seed", "budget", "execution", "config_hash")
BUDGET_DEFAULTS: dict[str, Any] = {"epochs": 1, "max_steps_per_epoch": None, "warmup_steps": 2,
                                   "eval_every_steps": None, "time_limit_s": None}
"""The defaults of a cell's budget, the same as the config schema's (a test keeps them equal)."""
EXECUTION_DEFAULTS: dict[str, Any] = {"device": "auto", "num_threads": None, "cuda_graph": False,
                                      "compile": False, "matmul_precision": "highest", "allocator": "reuse",
                                      "rounds": 1, "timing_group": None}
MATMUL_PRECISIONS = ("highest", "high", "medium")
"""Values of execution.matmul_precision (torch.set_float32_matmul_precision; highest = full FP32)."""
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A run_id is a plain file name (it names the cell's files): no "/", not starting with "." or "-"."""

class SpecError(ValueError):
    """An invalid run spec; the message names the key and the value."""


def _check_int(where: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_MAGNITUDE:
        raise SpecError(f"spec {where} must be an integer from {minimum} to 2**32, got {value!r}")


def _fill(where: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise SpecError(f"spec {where} must be a mapping, got {given!r}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SpecError(f"unknown key {where}.{unknown[0]}; allowed keys: {sorted(defaults)}")
    return {**defaults, **given}


def config_hash(spec: dict[str, Any]) -> str:
    """The cell's identity: a hash of everything in a complete spec (:func:`normalize_spec`) that changes
    the result, i.e. every key but run_id and config_hash. The one definition: the pipeline's grid and
    the CLI both get it through :func:`normalize_spec`, so the same cell has the same hash."""
    content = {k: v for k, v in spec.items() if k not in ("run_id", "config_hash")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def normalize_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A complete spec: keys checked (unknown -> SpecError naming it), defaults filled, run_id and
    config_hash derived when absent."""
    if not isinstance(spec, dict):
        raise SpecError(f"a spec must be a JSON object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise SpecError(f"unknown spec key {unknown[0]!r}; allowed keys: {list(SPEC_KEYS)}")
    for key in ("workload", "method", "batch_size"):
        if key not in spec:
            raise SpecError(f"spec is missing the key {key!r}")
    out = dict(spec)
    out.setdefault("variant", "default")
    for key in ("workload", "method", "variant"):
        if not isinstance(out[key], str) or not out[key]:
            raise SpecError(f"spec {key} must be a non-empty string, got {out[key]!r}")
    _check_int("batch_size", out["batch_size"], 1)
    out.setdefault("seed", 0)
    _check_int("seed", out["seed"], 0)
    out.setdefault("purpose", DEFAULT_PURPOSE)
    if out["purpose"] not in PURPOSES:
        raise SpecError(f"spec purpose must be one of {list(PURPOSES)}, got {out['purpose']!r}")
    out.setdefault("target_ratio", None)
    tr = out["target_ratio"]
    if tr is not None and (isinstance(tr, bool) or not isinstance(tr, (int, float)) or not 0 < tr <= 1):
        raise SpecError(f"spec target_ratio must be null or in (0, 1], got {tr!r}")
    for key in ("workload_params", "method_params"):
        if out.get(key) is not None and not isinstance(out[key], dict):
            raise SpecError(f"spec {key} must be a mapping of parameter names to values, got {out[key]!r}")
        out[key] = dict(out.get(key) or {})
    budget = out["budget"] = _fill("budget", out.get("budget"), BUDGET_DEFAULTS)
    _check_int("budget.epochs", budget["epochs"], 1)
    _check_int("budget.max_steps_per_epoch", budget["max_steps_per_epoch"], 1, optional=True)
    _check_int("budget.warmup_steps", budget["warmup_steps"], 0)
    _check_int("budget.eval_every_steps", budget["eval_every_steps"], 1, optional=True)
    limit = budget["time_limit_s"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not math.isfinite(limit) or limit <= 0):
        raise SpecError(f"spec budget.time_limit_s must be null or a finite number > 0, got {limit!r}")
    ex = out["execution"] = _fill("execution", out.get("execution"), EXECUTION_DEFAULTS)
    if ex["device"] not in ("cpu", "cuda", "auto") and not str(ex["device"]).startswith("cuda:"):
        raise SpecError(f"spec execution.device must be cpu|cuda|auto, got {ex['device']!r}")
    if ex["num_threads"] is None:
        ex["num_threads"] = torch.get_num_threads()
    _check_int("execution.num_threads", ex["num_threads"], 1)
    for key in ("cuda_graph", "compile"):
        if not isinstance(ex[key], bool):
            raise SpecError(f"spec execution.{key} must be true or false, got {ex[key]!r}")
    if ex["matmul_precision"] not in MATMUL_PRECISIONS:
        raise SpecError(f"spec execution.matmul_precision must be one of {list(MATMUL_PRECISIONS)}, "
                        f"got {ex['matmul_precision']!r}")
    _check_int("execution.rounds", ex["rounds"], 1)
    if ex["timing_group"] is not None and not isinstance(ex["timing_group"], str):
        raise SpecError(f"spec execution.timing_group must be null or a string, got {ex['timing_group']!r}")
    if ex["allocator"] not in allocator.POLICIES:
        raise SpecError(f"spec execution.allocator must be one of {list(allocator.POLICIES)}, "
                        f"got {ex['allocator']!r}")
    out.setdefault("config_hash", "")
    if not isinstance(out["config_hash"], str):
        raise SpecError(f"spec config_hash must be a string (or absent), got {out['config_hash']!r}")
    if not out["config_hash"]:
        out["config_hash"] = config_hash(out)
    if not out.get("run_id"):  # the pipeline's scheme (harness.configs.grid.run_id)
        out["run_id"] = grid_run_id(out)
    if not isinstance(out["run_id"], str) or not RUN_ID_PATTERN.fullmatch(out["run_id"]):
        raise SpecError(f"spec run_id must be a plain file name (letters, digits, . _ -; not starting "
                        f"with '.' or '-'), got {out['run_id']!r}")
    return out


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    """Read a spec JSON file (SpecError naming the file when it is not valid JSON)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read spec {path}: {exc}") from exc
