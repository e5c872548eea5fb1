"""Result tables (docs/schema.md): column lists and types, provenance, atomic Parquet I/O, merging.

Kinds :data:`KINDS` (runs, curves, microbench, bench); files are written atomically
(:func:`write_parquet_atomic`), the writer's provenance in the metadata (:data:`METADATA_KEY`) and, but
for curves, in columns; :func:`merge` refuses files of another cell or table (docs/usage.md).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pyarrow as pa

from harness import package_version
from harness.atomic import atomic_write
from harness.spec import HASHES, MATMUL_PRECISIONS

if TYPE_CHECKING:
    import pandas as pd
    import torch

METADATA_KEY = b"comera_bench"

PROVENANCE_TYPES: dict[str, pa.DataType] = {
    "device": pa.string(), "device_name": pa.string(), "num_threads": pa.int64(),
    "torch_version": pa.string(), "cuda_version": pa.string(), "python_version": pa.string(),
    "comera_bench_version": pa.string(), "git_commit": pa.string(), "git_dirty": pa.bool_(),
    "hostname": pa.string(), "started_at": pa.string(),
    "matmul_precision": pa.string(),
}

FINAL_LOSS_WINDOW = 100
"""final_train_loss is the mean task loss over the last (at most) this many steps."""

RUNS_TYPES: dict[str, pa.DataType] = {
    # identity
    "run_id": pa.string(), "workload": pa.string(), "method": pa.string(), "variant": pa.string(),
    "batch_size": pa.int64(), "seq_len": pa.int64(), "rank": pa.int64(), "target_ratio": pa.float64(),
    "seed": pa.int64(), "cell_hash": pa.string(), "execution_hash": pa.string(),
    # status
    "status": pa.string(), "error": pa.string(),
    # time
    "step_time_ms": pa.float64(), "step_time_ms_iqr": pa.float64(), "steps_timed": pa.int64(),
    "epoch_time_s": pa.float64(), "epoch_time_kind": pa.string(), "samples_per_s": pa.float64(),
    # memory
    "peak_mem_bytes": pa.int64(), "peak_mem_kind": pa.string(), "cuda_reserved_bytes": pa.int64(),
    "state_bytes": pa.int64(),
    # quality
    "metric_name": pa.string(), "metric_value": pa.float64(), "final_train_loss": pa.float64(),
    "epochs": pa.float64(),
    # size
    "params_total": pa.int64(), "params_factorized_layers": pa.int64(), "compression_total": pa.float64(),
    "compression_layers": pa.float64(), "ranks": pa.string(),
    **PROVENANCE_TYPES,
    # beyond the paper-facing columns (docs/schema.md)
    "flops_per_step": pa.float64(), "settings": pa.string(), "extra": pa.string(), "purpose": pa.string(),
    "target_reached": pa.bool_(),
    # timing trust (harness.core.timing): the machine's state while the steps ran, the verdict, the rounds
    "timing_quality": pa.string(), "load_avg_1m": pa.float64(), "cpu_pressure": pa.float64(),
    "run_queue_frac": pa.float64(), "cpu_time_ratio": pa.float64(), "timing_group": pa.string(),
    "round_step_ms": pa.string(), "group_start_s": pa.float64(), "round_step_mean_ms": pa.string(),
    # how the cell ran (its spec's execution; num_threads and matmul_precision are provenance columns)
    "cuda_graph": pa.bool_(), "compile": pa.bool_(),
}

CURVES_TYPES: dict[str, pa.DataType] = {
    "run_id": pa.string(), "step": pa.int64(), "epoch": pa.int64(), "split": pa.string(),
    "metric_name": pa.string(), "value": pa.float64(),
}

MICROBENCH_TYPES: dict[str, pa.DataType] = {
    "op": pa.string(), "variant": pa.string(), "shape": pa.string(), "tokens": pa.int64(),
    "rank": pa.int64(), "direction": pa.string(), "time_ms": pa.float64(), "time_ms_iqr": pa.float64(),
    "round_time_ms": pa.string(), "timing_quality": pa.string(), "peak_mem_bytes": pa.int64(),
    "param_bytes": pa.int64(), "output_bytes": pa.int64(), "flops": pa.float64(),
    **PROVENANCE_TYPES,
}

BENCH_TYPES: dict[str, pa.DataType] = {
    "target": pa.int64(), "what": pa.string(), "goal_key": pa.string(), "goal": pa.float64(),
    "better": pa.string(), "measured": pa.float64(), "verdict": pa.string(), "flop_ratio": pa.float64(),
    "traffic_ratio": pa.float64(), "bound": pa.float64(), "bound_basis": pa.string(), "medians": pa.string(),
    "settings": pa.string(), "note": pa.string(), "stability": pa.string(),
    **PROVENANCE_TYPES,
}

TYPES: dict[str, dict[str, pa.DataType]] = {
    "runs": RUNS_TYPES, "curves": CURVES_TYPES, "microbench": MICROBENCH_TYPES, "bench": BENCH_TYPES,
}
PROVENANCE_COLUMNS: list[str] = list(PROVENANCE_TYPES)
FILE_PROVENANCE: tuple[str, ...] = (*PROVENANCE_TYPES, *HASHES)
"""A per-cell file's provenance metadata: the writing process's, and its cell's spec hashes."""
RUNS_COLUMNS: list[str] = list(RUNS_TYPES)
CURVES_COLUMNS: list[str] = list(CURVES_TYPES)
MICROBENCH_COLUMNS: list[str] = list(MICROBENCH_TYPES)
BENCH_COLUMNS: list[str] = list(BENCH_TYPES)
KINDS: tuple[str, ...] = tuple(TYPES)

