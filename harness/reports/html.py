"""HTML pages of the Markdown outputs (tables, claims.md, compare.md), for Snakemake's report.

:func:`write_html` writes ``<name>.html`` beside ``<name>.md``; every string from the data passes through
:func:`cell_text`, so no value in a row becomes a live link, an image or HTML in a report.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
from markdown_it import MarkdownIt

STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1.5em; max-width: 110em; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""

_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


_MARKUP = re.compile(r"[\\`*~\[\]<!|&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
"""What Markdown reads as markup inside a line: links and images, raw HTML and autolinks (both open with
``<``; ``>`` is left as it is, for readable ``(> 25%)``: it only quotes a block, at a line's start), entities,
code, emphasis (an underscore inside a word is plain text already), the cell separator and the escape."""


_BLOCK_START = re.compile(r"^(#{1,6}|[>+=-]|\d{1,9}(?=[.)]))")
"""What may open a block at a line's start: a heading, a quote, a list item (``-``, ``+``, ``1.``), a
setext underline (``*`` is escaped everywhere already)."""


def cell_text(text: str) -> str:
    r"""``text`` as literal inline text in Markdown (a table cell, a list item, a line of prose or a whole
    paragraph): markup backslash-escaped, line breaks as spaces, leading spaces dropped and a block marker
    at its start escaped, so it opens no link, image, tag, heading, quote, list or code block. The one
    escaping of every string from data that a Markdown output (tables, claims, compare, figure notes) holds.

    Example::

        >>> print(cell_text("[x](http://e.invalid)\n# H"))
        \[x\](http://e.invalid) # H
        >>> print(cell_text("# H"), cell_text("1. n"))
        \# H 1\. n
    """
    text = _MARKUP.sub(lambda m: "\\" + m.group(0), " ".join(text.splitlines()).lstrip())
    marker = _BLOCK_START.match(text)
    if marker is None:
        return text
    if marker.group(0)[0].isdigit():
        return f"{marker.group(0)}\\{text[marker.end():]}"
    return f"\\{text}"


def markdown_table(df: pd.DataFrame, floatfmt: str) -> str:
    """``df`` as a Markdown table: text cells as :func:`cell_text`, a missing value as an empty cell."""
    cells = df.astype(object).where(df.notna(), None)
    for col in cells:  # element by element: a column of whole counts and gaps must not turn float
        cells[col] = pd.Series([cell_text(v) if isinstance(v, str) else v for v in cells[col]],
                               index=cells.index, dtype=object)
    return cells.to_markdown(index=False, floatfmt=floatfmt, missingval="")


def anchor(heading: str) -> str:
    """A heading's id: its words before a colon, lower case, joined by "-" ("## C2: holds" -> "c2")."""
    return re.sub(r"[^a-z0-9]+", "-", heading.split(":")[0].lower()).strip("-") or "section"


def page(markdown: str, title: str) -> str:
    """A standalone HTML page of ``markdown`` (raw HTML in it is escaped, not rendered); every heading has
    an id (:func:`anchor`, made unique with -2, -3 ...), so ``claims.html#c2`` opens at its section."""
    tokens = _MARKDOWN.parse(markdown)
    seen: dict[str, int] = {}
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type == "heading_open":
            base = anchor(inline.content)
            seen[base] = seen.get(base, 0) + 1
            opening.attrSet("id", base if seen[base] == 1 else f"{base}-{seen[base]}")
    body = _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n{body}</body></html>\n")


def write_html(md_path: str | Path) -> Path:
    """``<name>.html`` next to the Markdown file ``md_path``; its title is the file's first heading."""
    md_path = Path(md_path)
    text = md_path.read_text()
    first = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")),
                 md_path.stem)
    out = md_path.with_suffix(".html")
    out.write_text(page(text, first))
    return out
