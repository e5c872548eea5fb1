"""Typed method parameters: each method declares one dataclass, validated here (:func:`parse`) only.

A field's annotation is its type (``int``, ``float``, ``bool``, ``str``, ``X | None``, ``Literal``),
``metadata["check"]`` a range (``">0"``, ``">=0"``, ``">=1"``, ``"[0,1]"``); a class may define
``resolve(given)``. Every error is a ValueError naming the method, the key and the value.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

CHECKS = {">0": lambda v: v > 0, ">=0": lambda v: v >= 0, ">=1": lambda v: v >= 1,
          "[0,1]": lambda v: 0 <= v <= 1, "[0,1)": lambda v: 0 <= v < 1}
_WORDS = {">0": "> 0", ">=0": ">= 0", ">=1": "a positive integer", "[0,1]": "in [0, 1]", "[0,1)": "in [0, 1)"}


def check(rule: str, **kwargs: Any) -> dict[str, Any]:
    """``field`` metadata holding a range rule (one of CHECKS)."""
    if rule not in CHECKS:
        raise ValueError(f"unknown check {rule!r}; one of {list(CHECKS)}")
    return {"check": rule, **kwargs}


def defaults(cls: type) -> dict[str, Any]:
    """The parameter dataclass's defaults, as a dict."""
    return dataclasses.asdict(cls())


def parse(method: str, cls: type, params: dict[str, Any] | None) -> Any:
    """``cls`` built from ``params`` (missing keys take the defaults); ValueError naming an unknown key
    (with the allowed ones), or the key and the value of a wrong type or out of its range, or what the
    class's ``resolve`` refuses."""
    given = dict(params or {})
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"method {method!r}: unknown parameter {unknown[0]!r}; allowed: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in given:
            given[f.name] = _check_value(method, f.name, given[f.name], hints[f.name],
                                         f.metadata.get("check"))
    if hasattr(cls, "resolve"):
        given = cls.resolve(given)
    return cls(**given)


def _check_value(method: str, key: str, value: Any, hint: Any, rule: str | None) -> Any:
    """``value`` checked against ``hint`` and ``rule``; an int given for a float parameter as a float."""
    where = f"method {method!r}: parameter {key!r}"
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args
    if optional:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise ValueError(f"{where} must be one of {list(choices)}, got {value!r}")
        return value
    null = " or null" if optional else ""
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false{null}, got {value!r}")
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer{null}, got {value!r}")
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number{null}, got {value!r}")
        value = float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string{null}, got {value!r}")
    elif isinstance(hint, type):
        if not isinstance(value, hint):
            raise ValueError(f"{where} must be a {hint.__name__}{null}, got {value!r}")
    else:  # pragma: no cover - a parameter class with a type this module does not know
        raise TypeError(f"{where}: unsupported parameter type {hint!r}")
    if rule is not None and not CHECKS[rule](value):
        raise ValueError(f"{where} must be {_WORDS[rule]}{null}, got {value!r}")
    return value
