"""Physical pruning: decided by rank shares, floors per bond and on the size, optimizer state sliced,
layers removed only when allowed and then storing nothing."""
import pytest
import torch

from comera import size
from comera.prune import prune
from tests.comera.test_size import hand_size, tt, ttm

LAYERS = [pytest.param(ttm, lambda: torch.tensor([[0, 3, 3, 49], [7, 12, 7, 1]]), id="ttm"),
          pytest.param(tt, lambda: torch.randn(2, 5, 24, dtype=torch.float64), id="tt")]


def test_a_rank_goes_by_its_share_not_by_its_gate():
    """A tiny gate whose cores carry the scale stays; a large gate on a rank with nothing in its core slice
    goes; a negative gate is as good as a positive one."""
    layer = ttm()
    with torch.no_grad():
        layer.gates[1][0] = 1e-4
        layer.cores[1][..., 0] *= 1e5   # same share as before the two changes
        layer.cores[1][..., 1] = 0.0    # rank 1 contributes nothing, gate 1.0 or not
        layer.gates[1][1] = 1.0
        layer.gates[1][2] = -0.9
    prune(layer, 1e-2)
    assert layer.ranks == [1, 3, 3, 1]
    gates = layer.gates[1].detach()
    assert float(gates[0]) == pytest.approx(1e-4) and float(gates[1]) == pytest.approx(-0.9)


def test_every_bond_keeps_min_rank_ranks_unless_removal_is_allowed():
    """A zero bond makes the weight zero, so no rank of any bond contributes: each keeps min_rank of them
    (default 1); with min_rank=0 the layer is removed and stores nothing."""
    layer = ttm()
    with torch.no_grad():
        layer.gates[1].zero_()
    report = prune(layer, 1e-2)
    assert layer.ranks == [1, 1, 1, 1] and report["removed"] == []
    report = prune(layer, 1e-2, min_rank=0)
    assert report["removed"] == [""] and layer.ranks == [1, 0, 0, 1]
    assert size.tt_parameter_count(layer) == report["params_after"] == 0
    assert size.removed_layers(layer) == [""]
    assert torch.count_nonzero(layer(torch.tensor([1, 2]))) == 0
    assert prune(layer, 1e-2, min_rank=0)["removed"] == []  # removed once


def test_a_removed_linear_layer_outputs_its_bias():
    layer = tt()
    with torch.no_grad():
        layer.bias.uniform_(-1, 1)
        layer.gates[2].zero_()
    prune(layer, 1e-2, min_rank=0)
    assert layer.ranks == [1, 0, 0, 0, 0, 0, 1]
    x = torch.randn(3, 24, dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer.bias.detach().expand(3, 20))


def test_a_size_floor_removes_smallest_shares_first_and_stops_at_the_floor():
    layer = ttm()
    with torch.no_grad():
        layer.cores[2].fill_(1.0)  # equal right slices: bond 2's shares follow its gates
        layer.gates[1][:] = torch.tensor([0.005, 1e-4, 1e-3, 0.9], dtype=torch.float64)
    floor = hand_size([1, 3, 2, 1])  # room for two of the three ranks below the threshold
    report = prune(layer, 1e-2, min_size=floor)
    assert layer.ranks == [1, 3, 2, 1] and report["params_after"] == floor
    torch.testing.assert_close(layer.gates[1].detach(), torch.tensor([0.005, 0.9], dtype=torch.float64))
    prune(layer, 1e-2, min_size=floor + 1)  # no room at all: nothing removed
    assert layer.ranks == [1, 3, 2, 1]


def test_bad_min_rank_is_named():
    with pytest.raises(ValueError, match="min_rank"):
        prune(ttm(), 1e-2, min_rank=-1)


@pytest.mark.parametrize("make,inputs", LAYERS)
def test_prune_keeps_the_output_of_the_kept_ranks_and_slices_optimizer_state(make, inputs):
    layer = make()
    inputs = inputs()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    for _ in range(2):
        loss = layer(inputs).square().sum()  # stays alive across prune, like the runner's loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        layer.gates[0][1] = 0.0
        layer.gates[1][0] = 0.0
        expected = layer(inputs)
    expected_ranks = list(layer.ranks)
    expected_ranks[1] -= 1
    expected_ranks[2] -= 1
    params = list(layer.parameters())
    steps = {id(p): opt.state[p]["step"].clone() for p in params}
    keep_first = torch.tensor([0] + list(range(2, layer.ranks[1])))
    keep_second = torch.arange(1, layer.ranks[2])
    core1_avg = opt.state[layer.cores[1]]["exp_avg"].clone()
    count_before = size.tt_parameter_count(layer)

    report = prune(layer, 1e-2, [opt])

    assert layer.ranks == expected_ranks == report["ranks_after"][""]
    assert report["params_after"] == size.tt_parameter_count(layer) < count_before
    assert [id(p) for p in layer.parameters()] == [id(p) for p in params]
    with torch.no_grad():
        torch.testing.assert_close(layer(inputs), expected, rtol=1e-12, atol=1e-12)
    # optimizer state is sliced, not reset: core 1 lost rank 1 on its first axis and rank 0 on its last
    torch.testing.assert_close(opt.state[layer.cores[1]]["exp_avg"],
                               core1_avg.index_select(0, keep_first).index_select(-1, keep_second))
    for p in params:
        assert opt.state[p]["exp_avg"].shape == p.shape == opt.state[p]["exp_avg_sq"].shape
        torch.testing.assert_close(opt.state[p]["step"], steps[id(p)])
    layer(inputs).square().sum().backward()  # training continues on the smaller layer
    opt.step()
    assert float(opt.state[params[0]]["step"]) == 3.0
    assert all(torch.isfinite(p).all() for p in layer.parameters())
