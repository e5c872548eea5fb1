"""Native (C++) execution of TT linear contraction plans: one dispatched op per forward, one per backward.

Results equal :mod:`comera.kernels`'. Built on first use; where it cannot be, the Python path runs with one
warning and :func:`status` says why. Build, environment and checks: docs/library-reference.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from comera.contraction import ContractionPlan, PlanSettings, make_plan

SOURCE = Path(__file__).resolve().parent / "csrc" / "tt_linear.cpp"
"""The C++ source of the ops."""
NAME = "comera_native"
"""The extension's (and the op namespace's) name."""
LIBRARY_ENV = "COMERA_NATIVE_LIBRARY"
"""The environment variable naming a prebuilt library to load instead of building."""
FAILED_MEMO = "build-failed.json"
"""The file in the build folder that remembers a failed build (the reason, and what it depended on)."""


class NativeStatus(NamedTuple):
    """Whether the native ops are in use, and why (not)."""

    in_use: bool
    reason: str


_lock = threading.Lock()
_state: NativeStatus | None = None  # None until the first attempt
_off = threading.local()  # .depth > 0 inside disabled()


def _build() -> NativeStatus:
    if os.environ.get("COMERA_NATIVE", "1").strip() == "0":
        return NativeStatus(False, "disabled by COMERA_NATIVE=0")
    skipped = ""  # why a prebuilt library named by LIBRARY_ENV was not used
    if os.environ.get(LIBRARY_ENV):
        library = Path(os.environ[LIBRARY_ENV])
        why_not = _load(library)
        if why_not is None:
            return NativeStatus(True, f"prebuilt {library}")
        skipped = f" ({LIBRARY_ENV}={library}: {why_not})"
    folder = Path(os.environ.get("COMERA_NATIVE_BUILD_DIR") or build_folder())
    built = folder / f"{NAME}.so"
    why_not = _load(built)
    if why_not is None:  # an earlier process built it for this source and torch
        return NativeStatus(True, f"built in {folder}{skipped}")
    memo, key = folder / FAILED_MEMO, _build_key()
    earlier = _read_json(memo)
    if earlier.get("key") == key:
        return _not_built(f"{earlier.get('error')} (an earlier build; delete {memo} to retry){skipped}")
    if why_not != "no such file":
        _discard(built, why_not)
    try:
        from torch.utils import cpp_extension

        cpp_extension.verify_ninja_availability()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            cpp_extension.load(name=NAME, sources=[str(SOURCE)], build_directory=str(folder),
                               extra_cflags=["-O2"], is_python_module=False, verbose=False)
        except Exception as exc:
            with contextlib.suppress(OSError):  # remembered for the next process, where the folder allows
                memo.write_text(json.dumps({"key": key, "error": _first_error(exc)}))
            raise
        torch.ops.comera_native.tt_forward  # noqa: B018 -- raises if the library registered nothing
        with contextlib.suppress(OSError):  # later processes load it directly (without cpp_extension)
            memo.unlink(missing_ok=True)
            built.with_suffix(".json").write_text(json.dumps({**library_metadata(), **file_record(built)}))
    except Exception as exc:  # no compiler, no ninja, a compile error: the Python path, said once
        return _not_built(f"{_first_error(exc)}{skipped}")
    return NativeStatus(True, f"built in {folder}{skipped}")


def _not_built(why: str) -> NativeStatus:
    reason = f"not built: {why}"
    warnings.warn(f"comera.native: {reason}; TT layers use the Python kernels", RuntimeWarning, stacklevel=4)
    return NativeStatus(False, reason)


def _discard(built: Path, why: str) -> None:
    """Remove the build folder's library ``built`` (and its ``.json``), which did not load for ``why``, so
    that the build makes it anew; not while another process builds there (it holds cpp_extension's lock
    file, and replaces the library itself)."""
    from torch.utils.file_baton import FileBaton

    baton = FileBaton(str(built.parent / "lock"))
    if not baton.try_acquire():
        return
    try:
        warnings.warn(f"comera.native: {built} is not used: {why}; building it again", RuntimeWarning,
                      stacklevel=4)
        for path in (built, built.with_suffix(".json")):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
    finally:
        baton.release()


def _load(library: Path) -> str | None:
    """Load ``library`` if the ``.json`` beside it matches :func:`library_metadata` and records the file's
    size and SHA-256 (:func:`file_record`); None when loaded, else why not."""
    if not library.is_file():
        return "no such file"
    made_for, wanted = _read_json(library.with_suffix(".json")), library_metadata()
    differ = ", ".join(f"{key} {made_for.get(key)} (here {value})" for key, value in wanted.items()
                       if made_for.get(key) != value)
    if differ:
        return f"skipped: built for {differ}"
    recorded = {key: made_for.get(key) for key in ("library_bytes", "library_sha256")}
    if None in recorded.values():
        return "skipped: its .json records no size and SHA-256 of the library (an older build)"
    found = file_record(library)
    if found != recorded:
        return (f"skipped: it has {found['library_bytes']} bytes and SHA-256 {found['library_sha256'][:12]}"
                f"..., its build recorded {recorded['library_bytes']} bytes and "
                f"{str(recorded['library_sha256'])[:12]}... (truncated, corrupt or replaced)")
    try:
        torch.ops.load_library(str(library))
        torch.ops.comera_native.tt_forward  # noqa: B018
    except Exception as exc:
        return f"did not load: {_first_error(exc)}"
    return None


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _build_key() -> str:
    """What a failed build depends on: the source, torch and the compiler ninja would run."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or "no c++"
    return f"{library_metadata()} {compiler}"


