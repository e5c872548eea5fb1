"""The defaults that the docs quote equal the code's (the library's in docs/library.md,
docs/library-reference.md and comera/adapt.py's docstring; the default grid's in docs/pipeline.md and
docs/recipe.md; the progress lines' period in README and docs/usage.md): each entry is a pattern whose one
group is the quoted value, and where in the code or the config that value lives."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from baselines.comera import PARAMS_DEFAULTS
from comera.adapt import defaults
from comera.rank import RankSettings
from harness.running.progress import LOG_EVERY_S

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LIBRARY = defaults()
FIELDS = {f.name: f.default for f in dataclasses.fields(RankSettings)}
NUMBER = r"([0-9][0-9.e+-]*)"
GRID = yaml.safe_load((DOCS.parent / "config" / "config.yaml").read_text())
GRID_COMERA = GRID["methods"]["comera"]["params"]
QUALITY = GRID["workloads"]["transformer"]["quality"]
QUALITY_STEPS = QUALITY["params"]["train_samples"] // QUALITY["batch_sizes"][0]  # one epoch


def _config(name: str, method: str = "comera") -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())["methods"][method].get("params", {})


QUOTED = [  # (file, pattern with the quoted value as its group, the code's default)
    ("library.md", rf"`early_fraction` \({NUMBER}\)", LIBRARY["early_fraction"]),
    ("library.md", rf"`l1_weight` \({NUMBER}, the\s+paper's\)", LIBRARY["l1_weight"]),
    ("library.md", rf"`l2_weight` x the squared core entries, {NUMBER} by default", LIBRARY["l2_weight"]),
    ("library.md", rf"with `size_weight` {NUMBER}, `rho`", LIBRARY["size_weight"]),
    ("library.md", rf"`rho` {NUMBER}: the task loss", LIBRARY["rho"]),
    ("library.md", rf"`target_ramp` \({NUMBER}\) of the late stage", LIBRARY["target_ramp"]),
    ("library.md", rf"`threshold` \({NUMBER}\)", LIBRARY["threshold"]),
    ("library.md", rf"`prune_every` \({NUMBER}\) steps", LIBRARY["prune_every"]),
    ("library.md", rf"`size_weight` {NUMBER}, the library's default", LIBRARY["size_weight"]),
    ("library.md", rf"raise `size_weight` to {NUMBER} for their", _config("config.yaml")["size_weight"]),
    ("library-reference.md", rf"{NUMBER} by default\s+in `comera.RankAdaptation` and so in the pipeline's",
     LIBRARY["target_ramp"]),
    ("library-reference.md", rf"{NUMBER} by default\s+in `comera.RankAdaptation` and so in the pipeline's",
     PARAMS_DEFAULTS["target_ramp"]),
    ("library-reference.md", rf"config/paper.yaml sets {NUMBER}, fixed, the paper's",
     _config("paper.yaml")["target_ramp"]),
    ("library-reference.md", rf"`target_ramp_steps`, {NUMBER} by default", FIELDS["target_ramp_steps"]),
    ("library-reference.md", rf"`l2_weight` is {NUMBER} by default", LIBRARY["l2_weight"]),
    ("pipeline.md", rf"with\s+`size_weight: {NUMBER}`", _config("config.yaml")["size_weight"]),
    ("pipeline.md", rf"`target_ramp` {NUMBER} \(S0 falls", LIBRARY["target_ramp"]),
    ("pipeline.md", rf"early stage {NUMBER} of the steps", LIBRARY["early_fraction"]),
    ("../comera/adapt.py", rf"``early_fraction`` {NUMBER} and", LIBRARY["early_fraction"]),
    ("../comera/adapt.py", rf"``target_ramp`` {NUMBER}; size weight", LIBRARY["target_ramp"]),
    ("../comera/adapt.py", rf"; size weight {NUMBER}, pruning", LIBRARY["size_weight"]),
    ("../comera/adapt.py", rf"pruning every {NUMBER} steps", LIBRARY["prune_every"]),
    ("../comera/adapt.py", rf"``l1_weight`` {NUMBER}, the paper's", LIBRARY["l1_weight"]),
    ("../comera/adapt.py", rf"``rho`` is {NUMBER}, so the", LIBRARY["rho"]),
    ("../comera/adapt.py", rf"raise ``size_weight`` to {NUMBER} for", _config("config.yaml")["size_weight"]),
    ("pipeline.md", rf"\(the library's is {NUMBER}\)", LIBRARY["size_weight"]),
    ("pipeline.md", rf"\(`target_ramp: {NUMBER}`\), `size_weight: [0-9.]+`", _config("paper.yaml")["target_ramp"]),
    ("pipeline.md", rf"\(`target_ramp: [0-9.]+`\), `size_weight: {NUMBER}`", _config("paper.yaml")["size_weight"]),
    # the default grid's values (config/config.yaml) and the progress lines' period
    ("pipeline.md", rf"gate penalty `l1_weight` {NUMBER}, the paper's", GRID_COMERA.get("l1_weight", LIBRARY["l1_weight"])),
    ("pipeline.md", rf"{NUMBER} early-stage steps",
     GRID_COMERA.get("early_fraction", LIBRARY["early_fraction"]) * QUALITY_STEPS),
    ("pipeline.md", rf"one epoch of\s+{NUMBER} steps", QUALITY_STEPS),
    ("pipeline.md", rf"ETA \.\.\.` at least\s+every {NUMBER} s", LOG_EVERY_S),
    ("usage.md", rf"ETA \.\.\.` every {NUMBER} s", LOG_EVERY_S),
    ("../README.md", rf"ETA at least every {NUMBER} s", LOG_EVERY_S),
    ("recipe.md", rf"gate penalty `l1_weight` \(default grid\) \| [0-9.]+ \| {NUMBER}, the paper's",
     GRID_COMERA.get("l1_weight", LIBRARY["l1_weight"])),
]


@pytest.mark.parametrize("doc, pattern, default", QUOTED, ids=[q[1][:40] for q in QUOTED])
def test_quoted_default_equals_the_code(doc, pattern, default):
    found = re.findall(pattern, (DOCS / doc).read_text())
    assert found, f"docs/{doc} no longer quotes /{pattern}/: update this test with the docs"
    assert all(float(value) == float(default) for value in found), \
        f"docs/{doc} quotes {found} for /{pattern}/, the code's default is {default!r}"

