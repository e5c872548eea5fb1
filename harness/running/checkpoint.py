"""A long cell's checkpoint, so that a cell stopped in mid-training resumes instead of starting over.

A stopped cell gets no row and runs again (harness.running.supervise): without a checkpoint it runs again
from its first step, which costs hours for the paper's quality cells. ``comera-bench run`` (hence the
pipeline) writes the checkpoint of a cell that is not in a timing group every :func:`every_s` seconds of
training (environment variable ``COMERA_BENCH_CHECKPOINT_S``; 0: never) to :func:`path_for` its runs
file (``<run_id>.checkpoint.pt``, beside it), atomically, between two training steps, and once more when
a stop signal reaches it in its training steps (:func:`stopping_at_a_step`). What it holds:
the method's state (:meth:`baselines.base.Prepared.state_dict`), the random number generators, where the
cell is in its data, and what harness.running.run has recorded so far (see there).

The next run of the cell starts from it when the spec and the code are the same (:func:`load`); anything
else -- another spec, another git commit, package or torch version, an unreadable file -- starts over, and
the log says why. Once the cell has a row (any status), its checkpoint is removed; a row written by the
supervisor for a cell whose process died (the OOM killer) leaves it, and says so.

Example::

    path = checkpoint.path_for("results/cpu/runs/cell.runs.parquet")  # .../cell.checkpoint.pt
    saved, why_not = checkpoint.load(path, spec)                       # (None, "") when there is none
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from harness.core import stops
from harness.core.clock import env_seconds
from harness.atomic import atomic_write

if TYPE_CHECKING:
    from harness.running.cell import CellState
    from harness.spec import Spec

STOP_GRACE_S = 5.0
"""How long a cell stopped in mid-training may take to finish its step and write its checkpoint; past it
(or at a second stop signal) the process ends without one, as it would without checkpoints."""
SAME_STOP_S = 1.0
"""Stop signals within this many seconds of the first are copies of it, not a second stop: a pipeline's
stop reaches a cell from Snakemake and again from the cell's supervisor (harness.core.stops)."""
CHECKPOINT_ENV = "COMERA_BENCH_CHECKPOINT_S"
CHECKPOINT_EVERY_S = 600.0
"""Seconds of training between two checkpoints of a cell, unless CHECKPOINT_ENV says otherwise."""
FORMAT = 1
"""The checkpoint layout's version; a file of another is not used."""
RUNS_SUFFIX = ".runs.parquet"


def every_s() -> float | None:
    """Seconds between checkpoints: CHECKPOINT_ENV when set (0: none), else CHECKPOINT_EVERY_S; a value that
    is not a number >= 0 raises ValueError naming the variable."""
    return env_seconds(CHECKPOINT_ENV, CHECKPOINT_EVERY_S, "the checkpoint interval", "no checkpoints")


def path_for(runs_out: str | os.PathLike) -> Path:
    """The checkpoint of the cell whose runs row goes to ``runs_out``: ``<run_id>.checkpoint.pt`` beside it."""
    runs_out = Path(runs_out)
    name = runs_out.name
    stem = name[:-len(RUNS_SUFFIX)] if name.endswith(RUNS_SUFFIX) else runs_out.stem
    return runs_out.with_name(f"{stem}.checkpoint.pt")


@dataclass
class StopRequest:
    """A stop signal received while the cell trains (:func:`stopping_at_a_step`)."""

    signum: int | None = None
    received_at: float = 0.0
    """time.monotonic() of the first stop signal."""
    at_steps: bool = False
    """Whether the cell is in its training steps, where a stop waits for the end of the step."""
    timer: threading.Timer | None = None
    """Ends the process STOP_GRACE_S after the stop unless the cell got there first."""


@dataclass(frozen=True)
class Checkpointing:
    """Where a cell's checkpoint lives (:func:`path_for`), the seconds of training between two, and a stop
    signal received while it trains (then the checkpoint is written at the end of the step)."""

    path: Path
    every_s: float
    stop: StopRequest = field(default_factory=StopRequest, compare=False)


class Stopped(BaseException):
    """A stop signal ended the training after a step and its checkpoint (no row: the cell runs again and
    resumes). A BaseException: the runner does not turn it into a failure row."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@contextlib.contextmanager
def stopping_at_a_step(checkpoint: Checkpointing | None) -> Iterator[None]:
    """While the block runs the cell: SIGTERM, SIGINT or SIGHUP in its training steps lets the step finish,
    the checkpoint be written and the process end by that signal (so its supervisor reads an interrupted
    cell), within STOP_GRACE_S; before or after the steps, or at a second stop (a signal SAME_STOP_S or
    more after the first), it ends at once, as without checkpoints. Nothing changes without checkpointing, outside the main thread, or for a signal
    the process ignores."""
    if checkpoint is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    request = checkpoint.stop

    def on_stop(signum: int, _frame: object) -> None:
        if request.signum is not None and time.monotonic() - request.received_at < SAME_STOP_S:
            return  # the same stop, passed on once more
        if request.signum is not None or not request.at_steps:
            _end_by(signum)
            return
        request.signum, request.received_at = signum, time.monotonic()
        request.timer = threading.Timer(STOP_GRACE_S, _end_by, (signum,))
        request.timer.daemon = True
        request.timer.start()

    previous = {sig: signal.getsignal(sig) for sig in stops.STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(sig, on_stop)
    try:
        yield
    except Stopped as stop:
        print(stop, file=sys.stderr, flush=True)
        _end_by(stop.signum)
    finally:  # a stop in the last step: the row was written first, the process ends as it would anyway
        if request.timer is not None:
            request.timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _end_by(signum: int) -> None:
    """End this process by ``signum``'s default action."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def in_steps(st: CellState, steps: bool) -> None:
    """The cell enters (True) or leaves its training steps, where a stop signal waits for the step's end."""
    if st.checkpoint is not None:
        st.checkpoint.stop.at_steps = steps


