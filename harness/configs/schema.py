"""The pipeline config's JSON schema: workflow/schemas/config.schema.yaml, with the keys a cell's spec shares
made from their one declaration in :mod:`harness.spec`.

The file holds what is the config's own (the grid's axes, method configurations, paths); each part it
leaves ``{}`` (the budget, a target, a batch size, a seed, the execution keys) :func:`config_schema` fills
from :class:`harness.spec.Budget`, :class:`harness.spec.Spec` and :class:`harness.spec.Execution` (type,
bounds, default, description; :func:`harness.params.field_schema`).
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import yaml

from harness.params import field_schema, model_schema
from harness.spec import Budget, Execution, Spec

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
"""The config schema's own part."""


def _value(field: Any) -> dict[str, Any]:
    """A field's schema as one value of a list (no default, no description)."""
    out = field_schema(field)
    out.pop("default", None)
    out.pop("description", None)
    return out


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    defs = yaml.safe_load(Path(path).read_text())
    spec, execution = Spec.model_fields, Execution.model_fields
    defs["$defs"]["budget"] = {**model_schema(Budget), "default": {}}
    target = spec["target_ratio"]
    defs["$defs"]["target"] = {**_value(target), "description": target.description}
    defs["$defs"]["batch_sizes"]["items"] = _value(spec["batch_size"])
    defs["$defs"]["matmul_precision"]["items"] = _value(execution["matmul_precision"])
    defs["properties"]["seeds"]["items"] = _value(spec["seed"])
    quality = defs["properties"]["workloads"]["additionalProperties"]["properties"]["quality"]
    quality["properties"]["seeds"]["items"] = _value(spec["seed"])
    own = defs["properties"]["execution"]["properties"]
    own["device"] = field_schema(execution["device"])
    threads = field_schema(execution["num_threads"])
    own["threads"] = {**threads, "type": ["integer", "string"], "pattern": "^auto$", **own["threads"]}
    own["rounds"] = {**field_schema(execution["rounds"]), **own["rounds"]}
    for axis in ("cuda_graph", "compile", "matmul_precision"):  # a grid axis: the spec's one value
        own[axis]["default"] = [execution[axis].default]
    return defs


def config_schema(path: str | os.PathLike = SCHEMA_FILE) -> dict[str, Any]:
    """The config schema: the file at ``path`` with the spec's keys filled in (a fresh copy).

    Example:
        >>> config_schema()["$defs"]["budget"]["properties"]["epochs"]["minimum"]
        1
    """
    return copy.deepcopy(_load(str(path)))


def main() -> None:
    """Print the config schema as YAML (``python -m harness.configs.schema``)."""
    print(yaml.safe_dump(config_schema(), sort_keys=False, width=110))


if __name__ == "__main__":
    main()
