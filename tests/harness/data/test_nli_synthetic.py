from collections import Counter

import pytest
import torch

import numpy as np

from harness.data.nli_synthetic import (CONTRADICTION, ENTAILMENT, FIRST_WORD_ID, NEUTRAL, NOT_ID, generate,
                                        word_topics)
from harness.data.text_tokenizer import CLS_ID, PAD_ID, SEP_ID


def _rule(ids: list[int], task: str, topics: int, topic_seed: int | None = None,
          num_words: int = 1024) -> int:
    """The documented labelling rule, recomputed from the tokens."""
    topic_of = word_topics(num_words, topics, topic_seed)
    sep = ids.index(SEP_ID)
    premise = ids[1:sep]
    end = ids.index(SEP_ID, sep + 1)
    hyp = [t for t in ids[sep + 1:end] if t != NOT_ID]
    if task in ("topic", "majority"):
        counts = Counter(topic_of[t - FIRST_WORD_ID] for t in premise)
        top, n_top = counts.most_common(1)[0]
        if task == "topic":
            assert len(counts) == 1  # a premise uses one topic
        assert 2 * n_top > len(premise)  # a strict majority
        topic = {top}
        hyp_topics = {topic_of[t - FIRST_WORD_ID] for t in hyp}
        assert len(hyp_topics) == 1
        if hyp_topics != topic:
            return NEUTRAL
    elif any(t not in set(premise) for t in hyp):
        return NEUTRAL
    return CONTRADICTION if NOT_ID in ids[sep + 1:end] else ENTAILMENT


@pytest.mark.parametrize("task, topics, topic_seed", [("topic", 4, None), ("topic", 4, 7), ("topic", 2, None),
                                                     ("membership", 1, None), ("majority", 4, None),
                                                     ("majority", 2, 7)])
@pytest.mark.parametrize("vocab_size, seq_len, premise_len", [(64, 24, 8), (1024, 64, 16)])
def test_labels_follow_the_rules_and_layout(vocab_size, seq_len, premise_len, task, topics, topic_seed):
    if task != "membership" and (vocab_size - FIRST_WORD_ID) // topics < premise_len + 1:
        pytest.skip("too few words per topic")
    data = generate(600, vocab_size=vocab_size, seq_len=seq_len, premise_len=premise_len, seed=3, task=task,
                    num_topics=max(topics, 2), topic_seed=topic_seed)
    ids = data["input_ids"]
    assert ids.shape == (600, seq_len) and ids.max() < vocab_size
    assert (ids[:, 0] == CLS_ID).all()
    assert torch.equal(data["attention_mask"], ids != PAD_ID)
    for row, seg, label in zip(ids.tolist(), data["segment_ids"].tolist(), data["labels"].tolist()):
        assert _rule(row, task, topics, topic_seed, vocab_size - FIRST_WORD_ID) == label
        sep = row.index(SEP_ID)
        end = row.index(SEP_ID, sep + 1)
        assert seg[:sep + 1] == [0] * (sep + 1) and seg[sep + 1:end + 1] == [1] * (end - sep)
        assert min(t for t in row[1:sep]) >= FIRST_WORD_ID
    counts = torch.bincount(data["labels"], minlength=3)
    assert counts.min() > 150  # balanced classes


@pytest.mark.parametrize("task", ["topic", "membership", "majority"])
def test_needs_both_sentences(task):
    """Half of the neutral hypotheses carry 'not' too, so 'not' alone cannot separate the classes."""
    data = generate(3000, vocab_size=256, seq_len=32, premise_len=10, seed=0, task=task)
    has_not = (data["input_ids"] == NOT_ID).any(1)
    neutral = data["labels"] == NEUTRAL
    assert 0.35 < has_not[neutral].float().mean() < 0.65
    assert has_not[data["labels"] == CONTRADICTION].all() and not has_not[data["labels"] == ENTAILMENT].any()


@pytest.mark.parametrize("task", ["topic", "majority"])
def test_deterministic_per_seed(task):
    a = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=1, task=task)
    b = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=1, task=task)
    c = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=2, task=task)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], c["input_ids"])


@pytest.mark.parametrize("num_words, num_topics", [(48, 4), (50, 4), (24, 2), (7, 3)])
def test_seeded_word_topics_are_balanced(num_words, num_topics):
    """Every topic gets num_words // num_topics words or one more; one topic_seed gives one map."""
    topics = word_topics(num_words, num_topics, topic_seed=5)
    assert sorted(np.bincount(topics, minlength=num_topics)) == sorted(np.bincount(
        np.arange(num_words) % num_topics, minlength=num_topics))
    assert np.array_equal(topics, word_topics(num_words, num_topics, topic_seed=5))
    assert not np.array_equal(topics, word_topics(num_words, num_topics, topic_seed=6))


