import json
import math
from pathlib import Path

import pytest
import torch

from harness.data.masking import IGNORE_INDEX
from harness.data.text_tokenizer import CLS_ID, SEP_ID
from harness.workloads import build_workload, check_params, mlm

WIKI = Path(__file__).parents[1] / "data" / "fixtures" / "tiny_wiki.raw"

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("csn")
    docs = [f"def add_{i}(a, b):\n    \"\"\"Adds {i}.\"\"\"\n    return a + b + {i}\n\n"
            f"class Thing{i}:\n    def run(self, x):\n        for k in range(x):\n"
            f"            print(k * {i})\n"
            for i in range(60)]
    (folder / "python_train_0.jsonl").write_text("".join(json.dumps({"code": d}) + "\n" for d in docs))
    return folder


@pytest.fixture(scope="module")
def tiny(corpus, tmp_path_factory):
    params = {"size": "tiny", "data": "jsonl", "data_path": str(corpus), "vocab_size": 300,
              "cache_dir": str(tmp_path_factory.mktemp("cache")), "seq_len": 32}
    return build_workload("mlm", params, batch_size=8, seed=0, device="cpu")


def test_paper_model_has_codebert_large_shapes():
    params = check_params("mlm", {"size": "paper"})
    with torch.device("meta"):
        model = mlm.build_model(params)
    assert sum(p.numel() for p in model.parameters()) == 355_412_057  # RoBERTa-large + tied LM head
    assert len(model.encoder.blocks) == 24 and model.encoder.embeddings.word.weight.shape == (50265, 1024)
    spec = mlm.tt_spec(params)
    assert spec["encoder.blocks.23.ffn_in"]["in_shape"] == [16, 8, 8]
    assert spec["encoder.blocks.23.ffn_in"]["out_shape"] == [16, 16, 16]
    assert "encoder.embeddings.word" not in spec  # the rebuttal: embedding and output layers dense
    assert mlm.tt_spec({**params, "tensorize_embedding": True})["encoder.embeddings.word"]["row_shape"] == \
        [15, 15, 15, 15]


def test_paper_preset_compresses_as_the_rebuttal_says():
    """CodeBERT-large with the encoder's linear layers at rank 99: 4.22x overall (rebuttal 4.25x,
    camera-ready abstract 4.23x), 9.77x on the tensorized layers (rebuttal 9.77x)."""
    from comera.convert import tensorize

    params = check_params("mlm", {"size": "paper"})
    with torch.device("meta"):
        model = mlm.build_model(params)
    report = tensorize(model, mlm.tt_spec(params))
    assert round(report.compression_layers, 2) == 9.77
    assert round(report.compression_total, 2) == 4.22


