"""The results-folder lock of a pipeline run (the Snakefile takes it in onstart; tests/workflow/
test_pipeline.py runs two real pipelines on one folder)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.results import lock

TAKE = "import os, sys; from harness.results import lock; lock.acquire(sys.argv[1]); print('held', flush=True); "


def other_process(folder, then: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TAKE + then, str(folder)], capture_output=True, text=True,
                          timeout=60)


def test_second_holder_refused_naming_folder_and_holder(tmp_path):
    folder = tmp_path / "results"
    path = lock.acquire(folder)
    try:
        assert lock.acquire(folder) == path  # again in the same process: no-op
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid() and holder["cwd"] == os.getcwd()
        res = other_process(folder, "")
        assert res.returncode != 0
        assert f"results folder {folder} is in use by another pipeline: pid {os.getpid()} on host" in res.stderr
    finally:
        lock.release(folder)
    assert path.read_text() == ""
    assert other_process(folder, "lock.release(sys.argv[1])").returncode == 0


def test_lock_of_a_dead_pipeline_is_taken_over(tmp_path):
    res = other_process(tmp_path, "os._exit(0)")  # dies holding it, as a SIGKILLed pipeline does
    assert res.stdout == "held\n"
    dead_pid = json.loads((tmp_path / lock.LOCK_NAME).read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(dead_pid, 0)
    lock.acquire(tmp_path)
    try:
        assert json.loads((tmp_path / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release(tmp_path)


def test_symlinked_lock_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_bytes(b"measurements\n")
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(lock.LockError, match=f"lock {folder.resolve() / lock.LOCK_NAME} is a symbolic link"):
        lock.acquire(folder)
    assert target.read_bytes() == b"measurements\n"


def test_dangling_symlinked_lock_creates_nothing(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / lock.LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(lock.LockError, match="not a regular file"):
        lock.acquire(folder)
    assert not (tmp_path / "elsewhere").exists()


def test_lock_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / lock.LOCK_NAME).mkdir()
    with pytest.raises(lock.LockError, match=f"lock {tmp_path.resolve() / lock.LOCK_NAME} is"):
        lock.acquire(tmp_path)


def test_hard_linked_lock_is_refused_and_the_other_name_kept(tmp_path):
    """A lock sharing its file with a name elsewhere (a hard link, as ``cp -al`` makes) is not emptied."""
    target = tmp_path / "precious.txt"
    target.write_bytes(b"measurements\n")
    folder = tmp_path / "results"
    folder.mkdir()
    os.link(target, folder / lock.LOCK_NAME)
    with pytest.raises(lock.LockError, match="has other names"):
        lock.acquire(folder)
    assert target.read_bytes() == b"measurements\n"
