"""The file-lock GPU allocator with fake GPU counts (no GPU needed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness.running import gpus

PRINT_AND_WAIT = "import os, sys, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(60)"


def cli(lock_dir, extra_env=None):
    """The allocator CLI over 2 fake GPUs running a child that prints its CUDA_VISIBLE_DEVICES."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | (extra_env or {})
    return subprocess.Popen([sys.executable, "-m", "harness.running.gpus", "--count", "2", "--lock-dir",
                             str(lock_dir), "--", sys.executable, "-c", PRINT_AND_WAIT],
                            stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("count", [1, 2, 4])
def test_each_gpu_given_once(tmp_path, count):
    held = [gpus.try_acquire(count, tmp_path) for _ in range(count)]
    assert sorted(index for index, _ in held) == list(range(count))
    assert gpus.try_acquire(count, tmp_path) is None
    index, fd = held[-1]
    os.close(fd)
    again = gpus.try_acquire(count, tmp_path)
    assert again is not None and again[0] == index
    for _, fd in held[:-1] + [again]:
        os.close(fd)


def test_acquire_times_out_when_all_taken(tmp_path):
    _, fd = gpus.acquire(1, tmp_path)
    with pytest.raises(TimeoutError, match="no free GPU among 1"):
        gpus.acquire(1, tmp_path, poll_s=0.01, timeout_s=0.05)
    os.close(fd)
    with pytest.raises(ValueError, match="GPU count must be >= 1"):
        gpus.acquire(0, tmp_path)


def test_command_holds_its_gpu_until_killed(tmp_path):
    index0, fd0 = gpus.try_acquire(2, tmp_path)
    assert index0 == 0
    proc = cli(tmp_path)
    try:
        assert proc.stdout.readline().strip() == "1"  # GPU 0 is taken by this test
        assert gpus.try_acquire(2, tmp_path) is None  # the child holds GPU 1 while it runs
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = gpus.try_acquire(2, tmp_path)
    assert got is not None and got[0] == 1, "a killed job must not leave its GPU locked"
    os.close(got[1])
    os.close(fd0)


def test_existing_cuda_visible_devices_kept(tmp_path):
    held = [gpus.try_acquire(2, tmp_path) for _ in range(2)]  # all local GPUs taken
    proc = cli(tmp_path, {"CUDA_VISIBLE_DEVICES": "3"})
    try:
        assert proc.stdout.readline().strip() == "3"  # SLURM's choice, no lock needed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for _, fd in held:
            os.close(fd)