STATUSES: tuple[str, ...] = ("ok", "oom", "diverged", "error", "timeout")

EXECUTION_TAGS: tuple[str, ...] = ("cudagraph", "compile", *(f"matmul-{p}" for p in MATMUL_PRECISIONS))
"""The tags a ``runs`` file written before the ``cuda_graph`` and ``compile`` columns appended to a row's
variant for its execution (:func:`from_tagged_variants`)."""

_PANDAS_DTYPES = {pa.string(): "object", pa.int64(): "Int64", pa.float64(): "float64",
                  pa.bool_(): "boolean"}


class ResultsError(Exception):
    """A result file that cannot be read or does not belong to the expected table."""


# ----------------------------------------------------------------------------------------- provenance

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str, bool | None]:
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return "", None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (bool(status) if status is not None else None)


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: torch.device | str) -> dict[str, Any]:
    """Where and with what a result was produced (the PROVENANCE_COLUMNS); started_at is now, UTC.

    git_dirty says whether tracked files differ from the commit (None when git is unavailable)."""
    import torch  # lazily: reading and merging results does not need torch

    device = torch.device(device)
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = _cpu_name()
    commit, dirty = _git_state()
    return {
        "device": device.type,
        "device_name": device_name,
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "python_version": platform.python_version(),
        "comera_bench_version": package_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname": socket.gethostname(),
        "started_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


# ------------------------------------------------------------------------------------- frames and I/O

def empty_frame(kind: str) -> pd.DataFrame:
    """A frame with no rows and the columns and dtypes of ``kind``."""
    import pandas as pd  # lazily (here and below): a cell's supervisor never needs pandas
    types = _types(kind)
    return pd.DataFrame({c: pd.Series(dtype=_PANDAS_DTYPES[t]) for c, t in types.items()})


def to_frame(rows: Iterable[dict[str, Any]], kind: str) -> pd.DataFrame:
    """Rows (dicts) as a frame of ``kind``; a missing or unknown column raises ResultsError."""
    import pandas as pd
    rows = list(rows)
    types = _types(kind)
    for i, row in enumerate(rows):
        missing = [c for c in types if c not in row]
        unknown = [c for c in row if c not in types]
        if missing or unknown:
            raise ResultsError(f"{kind} row {i}: missing columns {missing}, unknown columns {unknown}")
    if not rows:
        return empty_frame(kind)
    return coerce(pd.DataFrame(rows, columns=list(types)), kind)


def coerce(df: pd.DataFrame, kind: str, *, source: str = "frame") -> pd.DataFrame:
    """``df`` with exactly the columns of ``kind`` in order and their dtypes (ResultsError naming ``source``
    and the missing or unknown columns otherwise)."""
    types = _types(kind)
    missing = [c for c in types if c not in df.columns]
    unknown = [c for c in df.columns if c not in types]
    if unknown or missing:
        raise ResultsError(f"{source} is not a {kind} table: missing columns {missing}, "
                           f"unknown columns {unknown}")
    out = df[list(types)].copy()
    for col, t in types.items():
        try:
            if t == pa.string():
                out[col] = out[col].astype(object).where(out[col].notna(), None)
            else:
                out[col] = out[col].astype(_PANDAS_DTYPES[t])
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"{source}: column {col!r} cannot be read as {t}: {exc}") from exc
    return out.reset_index(drop=True)