def library_metadata() -> dict[str, str]:
    """What a library built from :data:`SOURCE` is tied to: torch's version and the source's SHA-256 (the
    ``.json`` written beside a prebuilt library, checked before it is loaded)."""
    return {"torch": torch.__version__, "source_sha256": source_sha256()}


def file_record(library: Path) -> dict[str, object]:
    """What the ``.json`` beside a library records of the file itself, checked before it is loaded: its
    size (``library_bytes``) and SHA-256 (``library_sha256``)."""
    return {"library_bytes": library.stat().st_size,
            "library_sha256": hashlib.sha256(library.read_bytes()).hexdigest()}


def source_sha256() -> str:
    """The SHA-256 of :data:`SOURCE` (hex)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def build_folder() -> Path:
    """The default build folder: one per torch version and Python in torch's extension folder
    (``$TORCH_EXTENSIONS_DIR``, else ``torch_extensions`` in ``$XDG_CACHE_HOME`` or ``~/.cache``; found
    without importing :mod:`torch.utils.cpp_extension`, which a process that loads a built library skips)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cache / "torch_extensions")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return root / f"{NAME}-{python}-torch{torch.__version__}"


def _first_error(exc: Exception) -> str:
    """The line of a build failure that says what went wrong (a compiler's first "error:"), with its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line or "not found" in line]
    return f"{type(exc).__name__}: {(errors or lines or [''])[0]}"


def status() -> NativeStatus:
    """Whether the native ops are in use and why (not); builds (or loads) them on the first call.

    Returns:
        NativeStatus: ``in_use`` and a ``reason`` ("disabled by COMERA_NATIVE=0", "not built: ..." naming
        the error, or where it was built).
    """
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = _build()
    return _state


def known_status() -> NativeStatus | None:
    """:func:`status` if something has asked for it in this process (a TT layer ran), else None; never
    builds. For provenance: a run's row says which kernels its TT layers had."""
    return _state


def usable(plan: ContractionPlan) -> bool:
    """Whether :class:`comera.tt.TTLinearFunction` runs ``plan`` natively (:func:`comera.feed_forward` does
    when both layers' plans are usable): the ops are built, the plan contracts something (a rank-0 plan
    stays Python), no torch.compile trace is running (the compiler sees the Python kernels) and the call is
    not inside :func:`disabled`."""
    return not (plan.zero or torch.compiler.is_compiling() or getattr(_off, "depth", 0)
                or not status().in_use)


@contextlib.contextmanager
def disabled():
    """Within the block (this thread), TT layers run the Python kernels: for comparisons and measurements
    (a TorchDispatchMode that accounts for every ATen op sees a native op as one op, not its inner calls).

    Example::

        >>> with comera.native.disabled():
        ...     reference = layer(x)
    """
    _off.depth = getattr(_off, "depth", 0) + 1
    try:
        yield
    finally:
        _off.depth -= 1


def plan_args(plan: ContractionPlan) -> tuple:
    """The plan as the ops' trailing arguments: ``(m, left_groups, right_groups, dense, fold_bias)``."""
    return (len(plan.in_shape), list(plan.left_groups), list(plan.right_groups), plan.dense, plan.fold_bias)


class SavedParts(NamedTuple):
    """What ``tt_forward`` returns after ``y`` for ``tt_backward`` (a plan with groups), by kind; flattened
    in this order (:meth:`flat`) they are ``tt_backward``'s ``saved``."""

    gated: list[torch.Tensor]
    """The gated cores ``H_0 .. H_{d-2}``."""
    left_blocks: list[torch.Tensor]
    """The blocks the input groups' merges made."""
    right_blocks: list[torch.Tensor]
    """The blocks the output groups' merges made."""
    left_outs: list[torch.Tensor]
    """Each input group's output; the last is ``z``."""
    right_acts: list[torch.Tensor]
    """The inputs of the output groups after the first, or ``[z | 1]`` when the bias is folded in."""

    def flat(self) -> list[torch.Tensor]:
        return [t for part in self for t in part]


def _side_counts(plan: ContractionPlan) -> tuple[int, int, int, int]:
    """How many left blocks, right blocks, left outputs and right activations ``plan`` saves."""
    left, right = len(plan.left_groups), len(plan.right_groups)
    return (len(plan.in_shape) - left, len(plan.out_shape) - right, left,
            1 if plan.fold_bias else right - 1)


