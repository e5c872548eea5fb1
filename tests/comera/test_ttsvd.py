"""TT-SVD constructors: TTLinear.from_linear / TTMEmbedding.from_embedding against dense float64
references (exact at full rank; the reported error is the true one, and the SVD tail for two cores)."""
import math

import pytest
import torch
from torch import nn

from comera import TTLinear, TTMEmbedding, tensorize
from comera.ttsvd import relative_error, tt_svd


def _chain(cores):
    """Dense tensor of TT cores (r, n, r') by plain einsum, float64 (independent of the layers' code)."""
    out = cores[0].double()
    for core in cores[1:]:
        out = torch.einsum("...a,anb->...nb", out, core.double())
    return out.squeeze(0).squeeze(-1)


def _low_rank(rows, cols, rank, noise=0.0):
    torch.manual_seed(0)
    w = torch.randn(rows, rank, dtype=torch.float64) @ torch.randn(rank, cols, dtype=torch.float64)
    return w + noise * torch.randn(rows, cols, dtype=torch.float64)


def test_from_linear_at_full_rank_is_the_linear_layer():
    torch.manual_seed(0)
    linear = nn.Linear(24, 30).double()
    layer = TTLinear.from_linear(linear, rank=1000, in_shape=(4, 6), out_shape=(5, 6))
    x = torch.randn(7, 24, dtype=torch.float64)
    torch.testing.assert_close(layer(x), linear(x), rtol=1e-10, atol=1e-10)
    assert layer.reconstruction_error < 1e-12


def test_from_linear_truncated_error_is_the_svd_tail_for_two_cores():
    linear = nn.Linear(40, 30, bias=False).double()
    with torch.no_grad():
        linear.weight.copy_(_low_rank(30, 40, 30))
    layer = TTLinear.from_linear(linear, rank=5, in_shape=(40,), out_shape=(30,))
    s = torch.linalg.svdvals(linear.weight.detach().T)
    tail = float(s[5:].square().sum().sqrt() / s.square().sum().sqrt())
    assert layer.ranks == [1, 5, 1]
    assert layer.reconstruction_error == pytest.approx(tail, rel=1e-9)
    reference = _chain([layer.cores[0], layer.cores[1]]).reshape(40, 30)
    x = torch.randn(3, 40, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x @ reference, rtol=1e-10, atol=1e-10)
    assert relative_error(linear.weight.T, reference) == pytest.approx(layer.reconstruction_error, rel=1e-9)


def test_from_linear_float32_low_rank_weight_is_recovered_and_trains():
    linear = nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(_low_rank(48, 64, 3).float())
    layer = TTLinear.from_linear(linear, rank=12)
    assert layer.cores[0].dtype == torch.float32 and layer.reconstruction_error < 1e-5
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), linear(x), rtol=1e-4, atol=1e-4)
    layer(x).square().sum().backward()
    assert all(c.grad is not None and c.grad.shape == c.shape for c in layer.cores)


def test_from_embedding_at_full_rank_is_the_table_and_keeps_padding():
    torch.manual_seed(0)
    embedding = nn.Embedding(97, 24, padding_idx=5).double()  # 97 rows padded to prod(row_shape) = 100
    layer = TTMEmbedding.from_embedding(embedding, rank=1000, row_shape=(4, 5, 5), col_shape=(2, 3, 4))
    idx = torch.tensor([[0, 5, 96], [3, 3, 50]])
    torch.testing.assert_close(layer(idx), embedding(idx), rtol=1e-10, atol=1e-10)
    assert layer.padding_idx == 5 and layer.reconstruction_error < 1e-12


def test_from_embedding_truncated_matches_its_cores_and_reports_the_true_error():
    torch.manual_seed(0)
    embedding = nn.Embedding(100, 24).double()
    layer = TTMEmbedding.from_embedding(embedding, rank=3, row_shape=(4, 5, 5), col_shape=(2, 3, 4))
    # reference: the TTM cores contracted by einsum, (m1 n1 .. m3 n3) -> (m1 m2 m3, n1 n2 n3)
    full = _chain([c.reshape(c.shape[0], -1, c.shape[-1]) for c in layer.cores]).reshape(4, 2, 5, 3, 5, 4)
    table = full.permute(0, 2, 4, 1, 3, 5).reshape(100, 24)
    idx = torch.arange(100)
    torch.testing.assert_close(layer(idx), table, rtol=1e-10, atol=1e-10)
    assert layer.ranks == [1, 3, 3, 1]
    assert layer.reconstruction_error == pytest.approx(relative_error(embedding.weight, table), rel=1e-9)
    assert 0 < layer.reconstruction_error < 1


def test_tt_svd_clips_ranks_to_the_unfoldings():
    cores = tt_svd(torch.randn(2 * 3 * 4), [2, 3, 4], [1, 50, 50, 1])
    assert [tuple(c.shape) for c in cores] == [(1, 2, 2), (2, 3, 4), (4, 4, 1)]
    with pytest.raises(ValueError, match="modes"):
        tt_svd(torch.randn(10), [2, 3], [1, 2, 1])


def test_tensorize_svd_init_reports_the_error_per_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 24), nn.Linear(24, 30))
    with pytest.warns(UserWarning, match="'0' grows"):  # full rank: larger than the table
        report = tensorize(model, {"0": {"rank": 1000, "row_shape": [4, 5, 5], "col_shape": [2, 3, 4]},
                                   "1": {"rank": 2}}, init="svd")
    assert report.layers["0"]["reconstruction_error"] < 1e-5
    assert 0 < report.layers["1"]["reconstruction_error"] < 1
    assert math.isclose(report.layers["1"]["reconstruction_error"], model[1].reconstruction_error)
