from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.data import mnli
from harness.data.text_tokenizer import (CLS_ID, PAD_ID, SEP_ID, encode_pairs, load_tokenizer_file,
                                         train_wordpiece)

FIXTURE = Path(__file__).parents[3] / "harness" / "data" / "fixtures" / "mnli"


def test_glue_fixture_loads_both_splits():
    train = mnli.load_split(FIXTURE, "train")
    dev = mnli.load_split(FIXTURE, "validation_matched")
    assert len(train.labels) == 36 and len(dev.labels) == 12
    assert set(train.labels) == {0, 1, 2}
    assert train.premises[0].endswith("in the morning.") and train.files == [FIXTURE / "train.tsv"]


def _hf_table(n=6):
    return pa.table({"premise": [f"p {i}" for i in range(n)], "hypothesis": [f"h {i}" for i in range(n)],
                     "label": [i % 3 for i in range(n - 1)] + [-1], "idx": list(range(n))})


@pytest.mark.parametrize("fmt", ["parquet", "arrow_stream", "arrow_file"])
def test_hugging_face_files(tmp_path, fmt):
    folder = tmp_path / "glue" / "mnli" / "0.0.0" / "abc"
    folder.mkdir(parents=True)
    table = _hf_table()
    for split in ("train", "validation_matched", "validation_mismatched"):
        if fmt == "parquet":
            pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")
        else:
            path = folder / f"glue-{split}.arrow"
            writer_cls = pa.ipc.new_stream if fmt == "arrow_stream" else pa.ipc.new_file
            with pa.OSFile(str(path), "wb") as sink, writer_cls(sink, table.schema) as writer:
                writer.write_table(table)
    with pytest.warns(UserWarning, match=r"6 rows read, 1 dropped \(label -1: 1\)"):
        split = mnli.load_split(tmp_path, "validation_matched")
    assert split.labels == [0, 1, 2, 0, 1]  # the unlabelled row (-1) is skipped, and counted
    assert split.rows_read == 6 and split.dropped == {"-1": 1}
    assert len(split.files) == 1 and "validation_matched" in split.files[0].name


def test_missing_column_is_named(tmp_path):
    lines = (FIXTURE / "train.tsv").read_text().splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(line.replace("gold_label", "label") for line in lines)
                                        + "\n")
    with pytest.raises(ValueError, match=r"train.tsv: missing column\(s\) gold_label"):
        mnli.load_split(tmp_path, "train")
    pq.write_table(_hf_table().drop_columns(["hypothesis"]), tmp_path / "validation_matched.parquet")
    with pytest.raises(ValueError, match=r"validation_matched.parquet: missing column\(s\) hypothesis"):
        mnli.load_split(tmp_path, "validation_matched")


def test_bad_label_and_missing_files_are_named(tmp_path):
    lines = (FIXTURE / "train.tsv").read_text().splitlines()
    lines[3] = lines[3].rsplit("\t", 1)[0] + "\tmaybe"
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"train.tsv:4: gold_label 'maybe'"):
        mnli.load_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="dev_matched.tsv"):
        mnli.load_split(tmp_path, "validation_matched")
    with pytest.raises(FileNotFoundError, match="not found"):
        mnli.load_split(tmp_path / "nowhere", "train")


def test_wordpiece_pair_encoding():
    train = mnli.load_split(FIXTURE, "train")
    tok = train_wordpiece(train.premises + train.hypotheses, vocab_size=200)
    assert tok.get_vocab_size() <= 200 and tok.token_to_id("[PAD]") == PAD_ID
    enc = encode_pairs(tok, train.premises[:4], train.hypotheses[:4], seq_len=24)
    ids, seg, mask = enc["input_ids"], enc["segment_ids"], enc["attention_mask"]
    assert ids.shape == (4, 24) and (ids[:, 0] == CLS_ID).all()
    for row, s, m in zip(ids.tolist(), seg.tolist(), mask.tolist()):
        n = sum(m)
        assert row[n:] == [PAD_ID] * (24 - n) and row[n - 1] == SEP_ID and row.count(SEP_ID) == 2
        first_sep = row.index(SEP_ID)
        assert s[:first_sep + 1] == [0] * (first_sep + 1) and s[first_sep + 1:n] == [1] * (n - first_sep - 1)
    short = encode_pairs(tok, train.premises[:2], train.hypotheses[:2], seq_len=8)  # truncated, still paired
    assert short["attention_mask"].all() and (short["input_ids"] == SEP_ID).sum(1).eq(2).all()


