import pytest
import torch

from harness.data.nli_synthetic import CONTRADICTION, ENTAILMENT, FIRST_WORD_ID, NEUTRAL, NOT_ID, generate
from harness.data.text_tokenizer import CLS_ID, PAD_ID, SEP_ID


def _rule(ids: list[int]) -> int:
    """The documented labelling rule, recomputed from the tokens."""
    sep = ids.index(SEP_ID)
    premise = set(ids[1:sep])
    end = ids.index(SEP_ID, sep + 1)
    hyp = ids[sep + 1:end]
    if any(t not in premise for t in hyp if t != NOT_ID):
        return NEUTRAL
    return CONTRADICTION if NOT_ID in hyp else ENTAILMENT


@pytest.mark.parametrize("vocab_size, seq_len, premise_len", [(64, 24, 8), (1024, 64, 16)])
def test_labels_follow_the_rules_and_layout(vocab_size, seq_len, premise_len):
    data = generate(600, vocab_size=vocab_size, seq_len=seq_len, premise_len=premise_len, seed=3)
    ids = data["input_ids"]
    assert ids.shape == (600, seq_len) and ids.max() < vocab_size
    assert (ids[:, 0] == CLS_ID).all()
    assert torch.equal(data["attention_mask"], ids != PAD_ID)
    for row, seg, label in zip(ids.tolist(), data["segment_ids"].tolist(), data["labels"].tolist()):
        assert _rule(row) == label
        sep = row.index(SEP_ID)
        end = row.index(SEP_ID, sep + 1)
        assert seg[:sep + 1] == [0] * (sep + 1) and seg[sep + 1:end + 1] == [1] * (end - sep)
        assert min(t for t in row[1:sep]) >= FIRST_WORD_ID
    counts = torch.bincount(data["labels"], minlength=3)
    assert counts.min() > 150  # balanced classes


def test_needs_both_sentences():
    """Half of the neutral hypotheses carry 'not' too, so 'not' alone cannot separate the classes."""
    data = generate(3000, vocab_size=256, seq_len=32, premise_len=10, seed=0)
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
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(5, **kwargs)
