"""YAML numbers in exponent notation (``1e-3``) read as numbers, as YAML 1.2 and JSON read them.

PyYAML, hence Snakemake's config loader, leaves them strings (docs/architecture.md, "Libraries").
"""
from __future__ import annotations

import re
from typing import Any

import yaml

EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""A number with an exponent that YAML 1.1 leaves as a string (``1e-3``, ``.5E2``, ``-2.0e30``)."""


class NumberLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader with exponent-notation floats resolved as in YAML 1.2: its C parser (libyaml)
    where PyYAML has it (a config with a 10 MB comment takes 0.2 s to read instead of 27 s), else the
    Python one."""


NumberLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+.0123456789"))


def load(text: str) -> Any:
    """A YAML document (or one value, e.g. of a KEY=VALUE option) with :class:`NumberLoader`."""
    return yaml.load(text, Loader=NumberLoader)


def exponent_strings_as_numbers(value: Any) -> Any:
    """``value`` (a loaded config: dicts, lists, scalars) with every string that is an exponent-notation
    number made a float, in place where it can be; for configs another YAML 1.1 loader has read."""
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = exponent_strings_as_numbers(item)
    elif isinstance(value, list):
        value[:] = [exponent_strings_as_numbers(item) for item in value]
    elif isinstance(value, str) and EXPONENT_FLOAT.match(value):
        return float(value.replace("_", ""))
    return value


_ABSENT = object()


def numbers_as_in(value: Any, reference: Any = _ABSENT) -> Any:
    """``value`` (a config another YAML 1.1 loader read) with an exponent-notation string made a float
    only where ``reference`` (the same files read with :class:`NumberLoader`) holds a number: a quoted
    ``"1e5"`` stays text. Where ``reference`` has nothing (a ``--config`` override), as
    :func:`exponent_strings_as_numbers`. In place where it can be."""
    if reference is _ABSENT:
        return exponent_strings_as_numbers(value)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = numbers_as_in(
                item, reference.get(key, _ABSENT) if isinstance(reference, dict) else _ABSENT)
    elif isinstance(value, list):
        refs = (reference if isinstance(reference, list) and len(reference) == len(value)
                else [_ABSENT] * len(value))
        value[:] = [numbers_as_in(item, ref) for item, ref in zip(value, refs)]
    elif isinstance(value, str) and isinstance(reference, float) and EXPONENT_FLOAT.match(value):
        return float(value.replace("_", ""))
    return value


def merged(documents: list[Any]) -> Any:
    """Config documents deep-merged in order (later keys win), as Snakemake merges --configfile files."""
    out: Any = {}
    for doc in documents:
        out = _merge(out, doc)
    return out


def _merge(base: Any, update: Any) -> Any:
    if isinstance(base, dict) and isinstance(update, dict):
        return {**base, **{k: _merge(base.get(k, _ABSENT), v) if k in base else v for k, v in update.items()}}
    return update


def typed_config_args(config: dict, config_args: Any) -> dict:
    """``config`` with the mappings given on Snakemake's command line (``--config execution='{threads:
    1}'``) read as YAML with :class:`NumberLoader`: Snakemake reads such a value with YAML's base loader,
    which leaves every scalar in it a string (``'1'``, refused as not an integer). Scalar values
    (``results_dir=out``) Snakemake already types itself; they are left as they are. In place."""
    for arg in config_args or ():
        key, sep, text = str(arg).partition("=")
        if not sep:
            continue
        try:
            value = load(text)
        except yaml.YAMLError:
            continue
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = _merge(config[key], value)
    return config
