"""One timing group of the pipeline (the ``time_<group>`` rule): ``python -m harness.running.group``.

Cells run isolated (:func:`isolated_command`) in interleaved rounds; an ``oom`` cell runs again alone
(:func:`retry_alone`; docs/measurement.md). Exit status 1 when a failure row could not be written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from harness.core import interleave, stops
from harness.running import eta


def isolated_command(cell: interleave.Cell) -> list[str]:
    """``comera-bench run --isolate`` (as the pipeline's per-cell rule runs it) for ``cell``: the installed
    script next to this Python when there is one, else ``python -m harness.cli``."""
    script = Path(sys.executable).with_name("comera-bench")
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]
    cmd = [*entry, "run", "--isolate", "--spec", cell.spec, "--runs-out", cell.runs,
           "--curves-out", cell.curves]
    return cmd + (["--log", cell.log] if cell.log else [])


def retry_alone(cells: list[interleave.Cell], log: Callable[[str], None] | None = None) -> list[str]:
    """Run again, each by itself, the cells of ``cells`` (a timing group of two or more) whose row says
    ``oom``; returns their run_ids."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if len(cells) < 2:
        return []
    from harness import results  # pyarrow: after the group, not in its start

    retried = []
    for cell in cells:
        try:
            row = results.read_parquet(cell.runs, "runs").iloc[0]
        except (OSError, results.ResultsError, IndexError):
            continue
        if row["status"] != "oom":
            continue
        run_id = cell.run_id or str(row["run_id"])
        reason = (f"it ran out of memory while the {len(cells)} cells of its timing group shared the memory "
                  f"({str(row['error'])[:300]}); timed alone after the group")
        log(f"  {run_id} ran out of memory beside its timing group: timing it alone")
        if cell.log and Path(cell.log).exists():
            Path(cell.log).replace(f"{cell.log}.in-group")
        interleave.run_alone(cell, command=isolated_command, reason=reason)
        retried.append(run_id)
    return retried


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.running.group --rounds R --cell SPEC RUNS CURVES LOG ...``: one timing group."""
    ap = argparse.ArgumentParser(prog="python -m harness.running.group", description=main.__doc__)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--cell", nargs=4, action="append", required=True,
                    metavar=("SPEC", "RUNS_OUT", "CURVES_OUT", "LOG"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: need at least 1")
    cells = [interleave.Cell(spec, runs, curves, log) for spec, runs, curves, log in args.cell]
    interleave.stop_on_signals()
    stops.die_with_parent()  # a killed pipeline takes its timing groups with it
    interleave.run_group(cells, args.rounds, command=isolated_command)
    retry_alone(cells)
    line = eta.pipeline_line(Path(cells[0].runs).parent)  # the group's cells leave it to this process
    if line:
        print(line, file=sys.stderr, flush=True)
    missing = [path for cell in cells for path in (cell.runs, cell.curves) if not Path(path).exists()]
    if missing:  # a cell's supervisor failed to write even its failure row
        print(f"python -m harness.running.group: no result written to {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
