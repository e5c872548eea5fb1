"""Declared parameters: each owner (a spec section, a method, a workload) declares its parameters once, as
the fields of one :class:`Params` model, and its checks, JSON schema and command-line options come from it.

A field's annotation is its type (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``list[X]``,
``X | None``, a nested :class:`Params`), its ``Field(default, ge=, gt=, le=, lt=, pattern=,
description=)`` its default, bounds and help. Relations between fields are a ``model_validator`` that
raises ValueError with its own message. Standard library and pydantic only: the methods (``baselines``)
import it as they import the plug-in finder.

Example:
    >>> class Sgd(Params):
    ...     lr: float = Field(0.1, gt=0, description="step size")
    >>> parse(Sgd, {"lr": 1}, owner="method 'sgd': ").lr
    1.0
    >>> parse(Sgd, {"lr": -1}, owner="method 'sgd': ")
    Traceback (most recent call last):
    ValueError: method 'sgd': parameter 'lr' must be a number > 0, got -1
"""
from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

__all__ = ["Field", "Params", "ReadOnlyDict", "model_validator", "parse", "describe", "field_schema",
           "model_schema", "add_options", "given_options", "option_name"]

_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


class Params(BaseModel):
    """A set of declared parameters: frozen, unknown keys refused, no type coercion (``4.0`` is not an
    integer, ``1`` not a boolean; an integer for a number is kept as a float), no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def as_dict(self) -> dict[str, Any]:
        """The values as JSON-able Python values (nested models as dicts)."""
        return self.model_dump()


class ReadOnlyDict(dict):
    """A dict that refuses changes (TypeError); still a dict to ``json``, ``pickle`` and ``copy``.

    Example:
        >>> ReadOnlyDict({"lr": 0.1})["lr"] = 1.0
        Traceback (most recent call last):
        TypeError: read-only params: 'lr' cannot be set
    """

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"read-only params: {args[0]!r} cannot be set" if args else "read-only params")

    __setitem__ = __delitem__ = setdefault = pop = _refuse

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("read-only params")

    def clear(self) -> None:
        raise TypeError("read-only params")

    def popitem(self) -> Any:
        raise TypeError("read-only params")

    def __ior__(self, other: Any) -> Any:
        raise TypeError("read-only params")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (dict(self),)


def parse(model: type[Params], given: Any, *, owner: str = "", noun: str = "parameter") -> Params:
    """``model`` from ``given`` (missing keys take the defaults).

    Args:
        model: the declaration.
        given: the values, a mapping.
        owner: the start of every message ("method 'comera': ", "spec: ").
        noun: what a key is called in the messages ("parameter", "key").

    Raises:
        ValueError: naming the first unknown key (with the allowed ones), a missing required key, or a
            key (dotted for a nested model) and its value with what it must be; a model validator's own
            message as it is.
    """
    if not isinstance(given, Mapping):
        raise ValueError(f"{owner}{noun}s must be a mapping of names to values, got {given!r}")
    try:
        return model.model_validate(dict(given))
    except pydantic.ValidationError as exc:
        raise ValueError(_message(model, dict(given), exc.errors()[0], owner, noun)) from None


def _message(model: type[Params], given: dict[str, Any], error: dict[str, Any], owner: str, noun: str) -> str:
    loc, kind = list(error["loc"]), error["type"]
    if kind in ("value_error", "assertion_error") and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    path, field, value = [], None, given
    while loc and isinstance(loc[0], str) and isinstance(model, type) and issubclass(model, Params) \
            and loc[0] in model.model_fields:
        name = loc.pop(0)
        path.append(name)
        field = model.model_fields[name]
        value = value.get(name) if isinstance(value, Mapping) else None
        model = _optional(field.annotation)[0]
    key = ".".join(path)
    if kind == "extra_forbidden":
        unknown = ".".join([*path, *(str(part) for part in loc)])
        allowed = sorted(model.model_fields) if isinstance(model, type) and issubclass(model, Params) else []
        return f"{owner}unknown {noun} {unknown!r}; allowed: {allowed}"
    if kind == "missing":
        return f"{owner}missing the {noun} {key!r}"
    if field is None:  # pragma: no cover - an error of the model as a whole
        return f"{owner}{error['msg']}, got {given!r}"
    return f"{owner}{noun} {key!r} must be {describe(field)}, got {value!r}"


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        rest = args[0] if len(args) == 1 else Union[tuple(args)]
        return rest, len(args) < len(typing.get_args(tp))
    return tp, False


def _constraint(metadata: list[Any], name: str) -> Any:
    return next((getattr(m, name) for m in metadata if getattr(m, name, None) is not None), None)


def _range(metadata: list[Any]) -> str:
    lo = [(k, _constraint(metadata, k)) for k in ("ge", "gt") if _constraint(metadata, k) is not None]
    hi = [(k, _constraint(metadata, k)) for k in ("le", "lt") if _constraint(metadata, k) is not None]
    if lo and hi:
        left, right = "[" if lo[0][0] == "ge" else "(", "]" if hi[0][0] == "le" else ")"
        return f" in {left}{lo[0][1]}, {hi[0][1]}{right}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return "".join(f" {signs[k]} {v}" for k, v in lo + hi)


def _describe(tp: Any, metadata: list[Any]) -> str:
    tp, nullable = _optional(tp)
    null = " or null" if nullable else ""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return f"one of {list(typing.get_args(tp))}{null}"
    if origin is list:
        return f"a list of values each {_describe(typing.get_args(tp)[0], [])}{null}"
    if tp is bool:
        return f"true or false{null}"
    if tp is int:
        return f"an integer{_range(metadata)}{null}"
    if tp is float:
        return f"a number{_range(metadata)}{null}"
    if tp is str:
        pattern, longest = _constraint(metadata, "pattern"), _constraint(metadata, "max_length")
        shortest = _constraint(metadata, "min_length")
        text = "a non-empty string" if shortest else "a string"
        text += f" matching {pattern}" if pattern else ""
        return text + (f" of at most {longest} characters" if longest else "") + null
    return f"a mapping{null}"


def describe(field: FieldInfo) -> str:
    """What a field's value must be, in words ("an integer in [1, 1024]", "one of ['a', 'b'] or null"); a
    field with a ``title`` (the words for a pattern) is described by it."""
    if field.title:
        return field.title + (" or null" if _optional(field.annotation)[1] else "")
    return _describe(field.annotation, field.metadata)


def _schema(tp: Any, metadata: list[Any]) -> dict[str, Any]:
    tp, nullable = _optional(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        out: dict[str, Any] = {"enum": list(typing.get_args(tp)) + ([None] if nullable else [])}
        return out
    if origin is list:
        out = {"type": "array", "items": _schema(typing.get_args(tp)[0], [])}
    elif isinstance(tp, type) and issubclass(tp, Params):
        out = model_schema(tp)
    else:
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp, "object")
        out = {"type": kind}
        for name, keyword in {**_BOUNDS, "pattern": "pattern", "max_length": "maxLength",
                              "min_length": "minLength"}.items():
            value = _constraint(metadata, name)
            if value is not None:
                out[keyword] = value
    if nullable:
        out["type"] = [out["type"], "null"]
    return out


def field_schema(field: FieldInfo) -> dict[str, Any]:
    """A field's JSON schema: its type and bounds, its default (unless required) and description."""
    out = _schema(field.annotation, field.metadata)
    if not field.is_required():
        default = field.get_default(call_default_factory=True)
        out["default"] = default.as_dict() if isinstance(default, Params) else default
    if field.title:
        out["title"] = field.title
    if field.description:
        out["description"] = field.description
    return out


