"""A synthetic natural-language-inference task whose labels need both sentences.

Tokens: ids 0-4 are the specials of :mod:`harness.data.text_tokenizer` ([PAD] [UNK] [CLS] [SEP] [MASK]),
id 5 is the negation word ``not``, ids 6.. are content words. A premise is a run of distinct content words;
the hypothesis is a few words, labelled by these rules, checked in order:

1. neutral (1): some hypothesis word does not occur in the premise;
2. contradiction (2): every word occurs in the premise and the hypothesis contains ``not``;
3. entailment (0): every word occurs in the premise and there is no ``not``.

Classes are balanced; half of the neutral hypotheses contain ``not``. The hypothesis alone therefore
gives at most 2/3 accuracy (``not`` -> contradiction, else entailment); the rest needs a comparison of
the two sentences (is each hypothesis word in the premise?), which attention learns. Labels use the
GLUE/Hugging Face MNLI coding: 0 entailment, 1 neutral, 2 contradiction.
"""
from __future__ import annotations

import numpy as np
import torch

from harness.data.text_tokenizer import CLS_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS

NOT_ID = len(SPECIAL_TOKENS)
FIRST_WORD_ID = NOT_ID + 1
ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2


def generate(num_samples: int, *, vocab_size: int, seq_len: int, premise_len: int,
             hypothesis_len: int = 4, num_words: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """``num_samples`` encoded pairs: input_ids, segment_ids, attention_mask (seq_len each) and labels.

    Premises have premise_len//2 .. premise_len words, hypotheses 2 .. hypothesis_len words (plus
    ``not``); content words are drawn from the first ``num_words`` word ids (default: all of the vocab).
    """
    words = vocab_size - FIRST_WORD_ID if num_words is None else num_words
    if words < premise_len + 1 or FIRST_WORD_ID + words > vocab_size:
        raise ValueError(f"synthetic NLI: vocab_size={vocab_size} / num_words={num_words} leave too few "
                         f"content words for premise_len={premise_len}")
    needed = premise_len + hypothesis_len + 4
    if needed > seq_len:
        raise ValueError(f"synthetic NLI: premise_len + hypothesis_len + 4 = {needed} > seq_len={seq_len}")
    if hypothesis_len < 2 or premise_len < 4:
        raise ValueError("synthetic NLI: need premise_len >= 4 and hypothesis_len >= 2")
    rng = np.random.default_rng(seed)
    ids = np.full((num_samples, seq_len), PAD_ID, dtype=np.int64)
    segments = np.zeros((num_samples, seq_len), dtype=np.int64)
    labels = rng.integers(0, 3, size=num_samples)
    for i in range(num_samples):
        n_p = int(rng.integers(premise_len // 2, premise_len + 1))
        n_h = int(rng.integers(2, min(hypothesis_len, n_p) + 1))
        chosen = rng.choice(words, size=n_p + 1, replace=False) + FIRST_WORD_ID
        premise, outsider = chosen[:n_p], chosen[n_p]
        hyp = list(rng.choice(premise, size=n_h, replace=False))
        negate = labels[i] == CONTRADICTION
        if labels[i] == NEUTRAL:
            hyp[int(rng.integers(n_h))] = outsider
            negate = bool(rng.integers(2))
        if negate:
            hyp.insert(int(rng.integers(n_h)), NOT_ID)
        row = [CLS_ID, *premise, SEP_ID, *hyp, SEP_ID]
        ids[i, :len(row)] = row
        segments[i, n_p + 2:len(row)] = 1
    ids_t = torch.from_numpy(ids)
    return {"input_ids": ids_t, "segment_ids": torch.from_numpy(segments),
            "attention_mask": ids_t != PAD_ID, "labels": torch.from_numpy(labels)}
