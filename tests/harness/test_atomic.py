"""Atomic writes: the temporary file of a writer killed mid-write is removed by the next write of the
same target (here through the data cache; a really killed writer: tests/harness/results/test_results.py);
temporaries of live writers and other hosts stay."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from pathlib import Path

from harness import atomic
from harness.data import cache


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    return int(proc.stdout)


def test_only_stale_temporaries_of_the_same_target_removed(tmp_path):
    host, gone = socket.gethostname(), dead_pid()
    target = tmp_path / "x.json"
    stale = tmp_path / f".x.json.{host}.{gone}.abcd1234.tmp"
    keep = [tmp_path / f".x.json.{host}.{os.getpid()}.abcd1234.tmp",  # a live writer (this process)
            tmp_path / f".x.json.other-host.{gone}.abcd1234.tmp",     # another machine's writer
            tmp_path / f".y.json.{host}.{gone}.abcd1234.tmp"]        # another target
    for path in [stale, *keep]:
        path.write_text("partial")
    cache.atomic_write(target, lambda tmp: Path(tmp).write_text("{}"))
    assert target.read_text() == "{}" and not stale.exists() and all(p.exists() for p in keep)
    assert atomic.remove_stale_temporaries(target) == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_respect_the_umask(tmp_path, umask, mode):
    """A shared results folder is readable by the group when the umask says so (mkstemp alone gives 0600)."""
    import os

    old = os.umask(umask)
    try:
        path = atomic.atomic_write(tmp_path / "r.parquet", lambda tmp: tmp.write_bytes(b"x"))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode
