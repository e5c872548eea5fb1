"""The results-folder lock of a pipeline run: one pipeline at a time per results folder.

:func:`acquire` takes an ``flock`` on ``<folder>/.pipeline.lock`` naming its holder (else
:class:`LockError`), :func:`release` empties and unlocks it; a dead holder's lock is taken over
(docs/pipeline.md, "Results lock"; why so: docs/design-notes.md). The lock is a regular file inside the
folder, opened without following links: a ``.pipeline.lock`` that is a link or not a regular file is refused
(LockError naming it), so a copied folder cannot make the lock empty a file elsewhere.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import stat
from pathlib import Path

LOCK_NAME = ".pipeline.lock"
_held: dict[Path, int] = {}


class LockError(RuntimeError):
    """The results folder cannot be locked: another pipeline holds it (the message names the folder and the
    holder), or its lock path is a link or not a regular file (the message names the path)."""


def _describe(path: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not holder:
        return "a process that has not written its name yet"
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')} "
            f"in {holder.get('cwd')}")


def _not_a_lock(path: Path) -> LockError:
    return LockError(f"lock {path} is a symbolic link or not a regular file; a results folder's lock must be "
                     f"a regular file inside it. Remove {path} (it is not this harness's) and run again.")


def _open_lock(path: Path) -> int:
    """Open (create) ``path`` read-write without following a link; LockError unless it is a regular file
    with no other name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise _not_a_lock(path) from err
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_a_lock(path)
    if info.st_nlink != 1:
        os.close(fd)
        raise LockError(f"lock {path} has other names (a hard link, {info.st_nlink} names): its file is "
                        f"not the folder's own. Remove {path} (it is not this harness's) and run again.")
    return fd


def acquire(folder: str | os.PathLike) -> Path:
    """Lock ``folder`` for this process (again: no-op).

    Raises:
        LockError: another live process holds the lock, or ``<folder>/.pipeline.lock`` is a symbolic link,
            not a regular file or a file with other names (never followed, never written).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.resolve() / LOCK_NAME
    if path in _held:
        return path
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockError(f"results folder {folder} is in use by another pipeline: {_describe(path)} "
                        f"(lock {path}). Wait for it to finish, or give this run another results_dir.")
    me = {"pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
          "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    _held[path] = fd
    return path


def release(folder: str | os.PathLike) -> None:
    """Empty and unlock ``folder``'s lock if this process holds it."""
    fd = _held.pop(Path(folder).resolve() / LOCK_NAME, None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)
