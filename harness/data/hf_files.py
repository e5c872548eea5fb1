"""Local Hugging Face dataset files: arrow or parquet shards whose names contain their split
(``train-00000-of-00002.parquet``, ``glue-train.arrow``), read with pyarrow."""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def find_split_files(root: Path, split: str, prefer: str | None = None) -> list[Path]:
    """Arrow/parquet files under ``root`` whose name contains ``split`` as a word (under a folder whose
    name contains ``prefer`` when there are any such, so a whole cache of several data sets works); when
    several folders hold the split, the most recently written one wins."""
    pattern = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
    files = [p for p in root.rglob("*") if p.suffix in (".arrow", ".parquet") and pattern.search(p.stem)]
    if prefer:
        files = [p for p in files if any(prefer in part.lower() for part in p.relative_to(root).parts[:-1])] or files
    if not files:
        return []
    folders = {p.parent for p in files}
    newest = max(folders, key=lambda d: max(f.stat().st_mtime for f in files if f.parent == d))
    return sorted(p for p in files if p.parent == newest)


def read_table(path: Path, columns: tuple[str, ...]) -> pa.Table:
    """One shard, which must have ``columns``; errors name the file."""
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path)
        else:
            with pa.memory_map(str(path)) as src:
                try:
                    table = pa.ipc.open_stream(src).read_all()
                except pa.ArrowInvalid:
                    src.seek(0)
                    table = pa.ipc.open_file(src).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: not a readable arrow/parquet file: {exc}") from exc
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} "
                         f"(columns: {', '.join(table.column_names)})")
    return table
