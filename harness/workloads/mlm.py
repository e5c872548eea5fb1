"""Masked-language-model pretraining of a BERT-like encoder on source code or plain text (docs/workloads.md).

The transformer's encoder with a RoBERTa LM head tied to the word embedding; metric ``mlm_loss`` (lower is
better), plus ``masked_accuracy``. Head, masking, rates and params: docs/design-notes.md.
"""
from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any, Iterable, Literal

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from harness.data import batching, code_corpus, text_corpus
from harness.data.cache import cache_dir, cached_tensors, fingerprint
from harness.data.masking import IGNORE_INDEX, mask_tokens
from harness.data.text_tokenizer import (SPECIAL_TOKENS, encode_stream, load_or_train, load_tokenizer_file,
                                         special_ids, train_byte_bpe, train_wordpiece)
from harness.workloads.base import Batch, Workload, evaluating, seeded_model
from harness.workloads.params import EncoderParams, Field, require
from harness.workloads.transformer import BERT_INIT_STD, Encoder, encoder_tt_spec, init_bert_weights
from harness.workloads.tt_spec import embedding_shapes, embedding_spec

NAME = "mlm"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=512, d_model=32, num_layers=1, num_heads=2, d_ff=64, max_positions=64, seq_len=64,
                 dropout=0.0, rank=8, embedding_rank=8, max_documents=24, max_train_blocks=1024,
                 max_eval_blocks=128),
    "small": dict(vocab_size=4096, d_model=128, num_layers=2, num_heads=4, d_ff=512, max_positions=128,
                  seq_len=128, dropout=0.1, rank=16, embedding_rank=16, max_documents=300,
                  max_train_blocks=20000, max_eval_blocks=512),
    "paper": dict(vocab_size=50265, d_model=1024, num_layers=24, num_heads=16, d_ff=4096, max_positions=514,
                  seq_len=128, dropout=0.1, rank=99, embedding_rank=32, tensorize_embedding=False,
                  max_documents=None, max_train_blocks=None, max_eval_blocks=None),
    "bert-large": dict(vocab_size=30522, d_model=1024, num_layers=24, num_heads=16, d_ff=4096,
                       max_positions=512,
                       seq_len=128, dropout=0.1, rank=99, embedding_rank=32, tensorize_embedding=False,
                       max_documents=None, max_train_blocks=None, max_eval_blocks=None),
}
#: Presets with the paper's learning rates (the others are CPU sizes).
PAPER_SIZES = ("paper", "bert-large")
#: TTM shapes of the word embedding per (vocab_size, d_model); other sizes are factorized.
EMBEDDING_SHAPES = {(50265, 1024): ([15, 15, 15, 15], [4, 4, 8, 8]), (4096, 128): ([16, 16, 16], [8, 4, 4]),
                    (512, 32): ([8, 8, 8], [4, 4, 2])}



class MLMParams(EncoderParams):
    """The masked language model's parameters; those without a default come from the size preset
    (PRESETS)."""

    max_documents: int | None = Field(gt=0)
    max_train_blocks: int | None = Field(gt=0)
    max_eval_blocks: int | None = Field(gt=0)
    data: Literal["stdlib", "jsonl", "text"] = "stdlib"
    data_path: str | None = None
    cache_dir: str | None = None
    data_seed: int = 0
    eval_every: int = Field(20, ge=2)
    mask_prob: float = Field(0.15, gt=0, lt=1)
    eval_batch_size: int | None = Field(None, gt=0)
    tensorize_embedding: bool = True
    tokenizer_file: str | None = None


PARAMS = MLMParams
LR = {"paper": {"dense": 1e-4, "cores": 1e-4, "other": 5e-5, "gates": 1e-3},
      "small": {"dense": 5e-4, "cores": 5e-4, "other": 5e-4, "gates": 5e-3},
      "tiny": {"dense": 2e-3, "cores": 2e-3, "other": 2e-3, "gates": 5e-3}}


def validate(p: dict[str, Any]) -> None:
    """The relations between params (each param's own bounds: :class:`MLMParams`)."""
    require(p["d_model"] % p["num_heads"] == 0, NAME, "num_heads", p["num_heads"],
            f"must divide d_model={p['d_model']}")
    require(3 <= p["seq_len"] <= p["max_positions"], NAME, "seq_len", p["seq_len"],
            f"must be in [3, max_positions={p['max_positions']}]")
    require(p["vocab_size"] > len(SPECIAL_TOKENS) + 256, NAME, "vocab_size", p["vocab_size"],
            "must exceed the 256 byte tokens plus the special tokens")
    require(p["data"] == "stdlib" or p["data_path"] is not None, NAME, "data_path", p["data_path"],
            f"is required when data={p['data']!r}")


