"""The paper's six-encoder transformer on MNLI (docs/workloads.md), and the encoder the MLM workload reuses.

Sizes "tiny", "small" (default) and "paper"; :func:`official_init`, :func:`sized_candidates` (the
size-matched dense model's shapes). Why the paper size is built so, the rates and the params:
docs/design-notes.md.
"""
from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from comera import feed_forward
from harness.data import batching, mnli, nli_synthetic
from harness.data.cache import cache_dir, cached_tensors, configured_cache_dir, fingerprint
from harness.data.text_tokenizer import (UNK_ID, encode_pairs, load_or_train, load_tokenizer_file,
                                         train_wordpiece)
from harness.workloads.base import Batch, Holdout, SizedModel, Workload, evaluating, seeded_model
from harness.workloads.dropout import Dropout, attention, replaces_torch
from harness.workloads.params import EncoderParams, Field, require
from harness.workloads.tt_spec import embedding_shapes, embedding_spec, linear_spec

NAME = "transformer"
NUM_CLASSES = 3

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=256, d_model=32, num_layers=1, num_heads=2, d_ff=64, max_positions=32,
                 seq_len=32, dropout=0.0, rank=8, embedding_rank=8, premise_len=10, hypothesis_len=4,
                 train_samples=2048, eval_samples=512),
    "small": dict(vocab_size=1024, d_model=128, num_layers=2, num_heads=4, d_ff=512, max_positions=64,
                  seq_len=16, dropout=0.1, rank=16, embedding_rank=32, premise_len=5, hypothesis_len=4,
                  num_words=24, num_topics=2, train_samples=20000, eval_samples=2000),
    "paper": dict(vocab_size=30522, d_model=768, num_layers=6, num_heads=12, d_ff=3072, max_positions=512,
                  seq_len=128, dropout=0.1, rank=30, embedding_rank=32, premise_len=40, hypothesis_len=6,
                  train_samples=392702, eval_samples=9815),
}
#: TTM shapes of the word embedding per (vocab_size, d_model): the paper's, and the CPU presets'.
EMBEDDING_SHAPES = {(30522, 768): ([16, 20, 10, 10], [4, 4, 8, 6]), (1024, 128): ([16, 8, 8], [8, 4, 4]),
                    (256, 32): ([8, 8, 4], [4, 4, 2])}



class TransformerParams(EncoderParams):
    """The transformer's parameters; those without a default come from the size preset (PRESETS)."""

    premise_len: int
    hypothesis_len: int
    train_samples: int | None = Field(gt=0)
    eval_samples: int | None = Field(gt=0)
    data: Literal["synthetic", "mnli"] = "synthetic"
    data_dir: str | None = None
    tokenizer: str | None = None
    cache_dir: str | None = None
    data_seed: int = 0
    num_words: int | None = Field(None, gt=0)
    eval_batch_size: int | None = Field(None, gt=0)
    tensorize_embedding: bool = True
    task: Literal[nli_synthetic.TASKS] = "topic"
    num_topics: int = Field(4, ge=2)
    word_topics: Literal["modular", "random"] = "random"
    label_noise: float = Field(0.0, ge=0, le=1)


PARAMS = TransformerParams
LR = {"paper": {"dense": 1e-4, "cores": 1e-4, "other": 5e-5, "gates": 1e-3},
      "cpu": {"dense": 3e-4, "cores": 3e-4, "other": 3e-4, "gates": 3e-3, "embedding_cores": 3e-3}}


def validate(p: dict[str, Any]) -> None:
    """The relations between params (each param's own bounds: :class:`TransformerParams`)."""
    require(p["d_model"] % p["num_heads"] == 0, NAME, "num_heads", p["num_heads"],
            f"must divide d_model={p['d_model']}")
    require(p["seq_len"] <= p["max_positions"], NAME, "seq_len", p["seq_len"],
            f"exceeds max_positions={p['max_positions']}")
    if p["data"] == "synthetic":  # the generator's own rule, checked before any cell runs
        needed = p["premise_len"] + p["hypothesis_len"] + 4
        require(needed <= p["seq_len"], NAME, "seq_len", p["seq_len"],
                f"is too short for premise_len + hypothesis_len + 4 = {needed} (synthetic data)")
    require(p["data"] != "mnli" or p["data_dir"] is not None, NAME, "data_dir", p["data_dir"],
            "is required when data='mnli' (a folder with train.tsv/dev_matched.tsv or Hugging Face files)")


