"""The results-folder lock of a pipeline run: one pipeline at a time per results folder.

:func:`acquire` takes an ``flock`` on ``<folder>/.pipeline.lock`` naming its holder (else
:class:`LockError`), :func:`release` empties and unlocks it; a dead holder's lock is taken over
(docs/pipeline.md, "Results lock"; why so: docs/design-notes.md).
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_NAME = ".pipeline.lock"
_held: dict[Path, int] = {}


class LockError(RuntimeError):
    """The results folder is in use by another pipeline; the message names the folder and the holder."""


def _describe(path: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not holder:
        return "a process that has not written its name yet"
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')} "
            f"in {holder.get('cwd')}")


def acquire(folder: str | os.PathLike) -> Path:
    """Lock ``folder`` for this process (again: no-op); LockError when another live process holds it."""
    folder = Path(folder)
    path = (folder / LOCK_NAME).resolve()
    if path in _held:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
    fd = _held.pop((Path(folder) / LOCK_NAME).resolve(), None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)
