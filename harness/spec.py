"""A cell's spec: its keys, defaults and checks, its name, purpose and two hashes (docs/usage.md).

:class:`Spec`, :class:`Budget` and :class:`Execution` declare every key once (type, default, bounds, help;
:mod:`harness.params`): the config schema's budget and execution keys (harness.configs.schema) and the
cell options of ``comera-bench run`` are made from them. :func:`make` is the one place a spec is made:
keys checked, defaults filled, params resolved by their owners. A :class:`Spec` is frozen, its params
read-only; :meth:`Spec.to_dict` is its JSON.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple

from harness.core.allocator import POLICIES as ALLOCATOR_POLICIES
from harness.params import Field, Params, ReadOnlyDict, parse

PURPOSES = ("timing", "quality")
"""A cell's purpose: short runs for time and memory, or training long enough to compare accuracy."""
DEFAULT_PURPOSE = PURPOSES[0]
"""The purpose of a spec that names none."""
MATMUL_PRECISIONS = ("highest", "high", "medium")
"""Values of execution.matmul_precision (torch.set_float32_matmul_precision; highest = full FP32)."""
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A run_id is a plain file name (it names the cell's files): no "/", not starting with "." or "-"."""
MAX_RUN_ID = 150
"""The longest cell name: it names files such as .<run_id>.runs.parquet.<host>.<pid>.<random>.tmp."""
MAX_SEED = 2**32 - 1
"""The largest seed: numpy's seeds are 32-bit."""
MAX_THREADS = 1024
"""The most torch threads of a cell."""
MAX_ROUNDS = 1000
"""The most timing rounds of a cell (also of a microbenchmark spec)."""
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


class Budget(Params):
    """How long a cell trains (the config's ``budget``)."""

    epochs: int = Field(1, ge=1, le=100_000, description="passes over the training data")
    max_steps_per_epoch: int | None = Field(None, ge=1, le=10**9,
                                            description="steps of an epoch at most (null: the whole epoch)")
    warmup_steps: int = Field(2, ge=0, le=10**6,
                              description="first steps, run but not counted in the step times")
    eval_every_steps: int | None = Field(None, ge=1, le=10**9,
                                         description="evaluate every this many steps (null: per epoch)")
    time_limit_s: float | None = Field(
        None, gt=0, le=10**8,
        description="wall time from the first training step to the end of the final evaluation (warm-up, "
                    "data and model building not counted); past it the cell is \"timeout\" with its partial "
                    "numbers, and a step or evaluation still running 30 s later is ended by a watchdog "
                    "(harness/running/run.py)")


class Execution(Params):
    """How a cell runs: where, with how many threads, under which wrappers, in which timing rounds."""

    device: str = Field("auto", pattern=r"^(cpu|cuda|auto|cuda:[0-9]+)$", title="cpu, cuda, cuda:N or auto",
                        description="cpu, cuda, cuda:N or auto: cuda when available, else cpu")
    num_threads: int = Field(2, ge=1, le=MAX_THREADS, description="torch threads")
    cuda_graph: bool = Field(False, description="capture the training step in a CUDA graph")
    compile: bool = Field(False, description="run the model under torch.compile")
    matmul_precision: Literal[MATMUL_PRECISIONS] = Field(
        "highest", description="torch.set_float32_matmul_precision of the cell, applied before its model is "
                               "built (highest: full FP32, as the paper's; high: TF32 on NVIDIA GPUs; "
                               "medium: bfloat16)")
    allocator: Literal[ALLOCATOR_POLICIES] = Field(
        "reuse", description="CPU allocator policy (harness/core/allocator.py)")
    rounds: int = Field(5, ge=1, le=MAX_ROUNDS, description="timing rounds of a timing cell")
    timing_group: str | None = Field(None, description="the cells timed together in interleaved rounds")


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


MAX_MAGNITUDE = 2**32
"""The largest size of any number in a spec or config (a seed's range; the declarations bound most keys
tighter): a larger one (``batch_sizes: [1e30]``, ``lr: 1e308``, ``d_model: 2**62``) is refused, naming the
key, instead of crashing every cell that uses it."""


class Spec(Params):
    """One cell, complete and checked (:func:`make`); its params are resolved (:data:`ParamChecks`) and
    read-only."""

    run_id: str | None = Field(None, pattern=f"^{RUN_ID_PATTERN.pattern}$", max_length=MAX_RUN_ID,
                               title=f"a plain file name (letters, digits, . _ -; not starting with '.' or "
                                     f"'-') of at most {MAX_RUN_ID} characters",
                               description="the cell's name (it names its files); null: derived")
    purpose: Literal[PURPOSES] = Field(
        DEFAULT_PURPOSE, description="timing (a short run for time and memory) or quality (trained to "
                                     "compare accuracy; run_id has _quality)")
    workload: str = Field(min_length=1, description="a workload module or plug-in")
    workload_params: Mapping[str, Any] = Field(default_factory=dict)
    method: str = Field(min_length=1, description="a method module or plug-in")
    variant: str = Field("default", min_length=1, description="the method configuration's variant")
    method_params: Mapping[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(ge=1, le=2**20, description="samples per step")
    target_ratio: float | None = Field(
        None, gt=0, le=1, description="compression target (fraction of the tensorized size kept; null = "
                                      "early stage only)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="the seed of the data, the model and the run")
    budget: Budget = Field(default_factory=Budget)
    execution: Execution = Field(default_factory=Execution)

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
        return _digest(self.execution.as_dict())

    def content(self) -> dict[str, Any]:
        """The spec's keys as JSON values, without the hashes."""
        out = {name: getattr(self, name) for name in type(self).model_fields}
        out.update(workload_params=dict(self.workload_params), method_params=dict(self.method_params),
                   budget=self.budget.as_dict(), execution=self.execution.as_dict())
        return out

    def to_dict(self) -> dict[str, Any]:
        """The spec's JSON object: its keys and its two hashes."""
        return {**self.content(), "cell_hash": self.cell_hash, "execution_hash": self.execution_hash}

    def with_execution(self, **changes: Any) -> Spec:
        """This spec with execution keys changed (checked as :func:`make` checks them)."""
        return make({**self.content(), "execution": {**self.execution.as_dict(), **changes}}, AS_WRITTEN)


def _params(key: str, name: str, given: Mapping[str, Any],
            check: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Mapping[str, Any]:
    try:
        return ReadOnlyDict(check(name, dict(given)))
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
        raw: the keys of :class:`Spec` (workload, method and batch_size required; the rest default; a
            null budget or execution: the defaults); ``cell_hash`` and ``execution_hash`` may be present
            and are derived again, never read.
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
    given = {k: v for k, v in raw.items() if k not in HASHES and not (
        v is None and k in ("budget", "execution", "workload_params", "method_params", "run_id"))}
    try:
        spec = parse(Spec, given, owner="spec: ", noun="key")
    except ValueError as err:
        raise SpecError(str(err)) from None
    checks = checks or registry_checks()
    resolved = {"workload_params": _params("workload_params", spec.workload, spec.workload_params,
                                           checks.workload),
                "method_params": _params("method_params", spec.method, spec.method_params, checks.method)}
    spec = spec.model_copy(update=resolved)
    if spec.run_id:
        return spec
    content = spec.content()  # a name of the grid's scheme that says which cell it is
    name = run_id(content) + f"_c{Spec.model_construct(**{**dict(spec), 'run_id': '-'}).cell_hash[:8]}"
    if len(name) > MAX_RUN_ID:
        raise SpecError(f"spec run_id must be at most {MAX_RUN_ID} characters (it names files), got "
                        f"{name!r} ({len(name)}); give a shorter run_id or variant")
    return spec.model_copy(update={"run_id": name})


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
