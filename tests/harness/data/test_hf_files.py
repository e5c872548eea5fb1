"""harness.data.hf_files: numbered shard sets must be whole; the check names what is missing."""
from __future__ import annotations

import signal

import pytest

from harness.data import hf_files


def _touch(folder, *names):
    for name in names:
        (folder / name).write_bytes(b"")
    return sorted(folder / n for n in names)


def test_a_partial_shard_set_names_the_missing_shards(tmp_path):
    files = _touch(tmp_path, "train-00000-of-00003.parquet", "train-00002-of-00003.parquet")
    with pytest.raises(ValueError, match=r"train-\*-of-00003.parquet lacks 1 of its 3 shards: "
                                         r"train-00001-of-00003.parquet \(a partial download"):
        hf_files.check_shard_sets(files)
    hf_files.check_shard_sets(_touch(tmp_path, "train-00001-of-00003.parquet") + files)  # whole: no error


def test_a_huge_shard_count_is_named_without_listing_every_name(tmp_path):
    """``-of-999999999999`` is checked from the shards present, not by building every missing name (which
    never ended); the message lists the first ten and counts the rest."""
    files = _touch(tmp_path, "train-00000-of-999999999999.parquet")

    def stuck(*_):
        raise AssertionError("the shard check did not end within 120 s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(120)  # the check takes microseconds; this only turns a hang into a failure
    try:
        with pytest.raises(ValueError) as err:
            hf_files.check_shard_sets(files)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(err.value)
    assert f"{tmp_path}: the shard set train-*-of-999999999999.parquet lacks 999999999998 of its " \
           "999999999999 shards: train-000000000001-of-999999999999.parquet" in message
    assert "and 999999999988 more" in message and len(message) < 1000
