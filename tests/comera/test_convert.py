"""tensorize / model_size on a toy model with hand-counted sizes."""
import math
import re
import warnings

import pytest
import torch
from torch import nn

from comera.prune import prune
from comera.convert import model_size, tensorize
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding


SPEC = {
    "0": {"kind": "embedding", "row_shape": [4, 5, 5], "col_shape": [2, 3, 4], "rank": 3},
    "1": {"kind": "linear", "in_shape": [4, 6], "out_shape": [5, 6], "rank": 2},
}
# embedding cores 1*4*2*3 + 3*5*3*3 + 3*5*4*1 = 219, gates 3 + 3 -> 225
# linear cores (1,4,2) + (2,6,2) + (2,5,2) + (2,6,1) = 64, gates 3 * 2, bias 30 -> 100
DENSE = {"0": 100 * 24, "1": 24 * 30 + 30, "2": 30 * 5 + 5}
TT = {"0": 225, "1": 100}


def _toy(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(100, 24, padding_idx=0), nn.Linear(24, 30), nn.Linear(30, 5)).to(dtype)


def test_tensorize_replaces_modules_and_reports_hand_counted_compression():
    model = _toy(torch.float64)
    report = tensorize(model, SPEC)
    assert isinstance(model[0], TTMEmbedding) and isinstance(model[1], TTLinear)
    assert isinstance(model[2], nn.Linear)
    assert model[0].padding_idx == 0 and model[0].cores[0].dtype == torch.float64
    dense_total, total = sum(DENSE.values()), TT["0"] + TT["1"] + DENSE["2"]
    assert (report.params_dense_total, report.params_total) == (dense_total, total) == (3305, 480)
    assert (report.params_dense_layers, report.params_layers) == (3150, 325)
    assert report.compression_total == pytest.approx(3305 / 480)
    assert report.compression_layers == pytest.approx(3150 / 325)
    assert report.layers["0"] == {"kind": "embedding", "row_shape": [4, 5, 5], "col_shape": [2, 3, 4],
                                  "ranks": [1, 3, 3, 1], "params_dense": 2400, "params": 225,
                                  "compression": pytest.approx(2400 / 225)}
    assert report.layers["1"]["ranks"] == [1, 2, 2, 2, 1] and report.layers["1"]["params"] == 100
    assert report.as_dict()["params_total"] == 480
    assert model_size(model) == {"params_total": 480.0, "params_factorized_layers": 325.0,
                                 "params_dense_total": 3305.0, "params_dense_layers": 3150.0,
                                 "compression_total": pytest.approx(3305 / 480),
                                 "compression_layers": pytest.approx(3150 / 325)}
    out = model(torch.tensor([[1, 2, 0]]))
    assert out.shape == (1, 3, 5)


def test_model_size_follows_pruning():
    model = _toy()
    tensorize(model, SPEC)
    with torch.no_grad():
        model[0].gates[0][0] = 0.0  # embedding bond 1: 3 -> 2
    prune(model, 1e-2)
    embedding = 1 * 4 * 2 * 2 + 2 * 5 * 3 * 3 + 3 * 5 * 4 + 2 + 3
    size = model_size(model)
    assert size["params_factorized_layers"] == embedding + TT["1"]
    assert size["compression_layers"] == pytest.approx(3150 / (embedding + TT["1"]))
    assert size["compression_total"] == pytest.approx(3305 / (embedding + TT["1"] + DENSE["2"]))


def test_automatic_shapes_with_order():
    model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 48))
    tensorize(model, {"0": {"kind": "embedding", "rank": 4, "order": 3},
                      "1": {"kind": "linear", "rank": 4, "order": 2}})
    assert math.prod(model[0].row_shape) >= 1000 and math.prod(model[0].col_shape) == 64
    assert len(model[1].in_shape) == 2 and math.prod(model[1].in_shape) == 64
    assert model(torch.tensor([3, 999])).shape == (2, 48)


