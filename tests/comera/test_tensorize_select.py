"""tensorize for real models: patterns, "all-linear", the kind read from the module, defaults as keywords,
a warning naming a layer whose TT is larger than its dense module, and the errors that name the key."""
import warnings

import pytest
from torch import nn

from comera import TTLinear, TTMEmbedding, tensorize


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.blocks = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(64, 256), "fc2": nn.Linear(256, 64)})
                                    for _ in range(2))
        self.head = nn.Linear(64, 8)


def _types(model):
    return {name: type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Embedding, TTLinear, TTMEmbedding))}


def test_all_linear_with_keyword_defaults_and_inferred_kind():
    model = Net()
    report = tensorize(model, ["all-linear", "all-embedding"], rank=4, lookup="naive")
    assert set(_types(model).values()) == {"TTLinear", "TTMEmbedding"}
    assert model.embed.lookup == "naive" and model.head.init == "official"
    assert set(report.layers) == {"embed", "head", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1",
                                  "blocks.1.fc2"}


def test_glob_regex_and_exact_names_override_patterns():
    model = Net()
    tensorize(model, {"blocks.*.fc1": {"rank": 8}, "re:blocks\\.[01]\\.fc2": {"rank": 4},
                      "blocks.1.fc1": {"rank": 2}})
    assert _types(model) == {"embed": "Embedding", "blocks.0.fc1": "TTLinear", "blocks.0.fc2": "TTLinear",
                             "blocks.1.fc1": "TTLinear", "blocks.1.fc2": "TTLinear", "head": "Linear"}
    assert max(model.blocks[0].fc1.ranks) == 8 and max(model.blocks[1].fc1.ranks) == 2
    assert max(model.blocks[0].fc2.ranks) == 4


def test_the_old_form_with_exact_names_and_kind_still_works():
    model = Net()
    tensorize(model, {"head": {"kind": "linear", "rank": 2, "in_shape": [4, 4, 4], "out_shape": [2, 2, 2]}})
    assert model.head.in_shape == (4, 4, 4)


@pytest.mark.parametrize("spec,error,message", [
    ({"blocks.*.fc3": {"rank": 2}}, KeyError, r"'blocks\.\*\.fc3'.*blocks\.0\.fc1 \(Linear\)"),
    ({"blocks.*": {"rank": 2}, "*.fc1": {"rank": 4}}, ValueError, r"blocks\.0\.fc1.*'blocks\.\*'.*'\*\.fc1'"),
    ({"re:blocks[": {"rank": 2}}, ValueError, "regular expression"),
    ({"blocks": {"rank": 2}}, TypeError, "ModuleList"),
    ({"head": {"kind": "embedding", "rank": 2}}, TypeError, "Linear"),
])
def test_bad_selections_are_named(spec, error, message):
    model = Net()
    with pytest.raises(error, match=message):
        tensorize(model, spec)
    assert isinstance(model.head, nn.Linear) and isinstance(model.blocks[0].fc1, nn.Linear)


def test_unknown_keyword_is_named():
    with pytest.raises(ValueError, match="rnak"):
        tensorize(Net(), "all-linear", rnak=2)


def test_a_layer_larger_than_its_dense_module_warns_with_its_name_and_both_sizes():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    with pytest.warns(UserWarning) as caught:
        report = tensorize(model, {"0": {"rank": 64}, "1": {"rank": 2}})
    assert len(caught) == 1
    text = str(caught[0].message)
    params, dense = report.layers["0"]["params"], report.layers["0"]["params_dense"]
    assert params > dense == 64 * 64 + 64
    assert "'0'" in text and f"{params:,}" in text and f"{dense:,}" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensorize(nn.Sequential(nn.Linear(64, 64)), "all-linear", rank=4)  # smaller: no warning
