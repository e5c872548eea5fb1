"""A synthetic natural-language-inference task whose labels need both sentences: :func:`generate`.

The tasks :data:`TASKS`, the words' topics (:func:`word_topics`) and ``label_noise``; classes balanced,
labels in the MNLI coding. The tasks and their ceilings: docs/design-notes.md; the grid's: docs/recipe.md.
"""
from __future__ import annotations

import numpy as np
import torch

from harness.data.text_tokenizer import CLS_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS

NOT_ID = len(SPECIAL_TOKENS)
FIRST_WORD_ID = NOT_ID + 1
ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2


TASKS = ("topic", "membership", "majority")


def generate(num_samples: int, *, vocab_size: int, seq_len: int, premise_len: int,
             hypothesis_len: int = 4, num_words: int | None = None, seed: int = 0, task: str = "topic",
             num_topics: int = 4, topic_seed: int | None = None, label_noise: float = 0.0
             ) -> dict[str, torch.Tensor]:
    """``num_samples`` encoded pairs: input_ids, segment_ids, attention_mask (seq_len each) and labels.

    Premises have premise_len//2 .. premise_len words, hypotheses 2 .. hypothesis_len words (plus
    ``not``); content words are drawn from the first ``num_words`` word ids (default: all of the vocab);
    their topics are :func:`word_topics`'s.
    """
    if task not in TASKS:
        raise ValueError(f"synthetic NLI: task={task!r}, expected one of {TASKS}")
    words = vocab_size - FIRST_WORD_ID if num_words is None else num_words
    topics = 1 if task == "membership" else num_topics
    if task != "membership" and num_topics < 2:
        raise ValueError(f"synthetic NLI: num_topics={num_topics} must be >= 2 for task {task!r}")
    if words // topics < premise_len + 1 or FIRST_WORD_ID + words > vocab_size:
        raise ValueError(f"synthetic NLI: vocab_size={vocab_size} / num_words={num_words} leave too few "
                         f"content words for premise_len={premise_len}"
                         + (f" in each of {topics} topics" if topics > 1 else ""))
    needed = premise_len + hypothesis_len + 4
    if needed > seq_len:
        raise ValueError(f"synthetic NLI: premise_len + hypothesis_len + 4 = {needed} > seq_len={seq_len}")
    if not 0 <= label_noise <= 1:
        raise ValueError(f"synthetic NLI: label_noise={label_noise} must be in [0, 1]")
    if hypothesis_len < 2 or premise_len < 4:
        raise ValueError("synthetic NLI: need premise_len >= 4 and hypothesis_len >= 2")
    rng = np.random.default_rng(seed)
    topic_of = word_topics(words, topics, topic_seed)
    pools = [np.flatnonzero(topic_of == t) + FIRST_WORD_ID for t in range(topics)]
    ids = np.full((num_samples, seq_len), PAD_ID, dtype=np.int64)
    segments = np.zeros((num_samples, seq_len), dtype=np.int64)
    labels = rng.integers(0, 3, size=num_samples)
    for i in range(num_samples):
        n_p = int(rng.integers(premise_len // 2, premise_len + 1))
        n_h = int(rng.integers(2, min(hypothesis_len, n_p) + 1))
        topic = int(rng.integers(topics)) if topics > 1 else 0
        chosen = rng.choice(pools[topic], size=n_p + 1, replace=False)
        premise, outsider = chosen[:n_p], chosen[n_p]
        if task == "majority":
            n_noise = int(rng.integers(0, (n_p - 1) // 2 + 1))
            others = np.concatenate([pool for t, pool in enumerate(pools) if t != topic])
            noise = rng.choice(others, n_noise, replace=False)
            premise = rng.permutation(np.concatenate([premise[n_noise:], noise]))
        negate = labels[i] == CONTRADICTION
        if task != "membership":
            other = (topic + int(rng.integers(1, topics))) % topics if labels[i] == NEUTRAL else topic
            hyp = list(rng.choice(pools[other], size=n_h, replace=False))
        else:
            hyp = list(rng.choice(premise, size=n_h, replace=False))
            if labels[i] == NEUTRAL:
                hyp[int(rng.integers(n_h))] = outsider
        if labels[i] == NEUTRAL:
            negate = bool(rng.integers(2))
        if negate:
            hyp.insert(int(rng.integers(n_h)), NOT_ID)
        row = [CLS_ID, *premise, SEP_ID, *hyp, SEP_ID]
        ids[i, :len(row)] = row
        segments[i, n_p + 2:len(row)] = 1
    if label_noise:  # its own stream: the tokens and the other labels are the noiseless task's
        noise = np.random.default_rng([seed, 1])
        redrawn = np.flatnonzero(noise.random(num_samples) < label_noise)
        labels[redrawn] = noise.integers(0, 3, size=len(redrawn))
    ids_t = torch.from_numpy(ids)
    return {"input_ids": ids_t, "segment_ids": torch.from_numpy(segments),
            "attention_mask": ids_t != PAD_ID, "labels": torch.from_numpy(labels)}


def token_ids(vocab_size: int, num_words: int | None = None) -> list[int]:
    """The token ids :func:`generate` can emit for these ``vocab_size`` / ``num_words`` (the special
    tokens, ``not``, the content words), ascending; the rest of the vocabulary never occurs.

    Example::

        >>> len(token_ids(1024, 96))
        102
    """
    words = vocab_size - FIRST_WORD_ID if num_words is None else num_words
    return [*range(len(SPECIAL_TOKENS)), NOT_ID, *range(FIRST_WORD_ID, FIRST_WORD_ID + words)]


def word_topics(num_words: int, num_topics: int, topic_seed: int | None = None) -> np.ndarray:
    """The topic of each content word: entry ``i`` is that of word id ``FIRST_WORD_ID + i``.

    ``topic_seed`` None: ``i % num_topics``; an integer: the same counts per topic, dealt to the words in
    the order of a permutation seeded by it.

    Example::

        >>> word_topics(6, 2).tolist()
        [0, 1, 0, 1, 0, 1]
    """
    order = (np.arange(num_words) if topic_seed is None
             else np.random.default_rng(topic_seed).permutation(num_words))
    topics = np.empty(num_words, dtype=np.int64)
    topics[order] = np.arange(num_words) % num_topics
    return topics
