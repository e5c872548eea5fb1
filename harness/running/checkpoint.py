"""A long cell's checkpoint, so that a cell stopped in mid-training resumes instead of starting over.

:func:`write` and :func:`write_at_stop` save it beside the runs file (:func:`path_for`), atomically;
:func:`load` returns it only for the same layout, spec and code, read as data, else ``(None, why)``.
When and why: docs/pipeline.md, "Stopping, resuming, unlocking"; docs/design-notes.md.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import settings
from harness.spec import HASHES

if TYPE_CHECKING:
    from harness.running.cell import CellState
    from harness.spec import Spec

CHECKPOINT_ENV = "COMERA_BENCH_CHECKPOINT_S"
CHECKPOINT_EVERY_S = settings.SETTINGS[CHECKPOINT_ENV].default
"""Seconds of training between two checkpoints of a cell, unless CHECKPOINT_ENV says otherwise."""
FORMAT = 2
"""The checkpoint layout's version; a file of another is not used."""
RUNS_SUFFIX = ".runs.parquet"


def every_s() -> float | None:
    """Seconds between checkpoints: CHECKPOINT_ENV when set (0: none), else CHECKPOINT_EVERY_S; a value that
    is not a number >= 0 raises ValueError naming the variable."""
    return settings.read(CHECKPOINT_ENV)


def path_for(runs_out: str | os.PathLike) -> Path:
    """The checkpoint of the cell whose runs row goes to ``runs_out``: ``<run_id>.checkpoint.pt`` beside
    it."""
    runs_out = Path(runs_out)
    name = runs_out.name
    stem = name[:-len(RUNS_SUFFIX)] if name.endswith(RUNS_SUFFIX) else runs_out.stem
    return runs_out.with_name(f"{stem}.checkpoint.pt")


@dataclass(frozen=True)
class Checkpointing:
    """Where a cell's checkpoint lives (:func:`path_for`) and the seconds of training between two."""

    path: Path
    every_s: float


def checkpointing(spec: Spec, runs_out: str | os.PathLike) -> Checkpointing | None:
    """The checkpointing of the cell ``spec`` whose row goes to ``runs_out``: none for a cell of a timing
    group (short, and timed only in its group's rounds) or when checkpoints are turned off."""
    every = every_s()
    if every is None or spec.execution.timing_group:
        return None
    return Checkpointing(path_for(runs_out), every)


CODE_PACKAGES = ("harness", "comera", "baselines")
CODE_SUFFIXES = (".py", ".cpp", ".h", ".cu")
"""The code a checkpoint belongs to: these packages' (and the plug-in folders') files of these kinds."""