def test_nested_module_names():
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8))])
    tensorize(model, {"blocks.0.0": {"kind": "linear", "in_shape": [2, 4], "out_shape": [4, 2], "rank": 2}})
    assert isinstance(model.blocks[0][0], TTLinear)


@pytest.mark.parametrize("spec,error,message", [
    ({"9": {"kind": "linear", "rank": 2}}, KeyError, "'9'"),
    ({"1": {"kind": "conv", "rank": 2}}, ValueError, "kind"),
    ({"1": {"kind": "linear", "rank": 2, "in_shpe": [4, 6]}}, ValueError, "in_shpe"),
    ({"1": {"kind": "linear"}}, ValueError, "rank"),
    ({"0": {"kind": "embedding", "rank": 2, "lookup": "fast"}}, ValueError, "lookup"),
    ({"0": {"kind": "linear", "rank": 2}}, TypeError, "Embedding"),
    ({"1": {"kind": "embedding", "rank": 2}}, TypeError, "Linear"),
])
def test_bad_spec_is_named(spec, error, message):
    model = _toy()
    with pytest.raises(error, match=message):
        tensorize(model, spec)
    assert isinstance(model[1], nn.Linear)  # nothing replaced on error


@pytest.mark.parametrize("spec,ok", [
    ({"0": {"rank": 3, "init": "official"}, "1": {"rank": 2}}, True),
    ({"0": {"rank": 3, "init": "default", "init_std": 0.5}}, True),
    ({"0": {"rank": 3, "init": "default"}}, False),
    ({"0": {"rank": 3, "init": "svd"}}, False),
    ({"1": {"rank": 2, "init": "svd"}}, False),
])
def test_a_model_on_the_meta_device_builds_unless_the_init_reads_its_weights(spec, ok):
    """A model built on the meta device (no values) tensorizes with schemes that do not read the weights;
    svd (and an embedding's default std) names the layer and the way out instead of a meta-tensor error."""
    with torch.device("meta"):
        model = _toy()
    if ok:
        tensorize(model, spec)
        assert all(p.is_meta for p in model.parameters())
        return
    with pytest.raises(ValueError, match=rf"spec\['{next(iter(spec))}'\].*meta device"):
        tensorize(model, spec)


def test_multihead_attention_keeps_its_out_proj():
    """nn.MultiheadAttention reads out_proj.weight itself: patterns leave that child out, with a warning and
    the report naming it; the layer still runs forward and backward; naming it exactly is an error."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=24, nhead=4, dim_feedforward=48, batch_first=True)
    with pytest.warns(UserWarning, match=r"left out \['self_attn.in_proj_weight', 'self_attn.out_proj'\]: "
                                         r"MultiheadAttention holds its Q/K/V projections as Parameters"):
        report = tensorize(layer, "all-linear", rank=3)
    assert sorted(report.layers) == ["linear1", "linear2"]
    assert sorted(report.skipped) == ["self_attn.in_proj_weight", "self_attn.out_proj"]
    assert "stay dense" in report.skipped["self_attn.in_proj_weight"]
    assert type(layer.self_attn.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    layer(torch.randn(2, 5, 24)).sum().backward()
    with pytest.raises(ValueError, match=r"'self_attn.out_proj' cannot be replaced: MultiheadAttention"):
        tensorize(nn.TransformerEncoderLayer(d_model=24, nhead=4, dim_feedforward=48),
                  {"self_attn.out_proj": {"rank": 3}})


def test_every_attention_projection_left_dense_is_named():
    """Separate key / value sizes: MultiheadAttention holds q_proj_weight, k_proj_weight and v_proj_weight;
    each is named in the report and the warning, for every attention a pattern reached; a pattern that
    reaches no attention names none."""
    model = nn.ModuleDict({"attn": nn.MultiheadAttention(8, 2, kdim=6, vdim=4), "fc": nn.Linear(8, 8)})
    with pytest.warns(UserWarning, match=r"attn.k_proj_weight"):
        report = tensorize(model, "all-linear", rank=2)
    assert sorted(report.skipped) == ["attn.k_proj_weight", "attn.out_proj", "attn.q_proj_weight",
                                      "attn.v_proj_weight"]
    other = nn.ModuleDict({"attn": nn.MultiheadAttention(8, 2), "fc": nn.Linear(8, 8)})
    assert tensorize(other, "fc", rank=2).skipped == {}


class _Tied(nn.Module):
    """A language-model toy whose output layer shares the input embedding's table."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 24)
        self.out = nn.Linear(24, 100, bias=False)
        self.out.weight = self.embed.weight