def split_saved(plan: ContractionPlan, saved) -> SavedParts:
    """``tt_forward``'s outputs after ``y`` for a plan with groups, by kind."""
    d = len(plan.ranks) - 1
    sizes = _side_counts(plan)
    parts, start = [list(saved[:d - 1])], d - 1
    for size in sizes:
        parts.append(list(saved[start:start + size]))
        start += size
    return SavedParts(*parts)


def left_forward(plan: ContractionPlan, x: torch.Tensor,
                 eff) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The input side alone (``kernels.left_forward``), one op: ``(left_blocks, left_outs)`` of
    :class:`SavedParts`. ``eff``: all ``d`` gated cores (the last one as it is)."""
    count = _side_counts(plan)[0]
    out = torch.ops.comera_native.tt_left_forward(x, eff, len(plan.in_shape), list(plan.left_groups))
    return out[:count], out[count:]


def right_forward(plan: ContractionPlan, z: torch.Tensor, bias: torch.Tensor | None, eff):
    """The output side alone (``kernels.right_forward``), one op: ``(y, right_blocks, right_acts)``, the last
    two as in :class:`SavedParts`. ``eff``: all ``d`` gated cores (the last one as it is)."""
    count = _side_counts(plan)[1]
    y, *rest = torch.ops.comera_native.tt_right_forward(z, bias, eff, len(plan.in_shape),
                                                       list(plan.right_groups), plan.fold_bias)
    return y, rest[:count], rest[count:]


# ------------------------------------------------------------------------------------------- counting

_PRODUCT_FREE = ("gate", "dgate", "dcore", "bias", "dbias")
"""Plan steps that are not matrix products (FlopCounterMode counts products only)."""


def _plan_of(x_shape, bias_shape, core_shapes, m, left_groups, right_groups,
             dense, fold_bias) -> ContractionPlan:
    tokens = x_shape[0]
    modes = tuple(s[1] for s in core_shapes)
    ranks = (1,) + tuple(s[2] for s in core_shapes)
    strategies = "dense" if dense else (tuple(left_groups), tuple(right_groups))
    settings = PlanSettings(fold_bias_min_tokens=tokens if fold_bias else tokens + 1)
    return make_plan(modes[:m], modes[m:], ranks, tokens, bias_shape is not None, strategies, settings)


def _product_flops(plan: ContractionPlan, phase: str, need_dx: bool = True) -> int:
    return sum(s.flops for s in plan.steps if s.phase == phase and s.name.rstrip("0123456789") not in
               _PRODUCT_FREE and (need_dx or s.name != "dx"))


def _side_flops(plan: ContractionPlan, left: bool) -> int:
    """Forward FLOPs of one side's merges and absorptions (a step's number is a core of its side)."""
    m = len(plan.in_shape)
    total = 0
    for s in plan.steps:
        kind = s.name.rstrip("0123456789")
        if s.phase == "forward" and kind in ("merge", "absorb") and (int(s.name[len(kind):]) < m) == left:
            total += s.flops
    return total


def register_flop_formulas() -> None:
    """Teach :class:`torch.utils.flop_counter.FlopCounterMode` the FLOPs of the native ops (it does not
    see the ATen calls made inside them): the matrix-product FLOPs of their plan (or of its side), the count
    the Python kernels give. Idempotent; a no-op when the ops are not built.
    :func:`comera.register_flop_formulas` calls it."""
    if not status().in_use:
        return
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    ops = torch.ops.comera_native
    if ops.tt_forward in flop_registry:
        return

    @register_flop_formula(ops.tt_forward)
    def _forward_flops(x, bias, cores, gates, m, left_groups, right_groups, dense, fold_bias, *args,
                       **kwargs) -> int:
        plan = _plan_of(x, bias, cores, m, left_groups, right_groups, dense, fold_bias)
        return _product_flops(plan, "forward")

    @register_flop_formula(ops.tt_backward)
    def _backward_flops(dy, x, cores, gates, saved, m, left_groups, right_groups, dense, fold_bias, has_bias,
                        need_dx, need_dbias, *args, **kwargs) -> int:
        plan = _plan_of(x, () if has_bias else None, cores, m, left_groups, right_groups, dense, fold_bias)
        return _product_flops(plan, "backward", need_dx)

    @register_flop_formula(ops.tt_left_forward)
    def _left_flops(x, cores, m, left_groups, *args, **kwargs) -> int:
        plan = _plan_of(x, None, cores, m, left_groups, [len(cores) - m], False, False)
        return _side_flops(plan, left=True)

    @register_flop_formula(ops.tt_right_forward)
    def _right_flops(z, bias, cores, m, right_groups, fold_bias, *args, **kwargs) -> int:
        plan = _plan_of(z, bias, cores, m, [m], right_groups, False, fold_bias)
        return _side_flops(plan, left=False)
