"""Methods and workloads are plug-ins found by file (docs/architecture.md, "Plug-ins").

Listing reads the sources (``METHOD =`` / ``def build(`` at a line's start) and imports nothing; a bad or
taken name, or a ``COMERA_BENCH_PLUGINS`` entry that is not a folder, raises :class:`PluginError`.
Standard library only: the method registry imports it.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from harness import settings

ENV = "COMERA_BENCH_PLUGINS"
NAME = re.compile(r"[a-z][a-z0-9_]*")
MARKERS = {"methods": re.compile(r"^METHOD\s*=", re.M), "workloads": re.compile(r"^def build\(", re.M)}


class PluginError(ValueError):
    """A plug-in file that cannot be used; the message names the file."""


def plugin_dirs() -> list[Path]:
    """The folders named in COMERA_BENCH_PLUGINS; one that is not a folder raises PluginError naming it."""
    folders = list(settings.read(ENV))
    for folder in folders:
        if not folder.is_dir():
            raise PluginError(f"environment variable {ENV} names {folder}, which is not a folder; fix the "
                              "path or remove it from the variable")
    return folders


def discover(kind: str, package_dir: Path) -> dict[str, Path]:
    """name -> file of every ``kind`` ("methods" | "workloads"): the package's own modules, then the
    plug-in folders' (a file without the marker, a bad name or a taken name raises PluginError)."""
    marker = MARKERS[kind]
    found = {p.stem: p for p in sorted(package_dir.glob("*.py"))
             if not p.stem.startswith("_") and marker.search(p.read_text(errors="replace"))}
    for folder in plugin_dirs():
        for path in sorted((folder / kind).glob("*.py")):
            if not NAME.fullmatch(path.stem):
                raise PluginError(f"plug-in {path}: a {kind[:-1]} name must match {NAME.pattern}")
            if path.stem in found:
                raise PluginError(f"plug-in {path}: the {kind[:-1]} {path.stem!r} exists already "
                                  f"({found[path.stem]})")
            if not marker.search(path.read_text(errors="replace")):
                raise PluginError(f"plug-in {path}: no line matching {marker.pattern!r} "
                                  f"({'METHOD = <class>' if kind == 'methods' else 'def build(...)'})")
            found[path.stem] = path
    return found


def load(kind: str, name: str, path: Path, package: str) -> ModuleType:
    """The module of plug-in ``name``: imported from ``package`` when it lives there, else from its file."""
    if path.parent.resolve() == Path(importlib.import_module(package).__path__[0]).resolve():
        return importlib.import_module(f"{package}.{name}")
    module_name = f"comera_bench_plugins.{kind}.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise PluginError(f"plug-in {path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module