# ---------------------------------------------------------------- the encoder (shared with mlm)

class Embeddings(nn.Module):
    """Word + learned position (+ segment) embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, num_segments: int, dropout: float):
        super().__init__()
        self.word = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.segment = nn.Embedding(num_segments, d_model) if num_segments > 0 else None
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)
        if self.segment is not None:
            x = x + self.segment(segment_ids if segment_ids is not None else torch.zeros_like(input_ids))
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q/k/v/o nn.Linear layers (so each can be tensorized).

    Eager training on CPU with dropout uses :func:`harness.workloads.dropout.attention` (SDPA would fall
    back to its math path with ``bernoulli_`` masks); otherwise ``F.scaled_dot_product_attention``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, s, d = x.shape
        heads = [t.view(b, s, self.num_heads, d // self.num_heads).transpose(1, 2)
                 for t in (self.q(x), self.k(x), self.v(x))]
        p = self.dropout if self.training else 0.0
        if replaces_torch(x, p, self.training):
            out = attention(*heads, attn_mask, p)
        else:
            out = F.scaled_dot_product_attention(*heads, attn_mask=attn_mask, dropout_p=p)
        return self.o(out.transpose(1, 2).reshape(b, s, d))


class EncoderBlock(nn.Module):
    """Post-LN block: x = LN(x + attn(x)); x = LN(x + ffn_out(gelu(ffn_in(x)))). The FFN goes through
    :func:`comera.feed_forward`: once both layers are TTLinear, backward keeps rank-r products only."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.attn = SelfAttention(d_model, num_heads, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn_in = nn.Linear(d_model, d_ff)
        self.ffn_out = nn.Linear(d_ff, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask)))
        return self.norm2(x + self.dropout(feed_forward(self.ffn_in, F.gelu, self.ffn_out, x)))


class Encoder(nn.Module):
    """Embeddings followed by post-LN encoder blocks; returns hidden states (batch, seq, d_model)."""

    def __init__(self, *, vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int,
                 max_positions: int, num_segments: int, dropout: float):
        super().__init__()
        self.embeddings = Embeddings(vocab_size, d_model, max_positions, num_segments, dropout)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, num_heads, d_ff, dropout)
                                    for _ in range(num_layers))

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``attention_mask``: (batch, seq) bool, True for real tokens (keys that may be attended)."""
        mask = attention_mask[:, None, None, :] if attention_mask is not None else None
        x = self.embeddings(input_ids, segment_ids)
        for block in self.blocks:
            x = block(x, mask)
        return x


#: BERT's initialization std of linear and embedding weights.
BERT_INIT_STD = 0.02


def init_bert_weights(module: nn.Module, std: float = BERT_INIT_STD) -> None:
    """BERT initialization: linear and embedding weights N(0, std), biases 0, LayerNorm 1 / 0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def official_init(model: nn.Module) -> None:
    """The official code's init of every module that is not TT / TTM (ziyangjoy/CoMERA
    ``tensor_layers_CoMERA/Transformer_tensor_sublayers.py`` leaves them at PyTorch's defaults):
    embeddings (position, segment, an untensorized word embedding) N(0, 1), nn.Linear (the classifier's
    fc2, any untensorized layer) weight and bias U(-1/sqrt(in), 1/sqrt(in)), LayerNorm 1 / 0. TT layers
    keep their own ``init: official`` (``comera.tt.TTLinear``: bias U(-1/sqrt(out), 1/sqrt(out)))."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            m.reset_parameters()


def encoder_tt_spec(prefix: str, num_layers: int, d_model: int, d_ff: int, rank: int) -> dict[str, dict]:
    """TT specs of every attention and FFN linear layer of an :class:`Encoder` named ``prefix``."""
    spec = {}
    for i in range(num_layers):
        block = f"{prefix}blocks.{i}."
        for name in ("q", "k", "v", "o"):
            spec[f"{block}attn.{name}"] = linear_spec(d_model, d_model, rank)
        spec[f"{block}ffn_in"] = linear_spec(d_model, d_ff, rank)
        spec[f"{block}ffn_out"] = linear_spec(d_ff, d_model, rank)
    return spec


# ---------------------------------------------------------------- the classifier

class NLIClassifier(nn.Module):
    """Encoder, then [CLS] -> tanh(fc1) -> dropout -> fc2 (class logits)."""

    def __init__(self, encoder: Encoder, d_model: int, num_classes: int, dropout: float):
        super().__init__()
        self.encoder = encoder
        self.fc1 = nn.Linear(d_model, d_model)
        self.fc2 = nn.Linear(d_model, num_classes)
        self.dropout = Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        cls = self.encoder(input_ids, segment_ids, attention_mask)[:, 0]
        return self.fc2(self.dropout(torch.tanh(self.fc1(cls))))


def build_model(p: dict[str, Any]) -> NLIClassifier:
    """The dense classifier for checked params ``p`` (on the current default device)."""
    encoder = Encoder(vocab_size=p["vocab_size"], d_model=p["d_model"], num_layers=p["num_layers"],
                      num_heads=p["num_heads"], d_ff=p["d_ff"], max_positions=p["max_positions"],
                      num_segments=2, dropout=p["dropout"])
    model = NLIClassifier(encoder, p["d_model"], NUM_CLASSES, p["dropout"])
    init_bert_weights(model)
    return model


def parameter_count(p: dict[str, Any]) -> int:
    """Parameters of the dense classifier for params ``p`` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(t.numel() for t in build_model(p).parameters())


