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
    assert [d.strip() for d in text_corpus.read_documents(file)] == ["first paragraph\nstill first",
                                                                     "second one", "third"]


def test_a_wikitext_folder_gives_its_train_and_valid_files(tmp_path):
    (tmp_path / "wiki.train.raw").write_text(FIXTURE.read_text())
    docs, evals, files = text_corpus.read_corpus(tmp_path)
    assert len(docs) == 4 and evals is None and files == [tmp_path / "wiki.train.raw"]
    (tmp_path / "wiki.valid.raw").write_text(" = Valid = \n text \n")
    docs, evals, files = text_corpus.read_corpus(tmp_path)
    assert evals == [" = Valid = \n text "] and files == [tmp_path / "wiki.train.raw",
                                                          tmp_path / "wiki.valid.raw"]
    assert text_corpus.read_corpus(FIXTURE) == (text_corpus.read_documents(FIXTURE), None, [FIXTURE])


def test_hugging_face_wikitext_shards_read_as_the_raw_files(tmp_path):
    """One line per row in column text, each with its newline (as the wikitext data set's parquet files)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [line + "\n" for line in FIXTURE.read_text().splitlines()]
    folder = tmp_path / "wikitext-2-raw-v1"
    folder.mkdir()
    pq.write_table(pa.table({"text": lines[:30]}), folder / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"text": lines[30:]}), folder / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"text": [" = Valid = \n", " text \n"]}),
                   folder / "validation-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": [" = Test = \n"]}), folder / "test-00000-of-00001.parquet")
    docs, evals, files = text_corpus.read_corpus(tmp_path)
    assert docs == text_corpus.read_documents(FIXTURE) and evals == [" = Valid = \n text "]
    assert [f.name for f in files] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet",
                                       "validation-00000-of-00001.parquet"]
    pq.write_table(pa.table({"line": ["x"]}), folder / "train-00001-of-00002.parquet")
    with pytest.raises(ValueError, match="train-00001-of-00002.parquet: missing column.s. text"):
        text_corpus.read_corpus(tmp_path)


def test_a_shard_set_with_a_missing_shard_is_an_error_naming_it(tmp_path):
    """train-00000-of-00003 and -00002 without -00001 (a partial download) would be a third less data,
    silently: the error names the missing file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "wikitext"
    folder.mkdir()
    for index in (0, 2):
        shard = folder / f"train-0000{index}-of-00003.parquet"
        pq.write_table(pa.table({"text": [" = Title = \n", " text \n"]}), shard)
    with pytest.raises(ValueError, match=r"the shard set train-\*-of-00003.parquet lacks 1 of its 3 shards: "
                                         r"train-00001-of-00003.parquet"):
        text_corpus.read_corpus(tmp_path)


def test_a_text_column_of_numbers_is_an_error_naming_the_file_and_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shard = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), shard)
    with pytest.raises(ValueError, match=f"{shard}: column 'text' holds int64, not text"):
        text_corpus.read_corpus(tmp_path)


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
        text_corpus.read_corpus(tmp_path / "nope.raw")
    assert str(err.value) == f"text corpus not found: {tmp_path / 'nope.raw'}"
    with pytest.raises(FileNotFoundError) as err:
        text_corpus.read_corpus(tmp_path)
    assert str(err.value) == (f"text corpus folder {tmp_path} has neither wiki.train.raw nor Hugging Face "
                              "train shards (.arrow / .parquet)")
