"""What torch.compile did with a model (harness.running.compiled), and the compiled cell's row that says
it."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
import torch
import torch._dynamo.utils

from harness.running import compiled
from harness.running import run as runner


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles from scratch and leaves no compiled code behind (Dynamo's counters stay: the
    reports count from their snapshots)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Clean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


class ItemBreak(Clean):
    """``.item()`` breaks the graph (Dynamo does not capture scalar outputs by default)."""

    def forward(self, x):
        y = self.fc(x)
        if y.sum().item() > 0:
            y = y * 2
        return y.relu()


def compiled_run(module, rows=(2,)):
    """Dynamo's report of ``torch.compile(module)`` called on inputs of ``rows`` rows each."""
    before = compiled.snapshot()
    model = torch.compile(module)
    for n in rows:
        model(torch.randn(n, 4))
    return compiled.report(before)


@pytest.mark.parametrize("module, graphs, breaks, reason", [
    (Clean, 1, 0, None),
    (ItemBreak, 2, 1, "Tensor.item()"),
])
def test_graphs_and_graph_breaks_are_counted_with_their_reasons(module, graphs, breaks, reason):
    report = compiled_run(module())
    assert json.loads(json.dumps(report)) == report  # JSON-able as it is
    assert (report["graphs"], report["graph_breaks"], report["eager_fallbacks"]) == (graphs, breaks, [])
    assert report["frames"] == report["frames_ok"] >= 1
    if reason is None:
        assert report["break_reasons"] == []
    else:
        assert len(report["break_reasons"]) == 1 and reason in report["break_reasons"][0]
        assert "\n" not in report["break_reasons"][0]  # the first line only


def test_a_frame_past_the_recompile_limit_is_an_eager_fallback():
    """Each new input shape recompiles (no dynamic shapes); past the limit of 1 the frame runs eagerly."""
    with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False):
        report = compiled_run(Clean(), rows=(1, 2, 3))
    assert report["eager_fallbacks"] == ["Dynamo recompile limit exceeded"]
    assert report["frames_ok"] < report["frames"] and report["graph_breaks"] == 0


def test_a_report_counts_only_what_came_after_its_snapshot():
    """Two compiled models in one process: the second's report leaves out the first's graphs and break."""
    first = compiled.snapshot()
    compiled_run(ItemBreak())
    second = compiled_run(Clean())
    assert (second["graphs"], second["graph_breaks"], second["break_reasons"]) == (1, 0, [])
    both = compiled.report(first)
    assert (both["graphs"], both["graph_breaks"]) == (3, 1)


@pytest.mark.parametrize("since, now, expected", [
    ({}, {}, {"frames": 0, "frames_ok": 0, "graphs": 0, "graph_breaks": 0, "break_reasons": [],
              "eager_fallbacks": []}),
    ({"graph_break": {"b": 1, "gone": 4}, "stats": {"unique_graphs": 2}},
     {"frames": {"total": 3}, "stats": {"unique_graphs": 5},
      "graph_break": {"a\nhint 1": 2, "a\nhint 2": 2, "b": 2, "c": 3, "d\n": 2},
      "unimplemented": {"limit\nwhy": 1, "limit\nother why": 2}},
     {"frames": 3, "frames_ok": 0, "graphs": 3, "graph_breaks": 10, "break_reasons": ["a", "c", "d"],
      "eager_fallbacks": ["limit"]}),
])
def test_counters_absent_or_gone_count_zero_and_reasons_group_by_their_first_line(monkeypatch, since, now,
                                                                                  expected):
    """Reasons that share a first line are one reason; the three most frequent are kept; a counter the
    table lacks, or one that fell since the snapshot, adds nothing."""
    table = defaultdict(Counter, {group: Counter(keys) for group, keys in now.items()})
    monkeypatch.setattr(torch._dynamo.utils, "counters", table)
    assert compiled.report(since) == expected


def tiny_transformer_spec(compile_model):
    return {"workload": "transformer",
            "workload_params": {"size": "tiny", "train_samples": 8, "eval_samples": 2},
            "method": "dense", "batch_size": 2, "seed": 0,
            "budget": {"epochs": 1, "max_steps_per_epoch": 2, "warmup_steps": 1, "eval_every_steps": None},
            "execution": {"device": "cpu", "num_threads": 1, "compile": compile_model}}


@pytest.mark.slow
@pytest.mark.parametrize("compile_model", [True, False])
def test_a_compiled_cells_row_says_what_dynamo_did_from_its_own_wrapper_on(compile_model):
    """A model compiled earlier in the process broke its graph; the cell counts from its own wrapper on
    (the tiny transformer compiles as one graph). An eager cell's row has no such key."""
    assert compiled_run(ItemBreak())["graph_breaks"] == 1
    row, _ = runner.run_cell(tiny_transformer_spec(compile_model))
    extra = json.loads(row["extra"])
    assert row["status"] == "ok", row["error"] + extra.get("traceback", "")
    if not compile_model:
        assert "compile" not in extra
        return
    report = extra["compile"]
    assert report["graphs"] >= 1 and report["frames"] == report["frames_ok"] >= 1
    assert (report["graph_breaks"], report["break_reasons"], report["eager_fallbacks"]) == (0, [], [])
