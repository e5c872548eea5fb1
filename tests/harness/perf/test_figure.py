"""harness.perf.figure: the bench table as bars of measured / goal with the measured bound."""
from __future__ import annotations

import pytest

from harness.perf import figure
from harness.perf.report import make_row


def _rows():
    return [make_row(1, "speedup that passes", 4.0, 6.0, bound=12.0, bound_basis="roofline"),
            make_row(2, "speedup short of a goal beyond its bound", 2.5, 1.5, bound=2.0, bound_basis="FLOPs"),
            make_row(2, "memory share", 0.7, 0.35, better="<="),
            make_row(3, "nothing measured", 5.0, None),
            make_row(5, "informational", None, 1.0),
            make_row(1, "x" * 120, 1.0, 1.0)]


def test_scores_put_every_judged_row_against_its_goal():
    """>= rows: measured / goal and bound / goal; <= rows: goal / measured (so 1 or more always meets the
    goal) and no bound; rows without a goal are left out; long names are wrapped, never cut."""
    got = figure.scores(_rows())
    assert [(s.value, s.bound, s.verdict) for s in got] == [
        (1.5, 3.0, "pass"), (0.6, 0.8, "short"), (2.0, None, "pass"), (None, None, "error"),
        (1.0, None, "pass")]
    assert got[0].label == "[1] speedup that passes"
    assert got[-1].label.replace("\n", "") == "[1] " + "x" * 120
    assert max(len(line) for line in got[-1].label.splitlines()) <= figure.LABEL_CHARS


def test_draw_writes_png_and_pdf_next_to_the_table(tmp_path):
    out = tmp_path / "bench.parquet"
    prov = {"device": "cpu", "device_name": "AMD EPYC", "num_threads": 2, "torch_version": "2.13.0+cpu",
            "git_commit": "0123456789abcdef", "git_dirty": True, "started_at": "2026-12-04T10:00:00Z"}
    title = figure.title_of(prov)
    assert "AMD EPYC (cpu), 2 threads" in title and "commit 0123456+dirty" in title
    written = figure.draw(_rows(), out, title)
    assert written == [tmp_path / "bench.png", tmp_path / "bench.pdf"]
    assert all(path.stat().st_size > 1000 for path in written)
    assert figure.draw([make_row(5, "informational", None, 1.0)], out, title) == []


@pytest.mark.parametrize("measured", [0.0, float("nan")])
def test_degenerate_measurements_are_drawn_without_failing(tmp_path, measured):
    rows = [make_row(2, "memory share", 0.7, measured, better="<="), make_row(1, "speedup", 2.0, 3.0)]
    assert len(figure.draw(rows, tmp_path / "bench.parquet", "t")) == 2


def test_an_impossible_row_is_purple_and_a_near_zero_ratio_does_not_stretch_the_axis(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    rows = [make_row(1, "speedup above its bound", 4.0, 67.75, bound=7.66, bound_basis="roofline"),
            make_row(2, "step speedup", 2.0, 1e-4)]
    assert rows[0].verdict == "impossible"
    seen = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: seen.update(
        xlim=fig.axes[0].get_xlim(), colors=[p.get_facecolor() for p in fig.axes[0].patches],
        texts=[t.get_text() for t in fig.axes[0].texts]))
    figure.draw(rows, tmp_path / "bench.parquet", "t")
    assert seen["xlim"][0] == figure.AXIS_FLOOR
    assert "16.94 impossible" in seen["texts"] and "5e-05" in seen["texts"]
    from matplotlib.colors import to_rgba
    assert seen["colors"][0] == to_rgba("tab:purple")
