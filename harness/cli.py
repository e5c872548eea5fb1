"""The ``comera-bench`` command.

    comera-bench run --spec SPEC.json --runs-out R.parquet --curves-out C.parquet [--isolate --log L]
    comera-bench run --workload transformer --method comera --batch-size 8 [...]   (defaults, results/cli/)
    comera-bench show [RESULTS...] [--where col=value|col>=x|col~text|col=null ...] [--group-by cols]
                      [--columns cols] [--csv]
    comera-bench merge --kind runs|curves|microbench|bench --out OUT.parquet FILE_OR_DIR...
    comera-bench noisy RESULTS... [--delete]   (the timing cells that were not stable, to time them again)
    comera-bench microbench|bench|compare ...
                      (harness.perf.microbench / harness.perf.bench / harness.reports.compare)
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import harness
from harness import params, plugins
from harness import spec as specs
from harness.configs import yamlnum
from harness.core import stops

if TYPE_CHECKING:
    import pandas as pd

DELEGATED = {"microbench": "harness.perf.microbench", "bench": "harness.perf.bench",
             "compare": "harness.reports.compare",
             "merge": "harness.results", "noisy": "harness.reports.noisy"}
DEFAULT_RESULTS_DIR = "results/cli"
"""Where ``comera-bench run`` writes a cell given without --runs-out (apart from the pipeline's
results/runs)."""
SHOW_COLUMNS = {
    "runs": ["run_id", "workload", "method", "variant", "batch_size", "target_ratio", "seed", "status",
             "step_time_ms", "step_time_ms_iqr", "timing_quality", "epoch_time_s", "peak_mem_bytes",
             "metric_name", "metric_value", "compression_total", "device"],
    "curves": None,  # every column
    "microbench": ["op", "variant", "shape", "tokens", "rank", "direction", "time_ms", "time_ms_iqr",
                   "timing_quality", "peak_mem_bytes", "flops", "device"],
    "bench": ["target", "what", "measured", "goal", "bound", "verdict", "device_name", "started_at"],
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(DELEGATED[argv[0]])
        entry = "cli_merge" if argv[0] == "merge" else "cli"
        return int(getattr(module, entry)(argv[1:]) or 0)
    try:
        parser = _parser(list_names=any(arg in ("-h", "--help") for arg in argv))
    except plugins.PluginError as exc:  # the parser lists the methods and workloads, plug-ins included
        print(f"comera-bench: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


def _parser(list_names: bool = False) -> argparse.ArgumentParser:
    """The command's parser; ``list_names``: the run options' help lists the workloads and methods (that
    imports torch and the plug-ins, which a cell's supervisor does not need)."""
    parser = argparse.ArgumentParser(prog="comera-bench", description=__doc__.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"comera-bench {harness.package_version() or 'unknown'}")
    sub = parser.add_subparsers(dest="command")
    for name, module in DELEGATED.items():
        sub.add_parser(name, help=f"see `comera-bench {name} --help` ({module})", add_help=False)

    run = sub.add_parser("run", help="run one grid cell and write its runs/curves Parquet files")
    run.add_argument("--spec", help="spec JSON file (when given, the cell options below are not allowed)")
    run.add_argument("--runs-out", help="runs Parquet file (default "
                                        f"{DEFAULT_RESULTS_DIR}/<device>/<run_id>.runs.parquet, or under "
                                        "--results-dir)")
    run.add_argument("--curves-out", help="curves Parquet file (default next to --runs-out)")
    cell = run.add_argument_group("a cell without a spec file")
    workload_names = method_names = "see --help"
    if list_names:
        import baselines
        import harness.workloads as workloads

        workload_names, method_names = ", ".join(workloads.WORKLOADS), ", ".join(baselines.METHODS)
    cell.add_argument("--workload", help=f"one of {workload_names} (plug-ins included)")
    cell.add_argument("--method", help=f"one of {method_names} (plug-ins included)")
    params.add_options(cell, specs.Spec, skip=("workload", "method"))
    cell.add_argument("--workload-param", action="append", default=[], metavar="KEY=VALUE",
                      help="workload parameter (YAML value), repeatable")
    cell.add_argument("--method-param", action="append", default=[], metavar="KEY=VALUE",
                      help="method parameter (YAML value), repeatable")
    params.add_options(cell, specs.Budget, prefix="budget.")
    params.add_options(cell, specs.Execution, prefix="execution.", aliases={"num_threads": "--threads"})
    cell.add_argument("--results-dir", default=None,
                      help="folder for the default output paths and the data cache (default results/cli: "
                           "apart from the pipeline's results/runs, whose cells have the same names; with "
                           "--runs-out, the cache goes beside the runs file)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar on stderr (default: when stderr is a terminal); without it, a line "
                          "'step N of M, elapsed, ETA' every 15 s")
    run.add_argument("--fail-on-error", action="store_true",
                     help="exit with 1 when the run's status is not ok (the files are written anyway)")
    run.add_argument("--isolate", action="store_true",
                     help="run the cell in a child process; if it dies without writing its row (killed by a "
                          "signal, e.g. the OOM killer), write one here: status oom, or error naming the "
                          "signal (harness/running/supervise.py; needs --spec and --runs-out)")
    run.add_argument("--log", help="with --isolate: the child's output goes to this file; this process's "
                                   "own messages stay on stderr")
    run.set_defaults(func=_cmd_run)

    show = sub.add_parser("show", help="print result tables")
    show.add_argument("results", nargs="*", default=["results"],
                      help="Parquet files or folders (default: results)")
    show.add_argument("--kind", choices=tuple(SHOW_COLUMNS), default="runs")
    show.add_argument("--where", action="append", default=[], metavar="COL=VALUE",
                      help="keep rows where COL=VALUE; also != > >= < <= (numbers), ~ (contains), VALUE null "
                           "for missing values (repeatable; all must hold)")
    show.add_argument("--group-by", help="comma-separated columns; also every setting column (workload, "
                      "method, variant, batch_size, seq_len, target_ratio, purpose, device) whose values "
                      "differ inside a group, said on stderr; numeric columns summarised by their median, "
                      "with the row count in n, the seeds listed, status and timing_quality counted")
    show.add_argument("--columns", help="comma-separated columns to print")
    show.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    show.set_defaults(func=_cmd_show)
    return parser


# ------------------------------------------------------------------------------------------- run

def _key_values(items: list[str], option: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"comera-bench run: {option} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = yamlnum.load(value)
        except yaml.YAMLError as exc:
            reason = str(getattr(exc, "problem", "") or exc).strip()
            raise SystemExit(f"comera-bench run: {option} {item!r}: the value is not valid YAML "
                             f"({reason})") from None
    return out


def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """A spec built from the cell options (:func:`harness.params.add_options` of :class:`harness.spec.Spec`,
    its budget and execution): the options given, the spec's defaults for the rest (as a config's)."""
    missing = [opt for opt, v in (("--workload", args.workload), ("--method", args.method),
                                  ("--batch-size", args.batch_size)) if v is None]
    if missing:
        raise SystemExit(f"comera-bench run: without --spec, {', '.join(missing)} must be given")
    return {
        "workload": args.workload, "method": args.method, **params.given_options(args, specs.Spec),
        "workload_params": _key_values(args.workload_param, "--workload-param"),
        "method_params": _key_values(args.method_param, "--method-param"),
        "budget": params.given_options(args, specs.Budget, prefix="budget."),
        "execution": params.given_options(args, specs.Execution, prefix="execution."),
    }


def _curves_path(runs_out: str | Path) -> Path:
    """The curves file next to a runs file: ``X.runs.parquet`` -> ``X.curves.parquet``."""
    runs_out = Path(runs_out)
    stem = runs_out.name[:-len(".runs.parquet")] if runs_out.name.endswith(".runs.parquet") else runs_out.stem
    return runs_out.with_name(f"{stem}.curves.parquet")


def _cmd_run_isolated(args: argparse.Namespace) -> int:
    """--isolate: the cell in a child process (harness.running.supervise); this process does not import torch
    unless it has to write the row itself."""
    from harness.running import checkpoint, supervise, watchdog

    if not args.spec or not args.runs_out or any(getattr(args, opt) is not None
                                                 for opt in ("workload", "method", "batch_size")):
        print("comera-bench run: --isolate needs --spec and --runs-out (no cell options)", file=sys.stderr)
        return 2
    try:  # a bad value would fail the child with a row that does not say why: no row, the variable named
        watchdog.stall_limit_s()
        checkpoint.every_s()
    except ValueError as exc:
        print(f"comera-bench run: {exc}; no row written", file=sys.stderr)
        return 2
    curves_out = args.curves_out or _curves_path(args.runs_out)
    command = [sys.executable, "-m", "harness.cli", "run", "--spec", args.spec, "--runs-out", args.runs_out,
               "--curves-out", str(curves_out)]
    if args.progress is not None:
        command.append("--progress" if args.progress else "--no-progress")
    code, status = supervise.supervise(command, args.spec, args.runs_out, curves_out, log=args.log)
    from harness.core import interleave
    from harness.running import eta

    # a cell of a timing group: its coordinator prints the line once, when the whole group is done
    line = "" if os.environ.get(interleave.ENV) else eta.pipeline_line(Path(args.runs_out).parent)
    if line:
        print(line, file=sys.stderr)
    return 1 if code == 0 and args.fail_on_error and status != "ok" else code


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.data.cache import run_cache

    stops.die_with_parent()  # a cell of a timing group, or under a supervisor, ends with its parent
    with run_cache(cache_folder(args)):  # unless the pipeline named one
        return _run_cell(args)


def cache_folder(args: argparse.Namespace) -> Path:
    """The data cache of ``comera-bench run``: ``<--results-dir>/cache``; without --results-dir, beside the
    runs file when --runs-out names one, else under the default results folder (results/cli)."""
    if args.results_dir is None and args.runs_out:
        return Path(args.runs_out).parent / "cache"
    return Path(args.results_dir or DEFAULT_RESULTS_DIR) / "cache"


def _run_cell(args: argparse.Namespace) -> int:
    if args.isolate:
        return _cmd_run_isolated(args)
    if args.log:
        print("comera-bench run: --log needs --isolate", file=sys.stderr)
        return 2
    from harness import running
    from harness import spec as specs
    from harness.core import measure
    from harness.running import run as runner

    cell_given = [opt for opt in ("workload", "method", "batch_size") if getattr(args, opt) is not None]
    try:  # a usage error is refused here, before any file is written
        checks = runner.default_registry().checks
        if args.spec:
            if cell_given:
                raise specs.SpecError(f"--spec cannot be combined with --{cell_given[0].replace('_', '-')}")
            spec = specs.load(args.spec, checks)
        else:
            spec = specs.make(spec_from_args(args), checks)
        running.check_environment()  # COMERA_BENCH_STALL_LIMIT_S, COMERA_BENCH_CHECKPOINT_S
    except ValueError as exc:
        print(f"comera-bench run: {exc}", file=sys.stderr)
        return 2
    runs_out, curves_out = args.runs_out, args.curves_out
    if runs_out is None:
        device = spec.execution.device
        if device == "auto":
            device = measure.resolve_device("auto").type
        folder = Path(args.results_dir or DEFAULT_RESULTS_DIR) / device.split(":")[0]
        runs_out = folder / f"{spec.run_id}.runs.parquet"
        specs.write(spec, folder / f"{spec.run_id}.spec.json")
    if curves_out is None:
        curves_out = _curves_path(runs_out)
    try:
        row = runner.run_to_files(spec, runs_out, curves_out, progress=args.progress,
                                  hang_exit_status=1 if args.fail_on_error else 0,
                                  started_at=stops.cell_started_at())
    except runner.EnvironmentFault as exc:
        print(f"comera-bench run: environment fault: {exc.strerror} ({exc.filename}); no row written, "
              "the cell runs again next time", file=sys.stderr)
        return runner.EXIT_ENVIRONMENT_FAULT
    summary = f"{row['run_id']}: {row['status']}"
    if row["status"] == "ok":
        summary += (f", step {row['step_time_ms']:.3g} ms, {row['metric_name']} "
                    f"{row['metric_value']:.4g}")
    else:
        summary += f" ({row['error']})"
    print(f"{summary} -> {runs_out}", file=sys.stderr)
    return 1 if args.fail_on_error and row["status"] != "ok" else 0


# ------------------------------------------------------------------------------------------ show

def _find_results(paths: list[str], kind: str) -> list[Path]:
    """Files as given; a folder gives its merged ``<kind>.parquet`` tables when it has any, else its
    per-cell ``*.<kind>.parquet`` files."""
    from harness import results

    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            merged = sorted(p.rglob(f"{kind}.parquet"))
            found.extend(merged or results.expand_paths([p], kind))
        elif p.exists():
            found.append(p)
        else:
            raise results.ResultsError(f"no such result file or folder: {p}")
    return found


_WHERE = re.compile(r"([A-Za-z0-9_]+)(!=|>=|<=|=|>|<|~)(.*)", re.S)
_COMPARE = {"=": "__eq__", "!=": "__ne__", ">=": "__ge__", "<=": "__le__", ">": "__gt__", "<": "__lt__"}
SETTINGS = ("workload", "method", "variant", "batch_size", "seq_len", "target_ratio", "purpose",
            "cuda_graph", "compile", "matmul_precision", "device_name", "device")
"""Columns naming what a cell ran: a --group-by summary never pools two values of one of them (it groups by
each one whose values differ inside a group it was asked for, and says so)."""
COUNTED = ("status", "timing_quality")
"""Text columns a --group-by summary counts per group ("2 ok", "1 stable, 1 noisy")."""


def _parse_where(items: list[str], df: pd.DataFrame) -> pd.Series:
    """Rows that meet every ``COL<op>VALUE``: op one of = != > >= < <= (numbers compare as numbers) or ~
    (the value occurs in the text); VALUE ``null`` matches missing values (= and != only)."""
    import pandas as pd  # lazily (here and below): a cell's supervisor needs neither pandas nor pyarrow

    from harness import results

    keep = pd.Series(True, index=df.index)
    for item in items:
        m = _WHERE.fullmatch(item)
        if m is None:
            raise results.ResultsError(f"--where expects COL=VALUE (or != > >= < <= ~), got {item!r}")
        col, op, value = m.groups()
        if col not in df.columns:
            raise results.ResultsError(f"--where: unknown column {col!r}; columns: {list(df.columns)}")
        column = df[col]
        if value == "null":
            if op not in ("=", "!="):
                raise results.ResultsError(f"--where {item!r}: null takes = or != only")
            keep &= column.isna() if op == "=" else column.notna()
            continue
        if op == "~":
            keep &= column.astype(str).str.contains(value, regex=False) & column.notna()
            continue
        if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            try:
                number = float(value)
            except ValueError:
                if op not in ("=", "!="):
                    raise results.ResultsError(f"--where {item!r}: {col} is numeric, {value!r} is not a "
                                               "number")
            else:
                keep &= getattr(column.astype(float), _COMPARE[op])(number).fillna(False).astype(bool)
                continue
        elif op not in ("=", "!="):
            raise results.ResultsError(f"--where {item!r}: {op} compares numbers; {col} is text (use = != ~)")
        text = column.astype(str).where(column.notna(), None)
        keep &= (text == value) if op == "=" else (text != value)
    return keep


def setting_keys(df: pd.DataFrame, keys: list[str]) -> list[str]:
    """The :data:`SETTINGS` columns outside ``keys`` whose values differ inside some group of ``keys`` (after
    grouping by the ones before it), in :data:`SETTINGS` order: what a summary must also group by."""
    added: list[str] = []
    for col in SETTINGS:
        if col in keys or col not in df.columns or not len(df):
            continue
        if (df.groupby(keys + added, dropna=False)[col].nunique(dropna=False) > 1).any():
            added.append(col)
    return added


def seeds_text(values: pd.Series) -> str:
    """"0,1": the distinct seeds of ``values``, in order."""
    return ",".join(map(str, sorted(int(x) for x in values.dropna().unique())))


def _counted(values: pd.Series) -> str:
    """"2 ok" / "1 stable, 1 noisy": each value's first word with its count (a missing value: "-")."""
    words = values.map(lambda v: str(v).split(":")[0] if isinstance(v, str) and v else "-")
    return ", ".join(f"{n} {word}" for word, n in words.value_counts(sort=False).sort_index().items())


def summary(df: pd.DataFrame, keys: list[str], cols: list[str]) -> pd.DataFrame:
    """One row per group of ``keys``: ``n``, the median of each numeric column of ``cols``, the seeds as a
    list (``seeds``), :data:`COUNTED` columns as counts, other text columns as their distinct values;
    ``run_id`` and JSON columns are left out."""
    import pandas as pd

    grouped = df.groupby(keys, dropna=False)
    parts = {"n": grouped.size()}
    for col in cols:
        if col in keys or col in ("run_id", "settings", "extra", "error"):
            continue
        column = df[col]
        if col == "seed":
            parts["seeds"] = grouped[col].agg(seeds_text)
        elif col in COUNTED:
            parts[col] = grouped[col].agg(_counted)
        elif pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            parts[col] = grouped[col].median()
        else:
            parts[col] = grouped[col].agg(lambda v: ", ".join(sorted({str(x) for x in v.dropna()})))
    return pd.DataFrame(parts).reset_index()


def _columns(spec: str | None, df: pd.DataFrame, default: list[str]) -> list[str]:
    from harness import results

    if spec is None:
        return [c for c in default if c in df.columns]
    cols = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = [c for c in cols if c not in df.columns]
    if unknown:
        raise results.ResultsError(f"unknown column(s) {unknown}; columns: {list(df.columns)}")
    return cols


def show_table(paths: list[str], *, kind: str = "runs", where: list[str] = (), group_by: str | None = None,
               columns: str | None = None) -> pd.DataFrame:
    """The frame ``comera-bench show`` prints."""
    import pandas as pd

    from harness import results

    files = _find_results(paths, kind)
    frames = [results.read_parquet(f, kind) for f in files]
    df = pd.concat(frames, ignore_index=True) if frames else results.empty_frame(kind)
    df = df[_parse_where(list(where), df)]
    if group_by:
        keys = _columns(group_by, df, [])
        added = setting_keys(df, keys)
        if added:
            print(f"comera-bench show: grouped by {', '.join(added)} too: their values differ inside the "
                  f"groups of --group-by {','.join(keys)}, and a summary never pools two settings (select "
                  f"one with --where {added[0]}=...)", file=sys.stderr)
        cols = _columns(columns, df, SHOW_COLUMNS[kind] or list(df.columns))
        return summary(df, keys + added, cols)
    return df[_columns(columns, df, SHOW_COLUMNS[kind] or list(df.columns))].reset_index(drop=True)


def _cmd_show(args: argparse.Namespace) -> int:
    import pandas as pd

    from harness import results

    try:
        df = show_table(args.results, kind=args.kind, where=args.where, group_by=args.group_by,
                        columns=args.columns)
    except results.ResultsError as exc:
        print(f"comera-bench show: {exc}", file=sys.stderr)
        return 1
    if args.csv:
        sys.stdout.write(df.to_csv(index=False))
    elif df.empty:
        print(f"(no {args.kind} rows)")
    else:
        with pd.option_context("display.width", 250, "display.max_columns", None,
                               "display.max_colwidth", 60, "display.float_format", "{:.4g}".format):
            print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
