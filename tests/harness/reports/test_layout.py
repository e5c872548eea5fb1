"""Every figure drawn from a results folder shaped like a real run of the default grid (config/config.yaml)
and of the paper's grid (config/paper.yaml), checked for what a reader trips over: tick labels printed on
top of each other, a plot squeezed below half the figure by its footer, text outside the picture or over a
plot, a long footer (its details belong in the figure's notes file). The folders come from
tests/harness/reports/synthetic.py, which follows the configs as they are (another cell list still gets
checked)."""
from __future__ import annotations

import itertools
import re

import matplotlib.pyplot as plt
import pytest

from harness.reports import compare, drawing, figures, tables
from harness.results.analysis import load
from tests.harness.reports import synthetic

pytestmark = pytest.mark.slow  # draws every figure of two grids (~30 s)
CONFIGS = {"default": synthetic.ROOT / "config" / "config.yaml",
           "paper": synthetic.ROOT / "config" / "paper.yaml"}
MIN_PLOT_SHARE = 0.5


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def _visible(texts):
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def _tick_labels(axis):
    """The tick labels drawn: visible, not empty, at a tick inside the axis' view."""
    lo, hi = sorted(axis.get_view_interval())
    pairs = [*zip(axis.get_majorticklocs(), axis.get_majorticklabels()),
             *zip(axis.get_minorticklocs(), axis.get_minorticklabels())]
    return [t for loc, t in pairs if lo - 1e-9 * abs(hi) <= loc <= hi + 1e-9 * abs(hi) and t in _visible([t])]


def _name(artist) -> str:
    return artist.get_text()[:40] if hasattr(artist, "get_text") else type(artist).__name__


def layout_problems(fig: plt.Figure) -> list[str]:
    """What is wrong with the layout of ``fig`` as saved (empty when nothing)."""
    fig.set_dpi(drawing.DPI)  # text extents as saved
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    problems = []
    plots = [ax for ax in fig.axes if ax.axison]
    share = sum(ax.get_window_extent(renderer).width * ax.get_window_extent(renderer).height for ax in plots)
    if plots and share < MIN_PLOT_SHARE * page.width * page.height:
        problems.append(f"the plots take {share / (page.width * page.height):.0%} of the figure")
    for ax in plots:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [(t.get_text(), t.get_window_extent(renderer)) for t in _tick_labels(axis)]
            for (ta, a), (tb, b) in itertools.combinations(labels, 2):
                if _overlap(a, b):
                    problems.append(f"{axis.axis_name} tick labels {ta!r} and {tb!r} overlap")
    texts = _visible(fig.texts) + ([fig._suptitle] if fig._suptitle is not None else [])
    for ax in plots:
        texts += _visible([ax.xaxis.label, ax.yaxis.label, ax.title]) + _visible(ax.texts)
        texts += _tick_labels(ax.xaxis) + _tick_labels(ax.yaxis)
        legend = ax.get_legend()
        if legend is not None:
            texts.append(legend)
    for t in texts:
        box = t.get_window_extent(renderer)
        if box.x0 < page.x0 or box.y0 < page.y0 or box.x1 > page.x1 or box.y1 > page.y1:
            problems.append(f"{_name(t)!r} is cut off")
    for t in _visible(fig.texts):  # the footer and other figure texts over no plot
        for ax in plots:
            if _overlap(t.get_window_extent(renderer), ax.get_tightbbox(renderer)):
                problems.append(f"figure text {t.get_text()[:40]!r} overlaps a plot")
    for ax in plots:  # notes in a plot over each other or its legend
        notes = _visible(ax.texts) + ([ax.get_legend()] if ax.get_legend() is not None else [])
        for a, b in itertools.combinations(notes, 2):
            if _overlap(a.get_window_extent(renderer), b.get_window_extent(renderer)):
                problems.append(f"{_name(a)!r} and {_name(b)!r} overlap")
    return problems


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def results(request, tmp_path_factory):
    """(grid name, merged results folder of that grid's shape)."""
    folder = tmp_path_factory.mktemp(request.param) / "dev"
    return request.param, synthetic.results_folder(CONFIGS[request.param], folder)


def test_every_figure_is_readable(results, tmp_path, monkeypatch):
    """Each figure of figures.FIGURES, as it is saved: no overlapping tick labels, plots on at least half of
    the figure, every text inside it and off the plots, a footer of at most FOOTER_LINES lines naming the
    figure's notes file, which holds the rest."""
    grid, folder = results
    found = {}
    real_save = drawing.save

    def check(fig, out, name):
        found[name] = layout_problems(fig)
        footer = fig.texts[-1].get_text()
        names_notes = f"Notes: {name}.md." in " ".join(footer.split())
        if len(footer.splitlines()) > drawing.FOOTER_LINES or not names_notes:
            found[name].append(f"footer {footer!r}")
        real_save(fig, out, name)

    monkeypatch.setattr(drawing, "save", check)
    res = load(folder)
    for name, draw in figures.FIGURES.items():
        draw(res, tmp_path)
    assert sorted(found) == sorted(figures.FIGURES)
    assert {name: p for name, p in found.items() if p} == {}, grid
    for name in figures.FIGURES:
        assert (tmp_path / f"{name}.md").read_text().startswith("# ")
        assert (tmp_path / f"{name}.html").is_file()


def test_the_device_comparison_is_readable(results, tmp_path, monkeypatch):
    """compare_time_memory of a grid's folder against a copy of it: the same checks."""
    grid, folder = results
    found = []
    real_save = compare.save
    monkeypatch.setattr(compare, "save",
                        lambda fig, out: found.append(layout_problems(fig)) or real_save(fig, out))
    assert compare.cli([str(folder), str(folder), "--names", "here,there", "--out", str(tmp_path)]) == 0
    assert found == [[]], grid


WINDOW_PX, CHAR_PX, CELL_PAD_PX, PAGE_MARGIN_PX = 1400, 8, 18, 42


def narrowest_width_px(markdown_table: str) -> int:
    """About the narrowest a Markdown table's HTML page lays the table out without breaking a word (a header
    breaks at "_" and "/", html.STYLE lets it), at 14 px text (``CHAR_PX`` per character): its width in px."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in markdown_table.splitlines()
            if line.startswith("|") and not set(line) <= set("|:- ")]
    widths = [max(len(w) for w in re.split(r"[_/ ]", header) or [""]) for header in rows[0]]
    for row in rows[1:]:
        widths = [max(w, *(len(x) for x in cell.split())) if cell else w for w, cell in zip(widths, row)]
    return sum(w * CHAR_PX + CELL_PAD_PX for w in widths) + PAGE_MARGIN_PX


def test_the_size_table_fits_a_1400_px_window(results, tmp_path):
    """table_mnli_size (one row per quality cell and seed, 17 columns): its page needs no sideways scrolling
    in a 1400-px window (an estimate from the words of its cells, not a browser's layout)."""
    grid, folder = results
    assert tables.main(["--results", str(folder), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "table_mnli_size.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    assert narrowest_width_px(table) <= WINDOW_PX, (grid, narrowest_width_px(table))
    assert "overflow-wrap: anywhere" in (tmp_path / "table_mnli_size.html").read_text()