def model_schema(model: type[Params]) -> dict[str, Any]:
    """A model's JSON schema: an object of its fields (:func:`field_schema`), no other keys."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False,
                           "properties": {name: field_schema(f) for name, f in model.model_fields.items()}}
    required = [name for name, f in model.model_fields.items() if f.is_required()]
    if required:
        out["required"] = required
    return out


def option_name(name: str) -> str:
    """The command-line option of a field: ``--`` and its name with dashes (``max_steps_per_epoch`` ->
    ``--max-steps-per-epoch``)."""
    return "--" + name.replace("_", "-")


def add_options(group: Any, model: type[Params], *, prefix: str = "", skip: tuple[str, ...] = (),
                aliases: Mapping[str, str] | None = None) -> None:
    """One option per field of ``model`` on an argparse parser or group: ``--name`` (:func:`option_name`,
    plus ``aliases[name]``), typed (a boolean ``--x/--no-x``, choices for a ``Literal``), its help the
    field's description and default; not given: None (the model's default applies)."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        tp, _ = _optional(field.annotation)
        names = [option_name(name), *([aliases[name]] if aliases and name in aliases else [])]
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = "required" if field.is_required() else f"default {'none' if default is None else default}"
        kwargs: dict[str, Any] = {"dest": prefix + name, "default": None,
                                  "help": f"{field.description or name} ({shown})"}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is Literal:
            choices = typing.get_args(tp)
            kwargs.update(choices=choices, type=type(choices[0]))
        elif tp in (int, float, str):
            kwargs.update(type=tp, metavar=name.upper())
        else:
            continue  # a mapping or list: not a plain option
        group.add_argument(*names, **kwargs)


def given_options(args: argparse.Namespace, model: type[Params], *, prefix: str = "") -> dict[str, Any]:
    """The values of ``model``'s options (:func:`add_options`) that were given on the command line."""
    return {name: getattr(args, prefix + name) for name in model.model_fields
            if getattr(args, prefix + name, None) is not None}
