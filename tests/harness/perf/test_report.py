"""harness.perf.report: verdicts, the Markdown table and the Parquet file with provenance columns."""
from __future__ import annotations

import pandas as pd
import pytest

from harness.cli import show_table
from harness.perf import report
from harness.results import PROVENANCE_COLUMNS, file_metadata, provenance


@pytest.mark.parametrize("measured, goal, better, expected", [
    (7.2, 7.0, ">=", "pass"), (7.0, 7.0, ">=", "pass"), (6.9, 7.0, ">=", "short"),
    (0.5, 0.7, "<=", "pass"), (0.71, 0.7, "<=", "short"), (None, 4.0, ">=", "error"),
    (float("nan"), 4.0, ">=", "error"), (3.0, None, ">=", "info"), (None, None, ">=", "error"),
])
def test_verdict(measured, goal, better, expected):
    assert report.verdict(measured, goal, better) == expected
    assert report.make_row(1, "x", goal, measured, better=better).verdict == expected


def test_markdown_table_has_every_row_and_escapes_pipes():
    rows = [report.make_row(1, "a | b", 7.0, 8.0, flop_ratio=18.0, bound=9.5, bound_basis="roofline",
                            medians="x 1 ms"),
            report.make_row(5, "plans", 1.0, 1.2, better="<=")]
    text = report.to_markdown(rows)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| target | what | measured | goal | bound | verdict")
    assert len(lines) == 4
    assert ("a \\| b" in lines[2] and "| pass |" in lines[2] and "18.00" in lines[2]
            and "9.50 (roofline)" in lines[2])
    assert "<= 1.00" in lines[3] and "| short |" in lines[3]


def test_written_rows_carry_the_provenance_columns(tmp_path):
    rows = [report.make_row(1, "a", 4.0, 5.0, goal_key="linear[0]"),
            report.make_row(5, "b", 1.0, 0.9, better="<=")]
    prov = provenance("cpu")
    md, pq = report.write(rows, tmp_path / "cpu" / "bench.parquet", prov, "reuse: glibc")
    frame = pd.read_parquet(pq)
    assert len(frame) == 2 and set(PROVENANCE_COLUMNS) <= set(frame.columns)
    assert list(frame["goal_key"]) == ["linear[0]", ""] and list(frame["verdict"]) == ["pass", "pass"]
    assert ((frame["git_commit"] == prov["git_commit"]).all()
            and (frame["torch_version"] == prov["torch_version"]).all())
    assert file_metadata(pq)["provenance"]["allocator"] == "reuse: glibc"
    assert md == tmp_path / "cpu" / "bench.md" and "Allocator: reuse: glibc" in md.read_text()
    assert not list((tmp_path / "cpu").glob("*.tmp"))
    shown = show_table([str(tmp_path)], kind="bench")  # `comera-bench show results --kind bench`
    assert list(shown["what"]) == ["a", "b"] and "bound" in shown.columns


@pytest.mark.parametrize("measured, bound, expected", [
    (67.75, 7.66, "impossible"), (8.0, 7.66, "pass"), (6.5, 7.66, "short"), (9.0, None, "pass"),
    (9.0, float("nan"), "pass"),
])
def test_a_ratio_above_its_bound_is_never_a_pass(measured, bound, expected):
    row = report.make_row(1, "x", 7.0, measured, bound=bound, bound_basis="roofline")
    assert row.verdict == expected
    assert ("above its own bound 7.66 (roofline)" in row.note) == (expected == "impossible")
    assert report.make_row(1, "x", None, measured, bound=bound).verdict in ("info", "impossible")


@pytest.mark.parametrize("measured, goal, bound, stability, expected", [
    (8.0, 7.0, None, "noisy: x per-round times spread 40% of their median (> 25%)", "noisy"),
    (6.0, 7.0, None, "noisy: tiny dense b8: 2 timed steps (< 5)", "noisy"),  # a noisy short is not short
    (8.0, 7.0, None, "stable", "pass"), (8.0, 7.0, None, "", "pass"),
    (67.75, 7.0, 7.66, "noisy: x", "impossible"),  # above its bound: impossible first
    (None, 7.0, None, "noisy: x", "error"), (3.0, None, None, "noisy: x", "info"),
])
def test_a_ratio_of_timings_that_are_not_stable_is_noisy_never_a_pass(measured, goal, bound,
                                                                      stability, expected):
    row = report.make_row(1, "x", goal, measured, bound=bound, bound_basis="roofline", stability=stability)
    assert row.verdict == expected and row.stability == stability
    assert ("timing not stable (" in row.note) == (expected == "noisy")
    text = report.to_markdown([row])
    assert text.splitlines()[0].startswith("| target | what | measured | goal | bound | verdict | "
                                           "stability |")
    assert f"| {expected} | {stability} |" in text
