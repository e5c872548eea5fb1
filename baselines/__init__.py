"""Training methods behind one interface (baselines/base.py): dense, comera, galore, lte, and plug-ins.

:func:`get_method` returns a fresh method object, :func:`check_params` checks a method's params and fills
their defaults; modules are imported on first use. The imports from the harness are the plug-in finder
(harness/plugins.py; why: docs/design-notes.md) and the parameter declarations (harness/params.py, standard
library and pydantic only).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import create_model

from harness import plugins

from .base import Method, Periodic, Prepared
from .params import Field, Params, parse

_FILES = plugins.discover("methods", Path(__file__).parent)
METHODS: tuple[str, ...] = tuple(_FILES)

__all__ = ["METHODS", "Method", "Periodic", "Prepared", "check_params", "get_method", "periodic", "positive",
           "validate_params", "workload_needs"]


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


def workload_needs(name: str, params: dict[str, Any]) -> dict[str, str]:
    """What method ``name`` with these (checked) params needs of a workload beyond a model and data, each
    with why: names of ``harness.workloads.FEATURES`` (the module's ``workload_needs(params)``; {} for a
    method without one). The config check refuses a workload that does not offer them."""
    needs = getattr(_module(name), "workload_needs", None)
    return dict(needs(dict(params))) if needs is not None else {}


def periodic(name: str, params: dict[str, Any]) -> dict[str, Periodic]:
    """The periodic work of method ``name`` with ``params`` (its module's ``periodic(params)`` on the
    checked params; {} for a method module without one).

    Example:
        >>> periodic("galore", {"update_proj_gap": 20})
        {'galore projection': Periodic(every=20, phase=0, forceable=True)}
    """
    module = _module(name)
    declared = getattr(module, "periodic", None)
    return declared(check_params(name, params)) if declared is not None else {}


def validate_params(method: str, params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """For plug-in methods that declare their parameters as a dict: ``defaults`` overridden by
    ``params``, checked by :func:`baselines.params.parse` (the built-in methods' one check) with the type
    of each default (int accepted for float; None: a number or null)."""
    return parse(method, params_class(method, defaults), params).as_dict()


def params_class(method: str, defaults: dict[str, Any]) -> type[Params]:
    """A parameter model (:class:`harness.params.Params`) whose fields are ``defaults``' keys, typed by
    their values."""
    def kind(value: Any) -> Any:
        return float | None if value is None else type(value)

    fields = {key: (kind(value), Field(default_factory=lambda v=value: copy.deepcopy(v)))
              for key, value in defaults.items()}
    name = "".join(part.title() for part in method.replace("-", "_").split("_") if part.isidentifier())
    return create_model(f"{name or 'Plugin'}Params", __base__=Params, **fields)


def positive(method: str, params: dict[str, Any], *keys: str) -> None:
    """ValueError naming the first of ``keys`` whose (non-null) value is not > 0."""
    for key in keys:
        if params[key] is not None and not params[key] > 0:
            raise ValueError(f"method {method!r}: parameter {key!r} must be > 0, got {params[key]!r}")
