"""Local Hugging Face dataset files: arrow or parquet shards named after their split, read with pyarrow.

A shard set missing a shard, or a text column that holds no text, is an error naming the files or column.
"""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


SHARD = re.compile(r"^(?P<name>.+)-(?P<index>\d+)-of-(?P<count>\d+)$")
"""A numbered shard's file stem: ``train-00000-of-00002``."""


def find_split_files(root: Path, split: str, prefer: str | None = None) -> list[Path]:
    """Arrow/parquet files under ``root`` whose name contains ``split`` as a word (under a folder whose
    name contains ``prefer`` when there are any such, so a whole cache of several data sets works); when
    several folders hold the split, the most recently written one wins.

    Raises:
        ValueError: a numbered shard set among them lacks shards (:func:`check_shard_sets`).
    """
    pattern = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
    files = [p for p in root.rglob("*") if p.suffix in (".arrow", ".parquet") and pattern.search(p.stem)]
    if prefer:
        files = [p for p in files
                 if any(prefer in part.lower() for part in p.relative_to(root).parts[:-1])] or files
    if not files:
        return []
    folders = {p.parent for p in files}
    newest = max(folders, key=lambda d: max(f.stat().st_mtime for f in files if f.parent == d))
    found = sorted(p for p in files if p.parent == newest)
    check_shard_sets(found)
    return found


def check_shard_sets(files: list[Path]) -> None:
    """ValueError naming the missing files when ``files`` hold part of a numbered shard set: every index
    from 0 to count - 1 of ``<name>-<index>-of-<count><suffix>`` in one folder (an index past the count
    is named too)."""
    sets: dict[tuple[Path, str, str, str], set[int]] = {}
    for path in files:
        numbered = SHARD.match(path.stem)
        if numbered:
            key = (path.parent, numbered["name"], numbered["count"], path.suffix)
            sets.setdefault(key, set()).add(int(numbered["index"]))
    for (folder, name, count, suffix), found in sorted(sets.items()):
        width, total = len(count), int(count)
        beyond = sorted(i for i in found if i >= total)
        lacking = total - (len(found) - len(beyond))
        if lacking or beyond:
            first = _first_missing(found, total, 10)
            listed = ", ".join(f"{name}-{i:0{width}d}-of-{count}{suffix}" for i in first) + (
                f" and {lacking - len(first)} more" if lacking > len(first) else "")
            problem = f"lacks {lacking} of its {total} shards: {listed}" if lacking else \
                f"has shards numbered past its count: {', '.join(map(str, beyond))}"
            raise ValueError(f"{folder}: the shard set {name}-*-of-{count}{suffix} {problem} (a partial "
                             "download? fetch the data set again)")


def _first_missing(found: set[int], total: int, most: int) -> list[int]:
    """The first ``most`` indices in [0, total) not in ``found``: found in at most len(found) + most steps,
    whatever ``total`` (a shard name may claim -of-999999999999)."""
    missing: list[int] = []
    index = 0
    while index < total and len(missing) < most:
        if index not in found:
            missing.append(index)
        index += 1
    return missing


def read_table(path: Path, columns: tuple[str, ...], text: tuple[str, ...] = ()) -> pa.Table:
    """One shard, which must have ``columns``, the ones in ``text`` holding strings; errors name the file
    (and the column)."""
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
    for column in text:
        kind = table.schema.field(column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
            raise ValueError(f"{path}: column {column!r} holds {kind}, not text")
    return table
