"""TTMEmbedding: every lookup mode against an independent float64 reference, padding, errors."""
import itertools
import math

import pytest
import torch

from comera import ttm
from comera.ttm import HalfTableRows, TTMEmbedding


LEVELS = list(itertools.product([False, True], [False, True]))  # (tensor_index_level, unique_rows)
SHAPES = [  # num_embeddings, embedding_dim, row_shape, col_shape, ranks
    (50, 24, [2, 5, 6], [2, 3, 4], [1, 3, 4, 1]),
    (37, 12, [2, 2, 3, 4], [1, 2, 3, 2], [1, 2, 5, 3, 1]),
    (9, 6, [9], [6], [1, 1]),
]


def _layer(shape, *, tensor_index_level, unique_rows, padding_idx=None, seed=0, chunk_bytes=None):
    torch.manual_seed(seed)
    num, dim, rows, cols, ranks = shape
    chunk = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    layer = TTMEmbedding(num, dim, row_shape=rows, col_shape=cols, rank=ranks, padding_idx=padding_idx,
                         tensor_index_level=tensor_index_level, unique_rows=unique_rows, dtype=torch.float64,
                         **chunk)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    return layer


def _reference_table(layer):
    """Entry-by-entry product of core slices and diagonal gate matrices (no shared code with the layer)."""
    cores = [c.detach() for c in layer.cores]
    gates = [torch.diag(g.detach()) for g in layer.gates] + [torch.eye(1, dtype=torch.float64)]
    table = torch.zeros(math.prod(layer.row_shape), math.prod(layer.col_shape), dtype=torch.float64)
    for r, row in enumerate(itertools.product(*map(range, layer.row_shape))):
        for c, col in enumerate(itertools.product(*map(range, layer.col_shape))):
            acc = torch.eye(1, dtype=torch.float64)
            for k, (i, j) in enumerate(zip(row, col)):
                acc = acc @ cores[k][:, i, j, :] @ gates[k]
            table[r, c] = acc[0, 0]
    table = table[: layer.num_embeddings]
    if layer.padding_idx is not None:
        table[layer.padding_idx] = 0
    return table


@pytest.mark.parametrize("shape", SHAPES, ids=["d3", "d4", "d1"])
def test_dense_weight_matches_entrywise_reference(shape):
    layer = _layer(shape, tensor_index_level=True, unique_rows=True, padding_idx=2)
    torch.testing.assert_close(layer.dense_weight().detach(), _reference_table(layer), rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["default_chunks", "one_row_chunks"])
@pytest.mark.parametrize("shape", SHAPES, ids=["d3", "d4", "d1"])
@pytest.mark.parametrize("tensor_index_level,unique_rows", LEVELS)
def test_lookup_matches_dense_weight_values_and_gradients(shape, tensor_index_level,
                                                          unique_rows, chunk_bytes):
    layer = _layer(shape, tensor_index_level=tensor_index_level, unique_rows=unique_rows, padding_idx=1,
                   chunk_bytes=chunk_bytes)
    num = shape[0]
    idx = torch.tensor([[1, 3, 3, num - 1, 0], [1, 0, 3, 7 % num, 3]])  # repeats and padding
    probe = torch.randn(*idx.shape, shape[1], dtype=torch.float64)

    out = layer(idx)
    (out * probe).sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    expected = layer.dense_weight()[idx]
    (expected * probe).sum().backward()

    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    for got, want in zip(grads, [p.grad for p in layer.parameters()]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("tensor_index_level,unique_rows", LEVELS)
def test_padding_row_is_zero_and_gets_no_gradient(tensor_index_level, unique_rows):
    layer = _layer(SHAPES[0], tensor_index_level=tensor_index_level, unique_rows=unique_rows, padding_idx=5)
    out = layer(torch.tensor([5, 5, 5]))
    assert torch.count_nonzero(out) == 0
    out.sum().backward()
    assert all(torch.count_nonzero(p.grad) == 0 for p in layer.parameters())


@pytest.mark.parametrize("ranks", [[1, 3, 0, 1], [1, 0, 3, 1]], ids=["inside_right_half", "between_halves"])
@pytest.mark.parametrize("lookup", ["naive", "optimized"])
def test_bond_of_rank_zero_gives_zero_rows(lookup, ranks):
    layer = TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=ranks, lookup=lookup)
    out = layer(torch.tensor([0, 4, 49]))
    assert out.shape == (3, 24) and torch.count_nonzero(out) == 0
    out.sum().backward()


