"""Training methods behind one interface (see baselines/base.py): dense, comera, galore, lte -- and any
``baselines/<name>.py`` (or plug-in folder file, harness/configs/plugins.py) that defines ``METHOD`` and
``check_params``.

``get_method(name)`` returns a fresh method object; ``check_params(name, params)`` validates a method's
parameters and fills their defaults. Method modules are imported on first use (galore-torch and the
CoMERA library are slow or optional imports).

The package's one import from the harness is the plug-in finder, harness.configs.plugins: it imports
only the standard library, the workload registry (harness.workloads) shares it, and it reads the
harness's plug-in folders (``COMERA_BENCH_PLUGINS``). Here it would cost the command line its quick
start: ``import harness.cli`` would import this package, hence torch, and find the methods at import,
so a bad plug-in folder would end the command with a traceback instead of a message
(tests/test_structure.py allows this import and no other).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.configs import plugins

from .base import Method, Prepared

_FILES = plugins.discover("methods", Path(__file__).parent)
METHODS: tuple[str, ...] = tuple(_FILES)

__all__ = ["METHODS", "Method", "Prepared", "check_params", "get_method", "positive", "validate_params"]


def _module(name: str):
    if name not in _FILES:
        raise ValueError(f"unknown method {name!r}; known methods: {list(METHODS)}")
    return plugins.load("methods", name, _FILES[name], __name__)


def get_method(name: str) -> Method:
    """A new method object for ``name`` (one of METHODS)."""
    return _module(name).METHOD()


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The method's params with defaults filled; ValueError naming any unknown key or bad value."""
    return _module(name).check_params(dict(params))


def validate_params(method: str, params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``params``. Unknown keys and values whose type does not match the
    default's type (int accepted for float; None accepted where the default is None) raise ValueError
    naming the method, the key and the allowed keys or expected type."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"method {method!r}: unknown parameter {unknown[0]!r}; "
                         f"allowed: {sorted(defaults)}")
    out = dict(defaults)
    for key, value in params.items():
        _check_type(method, key, value, defaults[key])
        out[key] = value
    return out


def _check_type(method: str, key: str, value: Any, default: Any) -> None:
    where = f"method {method!r}: parameter {key!r}"
    if default is None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{where} must be a number or null, got {value!r}")
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
    elif isinstance(default, (int, float)):
        integer = isinstance(default, int)
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise ValueError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    elif not isinstance(value, type(default)):
        raise ValueError(f"{where} must be a {type(default).__name__}, got {value!r}")


def positive(method: str, params: dict[str, Any], *keys: str) -> None:
    """ValueError naming the first of ``keys`` whose (non-null) value is not > 0."""
    for key in keys:
        if params[key] is not None and not params[key] > 0:
            raise ValueError(f"method {method!r}: parameter {key!r} must be > 0, got {params[key]!r}")
