"""Method parameters: each method declares one :class:`harness.params.Params` model (a field per parameter:
type, default, bounds, help), checked here only (:func:`parse`). Relations between parameters are the
model's ``model_validator``; every error is a ValueError naming the method, the key and the value.

Example:
    >>> class SgdParams(Params):
    ...     lr: float = Field(0.1, gt=0)  # the step size
    >>> parse("sgd", SgdParams, {"lr": 0})
    Traceback (most recent call last):
    ValueError: method 'sgd': parameter 'lr' must be a number > 0, got 0
"""
from __future__ import annotations

from typing import Any

from harness import params
from harness.params import Field, Params, model_validator

__all__ = ["Field", "Params", "defaults", "model_validator", "parse"]


def defaults(cls: type[Params]) -> dict[str, Any]:
    """The parameter model's defaults, as a dict."""
    return cls().as_dict()


def parse(method: str, cls: type[Params], given: dict[str, Any] | None) -> Params:
    """``cls`` from ``given`` (missing keys take the defaults); ValueError naming an unknown key (with the
    allowed ones), or the key and the value of a wrong type or out of its range, or what the model's
    validators refuse."""
    return params.parse(cls, dict(given or {}), owner=f"method {method!r}: ")
