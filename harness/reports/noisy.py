"""The timing cells whose timing is not stable, and how to time them again.

``comera-bench noisy RESULTS... [--delete]``: RESULTS are per-cell folders (results/runs/<device>) or
merged runs tables. Lists every ok timing cell whose ``timing_quality`` is not "stable", with its
reason. ``--delete`` removes their per-cell files (runs, curves), so that the next ``snakemake ...
figures`` times them again -- each with its whole timing group, since ratios come only from cells
timed together. The pipeline prints this list at its end (workflow/rules/common.smk).
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
    return df.drop_duplicates("run_id").reset_index(drop=True)


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
        removed = 0
        for folder in (Path(p) for p in args.results if Path(p).is_dir()):
            for rid in df.run_id:
                for kind in ("runs", "curves"):
                    path = folder / f"{rid}.{kind}.parquet"
                    if path.exists():
                        path.unlink()
                        removed += 1
        print(f"removed {removed} file(s); the next pipeline run times these cells (and their groups) again",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
