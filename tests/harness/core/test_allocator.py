"""harness.core.allocator: policies, honest 'unavailable' answers, and the effect of "reuse" and of
release_free_memory on a glibc process."""
from __future__ import annotations

import resource
from types import SimpleNamespace

import psutil
import pytest
import torch

from harness.core import allocator

GLIBC = allocator.glibc_version() is not None
needs_glibc = pytest.mark.skipif(not GLIBC, reason="needs glibc (mallopt / malloc_trim): not this C library")
BIG = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB)


def _touch_big() -> None:
    buf = torch.empty(BIG // 4)
    buf.fill_(1.0)  # every page written
    del buf


def test_unknown_policy_is_named():
    with pytest.raises(ValueError, match="allocator policy 'jemalloc'"):
        allocator.apply("jemalloc")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@needs_glibc
def test_reuse_keeps_freed_memory_release_hands_it_back_and_policy_undoes_it():
    with allocator.policy("reuse") as applied:
        assert applied.startswith("glibc ") and "mmap_max=0" in applied and allocator.current() == applied
        for _ in range(16):  # the heap settles: memalign's padding needs a few holes to coalesce
            _touch_big()
        faults = _faults()
        _touch_big()  # served from the kept heap memory: no fresh page faults
        _touch_big()
        assert _faults() - faults < 1000  # vs 2 x 16384 pages of 4 KiB
        rss = psutil.Process().memory_info().rss
        assert allocator.release_free_memory()
        assert rss - psutil.Process().memory_info().rss > BIG // 2
        assert allocator.apply("system").startswith("system (reuse already applied in this process: glibc")
    assert allocator.current().startswith("system (glibc defaults mmap_max=65536")
    assert allocator.apply("system") == "system"
    faults = _faults()
    _touch_big()  # glibc maps a big block again: every page is faulted in
    assert _faults() - faults > BIG // 4096 // 2


def test_not_linux_is_unavailable(monkeypatch):
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.apply("reuse") == "unavailable: not Linux (darwin)"
    assert allocator.current() == "unavailable: not Linux (darwin)"
    assert allocator.release_free_memory() is False
    assert allocator.glibc_version() is None


def _fake_libc(mallopt_result: int, **missing):
    def mallopt(param, value):
        return mallopt_result

    def version():
        return b"9.99"

    def trim(pad):
        return 0

    libc = SimpleNamespace(mallopt=mallopt, gnu_get_libc_version=version, malloc_trim=trim)
    for name in missing:
        delattr(libc, name)
    return libc


@pytest.mark.parametrize("libc, expected", [
    (_fake_libc(0), "unavailable: mallopt(mmap_max=0) failed"),
    (_fake_libc(1, gnu_get_libc_version=True),
     "unavailable: C library is not glibc (no gnu_get_libc_version)"),
    (_fake_libc(1), f"glibc 9.99 mallopt mmap_max=0 trim_threshold={allocator.TRIM_THRESHOLD}"),
])
def test_mallopt_results_are_checked(monkeypatch, libc, expected):
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_last", "system")
    assert allocator.apply("reuse") == expected
    assert allocator.apply("system") == ("system" if expected.startswith("unavailable") else
                                         f"system (reuse already applied in this process: {expected})")
