"""Checking a workload's params: presets by ``size``, overrides, unknown keys and bad values named.

A workload module declares ``PRESETS`` (size -> values), ``DEFAULTS``, ``TYPES`` (key -> type, types, or a
:class:`Choice`) and ``validate(params)`` for relations between keys.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Mapping

SIZES = ("tiny", "small", "paper")


@dataclass(frozen=True)
class Choice:
    """A value from a fixed set."""
    values: tuple


@dataclass(frozen=True)
class ListOf:
    """A list of values of one type."""
    item: type


def _type_ok(value: Any, expected: Any) -> bool:
    if isinstance(expected, Choice):
        return value in expected.values
    if isinstance(expected, ListOf):
        return isinstance(value, (list, tuple)) and all(_type_ok(v, expected.item) for v in value)
    if isinstance(expected, tuple):
        return any(_type_ok(value, e) for e in expected)
    if expected is None:
        return value is None
    if expected is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, expected)


def _describe(expected: Any) -> str:
    if isinstance(expected, Choice):
        return "one of " + ", ".join(repr(v) for v in expected.values)
    if isinstance(expected, ListOf):
        return f"a list of {_describe(expected.item)}"
    if isinstance(expected, tuple):
        return " or ".join(_describe(e) for e in expected)
    return "null" if expected is None else expected.__name__


def resolve(workload: str, module: Any, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` over the size preset over the defaults, checked; errors name the key and value."""
    params = dict(params or {})
    allowed = {"size", *module.TYPES}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"workload {workload!r}: unknown param(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    size = params.pop("size", "small")
    if not isinstance(size, str) or size not in module.PRESETS:
        raise ValueError(f"workload {workload!r}: param size={size!r} must be one of "
                         f"{', '.join(module.PRESETS)}")
    out = {"size": size, **module.DEFAULTS, **module.PRESETS[size], **params}
    for key, expected in module.TYPES.items():
        if not _type_ok(out[key], expected):
            raise ValueError(f"workload {workload!r}: param {key}={out[key]!r} must be {_describe(expected)}")
        if expected is float or (isinstance(expected, tuple) and float in expected and out[key] is not None):
            out[key] = float(out[key])
        if isinstance(out[key], tuple):
            out[key] = list(out[key])
    module.validate(out)
    return out


def require(condition: bool, workload: str, key: str, value: Any, why: str) -> None:
    """Raises ValueError naming the workload, key and value unless ``condition``."""
    if not condition:
        raise ValueError(f"workload {workload!r}: param {key}={value!r} {why}")


def positive(workload: str, params: Mapping[str, Any], *keys: str) -> None:
    """Each of ``keys`` is None or > 0."""
    for key in keys:
        value = params[key]
        require(value is None or value > 0, workload, key, value, "must be positive")
