"""The pipeline's merge of a grid's cells: its grid file, then its runs and curves tables.

``python -m harness.configs.merge_cells --cells DIR --grid-out G --runs-out R --curves-out C RUN_ID...``
reads ``DIR/<run_id>.{spec.json,runs.parquet,curves.parquet}`` of each cell named, so that the command
names each cell once (not its three files), and runs as a plain process (a Snakemake ``run:`` block
would start a second Snakemake to run it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import results
from harness.configs import grid


def steps(args: argparse.Namespace) -> list[tuple[str, object, list[str]]]:
    """(name, function, argv) of the three steps, in order: the grid file, the runs, the curves."""
    cells = Path(args.cells)
    files = {kind: [str(cells / f"{rid}.{kind}") for rid in args.run_ids]
             for kind in ("spec.json", "runs.parquet", "curves.parquet")}
    empty = ["--allow-empty"] if args.allow_empty else []
    return [("grid", grid.main, ["--out", args.grid_out, "--sweeps", args.sweeps, *files["spec.json"]]),
            ("runs", results.cli_merge, ["--kind", "runs", *empty, "--grid", args.grid_out, "--out",
                                         args.runs_out, *files["runs.parquet"]]),
            ("curves", results.cli_merge, ["--kind", "curves", *empty, "--grid", args.grid_out, "--out",
                                           args.curves_out, *files["curves.parquet"]])]


def main(argv: list[str] | None = None) -> int:
    """Run the steps, stopping at the first that fails; its exit status is this one's, and the last line on
    stderr names the step."""
    ap = argparse.ArgumentParser(prog="python -m harness.configs.merge_cells",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True, help="the folder of the per-cell files")
    ap.add_argument("--sweeps", default="{}", help="JSON: run_id -> sweep point")
    ap.add_argument("--allow-empty", action="store_true", help="no cells: empty tables (a stopped run)")
    ap.add_argument("--grid-out", required=True)
    ap.add_argument("--runs-out", required=True)
    ap.add_argument("--curves-out", required=True)
    ap.add_argument("run_ids", nargs="*")
    args = ap.parse_args(argv)
    for name, step, step_argv in steps(args):
        code = step(step_argv)
        if code:
            print(f"merge_cells: the {name} step failed (exit status {code})", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
