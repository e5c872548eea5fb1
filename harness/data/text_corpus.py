"""Plain-text corpora for masked-language-model pretraining, in WikiText's raw layout: :func:`read_corpus`.

A file, a folder holding ``wiki.train.raw`` or a folder of Hugging Face ``wikitext`` shards; an article is
one document (docs/workloads.md, the MLM workload's data).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from harness.data import hf_files

TRAIN_FILE, VALID_FILE = "wiki.train.raw", "wiki.valid.raw"
TITLE = re.compile(r"^ ?= [^=].* = ?$")


def read_corpus(path: str | Path, max_documents: int | None = None
                ) -> tuple[list[str], list[str] | None, list[Path]]:
    """(training documents, eval documents or None, files read) of a text file or a folder as above;
    errors name the path."""
    root = Path(path)
    if root.is_file():
        return read_documents(root, max_documents), None, [root]
    if not root.is_dir():
        raise FileNotFoundError(f"text corpus not found: {root}")
    train, valid = root / TRAIN_FILE, root / VALID_FILE
    if train.is_file():
        if not valid.is_file():
            return read_documents(train, max_documents), None, [train]
        return read_documents(train, max_documents), read_documents(valid, max_documents), [train, valid]
    shards = hf_files.find_split_files(root, "train")
    if not shards:
        raise FileNotFoundError(f"text corpus folder {root} has neither {TRAIN_FILE} nor Hugging Face train "
                                "shards (.arrow / .parquet)")
    valid_shards = hf_files.find_split_files(root, "validation")
    evals = read_shards(valid_shards, max_documents) if valid_shards else None
    return read_shards(shards, max_documents), evals, [*shards, *valid_shards]


def read_documents(file: Path, max_documents: int | None = None) -> list[str]:
    """The articles (or paragraphs) of one text file; a file that is not UTF-8 or holds no text is an
    error naming it."""
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{file}: not valid UTF-8 at line {line} ({exc.reason} at byte "
                         f"{exc.start})") from exc
    return split_documents(text.splitlines(), str(file), max_documents)


def read_shards(files: list[Path], max_documents: int | None = None) -> list[str]:
    """The articles of Hugging Face ``wikitext`` shards (one line per row in column ``text``)."""
    lines = [(row or "").rstrip("\n") for f in files
             for row in hf_files.read_table(f, ("text",), text=("text",)).column("text").to_pylist()]
    return split_documents(lines, ", ".join(map(str, files)), max_documents)


def split_documents(lines: list[str], where: str, max_documents: int | None = None) -> list[str]:
    """Lines cut into articles at title lines (paragraphs at blank lines when there is no title); no
    text at all is an error starting with ``where``."""
    if any(TITLE.match(line) for line in lines):
        docs = _split(lines, lambda line: bool(TITLE.match(line)))
    else:
        docs = _split(lines, lambda line: not line.strip())
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"{where}: no text (the file is empty or blank)")
    return docs[:max_documents]


def _split(lines: list[str], starts_new: Callable[[str], bool]) -> list[str]:
    """Lines joined into documents, a new one at each line for which ``starts_new`` is true."""
    docs: list[list[str]] = [[]]
    for line in lines:
        if starts_new(line) and docs[-1]:
            docs.append([])
        docs[-1].append(line)
    return ["\n".join(d) for d in docs]
