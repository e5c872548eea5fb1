"""The defaults that the docs quote equal the code's (the library's in docs/library.md and
docs/library-reference.md, the default grid's in docs/pipeline.md and docs/recipe.md, the progress lines'
period in README and docs/usage.md): each entry is a pattern whose one group is the quoted value, and
where in the code or the config that default lives."""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import yaml

from baselines.comera import PARAMS_DEFAULTS
from comera.adapt import DEFAULTS, RankAdaptation
from comera.rank import RankSettings
from harness.running.progress import LOG_EVERY_S

DOCS = Path(__file__).resolve().parents[2] / "docs"
SIGNATURE = {name: p.default for name, p in inspect.signature(RankAdaptation).parameters.items()}
FIELDS = {f.name: f.default for f in dataclasses.fields(RankSettings)}
NUMBER = r"([0-9][0-9.e+-]*)"
GRID = yaml.safe_load((DOCS.parent / "config" / "config.yaml").read_text())
GRID_COMERA = GRID["methods"]["comera"]["params"]

QUOTED = [  # (file, pattern with the quoted value as its group, the code's default)
    ("library.md", rf"`early_fraction` \({NUMBER}\)", SIGNATURE["early_fraction"]),
    ("library.md", rf"`l1_weight` \({NUMBER}, the\s+paper's\)", DEFAULTS["l1_weight"]),
    ("library.md", rf"`l2_weight` x the squared core entries, {NUMBER} by default", DEFAULTS["l2_weight"]),
    ("library.md", rf"with `size_weight` {NUMBER}, `rho`", DEFAULTS["size_weight"]),
    ("library.md", rf"`rho` {NUMBER}: the task loss", DEFAULTS["rho"]),
    ("library.md", rf"`target_ramp` \({NUMBER}\) of the late stage", SIGNATURE["target_ramp"]),
    ("library.md", rf"`threshold` \({NUMBER}\)", DEFAULTS["threshold"]),
    ("library.md", rf"`prune_every` \({NUMBER}\) steps", DEFAULTS["prune_every"]),
    ("library.md", rf"`size_weight` {NUMBER}, the library's default", DEFAULTS["size_weight"]),
    ("library-reference.md", rf"{NUMBER} by default in `comera.RankAdaptation`", SIGNATURE["target_ramp"]),
    ("library-reference.md", rf"{NUMBER} \(fixed, the\s+paper's\) by default in the pipeline's `comera` method",
     PARAMS_DEFAULTS["target_ramp"]),
    ("library-reference.md", rf"`target_ramp_steps`, {NUMBER} by default", FIELDS["target_ramp_steps"]),
    ("library-reference.md", rf"`l2_weight` is {NUMBER} by default", DEFAULTS["l2_weight"]),
    # the default grid's values (config/config.yaml) and the progress lines' period
    ("pipeline.md", rf"gate penalty `l1_weight` {NUMBER}, the paper's", GRID_COMERA.get("l1_weight", DEFAULTS["l1_weight"])),
    ("pipeline.md", rf"`size_weight: {NUMBER}`", GRID_COMERA["size_weight"]),
    ("pipeline.md", rf"`target_ramp: {NUMBER}`", GRID_COMERA["target_ramp"]),
    ("pipeline.md", rf"{NUMBER} early-stage steps", GRID_COMERA["early_fraction"] * 1000),
    ("pipeline.md", rf"ETA \.\.\.` at least\s+every {NUMBER} s", LOG_EVERY_S),
    ("usage.md", rf"ETA \.\.\.` every {NUMBER} s", LOG_EVERY_S),
    ("../README.md", rf"ETA at least every {NUMBER} s", LOG_EVERY_S),
    ("recipe.md", rf"gate penalty `l1_weight` \(default grid\) \| [0-9.]+ \| {NUMBER}, the paper's",
     GRID_COMERA.get("l1_weight", DEFAULTS["l1_weight"])),
]


@pytest.mark.parametrize("doc, pattern, default", QUOTED, ids=[q[1][:40] for q in QUOTED])
def test_quoted_default_equals_the_code(doc, pattern, default):
    found = re.findall(pattern, (DOCS / doc).read_text())
    assert found, f"docs/{doc} no longer quotes /{pattern}/: update this test with the docs"
    assert all(float(value) == float(default) for value in found), \
        f"docs/{doc} quotes {found} for /{pattern}/, the code's default is {default!r}"

