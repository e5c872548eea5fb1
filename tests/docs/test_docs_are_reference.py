"""docs/*.md are reference pages for the current behaviour, not run logs:

- their total size stays at most :data:`LIMIT` characters;
- every measured-looking number they quote (:func:`measured_numbers`: a decimal with 2+ significant digits
  such as 0.93 or 3.47x, or a time, ratio or share with 2+ significant digits such as 941 s, 12x or 87%;
  in prose, tables, inline code that is only a number, text blocks and the comments of code blocks)
  is generated (the page is made by a script: :data:`GENERATED`), checked against the code (a value that
  tests/docs/test_quoted_defaults.py compares with its default) or dated (a date YYYY-MM-DD on its line or
  in a heading above it; docs/changelog.md dates every section);
- config/*.yaml comments quote no measured number at all (what a setting does, not what a run measured);
- every citation of a page's section (``docs/recipe.md, "The task family"``) in the code, configs, tests
  and docs names a heading (or a bold label opening a paragraph or list item) of that page.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import settings
from tests.docs.test_quoted_defaults import QUOTED

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LIMIT = 150_000
GENERATED = {"settings.md": settings.markdown}  # page -> the function whose output it is
CHANGELOG = "changelog.md"
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
UNITS = r"x(?!\s*[\d(])|ms|s|min|h|µs|us"  # x: a ratio (12x), not a product (4096 x 3072)
UNIT = r"x\b(?!\d)|\s?(?:ms|s|min|h|µs|us)\b|\s?%|\sx\b(?!\s*[\d(])"  # 1.27x (rank 600): a ratio
NUMBER = re.compile(rf"(?<![\w./^=])(\d+(?:\.\d+)?)({UNIT})?(?![\w]|\.\d)")
VERSIONED = re.compile(r"(?:torch|python|cuda|glibc|version|arxiv|numpy|pandas|snakemake|ubuntu|yaml|sm)\s*$",
                       re.I)
EXEMPT_FENCES = {"bash", "python", "yaml", "toml", "sh"}  # commands and code, not output


def significant(number: str) -> int:
    """Significant digits of a decimal as written: 0.93 -> 2, 1.0 -> 2, 941 -> 3, 600 -> 1, 0.5 -> 1."""
    if "." in number:
        return len(number.replace(".", "").lstrip("0"))
    return len(number.lstrip("0").rstrip("0"))


def measured(number: str, unit: str | None) -> bool:
    """Whether a number reads as a measurement: a decimal with 2+ significant digits, or a time, ratio or
    share (a unit of :data:`UNITS`) with 2+ significant digits."""
    if "." in number:
        return significant(number) >= 2
    return bool(unit) and significant(number) >= 2


def _prose(text: str) -> str:
    """The page with what is exempt blanked out (same length, so offsets keep their lines): fenced blocks
    of commands or code, inline code spans holding more than a number (`target_ramp: 0.5`, `--threads 2`;
    a span that is only a number, `0.93`, stays), link targets and URLs."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    def fence(m: re.Match) -> str:
        """A block of commands or code blanked but for its comments (a measured number in a comment still
        counts); another block's content kept, without its backticks."""
        if m.group(1).strip().lower() not in EXEMPT_FENCES:
            return m.group(0).replace("`", " ")
        kept = []
        for line in m.group(0).split("\n"):
            code, hashed, comment = line.partition(" # ")
            kept.append(" " * len(code + hashed) + comment.replace("`", " ") if hashed else " " * len(line))
        return "\n".join(kept)

    def span(m: re.Match) -> str:
        bare = re.fullmatch(rf"\s*\d+(?:\.\d+)?\s?(?:{UNITS}|%)?\s*", m.group(1))
        return m.group(0) if bare else blank(m)

    text = re.sub(r"```([^\n]*)\n.*?```", fence, text, flags=re.S)
    text = re.sub(r"`([^`]+)`", span, text)  # a span may break across lines
    text = re.sub(r"\]\([^)]*\)|https?://\S+", blank, text)
    return text


def _measured(text: str) -> list[tuple[int, int, str]]:
    """(offset, line number, the number with its unit) of each measured-looking number outside what is
    exempt."""
    prose = _prose(text)
    found = []
    for m in NUMBER.finditer(prose):
        number, unit = m.group(1), m.group(2)
        if not measured(number, unit) or VERSIONED.search(prose[max(0, m.start() - 12):m.start()]):
            continue
        found.append((m.start(), prose.count("\n", 0, m.start()) + 1, m.group(0).strip()))
    return found


def measured_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, the number with its unit) of each measured-looking number outside what is exempt."""
    return [(line, number) for _, line, number in _measured(text)]


def checked_offsets(name: str, text: str) -> set[int]:
    """Where the numbers start that tests/docs/test_quoted_defaults.py compares with the code's value."""
    return {m.start(1) for doc, pattern, _ in QUOTED if doc == name for m in re.finditer(pattern, text)}


def dated_lines(text: str) -> set[int]:
    """Lines that carry a date or sit under a heading (any level above them) that carries one."""
    dated, headings = set(), {}  # level -> whether that heading is dated
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        in_fence ^= line.startswith("```")
        heading = re.match(r"(#+)\s", line) if not in_fence else None
        if heading:
            level = len(heading.group(1))
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = bool(DATE.search(line))
        if DATE.search(line) or any(headings.values()):
            dated.add(number)
    return dated