def write_parquet_atomic(df: pd.DataFrame, path: str | os.PathLike, *, kind: str | None = None,
                         provenance: dict[str, Any] | None = None) -> Path:
    """Write ``df`` to ``path`` atomically (harness.atomic: temporary file in the same folder, stale ones
    of killed writers removed, fsync, os.replace).

    With ``kind`` the frame is checked and typed against that table's columns. ``provenance`` (default:
    taken from the frame's provenance columns when they hold a single value each) is stored in the file's
    key-value metadata together with the kind."""
    import pyarrow.parquet as pq
    if kind is not None:
        df = coerce(df, kind)
    if provenance is None:
        provenance = _frame_provenance(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps({"kind": kind, "provenance": provenance}, default=str).encode()
    table = table.replace_schema_metadata(meta)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)

    return atomic_write(path, write, fsync=True)


def read_parquet(path: str | os.PathLike, kind: str | None = None) -> pd.DataFrame:
    """Read one result file; a corrupt file, or (with ``kind``) a foreign one or one of another schema,
    raises ResultsError naming the path."""
    import pyarrow.parquet as pq
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ResultsError(f"cannot read result file {path}: {exc}") from exc
    if kind is not None:
        _check_text_columns(table.schema, kind, path)
    df = table.to_pandas()
    if kind == "runs" and "variant" in df.columns and not {"cuda_graph", "compile"} & set(df.columns):
        df = from_tagged_variants(df)
    if kind is not None:
        df = coerce(df, kind, source=str(path))
    return df


def from_tagged_variants(df: pd.DataFrame) -> pd.DataFrame:
    """A ``runs`` table written before the ``cuda_graph`` and ``compile`` columns, as a current one: those
    columns from the execution tags its writer appended to each row's variant (``+cudagraph``, ``+compile``;
    :data:`EXECUTION_TAGS`), and the variant without the tags (the config's).

    Args:
        df: the older table (columns as read; ``variant`` may hold tags).

    Returns:
        A copy with the two columns added and the tags removed from ``variant``.

    Example:
        >>> import pandas as pd
        >>> from_tagged_variants(pd.DataFrame({"variant": ["default+cudagraph+matmul-high"]})).iloc[0].tolist()
        ['default', True, False]
    """
    tags = [str(v).split("+") if isinstance(v, str) else [] for v in df["variant"]]
    return df.assign(
        variant=["+".join(t for t in parts if t not in EXECUTION_TAGS) if isinstance(v, str) else v
                 for v, parts in zip(df["variant"], tags)],
        cuda_graph=["cudagraph" in parts for parts in tags], compile=["compile" in parts for parts in tags])


def _check_text_columns(schema: pa.Schema, kind: str, path: Path) -> None:
    """ResultsError naming ``path`` and the column when a text column of ``kind`` holds other values (a
    number, a list): pandas would carry them into the merged table, where pyarrow refuses them naming
    no file. (Numeric and boolean columns are checked as they are converted, :func:`coerce`.)"""
    for col, expected in _types(kind).items():
        if expected != pa.string() or col not in schema.names:
            continue
        found = schema.field(col).type
        if pa.types.is_dictionary(found):
            found = found.value_type
        if not (pa.types.is_string(found) or pa.types.is_large_string(found) or pa.types.is_null(found)):
            raise ResultsError(f"{path}: column {col!r} cannot be read as {expected}: it holds {found} values "
                               "(was the file edited, or written by another tool?)")