def test_user_tokenizer_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found: .*none.json"):
        load_tokenizer_file(tmp_path / "none.json")
    tok = train_wordpiece(["a b c", "b c d"], vocab_size=50)
    tok.save(str(tmp_path / "tok.json"))
    assert load_tokenizer_file(tmp_path / "tok.json").get_vocab() == tok.get_vocab()


def test_whole_glue_cache_prefers_the_mnli_folder(tmp_path):
    mnli_dir = tmp_path / "glue" / "mnli" / "0.0.0" / "a"
    cola_dir = tmp_path / "glue" / "cola" / "0.0.0" / "b"
    for folder in (mnli_dir, cola_dir):
        folder.mkdir(parents=True)
    pq.write_table(_hf_table(), mnli_dir / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"sentence": ["x"], "label": [1]}), cola_dir / "train-00000-of-00001.parquet")
    with pytest.warns(UserWarning, match="1 dropped"):
        split = mnli.load_split(tmp_path, "train")
    assert split.files == [mnli_dir / "train-00000-of-00001.parquet"] and len(split.labels) == 5


def _fixture_lines(split="train"):
    return (FIXTURE / mnli.SPLITS[split]).read_text().splitlines()


def _with_gold(line, gold):
    return line.rsplit("\t", 1)[0] + "\t" + gold


def test_undecodable_tsv_is_named_with_its_line(tmp_path):
    raw = (FIXTURE / "train.tsv").read_bytes().splitlines(keepends=True)
    raw[5] = raw[5][:12] + b"\xff\xfe" + raw[5][12:]
    (tmp_path / "train.tsv").write_bytes(b"".join(raw))
    with pytest.raises(ValueError, match=r"train.tsv:6: not valid UTF-8 \(invalid start byte at byte 12\)"):
        mnli.load_split(tmp_path, "train")
    raw[5] = raw[5].replace(b"\xff\xfe", b"\r")  # a line break inside a line: csv's error, located
    (tmp_path / "train.tsv").write_bytes(b"".join(raw))
    with pytest.raises(ValueError, match=r"train.tsv:6: new-line character seen in unquoted field"):
        mnli.load_split(tmp_path, "train")


@pytest.mark.parametrize("gold, message", [
    (None, r"MNLI split 'train' \(.*train.tsv\) has no labelled row: 0 rows read, 0 dropped"),
    ("-", r"MNLI split 'train' \(.*train.tsv\) has no labelled row: 36 rows read, 36 dropped "
          r"\(label '-': 36\)"),
])
def test_an_empty_split_is_a_clear_error(tmp_path, gold, message):
    """A header-only file, or one whose rows are all unlabelled, used to end in ZeroDivisionError (the
    latter only after the whole training)."""
    lines = _fixture_lines()
    lines = lines[:1] if gold is None else lines[:1] + [_with_gold(line, gold) for line in lines[1:]]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        mnli.load_split(tmp_path, "train")


def test_unlabelled_tsv_rows_are_counted_and_warned(tmp_path):
    lines = _fixture_lines("validation_matched")
    lines[2], lines[5] = _with_gold(lines[2], "-"), _with_gold(lines[5], "-")
    (tmp_path / "dev_matched.tsv").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"dev_matched.tsv\): 12 rows read, 2 dropped \(label '-': 2\)"):
        split = mnli.load_split(tmp_path, "validation_matched")
    assert len(split.labels) == 10 and split.rows_read == 12 and split.dropped == {"'-'": 2}


def test_hugging_face_rows_without_a_valid_label_fail_above_half(tmp_path):
    table = pa.table({"premise": list("abcdef"), "hypothesis": list("abcdef"),
                      "label": [0, 1, 7, -1, -1, None]})
    pq.write_table(table, tmp_path / "train.parquet")
    with pytest.raises(ValueError, match=r"more than 50% of its rows dropped: 6 rows read, 4 dropped "
                                         r"\(label 7: 1, label -1: 2, label None: 1\)"):
        mnli.load_split(tmp_path, "train")
    pq.write_table(table.slice(0, 3), tmp_path / "train.parquet")
    with pytest.warns(UserWarning, match=r"train.parquet\): 3 rows read, 1 dropped \(label 7: 1\)"):
        assert mnli.load_split(tmp_path, "train").labels == [0, 1]


def test_a_premise_column_of_numbers_is_an_error_naming_the_file_and_column(tmp_path):
    shard = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(_hf_table().set_column(0, "premise", pa.array(range(6))), shard)
    with pytest.raises(ValueError, match=f"{shard}: column 'premise' holds int64, not text"):
        mnli.load_split(tmp_path, "train")
