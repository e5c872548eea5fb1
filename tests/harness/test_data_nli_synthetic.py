import pytest
import torch

from harness.data.nli_synthetic import CONTRADICTION, ENTAILMENT, FIRST_WORD_ID, NEUTRAL, NOT_ID, generate
from harness.data.text_tokenizer import CLS_ID, PAD_ID, SEP_ID


def _rule(ids: list[int], task: str, topics: int) -> int:
    """The documented labelling rule, recomputed from the tokens."""
    sep = ids.index(SEP_ID)
    premise = ids[1:sep]
    end = ids.index(SEP_ID, sep + 1)
    hyp = [t for t in ids[sep + 1:end] if t != NOT_ID]
    if task == "topic":
        topic = {(t - FIRST_WORD_ID) % topics for t in premise}
        assert len(topic) == 1  # a premise uses one topic
        hyp_topics = {(t - FIRST_WORD_ID) % topics for t in hyp}
        assert len(hyp_topics) == 1
        if hyp_topics != topic:
            return NEUTRAL
    elif any(t not in set(premise) for t in hyp):
        return NEUTRAL
    return CONTRADICTION if NOT_ID in ids[sep + 1:end] else ENTAILMENT


@pytest.mark.parametrize("task, topics", [("topic", 4), ("topic", 2), ("membership", 1)])
@pytest.mark.parametrize("vocab_size, seq_len, premise_len", [(64, 24, 8), (1024, 64, 16)])
def test_labels_follow_the_rules_and_layout(vocab_size, seq_len, premise_len, task, topics):
    if task == "topic" and (vocab_size - FIRST_WORD_ID) // topics < premise_len + 1:
        pytest.skip("too few words per topic")
    data = generate(600, vocab_size=vocab_size, seq_len=seq_len, premise_len=premise_len, seed=3, task=task,
                    num_topics=max(topics, 2))
    ids = data["input_ids"]
    assert ids.shape == (600, seq_len) and ids.max() < vocab_size
    assert (ids[:, 0] == CLS_ID).all()
    assert torch.equal(data["attention_mask"], ids != PAD_ID)
    for row, seg, label in zip(ids.tolist(), data["segment_ids"].tolist(), data["labels"].tolist()):
        assert _rule(row, task, topics) == label
        sep = row.index(SEP_ID)
        end = row.index(SEP_ID, sep + 1)
        assert seg[:sep + 1] == [0] * (sep + 1) and seg[sep + 1:end + 1] == [1] * (end - sep)
        assert min(t for t in row[1:sep]) >= FIRST_WORD_ID
    counts = torch.bincount(data["labels"], minlength=3)
    assert counts.min() > 150  # balanced classes


@pytest.mark.parametrize("task", ["topic", "membership"])
def test_needs_both_sentences(task):
    """Half of the neutral hypotheses carry 'not' too, so 'not' alone cannot separate the classes."""
    data = generate(3000, vocab_size=256, seq_len=32, premise_len=10, seed=0, task=task)
    has_not = (data["input_ids"] == NOT_ID).any(1)
    neutral = data["labels"] == NEUTRAL
    assert 0.35 < has_not[neutral].float().mean() < 0.65
    assert has_not[data["labels"] == CONTRADICTION].all() and not has_not[data["labels"] == ENTAILMENT].any()


def test_deterministic_per_seed():
    a = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=1)
    b = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=1)
    c = generate(50, vocab_size=128, seq_len=32, premise_len=10, seed=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], c["input_ids"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=12, seq_len=32, premise_len=10), "too few content words"),
    (dict(vocab_size=256, seq_len=12, premise_len=10), "> seq_len=12"),
    (dict(vocab_size=40, seq_len=32, premise_len=10), "in each of 4 topics"),
    (dict(vocab_size=256, seq_len=32, premise_len=10, num_topics=1), "num_topics=1"),
    (dict(vocab_size=256, seq_len=32, premise_len=10, task="entail"), "task='entail'"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(5, **kwargs)