def test_the_splits_share_the_seeded_map():
    """Two sample seeds (the training and the evaluation split) with one topic_seed follow one map."""
    train, evals = (generate(400, vocab_size=64, seq_len=24, premise_len=8, num_words=48, seed=s,
                             topic_seed=5) for s in (0, 1))
    assert all(_rule(row, "topic", 4, 5, 48) == label for data in (train, evals)
               for row, label in zip(data["input_ids"].tolist(), data["labels"].tolist()))


def test_modular_topics_are_one_ttm_digit_and_seeded_ones_are_not():
    """The small preset's embedding rows [16, 8, 8]: with the modular rule a word's topic (4 topics, 48 words)
    is a function of its last row index alone; with a seeded permutation of no single row index."""
    ids = np.arange(48) + FIRST_WORD_ID
    digits = [ids // 64, ids // 8 % 8, ids % 8]

    def function_of(topics, digit):
        return all(len(set(topics[digit == d])) == 1 for d in np.unique(digit))

    assert function_of(word_topics(48, 4), digits[2])
    assert not any(function_of(word_topics(48, 4, topic_seed=0), digit) for digit in digits)


def test_majority_premises_carry_noise_words():
    """Up to (n-1)//2 premise words come from other topics; more than half of the premises have some."""
    data = generate(2000, vocab_size=128, seq_len=24, premise_len=8, num_words=80, seed=0, task="majority")
    mixed = 0
    for row in data["input_ids"].tolist():
        premise = row[1:row.index(SEP_ID)]
        counts = Counter((t - FIRST_WORD_ID) % 4 for t in premise).most_common()
        assert len(premise) - counts[0][1] <= (len(premise) - 1) // 2
        mixed += len(counts) > 1
    assert mixed > 2000 / 2


@pytest.mark.parametrize("task", ["topic", "majority"])
def test_hypothesis_only_ceiling(task):
    """Knowing the hypothesis's topic and whether it has 'not' predicts at most ~2/3 of the labels."""
    data = generate(6000, vocab_size=128, seq_len=24, premise_len=8, num_words=80, seed=0, task=task)
    groups = Counter()
    for row, label in zip(data["input_ids"].tolist(), data["labels"].tolist()):
        sep = row.index(SEP_ID)
        hyp = row[sep + 1:row.index(SEP_ID, sep + 1)]
        groups[(NOT_ID in hyp, (next(t for t in hyp if t != NOT_ID) - FIRST_WORD_ID) % 4, label)] += 1
    best = Counter()
    for (has_not, topic, _), n in groups.items():
        best[has_not, topic] = max(best[has_not, topic], n)
    assert sum(best.values()) / 6000 < 2 / 3 + 0.02


@pytest.mark.parametrize("noise", [0.1, 0.3])
def test_label_noise_redraws_a_share_of_the_labels_and_keeps_the_tokens(noise):
    """With probability ``label_noise`` a label is redrawn uniformly (so about 2/3 of those change); the
    tokens, and every label not redrawn, are the noiseless task's."""
    common = dict(vocab_size=128, seq_len=24, premise_len=8, num_words=48, seed=3, topic_seed=0)
    clean, noisy = generate(6000, **common), generate(6000, **common, label_noise=noise)
    assert all(torch.equal(clean[k], noisy[k]) for k in ("input_ids", "segment_ids", "attention_mask"))
    changed = float((clean["labels"] != noisy["labels"]).double().mean())
    assert abs(changed - 2 / 3 * noise) < 0.02  # 6000 draws: the standard error is below 0.006
    assert torch.equal(generate(6000, **common, label_noise=noise)["labels"], noisy["labels"])
    assert sorted(Counter(noisy["labels"].tolist())) == [0, 1, 2]


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=256, seq_len=32, premise_len=10, label_noise=1.5), "label_noise=1.5"),
    (dict(vocab_size=12, seq_len=32, premise_len=10), "too few content words"),
    (dict(vocab_size=256, seq_len=12, premise_len=10), "> seq_len=12"),
    (dict(vocab_size=40, seq_len=32, premise_len=10), "in each of 4 topics"),
    (dict(vocab_size=256, seq_len=32, premise_len=10, num_topics=1), "num_topics=1"),
    (dict(vocab_size=256, seq_len=32, premise_len=10, task="entail"), "task='entail'"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(5, **kwargs)
