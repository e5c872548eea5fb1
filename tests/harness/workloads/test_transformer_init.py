"""The CoMERA method's ``init: official`` with ``dense_init: official`` on the transformer: every
parameter that is not TT is drawn as in the official code (ziyangjoy/CoMERA
tensor_layers_CoMERA/Transformer_tensor_sublayers.py and layers.py: PyTorch's default nn.Embedding /
nn.Linear / nn.LayerNorm, TensorizedLinear_module's bias U(-1/sqrt(out), 1/sqrt(out)))."""
import math

import pytest
import torch

from baselines.comera import CoMERAMethod
from comera.tt import TTLinear
from harness.workloads import check_params, transformer
from harness.workloads.base import Workload


def _prepared(init: str, dense_init: str):
    params = check_params("transformer", {"size": "small"})
    torch.manual_seed(0)
    model = transformer.build_model(params)
    workload = Workload(name="transformer", model=model, tt_spec=transformer.tt_spec(params),
                        train_batches=lambda epoch: iter(()), eval_batches=lambda: iter(()),
                        loss=transformer.loss, evaluate=lambda m: {}, steps_per_epoch=1,
                        metric_name="accuracy", official_init=transformer.official_init)
    CoMERAMethod().prepare(model, workload, {"init": init, "dense_init": dense_init}, target_ratio=None,
                           total_steps=10)
    return params, model


@pytest.fixture(scope="module")
def official():
    return _prepared("official", "official")


def _std(t):
    return float(t.detach().double().std())


def test_official_init_embeddings_are_standard_normal(official):
    _, model = official
    embeddings = model.encoder.embeddings
    assert _std(embeddings.position.weight) == pytest.approx(1.0, rel=0.05)   # 64 x 128 entries
    assert _std(embeddings.segment.weight) == pytest.approx(1.0, rel=0.15)    # 2 x 128 entries
    assert abs(float(embeddings.position.weight.detach().mean())) < 0.05


def test_official_init_tt_biases_are_bounded_by_their_output_width(official):
    _, model = official
    layers = {name: m for name, m in model.named_modules() if isinstance(m, TTLinear)}
    assert {"encoder.blocks.0.ffn_in", "encoder.blocks.0.ffn_out", "fc1"} <= set(layers)
    for name, layer in layers.items():
        bound = 1 / math.sqrt(layer.out_features)
        bias = layer.bias.detach()
        assert float(bias.abs().max()) <= bound, name
        assert float(bias.abs().max()) > 0.9 * bound, name
        assert _std(bias) == pytest.approx(bound / math.sqrt(3), rel=0.2), name  # U(-b, b): std b / sqrt(3)
    # d_ff = 4 d_model: the official bounds of ffn_in and ffn_out are nn.Linear's the other way round
    ffn_in = layers["encoder.blocks.0.ffn_in"]
    assert float(ffn_in.bias.detach().abs().max()) < 1 / math.sqrt(ffn_in.in_features) / 1.5


def test_official_init_dense_linear_and_layernorm_are_pytorch_defaults(official):
    _, model = official
    bound = 1 / math.sqrt(model.fc2.in_features)
    weight = model.fc2.weight.detach()
    assert float(weight.abs().max()) <= bound
    assert _std(weight) == pytest.approx(bound / math.sqrt(3), rel=0.1)   # 3 x 128 entries
    assert float(model.fc2.bias.detach().abs().max()) <= bound
    assert float(model.fc2.bias.detach().abs().max()) > 0
    for norm in (model.encoder.embeddings.norm, model.encoder.blocks[0].norm1):
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
        assert torch.equal(norm.bias, torch.zeros_like(norm.bias))


@pytest.mark.parametrize("init", ["official", "default"])
def test_dense_init_workload_keeps_the_bert_init(init):
    _, model = _prepared(init, "workload")
    assert _std(model.encoder.embeddings.position.weight) == pytest.approx(transformer.BERT_INIT_STD,
                                                                           rel=0.05)
    assert torch.equal(model.fc2.bias, torch.zeros_like(model.fc2.bias))


def test_dense_init_is_checked():
    from baselines.comera import check_params as method_params
    assert method_params(None)["dense_init"] == "workload"
    with pytest.raises(ValueError, match="dense_init"):
        method_params({"dense_init": "bert"})
