"""Files from the future in a results folder: found and set back when a pipeline starts.

A folder copied from a machine whose clock is ahead (``cp -a``, ``rsync -a``, ``tar`` keep mtimes) holds
files modified "later" than anything this machine writes: Snakemake then takes a cell's new output as
older than its copied ``spec.json`` and deletes it, run after run. :func:`reset_future` sets every such
file's mtime to a given time (the pipeline's start, less a second: the progress line does not count them
as done in this run); docs/pipeline.md, "Results lock".
"""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

FUTURE_SLACK_S = 2.0
"""A file modified more than this many seconds after now is from the future (a little skew of a network
file system's clock is not)."""


def future_files(folder: str | os.PathLike, now: float | None = None,
                 slack_s: float = FUTURE_SLACK_S) -> list[Path]:
    """The regular files under ``folder`` (links neither followed nor listed) modified more than ``slack_s``
    seconds after ``now`` (default: the time now), sorted; [] when the folder does not exist."""
    now = time.time() if now is None else now
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root, name)
            try:
                st = path.lstat()
            except OSError:  # gone meanwhile
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mtime > now + slack_s:
                found.append(path)
    return sorted(found)


def reset_future(folder: str | os.PathLike, to: float, now: float | None = None,
                 slack_s: float = FUTURE_SLACK_S) -> list[Path]:
    """Set the access and modification times of :func:`future_files` to ``to`` (seconds since the epoch;
    a link is never followed) and return them.

    Args:
        folder: the results folder.
        to: the time they get; the pipeline gives its start less a second, so that outputs written by its
            jobs are newer and the progress line counts none of them as written in this run.
        now: the time they are compared with (default: now).
        slack_s: how far ahead a file may be without being reset.

    Example:
        >>> reset_future("results", to=started - 1.0)  # doctest: +SKIP
    """
    found = future_files(folder, now, slack_s)
    ns = int(to * 1e9)
    for path in found:
        try:
            os.utime(path, ns=(ns, ns), follow_symlinks=False)
        except FileNotFoundError:  # gone meanwhile
            continue
    return found


def warning(folder: str | os.PathLike, reset: list[Path]) -> str:
    """The pipeline's warning for the ``reset`` files of ``folder`` ('' when none)."""
    if not reset:
        return ""
    return (f"{len(reset)} file(s) in {folder} were modified in the future (copied from a machine whose clock "
            f"is ahead, e.g. {reset[0]}): their modification times were set to this run's start, or Snakemake "
            "would take every new output as older than its input and delete it")
