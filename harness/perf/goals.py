"""The goals of ``comera-bench bench``: goals.yaml, checked against goals.schema.yaml (both package data,
beside this module; errors name the file and the key)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.configs import grid

DEFAULT_PATH = Path(__file__).with_name("goals.yaml")
SCHEMA = Path(__file__).with_name("goals.schema.yaml")


def load(path: str | Path = DEFAULT_PATH) -> dict[str, Any]:
    """The goals file, read as the pipeline's configs are (a repeated key is an error, ``1e-3`` a number)
    and checked against the schema; ValueError names the file and the offending key."""
    try:
        goals = grid.load_config_file(path)
    except OSError as exc:
        raise ValueError(f"bench goals {path}: cannot read: {exc.strerror or exc}") from exc
    except (grid.ConfigError, yaml.YAMLError) as exc:
        raise ValueError(f"bench goals {path}: {exc}") from exc
    error = grid.schema_error(goals, SCHEMA)
    if error:
        raise ValueError(f"bench goals {path}: {error}")
    return goals
