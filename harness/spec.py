"""A cell's spec: its keys, defaults and checks, its name, purpose and two hashes (docs/usage.md).

:func:`make` is the one place a spec is made and normalized: keys checked, the config schema's defaults
filled (:data:`SCHEMA_KEYS`; tests/harness/test_spec.py), params resolved by their owners. A :class:`Spec`
is frozen; :meth:`Spec.to_dict` is its JSON.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from harness.core import allocator

PURPOSES = ("timing", "quality")
"""A cell's purpose: short runs for time and memory, or training long enough to compare accuracy."""
DEFAULT_PURPOSE = PURPOSES[0]
"""The purpose of a spec that names none."""
DEVICES = ("cpu", "cuda", "auto")
"""Values of execution.device (also ``cuda:N``); auto: cuda when available, else cpu."""
MATMUL_PRECISIONS = ("highest", "high", "medium")
"""Values of execution.matmul_precision (torch.set_float32_matmul_precision; highest = full FP32)."""
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A run_id is a plain file name (it names the cell's files): no "/", not starting with "." or "-"."""
MAX_RUN_ID = 150
"""The longest cell name: it names files such as .<run_id>.runs.parquet.<host>.<pid>.<random>.tmp."""
MAX_SEED = 2**32 - 1
"""The largest seed: numpy's seeds are 32-bit."""
MAX_THREADS = 1024
"""The most torch threads of a cell: the config's cap (``execution.threads`` in the config schema)."""
MATCH_PARAM = "match_run"
"""The method param of a size-matched cell: the run_id of the cell whose reached size it matches
(docs/workloads.md); the grid fills it, the cell's name takes that cell's target."""
HASHES = ("cell_hash", "execution_hash")
"""Keys of a spec's JSON derived from the rest (:attr:`Spec.cell_hash`, :attr:`Spec.execution_hash`)."""

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SpecError(ValueError):
    """An invalid spec; the message names the key and the value."""


def slug(text: str) -> str:
    """A file-name-safe lower-case form of ``text`` ("NVIDIA H200" -> "nvidia-h200"): every run of
    characters other than letters, digits, ``.``, ``_`` and ``-`` becomes one ``-``."""
    return _SAFE.sub("-", text.strip().lower()).strip("-") or "device"


@dataclass(frozen=True)
class Budget:
    """How long a cell trains (the config's ``budget``)."""

    epochs: int = 1
    max_steps_per_epoch: int | None = None
    warmup_steps: int = 2
    eval_every_steps: int | None = None
    time_limit_s: float | None = None


@dataclass(frozen=True)
class Execution:
    """How a cell runs: where, with how many threads, under which wrappers, in which timing rounds."""

    device: str = "auto"
    num_threads: int = 2
    cuda_graph: bool = False
    compile: bool = False
    matmul_precision: str = "highest"
    allocator: str = "reuse"
    rounds: int = 5
    timing_group: str | None = None


SCHEMA_KEYS: dict[str, str | None] = {
    "purpose": None, "workload": None, "method": None, "batch_size": None, "run_id": None,
    "variant": "methods.*.variant", "workload_params": "workloads.*.params",
    "method_params": "methods.*.params",
    "target_ratio": "workloads.*.targets", "seed": "seeds",
    **{f"budget.{f.name}": f"$defs.budget.{f.name}" for f in dataclasses.fields(Budget)},
    "execution.device": "execution.device", "execution.num_threads": "execution.threads",
    "execution.cuda_graph": "execution.cuda_graph", "execution.compile": "execution.compile",
    "execution.matmul_precision": "execution.matmul_precision", "execution.rounds": "execution.rounds",
    "execution.allocator": None, "execution.timing_group": None,
}
"""Each spec key -> the config schema key whose default it shares (a list's one item for the grid's axes),
or None: no default (workload, method, batch_size), derived by the grid (purpose, run_id, timing_group)
or not in a config (allocator: ``comera-bench run --allocator``)."""


class ParamChecks(NamedTuple):
    """The owners' checks that resolve a cell's params: ``workload(name, params)`` and ``method(name,
    params)`` return the full params (defaults filled, numbers of float parameters as floats) or raise
    ValueError naming the key."""

    workload: Callable[[str, dict[str, Any]], dict[str, Any]]
    method: Callable[[str, dict[str, Any]], dict[str, Any]]


def registry_checks() -> ParamChecks:
    """The checks of the workload and method registries (harness.workloads, baselines; plug-ins included)."""
    import baselines
    import harness.workloads as workloads

    return ParamChecks(workloads.check_params, baselines.check_params)


AS_WRITTEN = ParamChecks(lambda name, params: dict(params), lambda name, params: dict(params))
"""Params kept as written (a toy registry's cells, whose names no registry knows)."""


def _digest(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Spec:
    """One cell, complete and checked (:func:`make`); ``workload_params`` and ``method_params`` are resolved
    and not to be changed."""

    run_id: str
    purpose: str
    workload: str
    workload_params: dict[str, Any]
    method: str
    variant: str
    method_params: dict[str, Any]
    batch_size: int
    target_ratio: float | None
    seed: int
    budget: Budget
    execution: Execution

    @functools.cached_property
    def cell_hash(self) -> str:
        """What the cell computes: workload and method with their resolved params, variant, batch size,
        target, seed, purpose and budget. Not where or how it runs (:attr:`execution_hash`): the same cell
        on two devices has the same cell hash (harness.reports.compare pairs cells by it)."""
        return _digest({k: v for k, v in self.content().items() if k not in ("run_id", "execution")})

    @functools.cached_property
    def execution_hash(self) -> str:
        """How the cell runs: the execution keys (device, threads, CUDA graph, compile, matmul precision,
        allocator, rounds, timing group)."""
        return _digest(dataclasses.asdict(self.execution))

    def content(self) -> dict[str, Any]:
        """The spec's keys as JSON values, without the hashes."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(workload_params=dict(self.workload_params), method_params=dict(self.method_params),
                   budget=dataclasses.asdict(self.budget), execution=dataclasses.asdict(self.execution))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The spec's JSON object: its keys and its two hashes."""
        return {**self.content(), "cell_hash": self.cell_hash, "execution_hash": self.execution_hash}

    def with_execution(self, **changes: Any) -> Spec:
        """This spec with execution keys changed (checked as :func:`make` checks them)."""
        execution = {**dataclasses.asdict(self.execution), **changes}
        return make({**self.content(), "execution": execution}, AS_WRITTEN)


MAX_MAGNITUDE = 2**32
"""The largest size of any number in a spec or config (a seed's range; the schema bounds most keys
tighter): a larger one (``batch_sizes: [1e30]``, ``lr: 1e308``, ``d_model: 2**62``) is refused, naming the
key, instead of crashing every cell that uses it."""


def _check_int(where: str, value: Any, minimum: int, *, optional: bool = False, maximum: int = MAX_MAGNITUDE,
               shown: str = "2**32") -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(f"spec {where} must be an integer from {minimum} to {shown}, got {value!r}")


def _number(where: str, value: Any, check: Callable[[float], bool], what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not check(value):
        raise SpecError(f"spec {where} must be null or {what}, got {value!r}")
    return float(value)


def _section(where: str, given: Any, cls: type) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise SpecError(f"spec {where} must be a mapping, got {given!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise SpecError(f"unknown key {where}.{unknown[0]}; allowed keys: {sorted(names)}")
    return {**dataclasses.asdict(cls()), **given}


def _budget(given: Any) -> Budget:
    b = _section("budget", given, Budget)
    _check_int("budget.epochs", b["epochs"], 1)
    _check_int("budget.max_steps_per_epoch", b["max_steps_per_epoch"], 1, optional=True)
    _check_int("budget.warmup_steps", b["warmup_steps"], 0)
    _check_int("budget.eval_every_steps", b["eval_every_steps"], 1, optional=True)
    b["time_limit_s"] = _number("budget.time_limit_s", b["time_limit_s"], lambda v: v > 0,
                                "a finite number > 0")
    return Budget(**b)


def _execution(given: Any) -> Execution:
    ex = _section("execution", given, Execution)
    if ex["device"] not in DEVICES and not str(ex["device"]).startswith("cuda:"):
        raise SpecError(f"spec execution.device must be cpu|cuda|auto, got {ex['device']!r}")
    _check_int("execution.num_threads", ex["num_threads"], 1, maximum=MAX_THREADS, shown=str(MAX_THREADS))
    for key in ("cuda_graph", "compile"):
        if not isinstance(ex[key], bool):
            raise SpecError(f"spec execution.{key} must be true or false, got {ex[key]!r}")
    if ex["matmul_precision"] not in MATMUL_PRECISIONS:
        raise SpecError(f"spec execution.matmul_precision must be one of {list(MATMUL_PRECISIONS)}, "
                        f"got {ex['matmul_precision']!r}")
    if ex["allocator"] not in allocator.POLICIES:
        raise SpecError(f"spec execution.allocator must be one of {list(allocator.POLICIES)}, "
                        f"got {ex['allocator']!r}")
    _check_int("execution.rounds", ex["rounds"], 1)
    if ex["timing_group"] is not None and not isinstance(ex["timing_group"], str):
        raise SpecError(f"spec execution.timing_group must be null or a string, got {ex['timing_group']!r}")
    return Execution(**ex)


def _params(key: str, name: str, given: Any, check: Callable[[str, dict[str, Any]], dict[str, Any]]
            ) -> dict[str, Any]:
    if given is not None and not isinstance(given, Mapping):
        raise SpecError(f"spec {key} must be a mapping of parameter names to values, got {given!r}")
    try:
        return dict(check(name, dict(given or {})))
    except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
        raise SpecError(f"spec {key}: {err}") from err


def run_id(spec: Mapping[str, Any], suffix: str = "", entry: str | None = None) -> str:
    """The cell's name from a spec's JSON (its workload, method, variant, batch, target, seed, execution
    wrappers and purpose), starting with its config entry's name (default the workload's); ``suffix``
    names a sweep point. A cell without a target whose method params name a ``match_run`` (a size-matched
    cell) takes that cell's target in its name."""
    execution = spec.get("execution") or {}
    target = "none" if spec.get("target_ratio") is None else f"{spec['target_ratio']:g}"
    matched = (spec.get("method_params") or {}).get(MATCH_PARAM)
    if target == "none" and isinstance(matched, str):  # a size-matched cell: the target it matches
        target = (re.search(r"_t([^_]+)_s\d", matched) or [None, "match"])[1]
    precision = execution.get("matmul_precision", "highest")
    graph = ("_cg" if execution.get("cuda_graph") else "") + ("_compiled" if execution.get("compile") else "")
    graph += f"_matmul-{precision}" if precision != "highest" else ""
    quality = "_quality" if spec.get("purpose", DEFAULT_PURPOSE) == PURPOSES[1] else ""
    name = f"{entry or spec['workload']}_{spec['method']}-{spec.get('variant', 'default')}"
    return slug(f"{name}_b{spec['batch_size']}_t{target}_s{spec.get('seed', 0)}{graph}{suffix}{quality}")


def make(raw: Mapping[str, Any], checks: ParamChecks | None = None) -> Spec:
    """A complete, checked :class:`Spec` from a spec's JSON object.

    Args:
        raw: the keys of :class:`Spec` (workload, method and batch_size required; the rest default);
            ``cell_hash`` and ``execution_hash`` may be present and are derived again, never read.
        checks: resolve the params (default :func:`registry_checks`; :data:`AS_WRITTEN` keeps them).

    Returns:
        The spec. Where no run_id is given (``comera-bench run`` with cell options, a spec file without
        one) it is :func:`run_id` followed by ``_c`` and the first 8 characters of the cell hash: not a
        name a config's grid gives (it names its cells itself, without the hash), and two such names are
        equal only for the same cell.

    Raises:
        SpecError: naming the key and the value.
    """
    if not isinstance(raw, Mapping):
        raise SpecError(f"a spec must be a JSON object, got {type(raw).__name__}")
    keys = [f.name for f in dataclasses.fields(Spec)]
    unknown = sorted(set(raw) - set(keys) - set(HASHES))
    if unknown:
        raise SpecError(f"unknown spec key {unknown[0]!r}; allowed keys: {keys}")
    for key in ("workload", "method", "batch_size"):
        if key not in raw:
            raise SpecError(f"spec is missing the key {key!r}")
    out = {k: v for k, v in raw.items() if k not in HASHES}
    out.setdefault("variant", "default")
    for key in ("workload", "method", "variant"):
        if not isinstance(out[key], str) or not out[key]:
            raise SpecError(f"spec {key} must be a non-empty string, got {out[key]!r}")
    _check_int("batch_size", out["batch_size"], 1)
    out.setdefault("seed", 0)
    _check_int("seed", out["seed"], 0, maximum=MAX_SEED, shown="2**32 - 1")
    out.setdefault("purpose", DEFAULT_PURPOSE)
    if out["purpose"] not in PURPOSES:
        raise SpecError(f"spec purpose must be one of {list(PURPOSES)}, got {out['purpose']!r}")
    out["target_ratio"] = _number("target_ratio", out.get("target_ratio"), lambda v: 0 < v <= 1, "in (0, 1]")
    given = out.get("run_id")
    if given and (not isinstance(given, str) or not RUN_ID_PATTERN.fullmatch(given)):
        raise SpecError(f"spec run_id must be a plain file name (letters, digits, . _ -; not starting "
                        f"with '.' or '-'), got {out['run_id']!r}")
    checks = checks or registry_checks()
    out["workload_params"] = _params("workload_params", out["workload"], out.get("workload_params"),
                                     checks.workload)
    out["method_params"] = _params("method_params", out["method"], out.get("method_params"), checks.method)
    out["budget"] = _budget(out.get("budget"))
    out["execution"] = _execution(out.get("execution"))
    if not out.get("run_id"):  # a name of the grid's scheme that says which cell it is
        cell = Spec(**{**out, "run_id": "-"}).cell_hash
        out["run_id"] = run_id({**out, "execution": dataclasses.asdict(out["execution"])}) + f"_c{cell[:8]}"
    if len(out["run_id"]) > MAX_RUN_ID:
        raise SpecError(f"spec run_id must be at most {MAX_RUN_ID} characters (it names files), got "
                        f"{out['run_id']!r} ({len(out['run_id'])}); give a shorter run_id or variant")
    return Spec(**out)


def load(path: str | os.PathLike, checks: ParamChecks | None = None) -> Spec:
    """The spec of a JSON file (:func:`make`); SpecError naming the file when it cannot be read."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read spec {path}: {exc}") from exc
    return make(raw, checks)


def write(spec: Spec, path: str | os.PathLike) -> None:
    """Write a spec's JSON (sorted keys, hashes included: an unchanged spec gives identical bytes)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True) + "\n")
