"""A file-lock GPU allocator for local pipeline runs: two jobs never share a GPU.

``python -m harness.running.gpus [--count N] [--lock-dir DIR] -- CMD ...`` runs CMD on the first GPU
whose ``flock`` it takes, held by CMD's own process; with CUDA_VISIBLE_DEVICES set, CMD runs unchanged.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import NoReturn


def visible_gpu_count() -> int:
    """Number of CUDA devices this process can see (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def try_acquire(count: int, lock_dir: str | os.PathLike) -> tuple[int, int] | None:
    """Take the lock of the first free GPU among ``count``: (gpu index, locked file descriptor), or
    None when all are taken. The lock lasts as long as the descriptor (or an inherited copy) is open."""
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        fd = os.open(lock_dir / f"gpu{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return index, fd
    return None


def acquire(count: int, lock_dir: str | os.PathLike, *, poll_s: float = 0.5,
            timeout_s: float | None = None) -> tuple[int, int]:
    """Like :func:`try_acquire`, waiting until a GPU is free (TimeoutError after ``timeout_s``)."""
    if count < 1:
        raise ValueError(f"GPU count must be >= 1, got {count}: no GPU to allocate")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        got = try_acquire(count, lock_dir)
        if got is not None:
            return got
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no free GPU among {count} in {lock_dir} after {timeout_s} s")
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the command on a free GPU (replaces this process; a missing command raises OSError)."""
    ap = argparse.ArgumentParser(prog="python -m harness.running.gpus", description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=None, help="GPUs to share (default: all visible)")
    ap.add_argument("--lock-dir", default="results/.gpu-locks")
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        os.execvp(command[0], command)
    count = args.count if args.count is not None else visible_gpu_count()
    index, fd = acquire(count, args.lock_dir, timeout_s=args.timeout_s)
    os.set_inheritable(fd, True)
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    print(f"harness.running.gpus: running on GPU {index} (lock {args.lock_dir}/gpu{index}.lock)",
          file=sys.stderr)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
