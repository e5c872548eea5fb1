"""The timing cells whose timing is not stable, and how to time them again.

``comera-bench noisy RESULTS... [--delete]`` lists them with their reasons; ``--delete`` removes their
per-cell files under the folders given and nowhere else (:func:`delete_cells`; docs/measurement.md).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness import results
from harness.results.analysis import noisy_reason, unstable_timing_cells


def noisy_cells(paths: list[str | Path]) -> pd.DataFrame:
    """Ok timing rows that are not stable (run_id, timing_group, timing_quality), from files or folders;
    a folder without runs files raises ResultsError naming it."""
    for folder in (Path(p) for p in paths if Path(p).is_dir()):
        if not results.expand_paths([folder], "runs"):
            raise results.ResultsError(f"no results in {folder} (no *.runs.parquet files); name a "
                                       "results/runs/<device> folder or a runs table")
    files = results.expand_paths(paths, "runs")
    frames = [results.read_parquet(f, "runs") for f in files]
    if not frames:
        return results.empty_frame("runs")
    df = unstable_timing_cells(pd.concat(frames, ignore_index=True))
    return df.drop_duplicates(list(CELL_KEY)).reset_index(drop=True)


CELL_KEY = ("run_id", "hostname", "device_name")
"""The columns that tell one measured cell from another: the grid cell and the machine that timed it."""


def cell_keys(rows: pd.DataFrame) -> set[tuple[str, ...]]:
    """The :data:`CELL_KEY` of each row (a missing value as "")."""
    return {tuple("" if pd.isna(v) else str(v) for v in key)
            for key in rows[list(CELL_KEY)].itertuples(index=False)}


def summary(paths: list[str | Path], cells_dir: str, *, configfiles: Sequence[str] = (),
            settings: dict[str, str] | None = None, target: str = "figures", config_args: Sequence[str] = (),
            directory: str | None = None, env: dict[str, str] | None = None) -> str:
    """Lines naming the noisy timing cells and the commands that time them again ('' when none); the
    Snakemake command repeats the run's options (:func:`snakemake_command`), so it re-times the cells it
    deletes."""
    df = noisy_cells(paths)
    if not len(df):
        return ""
    lines = [f"{len(df)} timing cell(s) were not timed stably; no verdict or ratio uses them:"]
    lines += [f"  {r.run_id}: {noisy_reason(r)}" for _, r in df.iterrows()]
    command = snakemake_command(["--cores", "1", target], configfiles=configfiles, settings=settings,
                                config_args=config_args, directory=directory)
    lines.append(f"To time them again (with their timing groups) on a quieter machine: "
                 f"comera-bench noisy {shlex.quote(cells_dir)} --delete && {as_typed(command, env)}")
    return "\n".join(lines)


def snakemake_command(arguments: Sequence[str], *, configfiles: Sequence[str] = (),
                      settings: dict[str, str] | None = None, config_args: Sequence[str] = (),
                      directory: str | None = None) -> list[str]:
    """``snakemake <arguments>`` repeating a run's options, so that it works on that run's grid and
    folders: its ``--directory``, ``configfiles`` (the target goes before ``--configfile``, which takes
    every file name after it), and its ``--config`` values: ``config_args`` as given (``key=value``) and
    ``settings`` (a dict)."""
    command = ["snakemake", *arguments]
    if directory:
        command += ["--directory", directory]
    if configfiles:
        command += ["--configfile", *configfiles]
    values = [*config_args, *(f"{k}={v}" for k, v in (settings or {}).items())]
    if values:
        command += ["--config", *values]
    return command


def as_typed(command: Sequence[str], env: dict[str, str] | None = None) -> str:
    """``command`` as a shell line, after the environment variables ``env`` it needs (``NAME=value``)."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()), shlex.join(command)])


def delete_cells(paths: Sequence[str | Path], cells: pd.DataFrame) -> tuple[list[Path], list[str]]:
    """Remove the per-cell runs and curves files of the noisy cells ``cells`` found under the folders among
    ``paths`` (recursively); returns (the files removed, notes on what was left).

    A file goes only when its own row is a noisy timing cell listed in ``cells`` (same run_id, host and
    device: :data:`CELL_KEY`), it is named after that row's run_id, and it lies inside its folder (resolved
    paths checked: a stored run_id such as ``../x`` names no file). So another device's files of the same
    cells stay, stable or not listed. A runs table given as a file is left as it is (a note says so), as
    are the noisy cells that have no per-cell file there.

    Args:
        paths: results/runs/<device> folders (or runs tables, left alone).
        cells: the noisy rows to delete, as :func:`noisy_cells` gives them.
    """
    removed, notes, found = [], [], set()
    wanted = cell_keys(cells)
    run_ids = {key[0] for key in wanted}
    odd = sorted(rid for rid in run_ids if Path(rid).name != rid or rid.startswith((".", "-")))
    if odd:
        notes.append(f"refused: run_id {', '.join(map(repr, odd))} is not a plain file name (a row altered "
                     "or written elsewhere); nothing is deleted for it")
        run_ids = run_ids - set(odd)
    for given in map(Path, paths):
        if not given.is_dir():
            notes.append(f"{given} is a runs table, not a folder of per-cell files: nothing deleted for it "
                         "(name the results/runs/<device> folder the pipeline writes its cells to)")
            continue
        root = given.resolve()
        for runs in results.expand_paths([given], "runs"):
            name = runs.name.removesuffix(".runs.parquet")
            if name not in run_ids:
                continue
            rows = results.read_parquet(runs, "runs")
            if rows.run_id.tolist() != [name] or not runs.parent.resolve().is_relative_to(root):
                notes.append(f"{runs} left: it does not hold the one row of cell {name} inside {given}")
                continue
            own = cell_keys(unstable_timing_cells(rows))
            if not own or not own <= wanted:
                notes.append(f"{runs} left: its own row is not one of the noisy cells listed (stable, or "
                             "another host or device)")
                continue
            found.add(name)
            for path in (runs, runs.with_name(f"{name}.curves.parquet")):
                if path.exists():
                    path.unlink()
                    removed.append(path)
    missing = sorted(run_ids - found)
    if missing:
        listed = ", ".join(map(repr, missing[:10])) + (" ..." if len(missing) > 10 else "")
        notes.append(f"{len(missing)} noisy cell(s) have no per-cell files in the folders given, so they "
                     f"stay as they are: {listed}")
    return removed, notes


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="comera-bench noisy", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results/runs/<device> folders or runs tables")
    ap.add_argument("--delete", action="store_true",
                    help="remove their per-cell runs and curves files so the pipeline times them again")
    args = ap.parse_args(argv)
    try:
        df = noisy_cells(args.results)
    except results.ResultsError as exc:
        print(f"comera-bench noisy: {exc}", file=sys.stderr)
        return 1
    if not len(df):
        print("every ok timing cell is stable")
        return 0
    for _, r in df.iterrows():
        print(f"{r.run_id}\t{noisy_reason(r)}")
    if args.delete:
        removed, notes = delete_cells(args.results, df)
        for note in notes:
            print(f"comera-bench noisy: {note}", file=sys.stderr)
        cells = sum(path.name.endswith(".runs.parquet") for path in removed)
        if removed:
            print(f"removed {len(removed)} file(s) of {cells} cell(s); the next pipeline run times these "
                  "cells (and their groups) again", file=sys.stderr)
        else:
            print("removed nothing; no cell will be timed again", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
