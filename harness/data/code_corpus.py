"""Source-code corpora for masked-language-model pretraining: CodeSearchNet-style JSON lines or the stdlib.

:func:`read_jsonl` reads ``.jsonl`` / ``.jsonl.gz`` files or folders, :func:`read_stdlib` this Python's
standard-library ``.py`` files (not ``site-packages``), which exist on every machine.
"""
from __future__ import annotations

import gzip
import json
import os
import sysconfig
import zlib
from pathlib import Path

CODE_FIELDS = ("code", "original_string")


def stdlib_files(max_files: int | None = None) -> list[Path]:
    """The standard library's .py files in sorted order; ``max_files`` evenly spaced ones if given."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "dist-packages", "__pycache__")]
        files.extend(Path(folder, n) for n in names if n.endswith(".py"))
    files.sort()
    if not files:
        raise FileNotFoundError(f"no .py files under the standard library folder {root}")
    if max_files is not None and len(files) > max_files:
        step = len(files) / max_files
        files = [files[int(i * step)] for i in range(max_files)]
    return files


def read_stdlib(max_files: int | None = None) -> tuple[list[str], list[Path]]:
    """(documents, files): each standard-library file is one document."""
    files = stdlib_files(max_files)
    return [f.read_text(encoding="utf-8", errors="replace") for f in files], files


def jsonl_files(path: str | Path) -> list[Path]:
    """``path`` itself, or the .jsonl / .jsonl.gz files under it (sorted)."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"code corpus not found: {root}")
    files = sorted(p for p in root.rglob("*") if p.name.endswith((".jsonl", ".jsonl.gz")))
    if not files:
        raise FileNotFoundError(f"no .jsonl or .jsonl.gz files under {root}")
    return files


def read_jsonl(path: str | Path, max_documents: int | None = None) -> tuple[list[str], list[Path]]:
    """(documents, files) from CodeSearchNet-style JSON lines; errors name the file, and the line where
    known (a damaged .gz file: the last line read before the damage)."""
    docs: list[str] = []
    files = jsonl_files(path)
    for file in files:
        opener = gzip.open if file.name.endswith(".gz") else open
        lineno = 0
        try:
            with opener(file, "rb") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    code = _code_of(raw, f"{file}:{lineno}")
                    if code is not None:
                        docs.append(code)
                    if max_documents is not None and len(docs) >= max_documents:
                        return docs, files
        except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a damaged .gz (BadGzipFile, cut)
            raise ValueError(f"{file}: cannot read after line {lineno}: {exc}") from exc
    return docs, files


def _code_of(raw: bytes, where: str) -> str | None:
    """The code of one JSON line (None for a blank line); errors start with ``where``."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc.msg}") from exc
    field = next((f for f in CODE_FIELDS if isinstance(record, dict) and f in record), None)
    if field is None:
        raise ValueError(f"{where}: no field {' or '.join(CODE_FIELDS)}")
    if not isinstance(record[field], str):  # null or a number would become the text "None" / "3"
        raise ValueError(f"{where}: field {field!r} must be a string, got {json.dumps(record[field])}")
    return record[field]
