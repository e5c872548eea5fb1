"""Source-code corpora for masked-language-model pretraining.

Either CodeSearchNet-style JSON-lines files (one object per line with the code under ``"code"`` or
``"original_string"``; ``.jsonl`` or ``.jsonl.gz``; a file or a folder searched recursively) or, by
default, the ``.py`` files of this Python's standard library (``sysconfig`` path ``stdlib``,
``site-packages`` excluded), which exist on every machine.
"""
from __future__ import annotations

import gzip
import json
import os
import sysconfig
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
    """(documents, files) from CodeSearchNet-style JSON lines; errors name the file and line."""
    docs: list[str] = []
    files = jsonl_files(path)
    for file in files:
        opener = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{file}:{lineno}: not valid JSON: {exc.msg}") from exc
                field = next((f for f in CODE_FIELDS if isinstance(record, dict) and f in record), None)
                if field is None:
                    raise ValueError(f"{file}:{lineno}: no field {' or '.join(CODE_FIELDS)}")
                docs.append(str(record[field]))
                if max_documents is not None and len(docs) >= max_documents:
                    return docs, files
    return docs, files
