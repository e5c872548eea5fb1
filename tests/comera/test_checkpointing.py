"""TT and TTM layers (and the fused feed-forward) under activation checkpointing
(torch.utils.checkpoint), as a user's model wraps its blocks: the gradients equal those of the plain
forward exactly, in float64, dropout included (its random state is replayed)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import comera


class Block(nn.Module):
    """An embedding, dropout and a feed-forward pair: a TTM table and two TT layers once tensorized."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(600, 64)
        self.drop = nn.Dropout(0.1)
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, idx, fused=True):
        h = self.drop(self.emb(idx))
        return comera.feed_forward(self.fc1, F.gelu, self.fc2, h) if fused else self.fc2(F.gelu(self.fc1(h)))


def _grads(model, run):
    model.zero_grad()
    torch.manual_seed(5)
    run().pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("fused", [True, False])
def test_a_checkpointed_block_has_the_plain_gradients(fused):
    torch.manual_seed(0)
    model = Block().double()
    comera.tensorize(model, {"emb": {"rank": 8}, "fc1": {"rank": 8}, "fc2": {"rank": 8}})
    assert isinstance(model.emb, comera.TTMEmbedding) and isinstance(model.fc1, comera.TTLinear)
    idx = torch.randint(0, 600, (8, 16))
    plain = _grads(model, lambda: model(idx, fused))
    saved = _grads(model, lambda: checkpoint(model, idx, fused, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(plain, saved))


def test_a_checkpointed_tt_layer_has_the_plain_gradients_reentrant_too():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).double()
    comera.tensorize(model, "all-linear", rank=8)
    x = torch.randn(16, 64, dtype=torch.float64, requires_grad=True)
    plain = _grads(model, lambda: model(x))
    for reentrant in (False, True):
        assert all(torch.equal(a, b) for a, b in zip(plain, _grads(model, lambda: checkpoint(
            model, x, use_reentrant=reentrant))))
