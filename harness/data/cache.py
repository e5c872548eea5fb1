"""On-disk cache of derived data (tokenizers, tokenized tensors, generated files).

Entries are written atomically and read as data; one that cannot be read is deleted and rebuilt
(:func:`discard`), one that cannot be written leaves the run going (:func:`store`), each with a warning.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from harness import atomic, settings

if TYPE_CHECKING:
    import torch

DEFAULT_CACHE_DIR = "results/cache"
CACHE_ENV = "COMERA_BENCH_CACHE_DIR"
"""The cache folder of a run: the pipeline sets it to ``<results_dir>/cache`` (unless set already),
``comera-bench run`` to ``<--results-dir>/cache`` (:func:`run_cache`); DEFAULT_CACHE_DIR (under the cwd)
when unset."""
CACHE_FORMAT = 2
"""Part of every cache key: raise it when what an entry holds changes, so old entries are not read."""


def cache_dir(root: str | os.PathLike | None, *parts: str) -> Path:
    """The folder ``root/parts...`` (created); ``root`` None means the run's cache folder (CACHE_ENV, else
    DEFAULT_CACHE_DIR)."""
    if root is None:
        root = settings.read(CACHE_ENV) or DEFAULT_CACHE_DIR
    path = Path(root).joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def configured_cache_dir(root: str | os.PathLike | None, *parts: str) -> Path | None:
    """:func:`cache_dir` where a cache folder was asked for (``root``, or CACHE_ENV: a pipeline's or
    ``comera-bench run``'s), else None: data cheap to rebuild is cached only where a run keeps a cache,
    never in a default folder under the current directory."""
    if root is None and not settings.read(CACHE_ENV):
        return None
    return cache_dir(root, *parts)


@contextlib.contextmanager
def run_cache(folder: str | os.PathLike) -> Iterator[None]:
    """CACHE_ENV is ``folder`` inside the block (and in the processes started there), unless it is set
    already (by the pipeline); as it was afterwards."""
    if settings.read(CACHE_ENV):
        yield
        return
    os.environ[CACHE_ENV] = str(folder)
    try:
        yield
    finally:
        os.environ.pop(CACHE_ENV, None)


def fingerprint(*items: Any, files: Iterable[str | os.PathLike] = ()) -> str:
    """A short hash of JSON-able ``items`` and of each file's path, size and modification time."""
    h = hashlib.sha256(json.dumps([CACHE_FORMAT, *items], sort_keys=True, default=str).encode())
    for f in files:
        st = os.stat(f)
        h.update(f"{os.fspath(f)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Calls ``write(tmp)`` on a temporary file next to ``path``, flushes it to disk, then renames it onto
    ``path`` (harness.atomic: the temporary of a writer that was killed is removed by the next write)."""
    return atomic.atomic_write(path, write, fsync=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``<path>.lock`` (waiting for it): one process at a time builds an
    entry, the others then read it (an entry built twice may differ, e.g. a WordPiece vocabulary)."""
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def store(path: Path, write: Callable[[Path], None], what: str) -> bool:
    """:func:`atomic_write` of the cached ``what``; one that fails for whatever reason is a warning naming
    ``path`` (the caller goes on with what it built, uncached). Returns whether it was written."""
    try:
        atomic_write(path, write)
    except Exception as exc:  # noqa: BLE001 -- a cache entry is never worth the run
        warnings.warn(f"cannot cache {what} at {path} ({type(exc).__name__}: {exc}); going on without",
                      stacklevel=3)
        return False
    return True


def discard(path: Path, what: str, exc: BaseException) -> None:
    """Warns that the cached ``what`` at ``path`` cannot be read and deletes it (the caller rebuilds it)."""
    warnings.warn(f"cached {what} {path} cannot be read ({type(exc).__name__}: {exc}); rebuilding it",
                  stacklevel=3)
    path.unlink(missing_ok=True)


def cached_tensors(path: Path, build: Callable[[], dict[str, torch.Tensor]],
                   keys: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """Loads a dict of tensors from ``path``, or builds and saves it there first. An entry that is not a
    dict of tensors with every one of ``keys`` is discarded (a warning naming it) and rebuilt."""
    import torch  # lazily: the cache folder is known without torch (comera-bench run's supervising parent)

    if path.exists():
        try:
            tensors = torch.load(path, weights_only=True)
            if not (isinstance(tensors, dict) and all(isinstance(t, torch.Tensor) for t in tensors.values())):
                raise ValueError(f"it holds a {type(tensors).__name__}, not a dict of tensors")
            missing = sorted(set(keys) - set(tensors))
            if missing:
                raise ValueError(f"it lacks {missing} (it holds {sorted(tensors)})")
            return tensors
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            discard(path, "tensors", exc)
    tensors = build()
    store(path, lambda tmp: torch.save(tensors, tmp), "tensors")
    return tensors