# several chunks with a remainder, one exact chunk, one larger
@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_half_table_rows_values_gradcheck_and_gradgradcheck(chunk):
    gen = torch.Generator().manual_seed(chunk)
    left = torch.randn(3, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    right = torch.randn(5, 4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    left_index = torch.tensor([0, 2, 2, 1, 0, 2, 1])  # repeats: gradients of one table row accumulate
    right_index = torch.tensor([4, 0, 4, 3, 3, 1, 4])

    out = HalfTableRows.apply(left, right, left_index, right_index, chunk)

    expected = torch.einsum("bir,brj->bij", left.detach()[left_index], right.detach()[right_index])
    torch.testing.assert_close(out.detach(), expected, rtol=0, atol=1e-12)
    rows = lambda a, b: HalfTableRows.apply(a, b, left_index, right_index, chunk)  # noqa: E731
    assert torch.autograd.gradcheck(rows, (left, right))
    assert torch.autograd.gradgradcheck(rows, (left, right))  # create_graph: the backward is differentiable


def test_half_table_rows_names_a_bad_chunk():
    table = torch.zeros(2, 1, 1)
    with pytest.raises(ValueError, match="chunk=0"):
        HalfTableRows.apply(table, table, torch.tensor([0]), torch.tensor([1]), 0)


def test_lookup_saves_no_per_row_gathers():
    """Saved floating tensors are no larger than a half table (M x N x r), saved index tensors no longer than
    the index count; the per-row gathers of the two half tables (rows x N x r each) would exceed both."""
    torch.manual_seed(0)
    layer = TTMEmbedding(4096, 16, row_shape=[8, 8, 8, 8], col_shape=[2, 2, 2, 2], rank=4)
    idx = torch.randint(0, 4096, (600,))
    rows = int(torch.unique(idx).numel())
    half_table = 8 * 8 * 2 * 2 * 4  # M_L * N_L * r = M_R * r * N_R
    assert rows * 2 * 2 * 4 > max(half_table, idx.numel())  # a per-row gather would fail the bounds below
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tensor.numel()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = layer(idx)
    out.sum().backward()

    assert saved
    too_large = [(dtype, numel) for dtype, numel in saved
                 if numel > (half_table if dtype.is_floating_point else idx.numel())]
    assert not too_large


def test_autocast_runs_the_half_table_product_in_the_autocast_dtype():
    torch.manual_seed(0)
    layer = TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=3)  # left half: a bare core
    idx = torch.tensor([1, 7, 7, 49])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(idx)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), layer(idx).detach(), rtol=0.05, atol=0.05)


def test_lookup_modes_agree_on_zipf_indices_in_float32():
    torch.manual_seed(1)
    naive = TTMEmbedding(3000, 48, row_shape=[10, 15, 20], col_shape=[4, 3, 4], rank=8, lookup="naive")
    optimized = TTMEmbedding(3000, 48, row_shape=[10, 15, 20], col_shape=[4, 3, 4], rank=8)
    optimized.load_state_dict(naive.state_dict())
    weights = 1.0 / torch.arange(1, 3001, dtype=torch.float64) ** 1.1
    idx = torch.multinomial(weights, 5000, replacement=True)
    torch.testing.assert_close(optimized(idx), naive(idx), rtol=1e-5, atol=1e-6)


