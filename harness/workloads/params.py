"""Checking a workload's params: a size preset, overrides, unknown keys and bad values named.

A workload module declares ``PRESETS`` (size -> values), ``PARAMS`` (a :class:`WorkloadParams` model: each
parameter's type, default, bounds; one without a default comes from the preset) and ``validate(params)``
for the relations between keys (:func:`require`).

Example:
    >>> import types
    >>> class ToyParams(WorkloadParams):
    ...     samples: int = Field(gt=0)
    ...     features: int = Field(8, gt=0)
    >>> toy = types.SimpleNamespace(PRESETS={"small": {"samples": 64}}, PARAMS=ToyParams,
    ...                             validate=lambda p: None)
    >>> resolve("toy", toy, {"features": 4})
    {'size': 'small', 'samples': 64, 'features': 4}
"""
from __future__ import annotations

from typing import Any, Mapping

from harness import params
from harness.params import Field

__all__ = ["EncoderParams", "Field", "WorkloadParams", "require", "resolve"]


class WorkloadParams(params.Params):
    """The base of a workload's parameter model: ``size`` names one of the module's PRESETS."""

    size: str = Field("small", description="the size preset whose values fill the keys not given")


class EncoderParams(WorkloadParams):
    """The parameters every encoder workload (the transformer, the masked language model) shares: its
    shape, its TT ranks and its TTM word-table shapes; those without a default come from the preset."""

    vocab_size: int = Field(gt=0)
    d_model: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    max_positions: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    dropout: float = Field(ge=0, lt=1)
    rank: int = Field(gt=0)
    embedding_rank: int = Field(gt=0)
    embedding_row_shape: list[int] | None = None
    embedding_col_shape: list[int] | None = None


def resolve(workload: str, module: Any, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``given`` over the size preset over the defaults, checked (``module.PARAMS``, then
    ``module.validate``); a ValueError names the workload, the key and the value."""
    given = {key: list(value) if isinstance(value, tuple) else value
             for key, value in dict(given or {}).items()}
    size = given.get("size", "small")
    if not isinstance(size, str) or size not in module.PRESETS:
        raise ValueError(f"workload {workload!r}: parameter 'size' must be one of {list(module.PRESETS)}, "
                         f"got {size!r}")
    out = params.parse(module.PARAMS, {**module.PRESETS[size], **given}, owner=f"workload {workload!r}: ")
    out = out.as_dict()
    module.validate(out)
    return out


def require(condition: bool, workload: str, key: str, value: Any, why: str) -> None:
    """Raises ValueError naming the workload, key and value unless ``condition``."""
    if not condition:
        raise ValueError(f"workload {workload!r}: param {key}={value!r} {why}")