def sized_params(p: dict[str, Any], n: int) -> dict[str, Any]:
    """``p`` with the width whose dense classifier has the parameter count nearest ``n`` (the smaller one
    on a tie): ``d_model`` a multiple of ``num_heads`` up to the given one, ``d_ff`` kept in proportion
    (rounded), every other key (vocabulary, layers, heads, positions) unchanged."""
    ratio = p["d_ff"] / p["d_model"]
    widths = [{**p, "d_model": d, "d_ff": max(1, round(d * ratio))}
              for d in range(p["num_heads"], p["d_model"] + 1, p["num_heads"])]
    low, high = 0, len(widths) - 1  # the first width with at least n parameters (counts grow with it)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if parameter_count(widths[mid]) < n else (low, mid)
    return min(widths[max(low - 1, 0):low + 1], key=lambda q: abs(parameter_count(q) - n))


class TaskVocabulary(nn.Module):
    """A word embedding over only the token ids a task uses: id -> its row (``index``, a buffer, not a
    parameter); ids outside ``ids`` take the row of [UNK] (which must be among them).

    Shape:
        input: any shape of token ids below the full vocabulary size; output: (*input, embedding_dim).
    """

    def __init__(self, ids: list[int], vocab_size: int, embedding: nn.Embedding):
        super().__init__()
        if embedding.num_embeddings != len(ids) or UNK_ID not in ids:
            raise ValueError(f"TaskVocabulary: {len(ids)} ids (with [UNK] {UNK_ID}) for a table of "
                             f"{embedding.num_embeddings} rows")
        index = torch.full((vocab_size,), ids.index(UNK_ID), dtype=torch.long)
        index[torch.tensor(ids)] = torch.arange(len(ids))
        self.register_buffer("index", index.to(embedding.weight.device), persistent=False)
        self.embedding = embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.index[input_ids])


