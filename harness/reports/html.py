"""HTML pages of the Markdown outputs (tables, claims.md, compare.md), so that Snakemake's report shows
them as tables instead of offering a text download.

``write_html(md_path)`` writes ``<name>.html`` next to ``<name>.md``: CommonMark with GitHub-style tables
(markdown-it-py), in a page with a small style sheet.
"""
from __future__ import annotations

import html
from pathlib import Path

from markdown_it import MarkdownIt

STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1.5em; max-width: 110em; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""

_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def page(markdown: str, title: str) -> str:
    """A standalone HTML page of ``markdown`` (raw HTML in it is escaped, not rendered)."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n{_MARKDOWN.render(markdown)}</body></html>\n")


def write_html(md_path: str | Path) -> Path:
    """``<name>.html`` next to the Markdown file ``md_path``; its title is the file's first heading."""
    md_path = Path(md_path)
    text = md_path.read_text()
    first = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), md_path.stem)
    out = md_path.with_suffix(".html")
    out.write_text(page(text, first))
    return out