def stop_if_asked(st: CellState) -> None:
    """At the end of a training step: after a stop signal, write the checkpoint (unless written at this
    step) and raise :class:`Stopped`."""
    request = st.checkpoint.stop if st.checkpoint is not None else None
    if request is None or request.signum is None:
        return
    if st.last_checkpoint_step != st.steps_done:  # None before the first
        write(st)
    name = signal.Signals(request.signum).name
    raise Stopped(f"{st.spec.run_id}: stopped by {name} after step {st.steps_done}; its checkpoint is "
                  f"{'written' if not st.checkpoint_error else 'not written (' + st.checkpoint_error + ')'}, "
                  "no row: the cell resumes from it next time", request.signum)


def checkpointing(spec: Spec, runs_out: str | os.PathLike) -> Checkpointing | None:
    """The checkpointing of the cell ``spec`` whose row goes to ``runs_out``: none for a cell of a timing
    group (short, and timed only in its group's rounds) or when checkpoints are turned off."""
    every = every_s()
    if every is None or spec.execution.timing_group:
        return None
    return Checkpointing(path_for(runs_out), every)


def code_identity() -> dict[str, Any]:
    """What must not change between a checkpoint and its resumption: the git commit and whether the tree
    was dirty, the package's and torch's versions."""
    from harness import results

    prov = results.provenance("cpu")
    return {key: prov[key] for key in ("git_commit", "git_dirty", "comera_bench_version", "torch_version")}


def rng_state() -> dict[str, Any]:
    """Every random number generator a training step may draw from (Python, NumPy, torch's CPU and CUDA)."""
    import numpy as np  # lazily (here and below): a cell's supervisor needs only path_for, and quickly
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators to :func:`rng_state`'s ``state``."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: str | os.PathLike, spec: dict[str, Any], content: dict[str, Any]) -> None:
    """Write ``content`` (with ``spec``, the code's identity and the time) to ``path`` atomically and
    durably."""
    import torch

    payload = {"format": FORMAT, "spec": spec, "code": code_identity(),
               "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **content}
    atomic_write(path, lambda tmp: torch.save(payload, tmp), fsync=True)


def load(path: str | os.PathLike, spec: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint at ``path`` when the cell ``spec`` (normalized) can resume from it, with ``""``; else
    None and why not (``""`` when there is no file)."""
    import torch

    path = Path(path)
    if not path.exists():
        return None, ""
    try:
        # the cell's own file, written by save() above: it holds Python objects (random states, settings)
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 -- a truncated or foreign file: start over, say why
        return None, f"cannot read {path} ({type(exc).__name__}: {exc})"
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        return None, f"{path} is not a checkpoint of format {FORMAT}"
    if saved["spec"] != spec:
        differ = sorted(key for key in set(spec) | set(saved["spec"]) if spec.get(key) != saved["spec"].get(key))
        derived = [key for key in differ if key not in ("cell_hash", "execution_hash", "run_id")]
        return None, f"{path} belongs to another spec (it differs in {', '.join(derived or differ)})"
    code = code_identity()
    if saved["code"] != code:
        differ = [f"{key} {saved['code'].get(key)!r} -> {value!r}" for key, value in code.items()
                  if saved["code"].get(key) != value]
        return None, f"{path} was written by other code ({'; '.join(differ)})"
    return saved, ""


RESUMED_FIELDS = ("steps_done", "epoch", "curves", "losses", "last_eval", "last_eval_step", "stage",
                  "stage_switch_step", "full_epochs_s", "flops_initial", "flops_tokens", "flops_basis",
                  "train_s_before")
"""The CellState fields a checkpoint carries (with ``resumed``): everything the row and the curves need
of the steps before it. Step times, the machine's state and peak memory are each process's own."""


def resume(st: CellState) -> dict[str, Any] | None:
    """When the cell ``st`` (its method prepared) has a checkpoint it can resume from (:func:`load`): load
    the method's state into ``st.prepared`` and what the earlier processes recorded into ``st``; returns the
    checkpoint (the runner restores its ``rng`` right before the first step). Otherwise None, having said on
    stderr why a checkpoint that is there is not used."""
    if st.checkpoint is None:
        return None
    run_id = st.spec.run_id
    saved, why_not = load(st.checkpoint.path, st.spec.to_dict())
    if saved is None:
        if why_not:
            print(f"{run_id}: starting over: the checkpoint is not used: {why_not}", file=sys.stderr, flush=True)
        return None
    st.prepared.load_state_dict(saved["method"])
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
    limit. One that cannot be written (a full disk) is said on stderr and in ``st.checkpoint_error``; the
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
    except OSError as exc:
        st.checkpoint_error = f"after step {st.steps_done}: {exc}"
        print(f"{st.spec.run_id}: the checkpoint could not be written {st.checkpoint_error}; training goes "
              "on, the next checkpoint is tried in the next interval", file=sys.stderr, flush=True)
    st.checkpoint_s += time.perf_counter() - started
    st.last_checkpoint = time.perf_counter()
