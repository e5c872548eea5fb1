"""Atomic file writes (result tables, checkpoints, the data cache): :func:`atomic_write`.

A temporary file beside the target is renamed onto it, so no reader sees a partial file; the next write
removes the temporaries of dead writers on this host (docs/pipeline.md, "Outputs").
"""
from __future__ import annotations

import glob
import os
import socket
import tempfile
from pathlib import Path
from typing import Callable


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of ``path`` left by writers on this host that no longer run; returns them."""
    path = Path(path)
    host, removed = socket.gethostname(), []
    prefix = f".{path.name}."
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        parts = tmp.name[len(prefix):-len(".tmp")].rsplit(".", 2)  # host (may hold dots), pid, random
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _running(int(parts[1])):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, fsync: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file next to ``path`` (fsync'ed if asked), then rename it onto
    ``path``; the temporary is removed when ``write`` fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{socket.gethostname()}.{os.getpid()}.", suffix=".tmp",
                               dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600: give the file the mode open() would
    os.close(fd)
    try:
        write(Path(tmp))
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
