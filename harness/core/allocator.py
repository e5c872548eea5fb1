"""The CPU allocator policy of a measuring process (glibc malloc, set through ctypes): :data:`POLICIES`.

:func:`apply` returns the description results record (``"unavailable: <why>"`` without glibc; it never
raises), :func:`policy` applies one for a block and undoes "reuse", :func:`release_free_memory` hands free
heap pages back. What "reuse" does: docs/performance.md; glibc details: docs/design-notes.md.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator

POLICIES = ("reuse", "system")
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1
"""The largest value mallopt's int argument takes (2 GiB - 1)."""
GLIBC_DEFAULTS = {"mmap_max": (M_MMAP_MAX, 65536), "trim_threshold": (M_TRIM_THRESHOLD, 128 * 1024)}

_applied: str | None = None
"""The description of the "reuse" applied in this process (None: never applied)."""
_last = "system"
"""What the last :func:`apply` of this process returned."""


def _glibc() -> ctypes.CDLL | str:
    """The C library of this process when it is glibc, else the reason why not."""
    if not sys.platform.startswith("linux"):
        return f"unavailable: not Linux ({sys.platform})"
    try:
        libc = ctypes.CDLL(None)
    except OSError as exc:
        return f"unavailable: cannot open the C library ({exc})"
    for symbol in ("gnu_get_libc_version", "mallopt", "malloc_trim"):
        if not hasattr(libc, symbol):
            return f"unavailable: C library is not glibc (no {symbol})"
    return libc


def glibc_version() -> str | None:
    libc = _glibc()
    if isinstance(libc, str):
        return None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return libc.gnu_get_libc_version().decode()


def apply(name: str) -> str:
    """Set this process's allocator policy ``name``; returns what was done (recorded with the results).

    ValueError for an unknown policy; ``"unavailable: <why>"`` (no change) where glibc is missing."""
    global _last
    if name not in POLICIES:
        raise ValueError(f"allocator policy {name!r}: expected one of {list(POLICIES)}")
    _last = _set(name)
    return _last


def _set(name: str) -> str:
    global _applied
    if name == "system":
        return "system" + (f" (reuse already applied in this process: {_applied})" if _applied else "")
    libc = _glibc()
    if isinstance(libc, str):
        return libc
    done = []
    for option, param, value in (("mmap_max", M_MMAP_MAX, 0),
                                 ("trim_threshold", M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        if not _mallopt(libc, param, value):
            return f"unavailable: mallopt({option}={value}) failed" + (f" (already set: {done})"
                                                                       if done else "")
        done.append(f"{option}={value}")
    _applied = f"glibc {glibc_version()} mallopt mmap_max=0 trim_threshold={TRIM_THRESHOLD}"
    return _applied


@contextlib.contextmanager
def policy(name: str) -> Iterator[str]:
    """Apply ``name`` for the enclosed block (yields what :func:`apply` returned); a "reuse" this block
    applied is undone on exit: glibc's defaults (mmap_max 65536, trim_threshold 128 KiB) are set back
    and the free heap is handed to the kernel."""
    global _applied, _last
    already = _applied
    applied = apply(name)
    try:
        yield applied
    finally:
        libc = _glibc()
        if already is None and _applied is not None and not isinstance(libc, str):
            for param, value in GLIBC_DEFAULTS.values():
                _mallopt(libc, param, value)
            release_free_memory()
            _applied = None
            _last = ("system (glibc defaults " + " ".join(f"{k}={v}" for k, (_, v) in GLIBC_DEFAULTS.items())
                     + " set back after reuse)")


def _mallopt(libc, param: int, value: int) -> bool:
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc.mallopt(param, value) == 1


def current() -> str:
    """What the last :func:`apply` in this process did ("system" when it was never called)."""
    return _last


def release_free_memory() -> bool:
    """``malloc_trim(0)``: free heap pages go back to the kernel. True when glibc released some; False
    when none was released or glibc is missing."""
    libc = _glibc()
    if isinstance(libc, str):
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc.malloc_trim(0) == 1