def _table(embedding: nn.Module) -> torch.Tensor:
    """The (num_embeddings, dim) table of a dense or tensorized embedding."""
    return embedding.weight if isinstance(embedding, nn.Embedding) else embedding.dense_weight()


class MaskedLM(nn.Module):
    """Encoder + RoBERTa LM head; forward(input_ids, attention_mask) -> logits (batch, seq, vocab)."""

    def __init__(self, encoder: Encoder, d_model: int, vocab_size: int):
        super().__init__()
        self.encoder = encoder
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm(F.gelu(self.dense(self.encoder(input_ids, None, attention_mask))))
        return F.linear(h, _table(self.encoder.embeddings.word), self.decoder_bias)


def build_model(p: dict[str, Any]) -> MaskedLM:
    encoder = Encoder(vocab_size=p["vocab_size"], d_model=p["d_model"], num_layers=p["num_layers"],
                      num_heads=p["num_heads"], d_ff=p["d_ff"], max_positions=p["max_positions"],
                      num_segments=1, dropout=p["dropout"])
    model = MaskedLM(encoder, p["d_model"], p["vocab_size"])
    init_bert_weights(model)
    return model


def tt_spec(p: dict[str, Any]) -> dict[str, dict]:
    """Every encoder attention/FFN linear as TT; the (tied) word embedding as TTM if tensorize_embedding,
    its table at the dense model's std under every init scheme: the decoder's logits scale with it (the
    official scheme's table std 1 gave an initial loss of 42 against ln(vocab) = 8.3 at size small)."""
    spec = encoder_tt_spec("encoder.", p["num_layers"], p["d_model"], p["d_ff"], p["rank"])
    rows, cols = embedding_shapes(p, EMBEDDING_SHAPES)
    if p["tensorize_embedding"]:
        spec["encoder.embeddings.word"] = {
            **embedding_spec(p["vocab_size"], p["d_model"], p["embedding_rank"], row_shape=rows,
                             col_shape=cols),
            "init_std": BERT_INIT_STD}
    return spec


def _blocks(ids: Iterable[list[int]], seq_len: int, limit: int | None,
            special: dict[str, int]) -> torch.Tensor:
    """Documents joined by [SEP], cut into [CLS] + (seq_len - 2) tokens + [SEP] blocks (remainder dropped;
    documents past ``limit`` blocks are not read). The stream is an int64 array, not a list of Python
    ints: WikiText-103 is about 125M tokens."""
    body = seq_len - 2
    stream = array("q")
    for doc in ids:
        stream.extend(doc)
        stream.append(special["sep"])
        if limit is not None and len(stream) >= limit * body:
            break
    n = len(stream) // body if limit is None else min(limit, len(stream) // body)
    if n == 0:
        raise ValueError(f"workload 'mlm': the corpus has {len(stream)} tokens, "
                         f"fewer than one block of {body}")
    middle = torch.frombuffer(stream, dtype=torch.long)[:n * body].clone().view(n, body)
    return torch.cat([torch.full((n, 1), special["cls"]), middle, torch.full((n, 1), special["sep"])], dim=1)


def documents(p: dict[str, Any]) -> tuple[list[str], list[str], list[Path]]:
    """(training documents, eval documents, files read): the eval split is the text corpus's validation
    file or shards where it has them, else every ``eval_every``-th document (at least the last one)."""
    valid = None
    if p["data"] == "text":
        docs, valid, files = text_corpus.read_corpus(p["data_path"], p["max_documents"])
    elif p["data"] == "stdlib":
        docs, files = code_corpus.read_stdlib(p["max_documents"])
    else:
        docs, files = code_corpus.read_jsonl(p["data_path"], p["max_documents"])
    if valid is not None:
        return docs, valid, files
    held_out = {i for i in range(len(docs)) if i % p["eval_every"] == p["eval_every"] - 1} or {len(docs) - 1}
    train_docs = [d for i, d in enumerate(docs) if i not in held_out]
    if not train_docs:
        source = "the standard library" if p["data"] == "stdlib" else p["data_path"]
        raise ValueError(f"workload 'mlm': {len(docs)} document(s) in {source}, too few for a training and "
                         f"an eval split")
    return train_docs, [d for i, d in enumerate(docs) if i in held_out], files


