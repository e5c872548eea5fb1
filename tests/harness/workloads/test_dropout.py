import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import harness.workloads.dropout as fast
from harness.workloads import build_workload, transformer
from harness.workloads.dropout import LANE_LEVELS, Dropout, attention, dropout, keep_levels, keep_mask


def _within(rate: float, expected: float, n: int, sigmas: float = 6.0) -> bool:
    return abs(rate - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-12


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.25 + 1 / LANE_LEVELS])
def test_every_16_bit_lane_keeps_at_the_rounded_rate(p):
    """Each of the four lanes of a 64-bit draw is uniform (int64 random_() alone leaves the top bit 0)."""
    torch.manual_seed(0)
    n = 1 << 22
    keep = keep_mask((n,), keep_levels(p))
    expected = keep_levels(p) / LANE_LEVELS
    assert abs(expected - (1 - p)) <= 0.5 / LANE_LEVELS
    assert _within(keep.double().mean().item(), expected, n)
    for lane in range(4):
        assert _within(keep[lane::4].double().mean().item(), expected, n // 4), lane


def test_keep_mask_keeps_16_bit_draws_below_the_level():
    """The mask is "uniform 16-bit value < levels", and every one of the 2^16 values is equally likely."""
    n = 1 << 22
    torch.manual_seed(0)
    words = torch.empty(n // 4, dtype=torch.int64).random_(-(1 << 63), None)
    values = words.view(torch.int16).long() + (1 << 15)  # the draws keep_mask compares, in [0, 2^16)
    counts = torch.bincount(values, minlength=LANE_LEVELS).double()
    assert counts.numel() == LANE_LEVELS and counts.min() > 0
    expected = n / LANE_LEVELS
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert abs(chi2 - (LANE_LEVELS - 1)) < 6 * math.sqrt(2 * (LANE_LEVELS - 1))
    for levels in (0, 1, 12345, LANE_LEVELS - 1):
        torch.manual_seed(0)
        assert torch.equal(keep_mask((n,), levels), values < levels), levels
    with pytest.raises(ValueError, match="levels=65536 is outside"):
        keep_mask((n,), LANE_LEVELS)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_scales_kept_values_and_is_unbiased(p, dtype):
    torch.manual_seed(0)
    x = torch.rand(1 << 20, dtype=dtype) + 0.5  # no zeros: an output of 0 means dropped
    out = dropout(x, p)
    kept = out != 0
    scale = LANE_LEVELS / keep_levels(p)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out[kept], (x[kept] * scale).to(dtype))
    assert _within(kept.double().mean().item(), 1 - p, x.numel())
    ones = torch.ones(1 << 20, dtype=torch.float64)
    mean = dropout(ones, p).mean().item()  # E[out] = x exactly: the scale uses the rounded keep rate
    assert abs(mean - 1.0) <= 6 * math.sqrt(p / (1 - p) / ones.numel())


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(64, 32)
    module = Dropout(0.3).eval()
    assert module(x) is x
    assert Dropout(0.0).train()(x) is x and dropout(x, 0.3, training=False) is x
    assert dropout(x, 1e-6) is x  # rounds to keeping everything
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_is_an_nn_dropout_with_its_constructor():
    module = Dropout(0.1)
    assert isinstance(module, nn.Dropout) and module.p == 0.1 and repr(module) == repr(nn.Dropout(0.1))
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(torch.ones(3), -0.1)


def test_same_seed_same_mask_and_the_global_generator_advances():
    x = torch.randn(10_000)
    torch.manual_seed(3)
    a, b = dropout(x, 0.2), dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.2), a) and not torch.equal(a, b)


def test_gradient_is_masked_and_scaled():
    torch.manual_seed(0)
    x = (torch.rand(5000, dtype=torch.float64) + 0.5).requires_grad_()
    out = dropout(x, 0.3)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    kept = out.detach() != 0
    assert torch.equal(x.grad, torch.where(kept, grad_out * (LANE_LEVELS / keep_levels(0.3)), 0.0))


def test_backward_keeps_only_a_boolean_mask():
    x = torch.randn(1000, requires_grad=True)
    assert _saved_bytes(lambda: dropout(x, 0.5)) == 1000


def test_other_devices_use_torchs_dropout(monkeypatch):
    monkeypatch.setattr(fast, "keep_mask", lambda *a, **k: pytest.fail("keep_mask used off the CPU"))
    out = dropout(torch.ones(8, device="meta"), 0.5)
    assert out.device.type == "meta" and out.shape == (8,)


def test_compiled_graphs_keep_torchs_dropout_and_do_not_break():
    """Under torch.compile the 16-bit path (random_ breaks graphs) steps aside for torch's own ops."""
    layer = transformer.EncoderBlock(8, 2, 16, 0.5).train()
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)  # fullgraph: a break would raise
    out = compiled(torch.randn(2, 5, 8), mask)
    assert out.shape == (2, 5, 8) and torch.isfinite(out).all()