def test_tiny_builds_trains_one_batch_and_evaluates(tiny):
    batch = next(iter(tiny.train_batches(0)))
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (8, 32)
    assert (ids[:, 0] == CLS_ID).all() and (ids[:, -1] == SEP_ID).all()
    assert (labels != IGNORE_INDEX).any() and (labels[:, [0, -1]] == IGNORE_INDEX).all()
    loss = tiny.loss(tiny.model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert tiny.model.encoder.embeddings.word.weight.grad is not None  # tied decoder and input embedding
    result = tiny.evaluate(tiny.model)
    assert result["metric_name"] == "mlm_loss" == tiny.metric_name
    assert result["metric_value"] > 0 and 0 <= result["masked_accuracy"] <= 1 and result["masked_tokens"] > 0
    assert tiny.info["documents"] == 24 and tiny.info["tokenizer_vocab"] <= 300


def test_masks_are_redrawn_per_epoch_but_eval_is_fixed(tiny):
    a = next(iter(tiny.train_batches(0)))["labels"]
    b = next(iter(tiny.train_batches(1)))["labels"]
    assert not torch.equal(a, b)
    first = [batch["labels"] for batch in tiny.eval_batches()]
    second = [batch["labels"] for batch in tiny.eval_batches()]
    assert all(torch.equal(x, y) for x, y in zip(first, second))


def test_a_few_steps_lower_the_loss(tiny):
    model = tiny.model
    opt = torch.optim.AdamW(model.parameters(), lr=tiny.lr["dense"])
    before = tiny.evaluate(model)["metric_value"]
    for step, batch in enumerate(tiny.train_batches(0)):
        opt.zero_grad()
        tiny.loss(model, batch).backward()
        opt.step()
        if step == 40:
            break
    assert tiny.evaluate(model)["metric_value"] < before - 0.1


@pytest.mark.parametrize("init", ["official", "default"])
def test_tied_ttm_embedding_starts_at_the_dense_loss(tiny, init):
    """The decoder multiplies by the TTM table, so its std sets the logits' scale: CoMERA's model must
    start where the dense one does, near ln(vocab) (the official scheme's table std 1 gave 42 vs 8.3)."""
    from comera.convert import tensorize

    params = check_params("mlm", {"size": "tiny", "vocab_size": 300})
    spec = {name: {**entry, "init": init} for name, entry in mlm.tt_spec(params).items()}
    torch.manual_seed(0)
    model = mlm.build_model(params)
    dense_loss = tiny.evaluate(model)["metric_value"]
    tensorize(model, spec)
    assert tiny.evaluate(model)["metric_value"] == pytest.approx(dense_loss, abs=0.5)
    assert abs(dense_loss - math.log(params["vocab_size"])) < 0.5


def test_default_corpus_is_the_standard_library(tmp_path):
    work = build_workload("mlm", {"size": "tiny", "max_documents": 3, "cache_dir": str(tmp_path)},
                          batch_size=4, seed=0, device="cpu")
    assert work.info["data"] == "stdlib" and work.info["files"] == 3 and work.info["train_blocks"] > 4
    assert list((tmp_path / "mlm").glob("bpe-*.json"))


def test_bert_large_preset_has_bert_large_shapes_and_c8s_tt_shapes():
    """BERT-large (C9): 24 encoders, hidden 1024, 16 heads, FFN 4096, 512 positions, vocabulary 30522; the
    encoder linears tensorized as CodeBERT-large's (C8), embedding and output dense."""
    from comera.convert import tensorize

    params = check_params("mlm", {"size": "bert-large"})
    with torch.device("meta"):
        model = mlm.build_model(params)
    assert sum(p.numel() for p in model.parameters()) == 335_173_434
    assert model.encoder.embeddings.word.weight.shape == (30522, 1024) and len(model.encoder.blocks) == 24
    assert model.encoder.embeddings.position.weight.shape[0] == 512
    spec = mlm.tt_spec(params)
    assert spec == mlm.tt_spec(check_params("mlm", {"size": "paper"}))  # C8's TT shapes, no embedding
    report = tensorize(model, spec)
    assert round(report.compression_layers, 2) == 9.77 and round(report.compression_total, 2) == 5.24


def text_params(path, cache, **extra):
    return {"size": "tiny", "data": "text", "data_path": str(path), "vocab_size": 300, "seq_len": 32,
            "cache_dir": str(cache), **extra}


def test_text_data_uses_a_wordpiece_and_the_folders_valid_file(tmp_path):
    folder = tmp_path / "wikitext"
    folder.mkdir()
    (folder / "wiki.train.raw").write_text(WIKI.read_text())
    (folder / "wiki.valid.raw").write_text(" = Held Out = \n"
                                           + " the keeper rang the bell at the mill .\n" * 20)
    work = build_workload("mlm", text_params(folder, tmp_path / "cache"), batch_size=4, seed=0, device="cpu")
    assert work.info["tokenizer"] == "wordpiece" and work.info["tokenizer_vocab"] <= 300
    assert work.info["documents"] == 5 and work.info["files"] == 2 and work.info["train_blocks"] > 10
    assert list((tmp_path / "cache" / "mlm").glob("wordpiece-*.json"))
    batch = next(iter(work.train_batches(0)))
    assert torch.isfinite(work.loss(work.model, batch))


def test_bad_text_input_is_named(tmp_path):
    bad = tmp_path / "wiki.train.raw"
    bad.write_bytes(b" = Title = \n \xff \n")
    with pytest.raises(ValueError, match="wiki.train.raw: not valid UTF-8 at line 2"):
        build_workload("mlm", text_params(bad, tmp_path), batch_size=4, seed=0, device="cpu")
    with pytest.raises(FileNotFoundError, match="text corpus not found: .*missing.raw"):
        build_workload("mlm", text_params(tmp_path / "missing.raw", tmp_path), batch_size=4, seed=0,
                       device="cpu")
    with pytest.raises(ValueError, match="data_path=None is required when data='text'"):
        check_params("mlm", {"size": "tiny", "data": "text"})


@pytest.mark.parametrize("method", ["dense", "comera"])
def test_text_mlm_cell_runs_its_full_schedule_on_the_fixture(tmp_path, method):
    """C9's comparison at size tiny: a quality cell of the text MLM workload run to the end of its
    schedule, with the final training loss C9 compares."""
    from harness.running import run as runner

    spec = {"workload": "mlm", "workload_params": text_params(WIKI, tmp_path), "method": method,
            "batch_size": 4, "seed": 0, "target_ratio": None, "purpose": "quality",
            "budget": {"epochs": 2, "max_steps_per_epoch": None, "warmup_steps": 1},
            "execution": {"device": "cpu", "num_threads": 1}}
    row, _ = runner.run_cell(spec)
    assert row["status"] == "ok", row["error"]
    settings = json.loads(row["settings"])
    assert settings["steps_in_epoch"] == settings["steps_per_epoch"] > 1 and row["epochs"] == 2
    assert settings["workload_info"]["data"] == "text" and row["metric_name"] == "mlm_loss"
    assert math.isfinite(row["final_train_loss"]) and row["final_train_loss"] > 0


def bert_like_tokenizer(path):
    """A WordPiece tokenizer.json whose special tokens are not at 0-4 ([UNK] 3, [CLS] 4, [SEP] 5, [MASK] 6),
    as in BERT's own file ([CLS] 101)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator([WIKI.read_text()],
                            trainers.WordPieceTrainer(vocab_size=280, special_tokens=specials,
                                                      show_progress=False))
    tok.save(str(path))
    return path


def test_a_tokenizer_file_is_used_with_its_own_special_ids(tmp_path):
    file = bert_like_tokenizer(tmp_path / "tokenizer.json")
    work = build_workload("mlm", text_params(WIKI, tmp_path, tokenizer_file=str(file)), batch_size=4, seed=0,
                          device="cpu")
    assert (work.info["special_ids"] == {"pad": 0, "cls": 4, "sep": 5, "mask": 6}
            and work.info["tokenizer"] == "file")
    assert not list((tmp_path / "mlm").glob("wordpiece-*.json"))  # nothing trained
    batch = next(iter(work.train_batches(0)))
    ids, labels = batch["input_ids"], batch["labels"]
    assert (ids[:, 0] == 4).all() and (ids[:, -1] == 5).all() and (ids == 6).any()
    assert (labels[:, [0, -1]] == IGNORE_INDEX).all() and (labels != IGNORE_INDEX).any()
    with pytest.raises(ValueError, match=f"tokenizer file {file}: 280 tokens, more than vocab_size=270"):
        build_workload("mlm", text_params(WIKI, tmp_path, tokenizer_file=str(file), vocab_size=270),
                       batch_size=4, seed=0, device="cpu")
    with pytest.raises(FileNotFoundError, match="tokenizer file not found: .*nope.json"):
        build_workload("mlm", text_params(WIKI, tmp_path, tokenizer_file=str(tmp_path / "nope.json")),
                       batch_size=4, seed=0, device="cpu")