def undated_numbers(name: str, text: str) -> list[tuple[int, str]]:
    """The measured-looking numbers of page ``name`` that are neither checked against the code nor dated."""
    checked, dated = checked_offsets(name, text), dated_lines(text)
    return [(line, number) for offset, line, number in _measured(text)
            if offset not in checked and line not in dated]


PAGES = sorted(p.name for p in DOCS.glob("*.md"))


def test_the_docs_stay_within_their_size():
    sizes = {p.name: len(p.read_text()) for p in DOCS.glob("*.md")}
    total = sum(sizes.values())
    assert total <= LIMIT, f"docs/*.md hold {total} characters (at most {LIMIT}): " \
        f"{sorted(sizes.items(), key=lambda kv: -kv[1])}; move measured runs to docs/{CHANGELOG} or drop them"


@pytest.mark.parametrize("name", PAGES)
def test_every_quoted_number_is_generated_checked_or_dated(name):
    text = (DOCS / name).read_text()
    if name in GENERATED:
        assert text == GENERATED[name](), f"docs/{name} is generated: write it again from its script"
        return
    undated = undated_numbers(name, text)
    assert not undated, f"docs/{name} quotes measured-looking numbers outside a dated section " \
        f"(line, number): " \
        f"{undated}; date the section (YYYY-MM-DD), move them to docs/{CHANGELOG}, or drop them"


def test_the_changelog_dates_every_section():
    text = (DOCS / CHANGELOG).read_text()
    sections = re.findall(r"^##+ .*$", text, re.M)
    assert sections and all(DATE.search(s) for s in sections), [s for s in sections if not DATE.search(s)]
    first = text.find("\n##")
    assert not measured_numbers(text[:first]), "docs/changelog.md: numbers before its first dated section"


@pytest.mark.parametrize("path", sorted((ROOT / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_config_comments_quote_no_measured_number(path):
    lines = path.read_text().splitlines()
    comments = "\n".join(line.split("#", 1)[1] if "#" in line else "" for line in lines)
    found = measured_numbers(comments)
    assert not found, f"{path.relative_to(ROOT)}: comments quote measured-looking numbers (line, number) " \
        f"{found}; say what the setting does, and put measured runs in docs/{CHANGELOG}"


@pytest.mark.parametrize("text, expected", [
    ("accuracy 0.93 after 941 s, 3.47x faster, 87% reached", ["0.93", "941 s", "3.47x", "87%"]),
    ("a range 0.18-0.21, a gap of -0.044", ["0.18", "0.21", "0.044"]),
    ("from 1.27x (rank 600) to 62x (rank 30); 4096 x (3072)", ["1.27x", "62x"]),
    ("a bare `0.93` in code is still a number", ["0.93"]),
    ("rank 30, 16 steps, every 30 s, target 0.5, `target_ramp: 0.25`, torch 2.4, 4096 x 3072", []),
    ("```text\nstep 941 s\n```\n```bash\nsleep 941s\n```", ["941 s"]),
    ("```python\nx = f(0.93)  # accuracy 0.93\n```", ["0.93"]),
])
def test_what_reads_as_measured(text, expected):
    assert [n for _, n in measured_numbers(text)] == expected


def test_a_date_covers_its_section_only():
    text = "# Page\n\n## Run of 2026-12-07\n\n0.93\n\n### detail\n\n941 s\n\n## Now\n\n3.47x\n"
    assert undated_numbers("x.md", text) == [(13, "3.47x")]


SOURCES = [p for pattern in ("*.py", "*.md", "*.yaml", "*.smk", "Snakefile", "*.sh")
           for p in ROOT.rglob(pattern) if not {".venv", ".git", "results", ".snakemake"} & set(p.parts)]
CITATION = re.compile(r"(?:docs/|\]\()([a-z-]+\.md)\)?,?\s+\(?[\"“']([^\"”']{3,80})[\"”']")


def _label(text: str) -> str:
    return re.sub(r"[`*_\\]", "", text).strip().lower()


def citations() -> list[tuple[str, str, str]]:
    """(citing file, page, section) of each citation of a page's section (``docs/<page>.md, "<section>"`` or
    a Markdown link to the page followed by the quoted section), across line breaks."""
    found = []
    for path in SOURCES:
        text = re.sub(r"\s*\n\s*(?:#\s*|//\s*)?", " ", path.read_text(errors="replace"))
        found += [(str(path.relative_to(ROOT)), page, section) for page, section in CITATION.findall(text)]
    return sorted(set(found))


@pytest.mark.parametrize("where, page, section", citations(), ids=lambda v: str(v)[:50])
def test_a_cited_section_exists(where, page, section):
    text = (DOCS / page).read_text() if (DOCS / page).exists() else ""
    names = [_label(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)]
    names += [_label(b) for b in re.findall(r"^(?:[-*] )?\*\*(.+?)\*\*", text, re.M)]
    assert any(n.startswith(_label(section)) for n in names), \
        f"{where} cites docs/{page}, {section!r}: no such heading there"
