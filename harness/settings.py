"""Every ``COMERA_*`` environment variable the project reads: its type, default, bounds and meaning.

:data:`SETTINGS` declares them; :func:`read` is the one place the harness reads one, checked against its
declaration: a bad value raises :class:`SettingError` naming the variable and the value. The reference
table, docs/settings.md, is made from :data:`SETTINGS` (``python -m harness.settings > docs/settings.md``;
a test keeps it current).
"""
from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9._][A-Za-z0-9._-]*$"
"""A device label (a results folder name); the config schema's ``$defs.label`` pattern."""
MAX_THREADS = 1024
"""The most torch threads of a cell: the config's cap, :data:`harness.spec.MAX_THREADS` (a test keeps them
equal; not imported from there: this module imports nothing of the project's, so any module may read a
variable)."""
_WHOLE = re.compile(r"[0-9]+", re.ASCII)
"""A whole number as typed: ASCII digits only (``str.isdigit`` also takes ``²``)."""


class SettingError(ValueError):
    """A bad value of an environment variable; the message names the variable and the value."""


@dataclass(frozen=True)
class Setting:
    """One environment variable.

    Args:
        name: the variable.
        kind: how its text is read: ``seconds`` (a number >= 0; 0 reads as None), ``whole`` (ASCII digits,
            from ``low`` to ``high``), ``time`` (seconds since the epoch), ``label`` (a device label),
            ``path`` (its text), ``paths`` (Paths; separated by ``os.pathsep``), ``text``, ``switch`` (on
            by default: off with ``0``; off by default: on with ``1``).
        meaning: one line: what it sets.
        what: the noun its error messages use ("the stall limit").
        default: the value when unset or empty.
        low: the least value (``whole``).
        high: the largest value (``whole``).
        zero: ``seconds``: what 0 means.
        set_by: who sets it: "you", "the pipeline" or "the harness" (for its own child processes).
        read_in: the module that reads it.
    """

    name: str
    kind: str
    meaning: str
    what: str
    default: Any = None
    low: int | None = None
    high: int | None = None
    zero: str = ""
    set_by: str = "you"
    read_in: str = ""

    def expected(self) -> str:
        """What a value must be, in words."""
        return {"seconds": f"a number of seconds >= 0 (0: {self.zero})",
                "whole": f"a whole number from {self.low} to {self.high}",
                "time": "a time in seconds since the epoch",
                "label": "letters, digits and . _ - only, not starting with -, not '.' or '..'",
                "switch": "1 turns it on" if self.default is False else "0 turns it off",
                "path": "a path", "paths": f"paths separated by {os.pathsep!r}"}.get(self.kind, "any text")