@pytest.mark.cuda
def test_cuda_dropout_rate():
    x = torch.ones(1 << 20, device="cuda")
    assert _within((dropout(x, 0.1) != 0).double().mean().item(), 0.9, x.numel())


# ---------------------------------------------------------------- attention

def _qkv_mask(dtype=torch.float64):
    torch.manual_seed(0)
    b, h, s, d = 3, 2, 6, 4
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[0, ..., 4:] = False  # padding keys
    mask[2] = False  # a sample with no key at all: SDPA returns zeros, not NaN
    return q, k, v, mask


@pytest.mark.parametrize("masked", [True, False])
def test_attention_without_dropout_matches_sdpa(masked):
    q, k, v, mask = _qkv_mask()
    mask = mask if masked else None
    grad_out = torch.randn_like(q)
    ours = attention(q, k, v, mask, 0.0)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), grad_out),
                    torch.autograd.grad(ref, (q, k, v), grad_out)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if masked:
        assert torch.equal(ours[2], torch.zeros_like(ours[2]))


def test_attention_drops_probabilities_with_the_fast_mask():
    """Same seed: the output equals (softmax(scores) * keep / keep_rate) @ v with the mask keep_mask draws."""
    q, k, v, mask = _qkv_mask()
    grad_out = torch.randn_like(q)
    p = 0.4
    torch.manual_seed(5)
    ours = attention(q, k, v, mask, p)
    torch.manual_seed(5)
    keep = keep_mask((3, 2, 6, 6), keep_levels(p))
    scores = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0) * keep * (LANE_LEVELS / keep_levels(p))
    ref = probs @ v
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    # the row-less sample has NaN reference gradients through nan_to_num; compare the others
    ours_grads = torch.autograd.grad(ours, (q, k, v), grad_out)
    for a, b in zip(ours_grads, torch.autograd.grad(ref[:2], (q, k, v), grad_out[:2])):
        torch.testing.assert_close(a[:2], b[:2], rtol=1e-12, atol=1e-12)
        assert torch.equal(a[2], torch.zeros_like(a[2]))


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves while ``fn()`` runs."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_attention_dropout_saves_only_a_boolean_mask_more():
    """Dropout adds one byte per probability to what attention saves, not a dropped float copy."""
    q, k, v, mask = _qkv_mask(torch.float32)
    without = _saved_bytes(lambda: attention(q, k, v, mask, 0.0))
    with_dropout = _saved_bytes(lambda: attention(q, k, v, mask, 0.3))
    assert with_dropout - without == 3 * 2 * 6 * 6  # (batch, heads, seq, seq) booleans


def test_self_attention_picks_the_explicit_path_only_for_cpu_training_with_dropout(monkeypatch):
    layer = transformer.SelfAttention(8, 2, 0.1)
    x = torch.randn(2, 5, 8)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(k["dropout_p"]) or sdpa(*a, **k))
    layer.train()(x, None)
    assert calls == []
    layer.eval()(x, None)
    transformer.SelfAttention(8, 2, 0.0).train()(x, None)
    assert calls == [0.0, 0.0]


# ---------------------------------------------------------------- the workloads train with it

@pytest.mark.parametrize("name", ["transformer", "mlm"])
def test_tiny_workloads_train_deterministically_with_dropout(name, tmp_path):
    params = {"size": "tiny", "dropout": 0.1, "cache_dir": str(tmp_path)}
    if name == "mlm":
        params.update(max_documents=3, max_train_blocks=16)

    def two_steps():
        torch.manual_seed(0)
        work = build_workload(name, params, batch_size=8, seed=0, device="cpu")
        opt = torch.optim.AdamW(work.model.parameters(), lr=1e-3)
        losses = []
        for batch, _ in zip(work.train_batches(0), range(2)):
            loss = work.loss(work.model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return work.model, losses

    model, losses = two_steps()
    assert sum(isinstance(m, Dropout) for m in model.modules()) >= 2
    assert all(math.isfinite(x) for x in losses)
    assert two_steps()[1] == losses


def test_non_finite_values_propagate_like_torchs_dropout():
    """Masking multiplies (as F.dropout does): a dropped NaN or inf stays non-finite, kept values scale."""
    x = torch.tensor([float("nan"), float("inf"), 1.0] * 400)
    for out in (dropout(x, 0.5), torch.nn.functional.dropout(x, 0.5)):
        assert out[0::3].isnan().all() and not out[1::3].isfinite().any()
        assert out[2::3].isfinite().all()
    assert set(dropout(x, 0.5)[2::3].tolist()) == {0.0, LANE_LEVELS / keep_levels(0.5)}
