"""The paper's stated numbers (harness/reports/reference/paper.yaml), each with its source."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

REFERENCE_FILE = Path(__file__).with_name("reference") / "paper.yaml"
CLAIM_IDS = tuple(f"C{i}" for i in range(1, 11))


@functools.lru_cache(maxsize=None)
def load(path: str | Path = REFERENCE_FILE) -> dict[str, Any]:
    """The reference data; every claim and device ratio must name a source listed under ``sources``."""
    data = yaml.safe_load(Path(path).read_text())
    sources = data.get("sources", {})
    missing = [c for c in CLAIM_IDS if c not in data.get("claims", {})]
    if missing:
        raise ValueError(f"{path}: claims {missing} missing")
    for cid, claim in data["claims"].items():
        if claim.get("source") not in sources:
            raise ValueError(f"{path}: claims.{cid}.source {claim.get('source')!r} is not in sources")
    for name, device in data.get("devices", {}).items():
        for i, ratio in enumerate(device["ratios"]):
            if ratio.get("source") not in sources:
                raise ValueError(f"{path}: devices.{name}.ratios[{i}].source {ratio.get('source')!r} "
                                 "is not in sources")
    return data


def claim(cid: str) -> dict[str, Any]:
    """One claim (text, source key, device, values) with ``source_text`` filled in."""
    data = load()
    entry = dict(data["claims"][cid])
    entry["source_text"] = data["sources"][entry["source"]]
    return entry


def paper_devices() -> dict[str, dict[str, Any]]:
    """name -> {"label": ..., "ratios": [...]} for the paper's GPUs (CoMERA vs another method)."""
    return load()["devices"]


def source_text(key: str) -> str:
    return load()["sources"][key]