_SETTINGS = (
    Setting("COMERA_BENCH_DEVICE", "label", "the device label: results go to `results/runs/<label>` and "
            "`results/<label>` (default: derived from the device)", "a device label",
            read_in="harness.configs.grid"),
    Setting("COMERA_BENCH_THREADS", "whole", "torch threads of every cell under execution.threads: auto, "
            "chosen once by the pipeline's first Snakemake process", "the threads of every cell", low=1,
            high=MAX_THREADS, set_by="the pipeline", read_in="harness.running.threads"),
    Setting("COMERA_BENCH_STALL_LIMIT_S", "seconds", "how long the warm-up, a training step or an evaluation "
            "may run before the watchdog ends the cell", "the stall limit", default=3600.0,
            zero="no stall limit", read_in="harness.running.watchdog"),
    Setting("COMERA_BENCH_CHECKPOINT_S", "seconds", "seconds of training between two checkpoints of a cell",
            "the checkpoint interval", default=600.0, zero="no checkpoints",
            read_in="harness.running.checkpoint"),
    Setting("COMERA_BENCH_CACHE_DIR", "path", "the folder of derived data (tokenizers, tokenized tensors); "
            "the pipeline sets `<results_dir>/cache`, comera-bench run `<--results-dir>/cache` (unless set)",
            "the cache folder", read_in="harness.data.cache"),
    Setting("COMERA_BENCH_PLUGINS", "paths", "folders of plug-in methods and workloads",
            "the plug-in folders", default=(), read_in="harness.plugins"),
    Setting("COMERA_BENCH_PIPELINE_STARTED", "time", "when the pipeline run started (its progress lines)",
            "the pipeline's start", set_by="the pipeline", read_in="harness.running.eta"),
    Setting("COMERA_BENCH_PIPELINE_CELLS", "whole", "the grid's cell count (its progress lines)",
            "the grid's cell count", low=0, high=10**9, set_by="the pipeline", read_in="harness.running.eta"),
    Setting("COMERA_BENCH_ROUNDS", "path", "the socket of the round coordinator of a cell's timing group",
            "the round coordinator", set_by="the harness", read_in="harness.core.interleave"),
    Setting("COMERA_BENCH_ALONE", "text", "why a cell of a timing group is timed alone",
            "the reason a cell is timed alone", set_by="the harness", read_in="harness.core.interleave"),
    Setting("COMERA_BENCH_PARENT_PID", "whole", "the process a child is to die with", "the parent process",
            low=1, high=2**31 - 1, set_by="the harness", read_in="harness.core.stops"),
    Setting("COMERA_BENCH_CELL_STARTED", "time", "when a cell's supervisor started (the start of the cell's "
            "start phase)", "the cell's start", set_by="the harness", read_in="harness.core.stops"),
    Setting("COMERA_BENCH_SLURM_TESTS", "switch", "1: the tests start a one-node SLURM cluster (needs root)",
            "the SLURM tests", default=False, read_in="tests/workflow/test_slurm.py"),
    Setting("COMERA_BENCH_CELLS_DIR", "path", "the folder of the cells' runs files, where a size-matched "
            "cell reads the row of the cell it matches", "the cells' folder", set_by="the harness",
            read_in="baselines.dense"),
    Setting("COMERA_BENCH_OFFICIAL_DIR", "path", "a checkout of the official CoMERA code (ziyangjoy/CoMERA): "
            "the tests check the paper's rules against its own functions", "the official checkout",
            read_in="tests/comera/test_paper_rules.py"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _SETTINGS}
"""Every ``COMERA_*`` environment variable the project reads, by name."""


def read(name: str, environ: dict[str, str] | None = None) -> Any:
    """The value of the environment variable ``name`` (declared in :data:`SETTINGS`) as its kind reads it;
    its default when unset or empty (a number or switch: surrounding spaces ignored; other text as given).

    Args:
        name: the variable.
        environ: the environment (default: this process's).

    Raises:
        SettingError: a value its declaration refuses, naming the variable and the value.

    Example::

        >>> read("COMERA_BENCH_THREADS", {"COMERA_BENCH_THREADS": "4"})
        4
    """
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    text = raw.strip() if setting.kind in _NUMBERS else raw
    if not text:
        return setting.default
    value = _parse(setting, text)
    if value is _BAD:
        what = f"{setting.what} must be {setting.expected()}"
        if setting.set_by != "you":
            what += f"; {setting.set_by} sets it: unset it"
        raise SettingError(f"environment variable {name}={raw!r}: {what}")
    return value


_BAD = object()
_NUMBERS = ("seconds", "time", "whole", "switch")


def _parse(setting: Setting, text: str) -> Any:
    kind = setting.kind
    if kind == "seconds":
        value = _float(text)
        return _BAD if not math.isfinite(value) or value < 0 else (value or None)
    if kind == "time":
        value = _float(text)
        return _BAD if not math.isfinite(value) or value < 0 else value
    if kind == "whole":
        if not _WHOLE.fullmatch(text):
            return _BAD
        value = int(text)
        return value if setting.low <= value <= setting.high else _BAD
    if kind == "label":
        return text if re.fullmatch(LABEL_PATTERN, text) else _BAD
    if kind == "switch":
        return text != "0" if setting.default else text == "1"
    if kind == "paths":
        return tuple(Path(p) for p in text.split(os.pathsep) if p)
    return text  # path, text


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def markdown() -> str:
    """docs/settings.md: a table of :data:`SETTINGS`."""
    lines = ["# Environment variables", "",
             "Every `COMERA_*` variable the project reads (made from `harness/settings.py` by "
             "`python -m harness.settings > docs/settings.md`). A bad value is refused naming the variable "
             "and the value (`environment variable COMERA_BENCH_THREADS='abc': the threads of every cell "
             "must be a whole number from 1 to 1024; the pipeline sets it: unset it`); the pipeline checks "
             "the ones its cells read before its first job. Those set by the pipeline or the harness are "
             "for its own processes: leave them unset.", "",
             "| variable | value | default | set by | read in | meaning |", "|---|---|---|---|---|---|"]
    for s in _SETTINGS:
        default = "unset" if s.default in (None, ()) else {True: "on", False: "off"}.get(s.default, s.default)
        if s.kind == "seconds":
            default = f"{default:g}"
        cells = [f"`{s.name}`", s.expected(), str(default), s.set_by, f"`{s.read_in}`", s.meaning]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
