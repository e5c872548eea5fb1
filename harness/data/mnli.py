"""GLUE MNLI from local files: the GLUE TSV files (``train.tsv``, ``dev_matched.tsv``; columns
sentence1, sentence2, gold_label) or a local Hugging Face cache of ``glue/mnli`` (arrow or parquet files
whose names contain the split, columns premise, hypothesis, label), read with pyarrow.

Labels use the Hugging Face coding: 0 entailment, 1 neutral, 2 contradiction. Rows without a gold label
(``-`` in the TSV, -1 in the Hugging Face files) are skipped.
"""
from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SPLITS = {"train": "train.tsv", "validation_matched": "dev_matched.tsv"}
TSV_COLUMNS = ("sentence1", "sentence2", "gold_label")
HF_COLUMNS = ("premise", "hypothesis", "label")


@dataclass
class NLISplit:
    premises: list[str]
    hypotheses: list[str]
    labels: list[int]
    files: list[Path]


def load_split(data_dir: str | Path, split: str) -> NLISplit:
    """One split ("train" or "validation_matched") from ``data_dir`` (GLUE TSV or Hugging Face files)."""
    if split not in SPLITS:
        raise ValueError(f"MNLI split must be one of {sorted(SPLITS)}, got {split!r}")
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"MNLI data_dir not found or not a directory: {root}")
    tsv = root / SPLITS[split]
    if tsv.is_file():
        return read_glue_tsv(tsv)
    files = find_hf_files(root, split)
    if files:
        return read_hf_files(files)
    raise FileNotFoundError(f"MNLI split {split!r}: neither {tsv} nor Hugging Face .arrow/.parquet files "
                            f"named after the split under {root}")


def read_glue_tsv(path: Path) -> NLISplit:
    """A GLUE MNLI TSV file (tab-separated, header line, no quoting)."""
    csv.field_size_limit(sys.maxsize)
    out = NLISplit([], [], [], [path])
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header with columns {', '.join(TSV_COLUMNS)}")
        missing = [c for c in TSV_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
        cols = [header.index(c) for c in TSV_COLUMNS]
        for lineno, row in enumerate(reader, start=2):
            if len(row) <= max(cols):
                raise ValueError(f"{path}:{lineno}: {len(row)} fields, expected at least {max(cols) + 1}")
            s1, s2, gold = (row[c] for c in cols)
            if gold == "-":
                continue
            if gold not in LABELS:
                raise ValueError(f"{path}:{lineno}: gold_label {gold!r} is not one of {sorted(LABELS)}")
            out.premises.append(s1)
            out.hypotheses.append(s2)
            out.labels.append(LABELS[gold])
    return out


def find_hf_files(root: Path, split: str) -> list[Path]:
    """Arrow/parquet files under ``root`` whose name contains ``split`` as a word (under a folder named
    like ``mnli`` when there are any such, so a whole GLUE cache works); when several folders hold the
    split, the most recently written one wins."""
    pattern = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
    files = [p for p in root.rglob("*") if p.suffix in (".arrow", ".parquet") and pattern.search(p.stem)]
    mnli_files = [p for p in files if any("mnli" in part.lower() for part in p.relative_to(root).parts[:-1])]
    files = mnli_files or files
    if not files:
        return []
    folders = {p.parent for p in files}
    newest = max(folders, key=lambda d: max(f.stat().st_mtime for f in files if f.parent == d))
    return sorted(p for p in files if p.parent == newest)


def _read_table(path: Path) -> pa.Table:
    if path.suffix == ".parquet":
        return pq.read_table(path)
    with pa.memory_map(str(path)) as src:
        try:
            return pa.ipc.open_stream(src).read_all()
        except pa.ArrowInvalid:
            src.seek(0)
            return pa.ipc.open_file(src).read_all()


def read_hf_files(files: list[Path]) -> NLISplit:
    """Hugging Face ``glue/mnli`` shards (columns premise, hypothesis, label)."""
    out = NLISplit([], [], [], list(files))
    for path in files:
        try:
            table = _read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{path}: not a readable arrow/parquet file: {exc}") from exc
        missing = [c for c in HF_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} "
                             f"(columns: {', '.join(table.column_names)})")
        for p, h, y in zip(*(table.column(c).to_pylist() for c in HF_COLUMNS)):
            if y in (0, 1, 2):
                out.premises.append(p)
                out.hypotheses.append(h)
                out.labels.append(int(y))
    return out