@pytest.mark.parametrize("spec,warned", [("all-embedding", ["out"]), ("all-linear", ["embed"]),
                                         (["all-embedding", "all-linear"], None)])
def test_a_tied_weight_that_is_replaced_on_one_side_warns(spec, warned):
    model = _Tied()
    if warned is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tensorize(model, spec, rank=3)
        return
    with pytest.warns(UserWarning, match=rf"is tied to {re.escape(str(warned))}.*dense weight, untied"):
        tensorize(model, spec, rank=3)


@pytest.mark.parametrize("kwargs", [{"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}])
def test_embedding_options_a_ttm_table_cannot_apply_are_named(kwargs):
    model = nn.Sequential(nn.Embedding(100, 24, **kwargs))
    with pytest.warns(UserWarning, match=rf"embedding '0' has {re.escape(str(kwargs))}, which TTMEmbedding"):
        tensorize(model, "all-embedding", rank=3)


def test_meta_built_model_to_empty_and_reset_parameters_gives_the_layers_init():
    """The large-model recipe: build on the meta device, tensorize, ``to_empty``, then every module's
    ``reset_parameters``: both layer kinds get their initialization (finite, gates one, the same stds as
    layers built directly)."""
    with torch.device("meta"):
        model = _toy()
    tensorize(model, SPEC)
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()
    direct = _toy()
    torch.manual_seed(1)
    tensorize(direct, SPEC)
    for name in ("0", "1"):
        for gate in model.get_submodule(name).gates:
            assert torch.equal(gate, torch.ones_like(gate))
        for core, twin in zip(model.get_submodule(name).cores, direct.get_submodule(name).cores):
            assert torch.isfinite(core).all()
            assert core.std().item() == pytest.approx(twin.std().item(), rel=0.5)


class Conv1D(nn.Module):
    """Hugging Face's Conv1D as GPT-2 has it: ``y = x W + b`` with ``W`` laid out ``(in, out)``."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.randn(nx, nf, dtype=torch.float64))
        self.bias = nn.Parameter(torch.randn(nf, dtype=torch.float64))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, self.nx), self.weight).reshape(*x.shape[:-1], self.nf)


@pytest.mark.filterwarnings("ignore:tensorize. layer .* grows")  # full rank: larger than the dense layer
@pytest.mark.parametrize("init", ["svd", "official"])
def test_a_conv1d_layer_is_a_linear_layer(init):
    """'all-linear' takes a Conv1D (weight (in, out)); at full rank its TT-SVD gives the dense output."""
    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(30, 24), nn.Tanh(), nn.Linear(30, 6, dtype=torch.float64))
    x = torch.randn(5, 24, dtype=torch.float64)
    want = model(x)
    report = tensorize(model, "all-linear", rank=10**6, init=init)
    assert sorted(report.layers) == ["0", "2"] and isinstance(model[0], TTLinear)
    assert (model[0].in_features, model[0].out_features) == (24, 30)
    if init == "svd":
        torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-10)


@pytest.mark.filterwarnings("ignore:tensorize. layer .* grows")  # full rank: larger than the dense layer
def test_gpt2_tensorizes_and_equals_itself_at_full_rank():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=48, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval().double()
    ids = torch.randint(0, 100, (2, 7))
    want = model(ids).logits
    with pytest.warns(UserWarning, match=r"'lm_head' is tied to \['transformer.wte'\]"):
        report = tensorize(model, "all-linear", rank=10**6, init="svd")
    assert len(report.layers) == 2 * 4 + 1  # c_attn, c_proj, c_fc, mlp.c_proj per block; lm_head
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-9, atol=1e-9)
