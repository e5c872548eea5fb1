"""Text from the data (an error message, a value) is text in the Markdown tables and their HTML pages:
no live link, image or HTML, and a `|` does not split the cell."""
from __future__ import annotations

import re

import pandas as pd

from harness.reports import tables

HOSTILE = "bad [here](http://evil.example) ![i](http://evil.example/p.png) <b>x</b> <http://a.example> a|b\nc"


def _cells(line: str) -> int:
    """Cells of a Markdown table row: the pipes that are not backslash-escaped, less one."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def test_table_cells_from_data_are_text(tmp_path):
    df = pd.DataFrame({"run_id": ["a_b", "c"], "error": [HOSTILE, ""], "step_time_ms": [1.5, None],
                       "params": pd.Series([1234567, None], dtype=object)})
    tables.write_table(df, "a note", "All runs", tmp_path, "t", "settings")
    lines = (tmp_path / "t.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith("|")]
    assert len(rows) == 4 and {_cells(r) for r in rows} == {4}  # header, rule and two rows: four cells each
    html = (tmp_path / "t.html").read_text()
    body = html.split("<table>")[1]
    assert "<a " not in body and "<img" not in body and "<b>" not in body
    assert "[here](http://evil.example)" in body and "&lt;b&gt;x&lt;/b&gt;" in body and "a|b c" in body
    text = (tmp_path / "t.md").read_text()
    assert "a_b" in text and "1234567" in text  # a plain name stays readable, a whole count whole
    assert body.count("<td") == 8 and ">nan<" not in body


def _live(html: str) -> list[str]:
    """The live links, images and raw HTML elements of a page's body (its own table markup aside)."""
    body = html.split("<body>", 1)[1]
    return re.findall(r"<(?:a |img|b>)", body)


def test_a_tables_note_and_settings_line_from_data_are_text(tmp_path):
    """The settings line under a table holds the rows' device name, torch version and workload params."""
    df = pd.DataFrame({"run_id": ["a"]})
    tables.write_table(df, f"note naming {HOSTILE}", "All runs", tmp_path, "t", f"device x ({HOSTILE})")
    html = (tmp_path / "t.html").read_text()
    assert _live(html) == [] and "[here](http://evil.example)" in html
    empty = pd.DataFrame({"run_id": []})
    tables.write_table(empty, HOSTILE, "All runs", tmp_path, "u", HOSTILE)
    assert _live((tmp_path / "u.html").read_text()) == []


def test_claims_and_compare_text_from_data_is_text():
    from harness.reports import claims, compare, html

    row = {name: HOSTILE for name in claims.COLUMNS.values()}
    row[claims.COLUMNS["claim"]] = "C1"
    text = claims.markdown(pd.DataFrame([row]), HOSTILE, [HOSTILE], "none left out")
    assert _live(html.page(text, "claims")) == []
    empty = pd.DataFrame(columns=["workload", "method", "variant", "batch_size", "differences"])
    ratios = pd.DataFrame(columns=["device", "workload", "batch_size", "versus", "quantity", "ratio", "low",
                                   "high", "rounds", "interleaved", "note", "source"])
    text = compare._markdown(empty, [HOSTILE, "b"], ratios, [HOSTILE])
    assert _live(html.page(text, "compare")) == []


def test_every_heading_of_a_page_has_an_address(tmp_path):
    """claims.html#c2 opens at C2's section: each heading's id is its words before a colon, made unique."""
    from harness.reports.html import write_html

    md = tmp_path / "claims.md"
    md.write_text("# Claims of the paper vs cpu\n\n## C2: holds\n\ntext\n\n## C2: again\n\n"
                  "## How claims are judged\n")
    page = write_html(md).read_text()
    assert '<h2 id="c2">C2: holds</h2>' in page and '<h2 id="c2-2">' in page
    assert '<h1 id="claims-of-the-paper-vs-cpu">' in page and '<h2 id="how-claims-are-judged">' in page


FIGURE_HOSTILE = "[x](http://e.invalid) ![i](http://e.invalid/a.png)\n# H <script> $\\frac{$"


def _block_markup(html: str) -> list[str]:
    """Live links, images, tags and headings of a notes page beyond its one title heading."""
    body = html.split("<body>", 1)[1]
    return re.findall(r"<(?:a |img|script|h[2-6])", body) + re.findall(r"<h1", body)[1:]


def test_figure_notes_from_data_are_text(tmp_path):
    """Every figure's notes (``<fig>.md`` / ``.html``) hold the rows' device name and torch version: a
    Markdown link, image, heading or tag in them stays text."""
    from harness.reports import figures
    from tests.harness.reports.test_reports import make_folder, run_row

    rows = [run_row("transformer", m, b, time_s=t) for m, b, t in
            (("dense", 1, 30), ("comera", 1, 10), ("dense", 32, 90), ("comera", 32, 30))]
    rows += [run_row("dlrm", "dense", 256, time_s=1, nce=0.9), run_row("dlrm", "comera", 256, time_s=2)]
    for row in rows:
        row.update(device_name=FIGURE_HOSTILE, torch_version=FIGURE_HOSTILE, hostname=FIGURE_HOSTILE)
    folder = make_folder(tmp_path / FIGURE_HOSTILE.replace("/", "_").replace("\n", "_"), rows)
    out = tmp_path / "figs"
    assert figures.main(["--results", str(folder), "--out", str(out)]) == 0
    pages = sorted(out.glob("*.html"))
    assert pages and any("e.invalid" in page.read_text() for page in pages)
    assert all(page.with_suffix(".png").stat().st_size > 0 for page in pages)  # "$" opened no math
    for page in pages:
        assert _block_markup(page.read_text()) == [], page.name
        md = page.with_suffix(".md").read_text()
        assert [line for line in md.splitlines() if line.startswith("#")] == [md.splitlines()[0]], page.name


def test_a_notes_line_starting_with_block_markup_is_text(tmp_path):
    """Text from data that opens a notes paragraph (a device label) cannot open a heading, quote or list."""
    from harness.reports import drawing

    for start in ("# H", "> q", "- l", "1. n", "    code"):
        fig, _ = drawing.panels(1)
        notes = drawing.notes(model="m", settings="s", methods="x", measured="y", more=f"{start} notes")
        drawing.finish(fig, "T", f"{start} footer", tmp_path, "n", notes)
        body = (tmp_path / "n.html").read_text().split("<body>", 1)[1]
        assert re.findall(r"<(?:h2|h1|blockquote|ul|ol|pre)", body) == ["<h1"], start
