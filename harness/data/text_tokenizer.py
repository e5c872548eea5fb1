"""Tokenizers from the ``tokenizers`` library, trained locally and cached, and batch encoding to tensors.

Every tokenizer trained here puts the same special tokens at ids 0-4: [PAD] [UNK] [CLS] [SEP] [MASK].
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from harness.data.cache import discard, locked, store

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))


def train_wordpiece(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A lower-casing BERT-style WordPiece tokenizer trained on ``texts`` (at most ``vocab_size`` tokens)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_byte_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (keeps whitespace and case, as code needs) trained on ``texts``."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_or_train(path: Path, train: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer cached at ``path``, or a newly trained one saved there atomically; a cached file
    that cannot be read (e.g. truncated) is reported, deleted and rebuilt. Trained under a lock, so that
    cells started together share one tokenizer: WordPiece training breaks ties between equally frequent
    merges in a hash order that differs between processes, so two trainings may give two vocabularies."""
    with locked(path):
        if path.exists():
            try:
                return Tokenizer.from_file(os.fspath(path))
            except Exception as exc:  # noqa: BLE001 -- tokenizers raises a bare Exception ("EOF while parsing")
                discard(path, "tokenizer", exc)
        tok = train()
        store(path, lambda tmp: tok.save(os.fspath(tmp)), "tokenizer")
        return tok


def load_tokenizer_file(path: str | os.PathLike) -> Tokenizer:
    """A user's tokenizer.json; the error names the path when it is missing or unreadable."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:
        raise ValueError(f"cannot read tokenizer file {path}: {exc}") from exc


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of [PAD] [CLS] [SEP] [MASK] (or their RoBERTa names) in ``tok``; error if one is missing."""
    alternatives = {"pad": ("[PAD]", "<pad>"), "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"),
                    "mask": ("[MASK]", "<mask>")}
    out = {}
    for role, names in alternatives.items():
        ids = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not ids:
            raise ValueError(f"tokenizer has no {role} token (looked for {' or '.join(names)})")
        out[role] = ids[0]
    return out


def encode_pairs(tok: Tokenizer, first: Sequence[str], second: Sequence[str], seq_len: int,
                 chunk: int = 20000) -> dict[str, torch.Tensor]:
    """[CLS] a [SEP] b [SEP], truncated (longest first) and padded to ``seq_len``: input_ids,
    segment_ids (0 for a, 1 for b), attention_mask (bool)."""
    ids = special_ids(tok)
    tok = Tokenizer.from_str(tok.to_str())  # a copy: the settings below must not leak into a cached object
    cls, sep = tok.id_to_token(ids["cls"]), tok.id_to_token(ids["sep"])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, ids["cls"]), (sep, ids["sep"])])
    tok.enable_truncation(seq_len, strategy="longest_first")
    tok.enable_padding(length=seq_len, pad_id=ids["pad"], pad_token=tok.id_to_token(ids["pad"]))
    parts = []
    for start in range(0, len(first), chunk):
        enc = tok.encode_batch(list(zip(first[start:start + chunk], second[start:start + chunk])))
        parts.append({"input_ids": torch.tensor([e.ids for e in enc], dtype=torch.long),
                      "segment_ids": torch.tensor([e.type_ids for e in enc], dtype=torch.long),
                      "attention_mask": torch.tensor([e.attention_mask for e in enc], dtype=torch.bool)})
    if not parts:
        return {k: torch.zeros((0, seq_len), dtype=d) for k, d in
                (("input_ids", torch.long), ("segment_ids", torch.long), ("attention_mask", torch.bool))}
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def encode_stream(tok: Tokenizer, texts: Iterable[str], chunk: int = 256) -> Iterator[list[int]]:
    """Token ids of each text, without special tokens."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == chunk:
            yield from (e.ids for e in tok.encode_batch(batch, add_special_tokens=False))
            batch = []
    if batch:
        yield from (e.ids for e in tok.encode_batch(batch, add_special_tokens=False))