def file_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``comera_bench`` key-value metadata of a result file ({} when absent)."""
    import pyarrow.parquet as pq
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise ResultsError(f"cannot read result file {path}: {exc}") from exc
    raw = meta.get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def expand_paths(paths: Sequence[str | os.PathLike], kind: str) -> list[Path]:
    """Files as given; a folder stands for its ``*.<kind>.parquet`` files (recursively), sorted; a file
    named twice is read once."""
    out: list[Path] = []
    for p in map(Path, paths):
        found = sorted(p.rglob(f"*.{kind}.parquet")) if p.is_dir() else [p]
        out.extend(f for f in found if f.resolve() not in {o.resolve() for o in out})
    return out


def load_grid(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The cells (run_id -> spec) of a grid file (``python -m harness.configs.grid``); ResultsError naming it."""
    try:
        return dict(json.loads(Path(path).read_text())["cells"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"cannot read grid file {path}: {type(exc).__name__}: {exc}") from exc


def check_cells(df: pd.DataFrame, path: Path, cells: dict[str, dict[str, Any]], grid: str | os.PathLike) -> None:
    """ResultsError naming ``path`` (a per-cell runs file) unless it holds exactly one row, the grid cell the
    file is named after, run from the grid's spec (same cell_hash and execution_hash): a file of another
    config is refused, not merged, and so is one with no row (its cell would vanish from every table) or
    with its row more than once (merged as several runs)."""
    name = path.name.removesuffix(".runs.parquet")
    advice = (f"it was written by another config than the grid's ({grid}): delete it and its curves file, then "
              "run the pipeline again (the cell runs again)")
    if len(df) != 1 and set(df["run_id"]) <= {name}:
        held = (f"holds {len(df)} rows of cell {name}, not one" if len(df) else
                f"holds no row: cell {name} has no result")
        raise ResultsError(f"{path} {held} (a damaged or hand-made file); delete it and "
                           "its curves file, then run the pipeline again (the cell runs again)")
    for _, row in df.iterrows():
        rid = row["run_id"]
        if rid != name:
            raise ResultsError(f"{path} holds the row of cell {rid}, not of cell {name}; {advice}")
        if rid not in cells:
            raise ResultsError(f"{path}: cell {rid} is not in the grid; {advice}")
        for key in HASHES:
            if row[key] != cells[rid].get(key):
                raise ResultsError(f"{path}: its row of cell {rid} was run from another spec ({key} "
                                   f"{row[key]}; the grid's is {cells[rid].get(key)}); {advice}")


def check_curves(df: pd.DataFrame, path: Path, cells: dict[str, dict[str, Any]],
                 grid: str | os.PathLike) -> None:
    """ResultsError naming ``path`` (a per-cell curves file) unless every row is of the grid cell the file is
    named after and the file, where it says, was written from the grid's spec (its cell and execution
    hashes)."""
    name = path.name.removesuffix(".curves.parquet")
    advice = (f"it does not belong to this grid ({grid}): delete it and its runs file, then run the pipeline "
              "again (the cell runs again)")
    others = sorted(set(df["run_id"]) - {name})
    if others:
        raise ResultsError(f"{path} holds curves of cell(s) {', '.join(map(repr, others[:5]))}, not only of "
                           f"cell {name}; {advice}")
    if name not in cells:
        raise ResultsError(f"{path}: cell {name} is not in the grid; {advice}")
    provenance = file_metadata(path).get("provenance") or {}
    for key in HASHES:
        written = provenance.get(key)
        if written and written != cells[name].get(key):
            raise ResultsError(f"{path}: its curves of cell {name} were run from another spec ({key} "
                               f"{written}; the grid's is {cells[name].get(key)}); {advice}")


def check_timing_groups(files: list[tuple[Path, pd.DataFrame]]) -> None:
    """ResultsError naming the files of a timing group whose rows come from another host or device than
    the group's others: cells timed together ran on one machine in the same rounds, so such a file (copied
    from another machine, with the same config) is not one of them."""
    machines: dict[str, dict[tuple[Any, Any], list[Path]]] = {}
    for path, df in files:
        for group, host, device in zip(df["timing_group"], df["hostname"], df["device_name"]):
            if isinstance(group, str) and group:
                machines.setdefault(group, {}).setdefault((host, device), []).append(path)
    for group, found in sorted(machines.items()):
        if len(found) > 1:
            usual = max(found, key=lambda machine: len(found[machine]))
            odd = [f"{p} (host {host}, device {device})"
                   for (host, device), paths in sorted(found.items(), key=str) if (host, device) != usual
                   for p in paths]
            raise ResultsError(f"timing group {group}: its cells ran on host {usual[0]}, device {usual[1]}, "
                               f"but {'; '.join(odd)} ran elsewhere; cells timed together run on one machine "
                               "in the same rounds: delete the other machine's files (runs and curves), then "
                               "run the pipeline again (the group is timed again)")


def merge(paths: Sequence[str | os.PathLike], out: str | os.PathLike | None, kind: str, *,
          grid: str | os.PathLike | None = None) -> pd.DataFrame:
    """Concatenate result files of one kind (never dropping a row) and write ``out`` atomically (when
    given). Any unreadable, truncated or foreign file raises ResultsError naming its path. With ``grid``
    (runs and curves), every file must hold its own cell's rows, run from the grid's spec
    (:func:`check_cells`, :func:`check_curves`), and a timing group's runs rows must come from one host and
    device (:func:`check_timing_groups`)."""
    import pandas as pd

    _types(kind)
    cells = load_grid(grid) if grid is not None else None
    frames, files = [], []
    for path in expand_paths(paths, kind):
        frame = read_parquet(path, kind)
        if cells is not None and kind == "runs":
            check_cells(frame, path, cells, grid)
            files.append((path, frame))
        elif cells is not None:
            check_curves(frame, path, cells, grid)
        frames.append(frame)
    check_timing_groups(files)
    frames = [f for f in frames if len(f)]
    df = coerce(pd.concat(frames, ignore_index=True), kind) if frames else empty_frame(kind)
    if out is not None:
        write_parquet_atomic(df, out, kind=kind, provenance={"merged_from": len(frames)})
    return df


def cli_merge(argv: list[str]) -> int:
    """``comera-bench merge --kind runs|curves|microbench --out OUT.parquet FILE_OR_DIR...``"""
    ap = argparse.ArgumentParser(prog="comera-bench merge",
                                 description="Concatenate per-cell result files into one table.")
    ap.add_argument("--kind", required=True, choices=KINDS)
    ap.add_argument("--out", required=True, help="merged Parquet file (written atomically)")
    ap.add_argument("inputs", nargs="*", help="result files, or folders holding *.<kind>.parquet")
    ap.add_argument("--allow-empty", action="store_true",
                    help="with no inputs, write an empty table (the pipeline's grids without micro-benchmarks)")
    ap.add_argument("--grid", help="runs and curves: the grid file (grid.json); a per-cell file whose rows "
                                   "are not its cell's, run from the grid's spec, is refused, naming it; "
                                   "so is a runs file of a timing group from another host or device")
    args = ap.parse_args(argv)
    if args.grid and args.kind not in ("runs", "curves"):
        ap.error("--grid goes with --kind runs or curves")
    if not args.inputs and not args.allow_empty:
        print(f"comera-bench merge: no input files or folders given; {args.out} left as it is", file=sys.stderr)
        return 2
    if args.inputs and not args.allow_empty and not expand_paths(args.inputs, args.kind):
        print(f"comera-bench merge: no *.{args.kind}.parquet files in {', '.join(args.inputs)}; {args.out} "
              "left as it is", file=sys.stderr)
        return 2
    try:
        df = merge(args.inputs, args.out, args.kind, grid=args.grid)
    except ResultsError as exc:
        print(f"comera-bench merge: {exc}", file=sys.stderr)
        return 1
    print(f"{len(df)} {args.kind} rows -> {args.out}")
    return 0


def _types(kind: str) -> dict[str, pa.DataType]:
    try:
        return TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown result kind {kind!r}; expected one of {list(TYPES)}") from None


def _frame_provenance(df: pd.DataFrame) -> dict[str, Any]:
    if not len(df) or not all(c in df.columns for c in PROVENANCE_COLUMNS):
        return {}
    prov = {}
    for col in PROVENANCE_COLUMNS:
        values = df[col].dropna().unique()
        if len(values) > 1:
            return {}
        prov[col] = values[0].item() if len(values) and hasattr(values[0], "item") else (
            values[0] if len(values) else None)
    return prov
