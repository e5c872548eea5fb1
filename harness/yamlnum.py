"""YAML numbers in exponent notation read as numbers.

PyYAML (and so Snakemake's config loader) follows YAML 1.1, whose float needs a dot and a signed exponent:
``1e-3``, ``3e-4`` or ``1e30`` come back as strings, and a config's ``lr: 1e-3`` would be refused as "not
a number". YAML 1.2 and every JSON parser read them as floats; so does everything here.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""A number with an exponent that YAML 1.1 leaves as a string (``1e-3``, ``.5E2``, ``-2.0e30``)."""


class NumberLoader(yaml.SafeLoader):
    """PyYAML's safe loader with exponent-notation floats resolved as in YAML 1.2."""


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