def tokenizer(p: dict[str, Any], train_docs: list[str], files: list[Path],
              folder: Path) -> tuple[Tokenizer, str, str]:
    """(tokenizer, cache key, kind): the user's ``tokenizer_file`` (e.g. BERT's tokenizer.json; its
    vocabulary must fit vocab_size), else one trained on the training documents and cached in ``folder``:
    a WordPiece for text, a byte-level BPE for code."""
    if p["tokenizer_file"] is not None:
        path = p["tokenizer_file"]
        tok = load_tokenizer_file(path)
        try:
            special_ids(tok)
        except ValueError as exc:
            raise ValueError(f"tokenizer file {path}: {exc}") from exc
        if tok.get_vocab_size() > p["vocab_size"]:
            raise ValueError(f"tokenizer file {path}: {tok.get_vocab_size()} tokens, more than "
                             f"vocab_size={p['vocab_size']}")
        key = fingerprint("file", p["vocab_size"], p["max_documents"], p["eval_every"], files=[*files, path])
        return tok, key, "file"
    if p["data"] == "text":
        kind, prefix, train = "wordpiece", "wordpiece", train_wordpiece
    else:
        kind, prefix, train = "byte-bpe", "bpe", train_byte_bpe
    key = fingerprint(kind, p["vocab_size"], p["max_documents"], p["eval_every"], files=files)
    return load_or_train(folder / f"{prefix}-{key}.json",
                         lambda: train(train_docs, p["vocab_size"])), key, kind


def load_data(p: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    train_docs, eval_docs, files = documents(p)
    folder = cache_dir(p["cache_dir"], "mlm")
    tok, tok_key, kind = tokenizer(p, train_docs, files, folder)
    special = special_ids(tok)
    key = fingerprint(tok_key, p["seq_len"], p["max_train_blocks"], p["max_eval_blocks"], p["data_seed"],
                      p["mask_prob"])

    def build() -> dict[str, torch.Tensor]:
        train_ids = _blocks(encode_stream(tok, train_docs), p["seq_len"], p["max_train_blocks"], special)
        eval_ids = _blocks(encode_stream(tok, eval_docs), p["seq_len"], p["max_eval_blocks"], special)
        masked, labels = _mask(eval_ids, torch.Generator().manual_seed(p["data_seed"]), p, special)
        return {"train_ids": train_ids, "eval_ids": masked, "eval_labels": labels}

    data = cached_tensors(folder / f"blocks-{key}.pt", build, keys=("train_ids", "eval_ids", "eval_labels"))
    train = {"input_ids": data["train_ids"]}
    evals = {"input_ids": data["eval_ids"], "labels": data["eval_labels"]}
    docs = train_docs + eval_docs
    info = {"data": p["data"], "documents": len(docs), "files": len(files),
            "corpus_chars": sum(len(d) for d in docs), "tokenizer": kind,
            "tokenizer_vocab": tok.get_vocab_size(), "special_ids": special}
    return train, evals, info


def _mask(ids: torch.Tensor, gen: torch.Generator, p: dict[str, Any], special: dict[str, int]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks ``ids``; random replacements are drawn above the tokenizer's special ids."""
    return mask_tokens(ids, gen, vocab_size=p["vocab_size"], mask_id=special["mask"],
                       special_ids=(special["pad"], special["cls"], special["sep"]),
                       first_regular_id=max(special.values()) + 1,
                       mask_prob=p["mask_prob"])


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)


def build(p: dict[str, Any], *, batch_size: int, seed: int, device: torch.device) -> Workload:
    train, evals, info = load_data(p)
    model = seeded_model(build_model, p, seed, device)
    eval_bs = p["eval_batch_size"] or max(batch_size, 32)

    def add_masks(batch: Batch, gen: torch.Generator) -> Batch:
        masked, labels = _mask(batch["input_ids"], gen, p, info["special_ids"])
        return {"input_ids": masked, "labels": labels}

    def evaluate(m: nn.Module) -> dict[str, float]:
        total, correct, n = 0.0, 0, 0
        with evaluating(m):
            for batch in batching.eval_batches(evals, eval_bs, device):
                logits = m(batch["input_ids"]).flatten(0, 1)
                labels = batch["labels"].flatten()
                total += F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum").item()
                chosen = labels != IGNORE_INDEX
                correct += (logits[chosen].argmax(-1) == labels[chosen]).sum().item()
                n += int(chosen.sum())
        return {"metric_name": "mlm_loss", "metric_value": total / n, "masked_accuracy": correct / n,
                "masked_tokens": n}

    n_train = batching.num_rows(train)
    info.update(train_blocks=n_train, eval_blocks=batching.num_rows(evals), eval_batch_size=eval_bs)
    return Workload(
        name=NAME, model=model, tt_spec=tt_spec(p),
        train_batches=lambda epoch: batching.train_batches(train, batch_size, seed, epoch, device, add_masks),
        eval_batches=lambda: batching.eval_batches(evals, eval_bs, device),
        loss=loss, evaluate=evaluate, steps_per_epoch=batching.train_steps(n_train, batch_size),
        metric_name="mlm_loss", seq_len=p["seq_len"],
        lr=dict(LR["paper" if p["size"] in PAPER_SIZES else p["size"]]),
        info=info)
