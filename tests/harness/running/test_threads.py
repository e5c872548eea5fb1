"""execution.threads: auto -- the threads the CPUs left free allow, one CPU left to the rest of the machine,
or those of the finished cells."""
from __future__ import annotations

import json

import pytest

from harness.running import threads


@pytest.mark.parametrize("cpus, load, expected", [
    (2, 0.0, 1), (2, 0.9, 1), (2, 3.4, 1), (2, None, 1), (1, 0.0, 1),  # a 2-CPU machine: 1, busy or not
    (4, 0.0, 3), (4, 0.3, 3), (4, 1.6, 1), (16, 0.5, 4), (16, 13.2, 2), (16, 40.0, 1), (16, None, 4)])
def test_auto_gives_the_threads_the_free_cpus_allow(cpus, load, expected):
    assert threads.choose(cpus, load) == expected


def test_a_number_is_kept_and_auto_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    assert threads.resolve(3, tmp_path, 12.0) == (3, "")
    count, why = threads.resolve("auto", tmp_path, 3.4, cpus=2)
    assert count == 1 and why == "auto: 1 (1-minute load average 3.4 on 2 CPUs; at most 4)"


def test_auto_keeps_the_threads_of_the_finished_cells(tmp_path, monkeypatch):
    """A resumed run on a quieter machine keeps the threads its finished cells ran with (part of their
    specs): none of them runs again. A spec without a runs file (a cell not finished) does not count."""
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    for name, count, finished in (("a", 1, True), ("b", 1, True), ("c", 2, False)):
        (tmp_path / f"{name}.spec.json").write_text(json.dumps({"execution": {"num_threads": count}}))
        if finished:
            (tmp_path / f"{name}.runs.parquet").write_bytes(b"")
    count, why = threads.resolve("auto", tmp_path, 0.0, cpus=2)
    assert count == 1 and "the threads of the 2 finished cell(s)" in why


def test_every_process_of_one_run_has_the_first_ones_choice(tmp_path, monkeypatch):
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    assert threads.resolve("auto", tmp_path, 12.0, cpus=2)[0] == 2