class Unusable(Exception):
    """A checkpoint that passed :func:`load` but could not be loaded into the method: the cell starts over
    with a method prepared afresh (harness.running.run)."""


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """A hash of the code this process runs, taken once (when first asked, before the first step): the
    path and content of every CODE_SUFFIXES file of CODE_PACKAGES and of the plug-in folders
    (harness.plugins), committed or not."""
    import importlib.util

    from harness import plugins

    folders = [(name, Path(folder)) for name in CODE_PACKAGES
               for folder in (importlib.util.find_spec(name).submodule_search_locations or ())]
    folders += [(f"plug-ins {folder}", folder) for folder in plugins.plugin_dirs()]
    digest = hashlib.sha256()
    for label, folder in folders:
        for path in sorted(q for q in folder.rglob("*") if q.suffix in CODE_SUFFIXES and q.is_file()):
            digest.update(f"{label}/{path.relative_to(folder).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def code_identity() -> dict[str, Any]:
    """What must not change between a checkpoint and its resumption: the sources (:func:`sources_digest`:
    an edit counts whether committed or not), the package's and torch's versions."""
    import torch

    import harness

    return {"sources": sources_digest(), "comera_bench_version": harness.package_version(),
            "torch_version": str(torch.__version__)}


def rng_state() -> dict[str, Any]:
    """Every random number generator a training step may draw from (Python, NumPy, torch's CPU and CUDA),
    as tensors and plain values (what ``torch.load(weights_only=True)`` reads back)."""
    import numpy as np  # lazily (here and below): a cell's supervisor needs only path_for, and quickly
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    state = {"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": numpy_state}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators to :func:`rng_state`'s ``state``."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _rng_problem(state: Any) -> str:
    """Why ``state`` is not a :func:`rng_state` this process can restore ("" when it is), found on
    generators of its own (the process's are left as they are)."""
    import numpy as np
    import torch

    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        return "its random number generators are missing"
    try:
        random.Random().setstate(state["python"])
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.RandomState().set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.Generator().set_state(state["torch"])
        if "cuda" in state and not (isinstance(state["cuda"], list)
                                    and all(isinstance(t, torch.Tensor) for t in state["cuda"])):
            raise TypeError("the CUDA states are not a list of tensors")
    except Exception as exc:  # noqa: BLE001 -- whatever the file holds: say what
        return f"its random number generator states cannot be restored ({type(exc).__name__}: {exc})"
    return ""


def save(path: str | os.PathLike, spec: dict[str, Any], content: dict[str, Any]) -> None:
    """Write ``content`` (with ``spec``, the code's identity and the time) to ``path`` atomically and
    durably."""
    import torch

    from harness.atomic import atomic_write  # lazily: the supervisor checks every_s, quickly

    payload = {"format": FORMAT, "spec": spec, "code": code_identity(),
               "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **content}
    atomic_write(path, lambda tmp: torch.save(payload, tmp), fsync=True)


RESUMED_FIELDS = ("steps_done", "epoch", "curves", "losses", "last_eval", "last_eval_step", "stage",
                  "stage_switch_step", "full_epochs_s", "flops_initial", "flops_tokens", "flops_basis",
                  "train_s_before")
"""The CellState fields a checkpoint carries (with ``resumed``): everything the row and the curves need
of the steps before it. Step times, the machine's state and peak memory are each process's own."""
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "steps_done": (int,), "epoch": (int,), "curves": (list,), "losses": (list,), "last_eval": (dict,),
    "last_eval_step": (int,), "full_epochs_s": (list,), "flops_tokens": (dict,), "flops_basis": (dict,),
    "train_s_before": (int, float), "resumed": (list,), "stage_switch_step": (int, type(None)),
    "flops_initial": (int, type(None))}


def _layout_problem(saved: Any) -> str:
    """Why ``saved`` (what the file holds) is not a checkpoint of this layout ("" when it is)."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        return f"it is not a checkpoint of format {FORMAT}"
    wrong = [key for key, typ in (("spec", dict), ("code", dict), ("written_at", str), ("method", dict),
                                  ("cell", dict)) if not isinstance(saved.get(key), typ)]
    if wrong:
        return f"it lacks or has the wrong type of {', '.join(wrong)}"
    cell = saved["cell"]
    wrong = [key for key in (*RESUMED_FIELDS, "resumed")
             if key not in cell or not isinstance(cell[key], _FIELD_TYPES.get(key, (object,)))
             or isinstance(cell[key], bool)]
    if wrong or cell["steps_done"] < 0:
        return f"its cell state lacks or has the wrong type of {', '.join(wrong or ['steps_done'])}"
    return _rng_problem(saved.get("rng"))


def _load_error(exc: Exception) -> str:
    """The line of ``torch.load``'s error that says what was wrong (its weights-only refusals are long)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported" in line or line.startswith("WeightsUnpickler error: ")]
    if not named and exc.__context__ is not None:
        return _load_error(exc.__context__)
    return f"{type(exc).__name__}: {(named or lines or [''])[0][:300]}"


def load(path: str | os.PathLike, spec: dict[str, Any], steps_in_epoch: int | None = None
         ) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint at ``path`` when the cell ``spec`` (normalized) can resume from it, with ``""``; else
    None and why not (``""`` when there is no file). The file is read as data only: one that holds
    anything but tensors and plain values is refused, and nothing in it runs. With ``steps_in_epoch`` (the
    cell's, as its workload was built), its counters must lie within the spec's budget
    (:func:`counters_problem`)."""
    import torch

    path = Path(path)
    if not path.exists():
        return None, ""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- truncated, foreign or crafted: start over, say why
        return None, (f"cannot read {path} ({_load_error(exc)}); a checkpoint is read as data only (tensors "
                      "and plain values), so nothing in this file ran")
    problem = _layout_problem(saved)
    if problem:
        return None, f"{path} is not a usable checkpoint: {problem}"
    if saved["spec"] != spec:
        differ = sorted(key for key in set(spec) | set(saved["spec"])
                        if spec.get(key) != saved["spec"].get(key))
        derived = [key for key in differ if key not in (*HASHES, "run_id")]
        named = ", ".join(map(str, derived or differ))
        return None, f"{path} belongs to another spec (it differs in {named})"
    code = code_identity()
    if saved["code"] != code:
        differ = [f"{key} {saved['code'].get(key)!r} -> {value!r}" for key, value in code.items()
                  if saved["code"].get(key) != value]
        return None, f"{path} was written by other code ({'; '.join(differ)})"
    if steps_in_epoch is not None:
        problem = counters_problem(saved["cell"], spec["budget"]["epochs"], steps_in_epoch)
        if problem:
            return None, f"{path} is not a usable checkpoint: {problem}"
    return saved, ""


def counters_problem(cell: dict[str, Any], epochs: int, steps_in_epoch: int) -> str:
    """Why a checkpoint's cell state (of the right types) does not fit a budget of ``epochs`` epochs of
    ``steps_in_epoch`` steps ("" when it does): ``steps_done`` in [0, the budget's steps], ``epoch`` one of
    its epochs, ``last_eval_step`` in [-1, ``steps_done``], ``stage_switch_step`` (when set) in [0,
    ``steps_done``], the training seconds and each whole epoch's a finite number >= 0, at most one whole
    epoch time per epoch, ``flops_initial`` (when set) >= 0."""
    total = epochs * steps_in_epoch
    done = cell["steps_done"]
    budget = f"the budget's {epochs} epoch(s) of {steps_in_epoch} step(s)"
    if not 0 <= done <= total:
        return f"its steps_done {done} is outside [0, {total}], {budget}"
    if not 0 <= cell["epoch"] < epochs:
        return f"its epoch {cell['epoch']} is outside [0, {epochs - 1}], {budget}"
    if not -1 <= cell["last_eval_step"] <= done:
        return f"its last_eval_step {cell['last_eval_step']} is outside [-1, {done}] (its steps_done)"
    switch = cell["stage_switch_step"]
    if switch is not None and not 0 <= switch <= done:
        return f"its stage_switch_step {switch} is outside [0, {done}] (its steps_done)"
    seconds = [("train_s_before", cell["train_s_before"])]
    seconds += [("full_epochs_s", value) for value in cell["full_epochs_s"]]
    for key, value in seconds:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                  and value >= 0):
            return f"its {key} holds {value!r}, not a finite number of seconds >= 0"
    if len(cell["full_epochs_s"]) > epochs:
        return f"its full_epochs_s holds {len(cell['full_epochs_s'])} epoch times, {budget}"
    if cell["flops_initial"] is not None and cell["flops_initial"] < 0:
        return f"its flops_initial {cell['flops_initial']} is below 0"
    return ""


def resume(st: CellState) -> dict[str, Any] | None:
    """When the cell ``st`` (its method prepared, its ``steps_in_epoch`` set) has a checkpoint it can resume
    from (:func:`load`, its counters within the budget): load the method's state into ``st.prepared`` and
    what the earlier processes recorded into ``st``; returns the checkpoint (the runner restores its ``rng``
    right before the first step). Otherwise None, having said on stderr why a checkpoint that is there is
    not used.

    Raises:
        Unusable: the method could not take the saved state; ``st.prepared`` may hold part of it (the runner
            prepares the method again), ``st`` is unchanged otherwise.
    """
    if st.checkpoint is None:
        return None
    run_id = st.spec.run_id
    saved, why_not = load(st.checkpoint.path, st.spec.to_dict(), st.steps_in_epoch)
    if saved is None:
        if why_not:
            print(f"{run_id}: starting over: the checkpoint is not used: {why_not}",
                  file=sys.stderr, flush=True)
        return None
    try:
        st.prepared.load_state_dict(saved["method"])
    except Exception as exc:  # noqa: BLE001 -- whatever the saved state holds
        raise Unusable(f"{st.checkpoint.path} does not fit the method ({type(exc).__name__}: {exc})") from exc
    cell = saved["cell"]
    for key in RESUMED_FIELDS:
        setattr(st, key, cell[key])
    st.resumed = [*cell["resumed"], {"step": st.steps_done, "checkpoint_written_at": saved["written_at"]}]
    print(f"{run_id}: resuming at step {st.steps_done} from its checkpoint {st.checkpoint.path} (written "
          f"{saved['written_at']})", file=sys.stderr, flush=True)
    return saved


def due(st: CellState) -> bool:
    """Whether ``every_s`` seconds have passed since the cell's last checkpoint (or its first step here)."""
    return st.checkpoint is not None and time.perf_counter() - st.last_checkpoint >= st.checkpoint.every_s


def write(st: CellState) -> None:
    """Write the cell's checkpoint between two steps, outside every clock, the memory region and the time
    limit. One that cannot be written, for whatever reason (a full disk: OSError, or RuntimeError from
    ``torch.save``), is said on stderr and in ``st.checkpoint_error``; the last one written stays, the
    training goes on and the next interval tries again."""
    from harness.running.cell import training_s

    started = time.perf_counter()
    monitor = st.monitor if st.monitor is not None and st.monitor.running else None
    cell = {key: getattr(st, key) for key in RESUMED_FIELDS}
    cell.update(train_s_before=training_s(st), resumed=st.resumed)
    try:
        with (monitor.paused() if monitor else contextlib.nullcontext()), st.epoch_clock.paused():
            save(st.checkpoint.path, st.spec.to_dict(),
                 {"method": st.prepared.state_dict(), "rng": rng_state(), "cell": cell})
        st.checkpoints_written += 1
        st.last_checkpoint_step = st.steps_done
    except Exception as exc:  # noqa: BLE001 -- a checkpoint is never worth the cell
        st.checkpoint_error = f"after step {st.steps_done}: {type(exc).__name__}: {exc}"
        print(f"{st.spec.run_id}: the checkpoint could not be written {st.checkpoint_error}; training goes "
              "on, the next checkpoint is tried in the next interval", file=sys.stderr, flush=True)
    st.checkpoint_s += time.perf_counter() - started
    st.last_checkpoint = time.perf_counter()


def write_at_stop(st: CellState) -> str:
    """At the end of the step a stop signal waited for: write the checkpoint unless written at this step;
    returns what became of it, for the stop's message."""
    if st.last_checkpoint_step != st.steps_done:  # None before the first
        write(st)
    return "written" if st.last_checkpoint_step == st.steps_done else f"not written ({st.checkpoint_error})"
