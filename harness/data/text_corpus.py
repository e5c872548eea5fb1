"""Plain-text corpora for masked-language-model pretraining, in WikiText's raw layout.

A WikiText raw file (``wiki.train.raw``, ``wiki.valid.raw``) is lines of text with article titles as
`` = Title = `` lines, section headings as `` = = Section = = `` lines and blank lines between them. An
article (a title line up to the next one) is one document; a file without title lines is split into
paragraphs at blank lines instead. ``data_path`` is such a file, or a folder holding ``wiki.train.raw``
(WikiText's own layout), whose ``wiki.valid.raw``, when there, is the eval split.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

TRAIN_FILE, VALID_FILE = "wiki.train.raw", "wiki.valid.raw"
TITLE = re.compile(r"^ ?= [^=].* = ?$")


def text_files(path: str | Path) -> tuple[Path, Path | None]:
    """(training file, eval file or None) of a text file or a WikiText folder; errors name the path."""
    root = Path(path)
    if root.is_file():
        return root, None
    if not root.is_dir():
        raise FileNotFoundError(f"text corpus not found: {root}")
    train, valid = root / TRAIN_FILE, root / VALID_FILE
    if not train.is_file():
        raise FileNotFoundError(f"text corpus folder {root} has no {TRAIN_FILE}")
    return train, valid if valid.is_file() else None


def read_documents(file: Path, max_documents: int | None = None) -> list[str]:
    """The articles (or paragraphs) of one text file; a file that is not UTF-8 or holds no text is an
    error naming it."""
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{file}: not valid UTF-8 at line {line} ({exc.reason} at byte {exc.start})") from exc
    lines = text.splitlines()
    if any(TITLE.match(line) for line in lines):
        docs = _split(lines, lambda line: bool(TITLE.match(line)))
    else:
        docs = _split(lines, lambda line: not line.strip())
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"{file}: no text (the file is empty or blank)")
    return docs[:max_documents]


def _split(lines: list[str], starts_new: Callable[[str], bool]) -> list[str]:
    """Lines joined into documents, a new one at each line for which ``starts_new`` is true."""
    docs: list[list[str]] = [[]]
    for line in lines:
        if starts_new(line) and docs[-1]:
            docs.append([])
        docs[-1].append(line)
    return ["\n".join(d) for d in docs]