def sized_candidates(p: dict[str, Any], n: int, task_ids: list[int] | None = None) -> list[tuple[str, dict]]:
    """The shapes of the size-matched dense model, each at the parameter count nearest ``n``
    (:func:`sized_params`): "width" (d_model and d_ff narrower), "depth" (half the layers, rounded down,
    at the width that then matches; only with two layers or more) and "task-vocabulary" (a word table over
    ``task_ids`` only, the width then matched; only when given). Returns (shape, params) pairs;
    ``params["task_vocabulary"]`` is the number of ids of the last one."""
    out = [("width", sized_params(p, n))]
    if p["num_layers"] > 1:
        out.append(("depth", sized_params({**p, "num_layers": p["num_layers"] // 2}, n)))
    if task_ids is not None and len(task_ids) < p["vocab_size"]:
        q = sized_params({**p, "vocab_size": len(task_ids)}, n)
        out.append(("task-vocabulary", {**q, "vocab_size": p["vocab_size"],
                                        "task_vocabulary": len(task_ids)}))
    return out


def build_sized(q: dict[str, Any], task_ids: list[int] | None) -> NLIClassifier:
    """The classifier of a :func:`sized_candidates` shape (its word table over ``task_ids`` when the shape
    has ``task_vocabulary``)."""
    if not q.get("task_vocabulary"):
        return build_model(q)
    model = build_model({**q, "vocab_size": len(task_ids)})
    model.encoder.embeddings.word = TaskVocabulary(task_ids, q["vocab_size"], model.encoder.embeddings.word)
    return model


def tt_spec(p: dict[str, Any]) -> dict[str, dict]:
    """Attention q/k/v/o, FFN in/out and fc1 as TT; the word embedding as TTM (if tensorize_embedding)."""
    spec = encoder_tt_spec("encoder.", p["num_layers"], p["d_model"], p["d_ff"], p["rank"])
    rows, cols = embedding_shapes(p, EMBEDDING_SHAPES)
    spec["fc1"] = linear_spec(p["d_model"], p["d_model"], p["rank"])
    if p["tensorize_embedding"]:
        spec["encoder.embeddings.word"] = embedding_spec(
            p["vocab_size"], p["d_model"], p["embedding_rank"], row_shape=rows, col_shape=cols)
    return spec


# ---------------------------------------------------------------- data

def load_data(p: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(train, eval, info) tensors on the CPU: input_ids, segment_ids, attention_mask, labels."""
    if p["data"] == "synthetic":
        return _load_synthetic(p)
    return _load_mnli(p)


SYNTHETIC_PARTS = ("input_ids", "segment_ids", "attention_mask", "labels")


def _load_synthetic(p: dict[str, Any]):
    """The synthetic task's pairs, from the run's cache where it keeps one (its key: the parameters and
    the generator's source file)."""
    common = dict(vocab_size=p["vocab_size"], seq_len=p["seq_len"], premise_len=p["premise_len"],
                  hypothesis_len=p["hypothesis_len"], num_words=p["num_words"], task=p["task"],
                  num_topics=p["num_topics"], label_noise=p["label_noise"],
                  topic_seed=p["data_seed"] if p["word_topics"] == "random" else None)
    counts = {"train": p["train_samples"], "eval": p["eval_samples"]}

    def build() -> dict[str, torch.Tensor]:
        data = {}
        for i, (split, count) in enumerate(counts.items()):
            pairs = nli_synthetic.generate(count, seed=2 * p["data_seed"] + i, **common)
            data.update({f"{split}_{k}": pairs[k] for k in SYNTHETIC_PARTS})
        if p["label_noise"]:  # the share of evaluation labels that the noise left as the task's rule gives
            clean = nli_synthetic.generate(p["eval_samples"], seed=2 * p["data_seed"] + 1,
                                           **{**common, "label_noise": 0.0})
            data["label_ceiling"] = (clean["labels"] == data["eval_labels"]).double().mean()
        return data

    folder = configured_cache_dir(p["cache_dir"], "nli")
    key = fingerprint("synthetic", common, counts, p["data_seed"], files=[nli_synthetic.__file__])
    data = build() if folder is None else cached_tensors(
        folder / f"synthetic-{key}.pt", build, keys=[f"{s}_{k}" for s in counts for k in SYNTHETIC_PARTS])
    train, evals = ({k: data[f"{split}_{k}"] for k in SYNTHETIC_PARTS} for split in counts)
    info = {"data": "synthetic", "task": p["task"], "hypothesis_only_ceiling": 2 / 3}
    if p["label_noise"]:
        info["label_ceiling"] = float(data["label_ceiling"])
        info["hypothesis_only_ceiling"] = 2 / 3 - p["label_noise"] / 3  # a redrawn label: right 1 in 3
    return train, evals, info


def _load_mnli(p: dict[str, Any]):
    train_split = mnli.load_split(p["data_dir"], "train")
    eval_split = mnli.load_split(p["data_dir"], "validation_matched")
    files = [*train_split.files, *eval_split.files]
    folder = cache_dir(p["cache_dir"], "mnli")
    if p["tokenizer"]:
        tok = load_tokenizer_file(p["tokenizer"])
        tok_key = fingerprint(files=[p["tokenizer"]])
    else:
        tok_key = fingerprint("wordpiece", p["vocab_size"], files=train_split.files)
        tok = load_or_train(folder / f"wordpiece-{tok_key}.json",
                            lambda: train_wordpiece(train_split.premises + train_split.hypotheses,
                                                    p["vocab_size"]))
    if tok.get_vocab_size() > p["vocab_size"]:
        raise ValueError(f"workload 'transformer': tokenizer has {tok.get_vocab_size()} tokens, more than "
                         f"param vocab_size={p['vocab_size']}")
    key = fingerprint(tok_key, p["seq_len"], p["train_samples"], p["eval_samples"], files=files)

    def encode(split: mnli.NLISplit, limit: int | None) -> dict[str, torch.Tensor]:
        n = len(split.labels) if limit is None else min(limit, len(split.labels))
        out = encode_pairs(tok, split.premises[:n], split.hypotheses[:n], p["seq_len"])
        out["labels"] = torch.tensor(split.labels[:n], dtype=torch.long)
        return out

    keys = ("input_ids", "labels")
    train = cached_tensors(folder / f"train-{key}.pt", lambda: encode(train_split, p["train_samples"]), keys)
    evals = cached_tensors(folder / f"eval-{key}.pt", lambda: encode(eval_split, p["eval_samples"]), keys)
    info = {"data": "mnli", "data_files": [str(f) for f in files], "tokenizer_vocab": tok.get_vocab_size(),
            "rows_read": {"train": train_split.rows_read, "validation_matched": eval_split.rows_read},
            "rows_dropped": {"train": dict(train_split.dropped),
                             "validation_matched": dict(eval_split.dropped)}}
    return train, evals, info


# ---------------------------------------------------------------- the workload

def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    return F.cross_entropy(logits, batch["labels"])


def build(p: dict[str, Any], *, batch_size: int, seed: int, device: torch.device) -> Workload:
    train, evals, info = load_data(p)
    model = seeded_model(build_model, p, seed, device)

    task_ids = (nli_synthetic.token_ids(p["vocab_size"], p["num_words"]) if p["data"] == "synthetic"
                else None)

    def sized_models(n: int) -> list[SizedModel]:
        return [SizedModel(shape, {k: q[k] for k in ("d_model", "d_ff", "num_layers", "task_vocabulary")
                                   if k in q}, parameter_count({**q, "vocab_size": len(task_ids)}
                                                               if q.get("task_vocabulary") else q),
                           lambda q=q: seeded_model(lambda r: build_sized(r, task_ids), q, seed, device))
                for shape, q in sized_candidates(p, n, task_ids)]
    eval_bs = p["eval_batch_size"] or max(batch_size, 64)

    def scored(m: nn.Module, data: dict[str, torch.Tensor]) -> dict[str, float]:
        correct, total_loss, n = 0, 0.0, 0
        with evaluating(m):
            for batch in batching.eval_batches(data, eval_bs, device):
                logits = m(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
                total_loss += F.cross_entropy(logits, batch["labels"], reduction="sum").item()
                correct += (logits.argmax(-1) == batch["labels"]).sum().item()
                n += batch["labels"].shape[0]
        return {"metric_name": "accuracy", "metric_value": correct / n, "loss": total_loss / n, "samples": n}

    def evaluate(m: nn.Module) -> dict[str, float]:
        return scored(m, evals)

    def holdout(fraction: float) -> Holdout:
        rows = batching.num_rows(train)
        held = min(max(1, round(fraction * rows)), rows - 1)
        fit = {k: t[:rows - held] for k, t in train.items()}
        kept = {k: t[rows - held:] for k, t in train.items()}
        return Holdout(lambda epoch: batching.train_batches(fit, batch_size, seed, epoch, device),
                       batching.train_steps(rows - held, batch_size), lambda m: scored(m, kept))

    info.update(train_samples=batching.num_rows(train), eval_samples=batching.num_rows(evals),
                vocab_size=p["vocab_size"], eval_batch_size=eval_bs,
                label_counts=torch.bincount(train["labels"], minlength=NUM_CLASSES).tolist())
    return Workload(
        name=NAME, model=model, tt_spec=tt_spec(p),
        train_batches=lambda epoch: batching.train_batches(train, batch_size, seed, epoch, device),
        eval_batches=lambda: batching.eval_batches(evals, eval_bs, device),
        loss=loss, evaluate=evaluate,
        steps_per_epoch=batching.train_steps(batching.num_rows(train), batch_size),
        metric_name="accuracy", seq_len=p["seq_len"], lr=dict(LR["paper" if p["size"] == "paper" else "cpu"]),
        info=info, official_init=official_init, sized_models=sized_models, holdout=holdout)
