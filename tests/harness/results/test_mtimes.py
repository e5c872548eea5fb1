"""Files from the future in a results folder (copied from a machine whose clock is ahead) are found and set
back (harness.results.mtimes); links are neither followed nor changed."""
from __future__ import annotations

import os
import time

from harness.results import mtimes

HOUR = 3600.0


def touch(path, mtime):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_files_modified_in_the_future_are_found_and_set_to_the_time_given(tmp_path):
    now = time.time()
    results = tmp_path / "results"
    ahead = [touch(results / "runs" / "cpu" / f"c{i}.{kind}", now + HOUR)
             for i in range(2) for kind in ("spec.json", "runs.parquet")]
    slightly = touch(results / "runs" / "cpu" / "skewed.runs.parquet", now + 1.0)  # within the slack
    past = touch(results / "cpu" / "runs.parquet", now - HOUR)
    assert mtimes.future_files(results, now) == sorted(ahead)
    started = now - 5.0
    reset = mtimes.reset_future(results, to=started - 1.0, now=now)
    assert reset == sorted(ahead)
    assert {p.stat().st_mtime for p in ahead} == {started - 1.0}
    assert slightly.stat().st_mtime == now + 1.0 and past.stat().st_mtime == now - HOUR
    assert mtimes.future_files(results, now) == []
    message = mtimes.warning(results, reset)
    assert message.startswith(f"4 file(s) in {results} were modified in the future (copied from a machine "
                              "whose clock is ahead, e.g. ")
    assert mtimes.warning(results, []) == ""
    assert mtimes.future_files(tmp_path / "none", now) == []


def test_a_link_in_the_folder_is_neither_followed_nor_changed(tmp_path):
    now = time.time()
    outside = touch(tmp_path / "outside" / "file", now + HOUR)
    results = tmp_path / "results"
    results.mkdir()
    (results / "link").symlink_to(outside)
    (results / "folder-link").symlink_to(outside.parent, target_is_directory=True)
    assert mtimes.reset_future(results, to=now, now=now) == []
    assert outside.stat().st_mtime == now + HOUR
