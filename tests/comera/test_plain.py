"""comera.plain_autograd: the layers as ordinary autograd ops, so torch.func transforms apply; the same
results and gradients as the custom Functions, per-sample gradients equal to a loop over samples."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap

import comera
from comera import rank
from comera.feedforward import feed_forward


def _tt(bias=True, dtype=torch.float64):
    torch.manual_seed(0)
    layer = comera.TTLinear(24, 30, in_shape=[4, 6], out_shape=[5, 6], rank=3, bias=bias, dtype=dtype)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    return layer


class _Block(nn.Module):
    """An embedding, a fused TT feed-forward block and a head: every comera layer kind."""

    def __init__(self, lookup="optimized"):
        super().__init__()
        torch.manual_seed(1)
        self.embed = comera.TTMEmbedding(60, 24, row_shape=[3, 4, 5], col_shape=[2, 3, 4], rank=3,
                                         lookup=lookup, dtype=torch.float64)
        self.fc1 = comera.TTLinear(24, 48, in_shape=[4, 6], out_shape=[6, 8], rank=3, dtype=torch.float64)
        self.fc2 = comera.TTLinear(48, 24, in_shape=[6, 8], out_shape=[4, 6], rank=3, dtype=torch.float64)
        self.head = nn.Linear(24, 5, dtype=torch.float64)

    def forward(self, idx):
        h = self.embed(idx).mean(-2)
        return self.head(feed_forward(self.fc1, F.gelu, self.fc2, h))


class _Objective(nn.Module):
    """The early stage's objective as a module, so that functional_call swaps the parameters the penalty
    reads too."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, labels):
        task = F.cross_entropy(self.model(idx), labels)
        return rank.early_objective(task, self.model, l1_weight=0.1, l2_weight=0.01)


def _assert_close(got, want):
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-12, msg=key)


def _assert_per_sample_grads(loss, params, inputs, targets):
    """vmap(grad(loss)) over the samples inside plain_autograd equals autograd's gradient of each sample."""
    with comera.plain_autograd():
        per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, inputs[:, None], targets[:, None])
    for i in range(len(inputs)):
        one = torch.autograd.grad(loss(params, inputs[i:i + 1], targets[i:i + 1]), list(params.values()))
        _assert_close({k: v[i] for k, v in per_sample.items()}, dict(zip(params, one)))


@pytest.mark.parametrize("bias", [True, False])
def test_grad_and_per_sample_grads_of_a_tt_layer(bias):
    layer = _tt(bias)
    params = dict(layer.named_parameters())
    x, target = torch.randn(6, 24, dtype=torch.float64), torch.randn(6, 30, dtype=torch.float64)

    def loss(p, x, t):
        return (functional_call(layer, p, (x,)) - t).pow(2).sum()

    want = dict(zip(params, torch.autograd.grad(loss(params, x, target), list(params.values()))))
    with comera.plain_autograd():
        _assert_close(grad(loss)(params, x, target), want)
    _assert_per_sample_grads(loss, params, x, target)


def test_jacobian_of_a_tt_layer_is_its_dense_weight():
    layer = _tt()
    with comera.plain_autograd():
        jac = jacrev(layer)(torch.randn(24, dtype=torch.float64))
    torch.testing.assert_close(jac, layer.dense_weight().detach().T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lookup", ["optimized", "naive"])
def test_every_layer_kind_and_the_rank_objective_under_grad(lookup):
    model = _Objective(_Block(lookup))
    params = dict(model.named_parameters())
    idx, labels = torch.randint(0, 60, (4, 3)), torch.randint(0, 5, (4,))

    def objective(p, idx, labels):
        return functional_call(model, p, (idx, labels))

    want = torch.autograd.grad(objective(params, idx, labels), list(params.values()))
    with comera.plain_autograd():
        plain_value = objective(params, idx, labels)
        got = grad(objective)(params, idx, labels)
    torch.testing.assert_close(plain_value, objective(params, idx, labels), rtol=1e-12, atol=0)
    _assert_close(got, dict(zip(params, want)))


def test_per_sample_grads_through_every_layer_kind():
    model = _Block()
    params = dict(model.named_parameters())
    idx, labels = torch.randint(0, 60, (3, 2)), torch.randint(0, 5, (3,))

    def loss(p, idx, labels):
        return F.cross_entropy(functional_call(model, p, (idx,)), labels)

    _assert_per_sample_grads(loss, params, idx, labels)


def test_a_transform_outside_the_block_names_it():
    layer = _tt()
    with pytest.raises(RuntimeError, match="plain_autograd"):
        grad(lambda x: layer(x).sum())(torch.randn(2, 24, dtype=torch.float64))


def test_the_block_is_per_thread_and_nests():
    from comera import plain

    assert not plain.active()
    with comera.plain_autograd():
        with comera.plain_autograd():
            assert plain.active()
        assert plain.active()
    assert not plain.active()


def test_an_index_out_of_range_is_still_named_inside_the_block():
    table = comera.TTMEmbedding(60, 24, row_shape=[3, 4, 5], col_shape=[2, 3, 4], rank=3)
    with comera.plain_autograd(), pytest.raises(IndexError, match=r"out of range \[0, 60\)"):
        table(torch.tensor([3, 60]))
