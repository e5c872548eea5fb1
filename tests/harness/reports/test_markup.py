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


def test_every_heading_of_a_page_has_an_address(tmp_path):
    """claims.html#c2 opens at C2's section: each heading's id is its words before a colon, made unique."""
    from harness.reports.html import write_html

    md = tmp_path / "claims.md"
    md.write_text("# Claims of the paper vs cpu\n\n## C2: holds\n\ntext\n\n## C2: again\n\n"
                  "## How claims are judged\n")
    page = write_html(md).read_text()
    assert '<h2 id="c2">C2: holds</h2>' in page and '<h2 id="c2-2">' in page
    assert '<h1 id="claims-of-the-paper-vs-cpu">' in page and '<h2 id="how-claims-are-judged">' in page
