"""GLUE MNLI from local files: the GLUE TSV files or a local Hugging Face cache of ``glue/mnli``.

Labels use the Hugging Face coding (0 entailment, 1 neutral, 2 contradiction); :func:`load_split` drops
rows without a gold label and fails past :data:`MAX_DROPPED_FRACTION` (docs/usage.md, data errors).
"""
from __future__ import annotations

import csv
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from harness.data import hf_files

LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SPLITS = {"train": "train.tsv", "validation_matched": "dev_matched.tsv"}
TSV_COLUMNS = ("sentence1", "sentence2", "gold_label")
HF_COLUMNS = ("premise", "hypothesis", "label")
MAX_DROPPED_FRACTION = 0.5
"""A split that drops more than this fraction of its rows is an error, not a data set."""


@dataclass
class NLISplit:
    premises: list[str]
    hypotheses: list[str]
    labels: list[int]
    files: list[Path]
    rows_read: int = 0
    dropped: Counter = field(default_factory=Counter)
    """Rows dropped per label as read (its repr: ``'-'``, ``-1``, ...)."""


def load_split(data_dir: str | Path, split: str) -> NLISplit:
    """One split ("train" or "validation_matched") from ``data_dir`` (GLUE TSV or Hugging Face files)."""
    if split not in SPLITS:
        raise ValueError(f"MNLI split must be one of {sorted(SPLITS)}, got {split!r}")
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"MNLI data_dir not found or not a directory: {root}")
    tsv = root / SPLITS[split]
    if tsv.is_file():
        return _checked(read_glue_tsv(tsv), split)
    files = hf_files.find_split_files(root, split, prefer="mnli")
    if files:
        return _checked(read_hf_files(files), split)
    raise FileNotFoundError(f"MNLI split {split!r}: neither {tsv} nor Hugging Face .arrow/.parquet files "
                            f"named after the split under {root}")


def _checked(out: NLISplit, split: str) -> NLISplit:
    """``out``, after a warning naming the files when rows were dropped; ValueError when none is left or
    more than MAX_DROPPED_FRACTION were dropped."""
    dropped = sum(out.dropped.values())
    counts = ", ".join(f"label {label}: {n}" for label, n in out.dropped.items())
    where = f"MNLI split {split!r} ({', '.join(map(str, out.files))})"
    what = f"{out.rows_read} rows read, {dropped} dropped" + (f" ({counts})" if counts else "")
    if not out.labels:
        raise ValueError(f"{where} has no labelled row: {what}")
    if dropped > MAX_DROPPED_FRACTION * out.rows_read:
        raise ValueError(f"{where} has more than {MAX_DROPPED_FRACTION:.0%} of its rows dropped: {what}")
    if dropped:
        warnings.warn(f"{where}: {what}; the other rows are used", stacklevel=3)
    return out


def _tsv_rows(path: Path, fh: BinaryIO) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each line of a tab-separated file opened in binary mode; decoding and
    parsing errors name the file and line."""
    def lines() -> Iterator[str]:
        for lineno, raw in enumerate(fh, start=1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                                 ) from exc

    reader = csv.reader(lines(), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as exc:
        raise ValueError(f"{path}:{reader.line_num}: {exc}") from exc


def read_glue_tsv(path: Path) -> NLISplit:
    """A GLUE MNLI TSV file (tab-separated, header line, no quoting)."""
    csv.field_size_limit(sys.maxsize)
    out = NLISplit([], [], [], [path])
    with open(path, "rb") as fh:
        rows = _tsv_rows(path, fh)
        header = next(rows, (1, None))[1]
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header with columns {', '.join(TSV_COLUMNS)}")
        missing = [c for c in TSV_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
        cols = [header.index(c) for c in TSV_COLUMNS]
        for lineno, row in rows:
            if len(row) <= max(cols):
                raise ValueError(f"{path}:{lineno}: {len(row)} fields, expected at least {max(cols) + 1}")
            s1, s2, gold = (row[c] for c in cols)
            out.rows_read += 1
            if gold == "-":
                out.dropped[repr(gold)] += 1
                continue
            if gold not in LABELS:
                raise ValueError(f"{path}:{lineno}: gold_label {gold!r} is not one of {sorted(LABELS)}")
            out.premises.append(s1)
            out.hypotheses.append(s2)
            out.labels.append(LABELS[gold])
    return out


def read_hf_files(files: list[Path]) -> NLISplit:
    """Hugging Face ``glue/mnli`` shards (columns premise, hypothesis, label)."""
    out = NLISplit([], [], [], list(files))
    for path in files:
        table = hf_files.read_table(path, HF_COLUMNS, text=HF_COLUMNS[:2])
        for p, h, y in zip(*(table.column(c).to_pylist() for c in HF_COLUMNS)):
            out.rows_read += 1
            if y in (0, 1, 2):
                out.premises.append(p)
                out.hypotheses.append(h)
                out.labels.append(int(y))
            else:
                out.dropped[repr(y)] += 1
    return out
