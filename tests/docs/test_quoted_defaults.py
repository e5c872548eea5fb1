"""The defaults that the docs quote equal the code's (the library's in docs/library.md,
docs/library-reference.md and comera/adapt.py's docstring; the default grid's in docs/pipeline.md and
docs/recipe.md; the progress lines' period in README and docs/usage.md; the stability thresholds in
docs/measurement.md and docs/schema.md): each entry is a pattern whose one
group is the quoted value, and where in the code or the config that value lives."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from comera.adapt import defaults
from harness.core import timing
from harness.results.analysis import CONFIDENCE
from harness.running.progress import LOG_EVERY_S

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LIBRARY = defaults()
PAPER = defaults("paper")
NUMBER = r"([0-9][0-9.e+-]*)"
GRID = yaml.safe_load((DOCS.parent / "config" / "config.yaml").read_text())
QUALITY = GRID["workloads"]["transformer"]["quality"]
QUALITY_STEPS = QUALITY["params"]["train_samples"] // QUALITY["batch_sizes"][0]  # one epoch


def _config(name: str, method: str = "comera") -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())["methods"][method].get("params", {})


QUOTED = [  # (file, pattern with the quoted value as its group, the code's default)
    ("library.md", rf"`early_fraction` \({NUMBER}\)", LIBRARY["early_fraction"]),
    ("library.md", rf"over the stored size \({NUMBER} by default", LIBRARY["l1_weight"]),
    ("library.md", rf"`l2_weight` x\s+the squared core entries, {NUMBER} by default", LIBRARY["l2_weight"]),
    ("library.md", rf"`converged_gain`, {NUMBER}%", 100 * LIBRARY["converged_gain"]),
    ("library.md", rf"\(`size_weight` {NUMBER} x the soft size\)", LIBRARY["size_weight"]),
    ("library.md", rf"`loss_tolerance` \({NUMBER}\)", LIBRARY["loss_tolerance"]),
    ("library.md", rf"`target_ramp` \({NUMBER}\) of the late stage", LIBRARY["target_ramp"]),
    ("library.md", rf"`threshold` \({NUMBER}\)", LIBRARY["threshold"]),
    ("library.md", rf"`prune_every` \({NUMBER}\) steps", LIBRARY["prune_every"]),
    ("library.md", rf"`min_rank`\s+\({NUMBER}\) ranks", LIBRARY["min_rank"]),
    ("library-reference.md", rf"Early stage: `L \+ {NUMBER} R` \(`l1_weight`\)", PAPER["l1_weight"]),
    ("library-reference.md", rf"`threshold` \({NUMBER}; signed", PAPER["threshold"]),
    ("library-reference.md", rf"\(`min_rank` {NUMBER}\)", PAPER["min_rank"]),
    ("library-reference.md", rf"the official MNLI run's {NUMBER}, about the loss",
     _config("paper.yaml", "comera-paper")["loss_target"]),
    ("pipeline.md", rf"\(`target_ramp: {NUMBER}`\)", _config("paper.yaml")["target_ramp"]),
    ("pipeline.md", rf"paper's rules at targets 0.5 and 0.2 \(the switch\s+at step {NUMBER}\)",
     PAPER["early_fraction"] * QUALITY_STEPS),
    ("pipeline.md", rf"after at least {NUMBER}\s+steps", LIBRARY["early_fraction"] * QUALITY_STEPS),
    ("pipeline.md", rf"one epoch of\s+{NUMBER} steps", QUALITY_STEPS),
    ("pipeline.md", rf"ETA \.\.\.` at least\s+every {NUMBER} s", LOG_EVERY_S),
    ("usage.md", rf"ETA \.\.\.` every {NUMBER} s", LOG_EVERY_S),
    ("measurement.md", rf"<= {NUMBER} \(`MAX_IQR_OVER_MEDIAN`\)", timing.MAX_IQR_OVER_MEDIAN),
    ("measurement.md", rf"<= {NUMBER} \(`MAX_MEAN_OVER_MEDIAN`\)", timing.MAX_MEAN_OVER_MEDIAN),
    ("measurement.md", rf"<= {NUMBER} \(`MAX_RUN_QUEUE_FRAC`\)", timing.MAX_RUN_QUEUE_FRAC),
    ("measurement.md", rf"<= {NUMBER} \(`MAX_CPU_PRESSURE`\)", timing.MAX_CPU_PRESSURE),
    ("measurement.md", rf"`CONFIDENCE` = {NUMBER}%", 100 * CONFIDENCE),
    ("schema.md", rf"rounds spread more than {NUMBER}% of their median", 100 * timing.MAX_IQR_OVER_MEDIAN),
    ("schema.md", rf"\(over {NUMBER}% of their runnable time\)", 100 * timing.MAX_RUN_QUEUE_FRAC),
    ("schema.md", rf"CPU pressure \(over {NUMBER}%\)", 100 * timing.MAX_CPU_PRESSURE),
    ("../README.md", rf"ETA at least every {NUMBER} s", LOG_EVERY_S),
]


@pytest.mark.parametrize("doc, pattern, default", QUOTED, ids=[q[1][:40] for q in QUOTED])
def test_quoted_default_equals_the_code(doc, pattern, default):
    found = re.findall(pattern, (DOCS / doc).read_text())
    assert found, f"docs/{doc} no longer quotes /{pattern}/: update this test with the docs"
    assert all(float(value) == float(default) for value in found), \
        f"docs/{doc} quotes {found} for /{pattern}/, the code's default is {default!r}"

