"""Core initialization schemes: both give the full weight its target std; "official" splits it as the
official code does (core k scaled by 1/sqrt(r_{k+1}))."""
import math

import pytest
import torch

from comera.convert import tensorize
from comera.init import core_stds
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding


@pytest.mark.parametrize("scheme", ["default", "official"])
@pytest.mark.parametrize("ranks", [[1, 4, 1], [1, 3, 5, 2, 1], [1, 6, 0, 1]])
def test_core_stds_multiply_to_the_target_variance(scheme, ranks):
    stds = core_stds(ranks, 0.3, scheme)
    bonds = math.prod(max(r, 1) for r in ranks[1:-1])
    assert math.prod(s * s for s in stds) * bonds == pytest.approx(0.09)
    if scheme == "official":
        d = len(ranks) - 1
        assert stds == pytest.approx([0.3 ** (1 / d) / math.sqrt(max(ranks[k + 1], 1)) for k in range(d)])
    else:
        assert len(set(stds)) == 1


def test_unknown_scheme_is_named():
    with pytest.raises(ValueError, match="'xavier'"):
        core_stds([1, 2, 1], 1.0, "xavier")
    with pytest.raises(ValueError, match="init='xavier'"):
        TTLinear(8, 8, rank=2, init="xavier")


@pytest.mark.parametrize("init,expected_std", [("default", math.sqrt(1 / (3 * 64))),
                                               ("official", math.sqrt(1 / (64 + 96)))])
def test_tt_linear_weight_std(init, expected_std):
    torch.manual_seed(0)
    stds = [float(TTLinear(64, 96, in_shape=[4, 4, 4], out_shape=[4, 4, 6], rank=8, init=init,
                           dtype=torch.float64).dense_weight().detach().std()) for _ in range(20)]
    assert sum(stds) / len(stds) == pytest.approx(expected_std, rel=0.1)


def test_official_cores_shrink_with_their_right_bond():
    torch.manual_seed(0)
    layer = TTMEmbedding(1000, 64, row_shape=[10, 10, 10], col_shape=[4, 4, 4], rank=[1, 40, 20, 1],
                         init="official", dtype=torch.float64)
    measured = [float(c.std()) for c in layer.cores]
    assert measured == pytest.approx(core_stds([1, 40, 20, 1], 1.0, "official"), rel=0.1)
    assert measured[0] < measured[1] < measured[2]


def test_tensorize_passes_the_scheme_and_the_official_table_std():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(1000, 64), "lin": torch.nn.Linear(64, 64)})
    torch.nn.init.normal_(model["emb"].weight, 0.0, 0.02)
    tensorize(model, {"emb": {"kind": "embedding", "row_shape": [10, 10, 10], "col_shape": [4, 4, 4],
                              "rank": 16, "init": "official"},
                      "lin": {"kind": "linear", "rank": 8, "init": "official"}})
    assert model["lin"].init == "official"
    table_std = float(model["emb"](torch.arange(1000)).std())
    assert table_std == pytest.approx(1.0, rel=0.25)  # the official code's TTM std, not the dense 0.02
    with pytest.raises(ValueError, match="init"):
        tensorize(torch.nn.ModuleDict({"l": torch.nn.Linear(8, 8)}), {"l": {"kind": "linear", "rank": 2,
                                                                            "init": "xavier"}})


@pytest.mark.parametrize("init", ["default", "official"])
def test_embedding_init_std_sets_the_table_std_under_either_scheme(init):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(1000, 64)})  # N(0, 1) as built
    tensorize(model, {"emb": {"kind": "embedding", "row_shape": [10, 10, 10], "col_shape": [4, 4, 4],
                              "rank": 16, "init": init, "init_std": 0.05}})
    assert float(model["emb"](torch.arange(1000)).std()) == pytest.approx(0.05, rel=0.25)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "0.1", True])
def test_bad_embedding_init_std_is_named(bad):
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(1000, 64)})
    with pytest.raises(ValueError, match=r"spec\['emb'\]\['init_std'\]"):
        tensorize(model, {"emb": {"kind": "embedding", "rank": 4, "init_std": bad}})
    assert isinstance(model["emb"], torch.nn.Embedding)
