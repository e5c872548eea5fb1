"""Plain text in WikiText's raw layout: articles, the folder layout, and errors that name the file."""
from pathlib import Path

import pytest

from harness.data import text_corpus

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_wiki.raw"


def test_articles_start_at_title_lines_not_section_headings():
    docs = text_corpus.read_documents(FIXTURE)
    assert [d.split("\n")[0] for d in docs] == [" = Harbor Lighthouse = ", " = River Mill = ",
                                                " = Village School = ", " = Mountain Road = "]
    assert " = = Keepers = = " in docs[0]
    assert len(text_corpus.read_documents(FIXTURE, max_documents=2)) == 2


def test_text_without_titles_is_split_into_paragraphs(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("first paragraph\nstill first\n\nsecond one\n\n\nthird\n")
    assert [d.strip() for d in text_corpus.read_documents(file)] == ["first paragraph\nstill first", "second one",
                                                                     "third"]


def test_a_wikitext_folder_gives_its_train_and_valid_files(tmp_path):
    (tmp_path / "wiki.train.raw").write_text(FIXTURE.read_text())
    assert text_corpus.text_files(tmp_path) == (tmp_path / "wiki.train.raw", None)
    (tmp_path / "wiki.valid.raw").write_text(" = Valid = \n text \n")
    assert text_corpus.text_files(tmp_path) == (tmp_path / "wiki.train.raw", tmp_path / "wiki.valid.raw")
    assert text_corpus.text_files(FIXTURE) == (FIXTURE, None)


@pytest.mark.parametrize("content, message", [
    (b"", "no text"), (b" \n\n \n", "no text"),
    (b" = Title = \n caf\xe9 \n", "not valid UTF-8 at line 2 (invalid continuation byte at byte 16)"),
])
def test_bad_text_is_named(tmp_path, content, message):
    file = tmp_path / "wiki.train.raw"
    file.write_bytes(content)
    with pytest.raises(ValueError) as err:
        text_corpus.read_documents(file)
    assert str(err.value).startswith(f"{file}: ") and message in str(err.value)


def test_missing_text_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        text_corpus.text_files(tmp_path / "nope.raw")
    assert str(err.value) == f"text corpus not found: {tmp_path / 'nope.raw'}"
    with pytest.raises(FileNotFoundError) as err:
        text_corpus.text_files(tmp_path)
    assert str(err.value) == f"text corpus folder {tmp_path} has no wiki.train.raw"
