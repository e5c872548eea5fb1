"""Model size: exact counts, rank shares (gauge-invariant), the l0 size and its soft surrogate."""
import math

import pytest
import torch
from torch import nn

from comera import size
from comera.prune import prune
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding

MODES = [2 * 2, 5 * 3, 6 * 4]  # the TTM's u_k


def ttm(seed=0):
    torch.manual_seed(seed)
    layer = TTMEmbedding(50, 24, row_shape=[2, 5, 6], col_shape=[2, 3, 4], rank=[1, 3, 4, 1],
                         dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    return layer


def tt(seed=0):
    torch.manual_seed(seed)
    layer = TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=[1, 2, 4, 3, 4, 2, 1],
                     dtype=torch.float64)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    return layer


def hand_size(ranks, modes=MODES):
    return sum(ranks[k] * modes[k] * ranks[k + 1] for k in range(len(modes))) + sum(ranks[1:-1])


def test_stored_size_counts_every_core_and_gate():
    layer = ttm()
    assert size.tt_parameter_count(layer) == hand_size([1, 3, 4, 1]) == 295
    model = nn.Sequential(ttm(), nn.Linear(24, 3), ttm(seed=1))
    assert size.ranks(model) == {"0": [1, 3, 4, 1], "2": [1, 3, 4, 1]}
    assert size.tt_parameter_count(model) == 2 * 295


@pytest.mark.parametrize("make", [ttm, tt], ids=["ttm", "tt"])
def test_rank_shares_do_not_depend_on_how_the_scale_is_split(make):
    """Scaling gate entry i by c and the matching slice of the left core by 1 / c leaves the weight and
    every share as they were; the raw gate changes."""
    layer = make()
    dense = layer.dense_weight().detach().clone()
    shares = size.rank_shares(layer)
    with torch.no_grad():
        layer.gates[1][0] *= 40.0
        layer.cores[1][..., 0] /= 40.0
    moved = layer.dense_weight().detach()
    torch.testing.assert_close(moved, dense)
    for before, after in zip(shares, size.rank_shares(layer)):
        torch.testing.assert_close(after, before)
        assert float(after.max()) == pytest.approx(1.0)


def test_a_rank_share_is_the_norm_of_its_term_of_the_weight():
    """Share of rank i of a bond: the norm of the weight with only that rank left on the bond (float64),
    over the bond's largest."""
    layer = tt()
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(-1.0, 1.0)
    for k, share in enumerate(size.rank_shares(layer)):
        gate = layer.gates[k]
        saved = gate.detach().clone()
        norms = []
        for i in range(gate.numel()):
            with torch.no_grad():
                gate.zero_()
                gate[i] = saved[i]
            norms.append(layer.dense_weight().detach().norm())
        with torch.no_grad():
            gate.copy_(saved)
        norms = torch.stack(norms)
        torch.testing.assert_close(share, norms / norms.max())


def test_l0_size_counts_the_ranks_above_the_threshold_as_pruning_would_leave_them():
    layer = ttm()
    with torch.no_grad():
        layer.gates[0][1] = 0.0       # bond 1 counts 2
        layer.gates[1][:2] = 1e-6     # bond 2 counts 2
    assert float(size.size_l0(layer, 1e-2)) == hand_size([1, 2, 2, 1])
    prune(layer, 1e-2, min_rank=0)
    assert float(size.size_l0(layer, 1e-2)) == size.tt_parameter_count(layer) == hand_size([1, 2, 2, 1])


def test_soft_size_is_the_l0_size_on_equal_gates_and_ignores_a_bond_scale():
    layer = ttm()
    with torch.no_grad():
        layer.gates[0].fill_(0.7)
        layer.gates[1].copy_(torch.tensor([2.0, 2.0, 0.0, 0.0], dtype=torch.float64))
    assert float(size.soft_size(layer).detach()) == pytest.approx(hand_size([1, 3, 2, 1]))
    with torch.no_grad():
        layer.gates[1].uniform_(0.1, 1.0)
    before = float(size.soft_size(layer))
    with torch.no_grad():
        layer.gates[1].mul_(0.01)      # every gate of the bond shrinks together: the same soft size
    assert float(size.soft_size(layer)) == pytest.approx(before, rel=1e-12)
    (grad,) = torch.autograd.grad(size.soft_size(layer), [layer.gates[1]])
    assert float(grad @ layer.gates[1].detach()) == pytest.approx(0.0, abs=1e-9)  # no pull on the scale
    assert float(grad[layer.gates[1].argmin()]) > 0 > float(grad[layer.gates[1].argmax()])


def explicit_sizes(model):
    """Per-module loops over the cores: (soft size, sum of squared cores)."""
    soft = squares = 0.0
    for _, module in size.tensorized_modules(model):
        gates = [g.detach() for g in module.gates]
        ranks = [1.0] + [float((g.abs().sum() / g.norm()) ** 2) if g.numel() else 0.0 for g in gates] + [1.0]
        for k, core in enumerate(module.cores):
            soft += math.prod(core.shape[1:-1]) * ranks[k] * ranks[k + 1]
            squares += float(core.detach().square().sum())
        soft += sum(ranks[1:-1])
    return soft, squares


def test_vectorized_sizes_match_per_module_loops_across_pruning():
    torch.manual_seed(3)
    model = nn.ModuleDict({
        "tt": TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=3, dtype=torch.float64),
        "ttm": ttm(),
        "flat": TTMEmbedding(9, 6, row_shape=[9], col_shape=[6], rank=1, dtype=torch.float64),
    })
    with torch.no_grad():
        for _, module in size.tensorized_modules(model):
            for gate in module.gates:
                gate.uniform_(-0.05, 1.0)
        model["ttm"].gates[1][:2] = 0.0
    for _ in range(2):  # before and after pruning (the cached layout must follow the new shapes)
        soft, squares = explicit_sizes(model)
        assert float(size.soft_size(model)) == pytest.approx(soft, rel=1e-12)
        assert float(size.core_l2(model)) == pytest.approx(squares, rel=1e-12)
        prune(model, 0.02)
    assert model["ttm"].ranks == [1, 3, 2, 1]


def test_core_l2_gradient_is_twice_every_core():
    """The l2 term's own backward (one multi-tensor product) against the closed form 2 G, its double
    backward (the Hessian is 2 I), over TT and TTM cores together."""
    model = nn.ModuleDict({"tt": tt(), "ttm": ttm()})
    cores = [c for _, m in size.tensorized_modules(model) for c in m.cores]
    for grad, core in zip(torch.autograd.grad(size.core_l2(model), cores), cores):
        torch.testing.assert_close(grad, 2 * core.detach())
    vectors = [torch.randn_like(c) for c in cores]
    first = torch.autograd.grad(size.core_l2(model), cores, create_graph=True)
    for got, v in zip(torch.autograd.grad(first, cores, vectors), vectors):
        torch.testing.assert_close(got, 2 * v)


def test_cached_layout_follows_replaced_parameters_and_dtype():
    layer = ttm()
    assert float(size.core_l2(layer)) == pytest.approx(float(sum(c.square().sum() for c in layer.cores)))
    with torch.no_grad():
        layer.cores[1] = nn.Parameter(torch.full_like(layer.cores[1], 2.0))
    expected = float(sum(c.square().sum() for c in layer.cores))
    assert float(size.core_l2(layer)) == pytest.approx(expected)
    layer.float()
    assert size.core_l2(layer).dtype == size.soft_size(layer).dtype == torch.float32
    assert float(size.core_l2(layer)) == pytest.approx(expected, rel=1e-6)