def test_ranks_clip_and_initial_table_scale():
    torch.manual_seed(0)
    layer = TTMEmbedding(1000, 64, row_shape=[10, 10, 10], col_shape=[4, 4, 4], rank=100, init_std=0.5)
    assert layer.ranks == [1, 40, 40, 1]  # min(10*4, 10*4*10*4) on both internal bonds
    assert [tuple(c.shape) for c in layer.cores] == [(1, 10, 4, 40), (40, 10, 4, 40), (40, 10, 4, 1)]
    assert [g.shape[0] for g in layer.gates] == [40, 40]
    assert abs(float(layer.dense_weight().detach().std()) - 0.5) < 0.1


def test_automatic_shapes_use_comera_shapes():
    layer = TTMEmbedding(30522, 768, rank=4)
    assert math.prod(layer.row_shape) >= 30522 and math.prod(layer.col_shape) == 768
    assert len(layer.row_shape) == len(layer.col_shape) == 3


@pytest.mark.parametrize("kwargs,message", [
    ({"row_shape": [2, 5], "col_shape": [4, 6]}, "num_embeddings"),
    ({"row_shape": [8, 8], "col_shape": [4, 5]}, "embedding_dim"),
    ({"row_shape": [8, 8], "col_shape": [4, 2, 3]}, "same"),
    ({"row_shape": [8, 8], "col_shape": [4, 6], "lookup": "fast"}, "lookup"),
    ({"row_shape": [8, 8], "col_shape": [4, 6], "padding_idx": 64}, "padding_idx"),
])
def test_bad_configuration_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TTMEmbedding(64, 24, rank=2, **kwargs)


def test_out_of_range_index_is_named():
    layer = TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=2)
    with pytest.raises(IndexError, match="50"):
        layer(torch.tensor([0, 50]))  # row 50 exists in the padded 60-row table but not in the embedding
    with pytest.raises(TypeError, match="int"):
        layer(torch.tensor([0.0]))


def test_lookup_under_cuda_graph_capture_skips_the_host_syncing_unique(monkeypatch):
    """torch.unique's output size needs a host sync, which invalidates a CUDA graph capture (the H200's
    whole-step capture of CoMERA failed with cudaErrorStreamCaptureInvalidated): while a capture runs,
    every row is computed, with the same values and gradients."""
    torch.manual_seed(0)
    emb = TTMEmbedding(64, 16, row_shape=[4, 4, 4], col_shape=[4, 2, 2], rank=4)
    idx = torch.tensor([[3, 3, 7, 60], [7, 0, 3, 3]])
    expected = emb(idx)
    expected_grads = torch.autograd.grad(expected.square().sum(), list(emb.cores))
    unique_calls = []
    real_unique = torch.unique
    monkeypatch.setattr(torch, "unique", lambda *a, **k: unique_calls.append(1) or real_unique(*a, **k))
    monkeypatch.setattr(ttm, "_capturing", lambda t: True)
    captured = emb(idx)
    grads = torch.autograd.grad(captured.square().sum(), list(emb.cores))
    assert unique_calls == [] and torch.allclose(captured, expected, atol=1e-6)
    assert all(torch.allclose(g, e, atol=1e-5) for g, e in zip(grads, expected_grads))


@pytest.mark.parametrize("lookup", ["naive", "optimized"])
def test_torch_compile_takes_the_lookup_in_one_graph(lookup):
    """No graph break (fullgraph: a break would raise): the range check is a traced assertion and the
    data-dependent torch.unique steps aside; values and gradients as eager, a bad index still refused."""
    torch._dynamo.reset()  # a static token count: one more would be traced as a symbolic one
    torch.manual_seed(0)
    emb = TTMEmbedding(64, 16, row_shape=[4, 4, 4], col_shape=[4, 2, 2], rank=4, lookup=lookup,
                       dtype=torch.float64)
    idx = torch.tensor([[3, 3, 7, 60], [7, 0, 3, 3]])
    expected = emb(idx)
    expected_grads = torch.autograd.grad(expected.square().sum(), list(emb.cores))
    compiled = torch.compile(emb, backend="eager", fullgraph=True)
    out = compiled(idx)
    grads = torch.autograd.grad(out.square().sum(), list(emb.cores))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match=r"index out of range \[0, 64\)"):
        compiled(torch.tensor([[3, 64]]))
    torch._dynamo.reset()
