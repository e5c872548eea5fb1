"""A pruned model's state dict loads into a freshly tensorized model without passing ranks by hand."""
import io

import pytest
import torch
from torch import nn

from comera import prune, ranks, tensorize


def _model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 4))
    tensorize(model, {"0": {"rank": 4}, "1": {"rank": 6}})
    return model


def _prune_some(model):
    with torch.no_grad():
        model[0].gates[0][:2] = 0.0
        model[1].gates[3].zero_()      # a zero layer: with min_rank 0 it is removed, every bond of size 0
    prune(model, 1e-2, min_rank=0)


def test_pruned_state_dict_reloads_into_a_fresh_model_through_a_file():
    model = _model()
    _prune_some(model)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    fresh = _model(seed=1)
    assert ranks(fresh) != ranks(model)
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    assert ranks(fresh) == ranks(model)
    assert ranks(fresh)["0"][1] == 2 and set(ranks(fresh)["1"][1:-1]) == {0}
    idx = torch.tensor([[1, 7, 49]])
    torch.testing.assert_close(fresh(idx), model(idx), rtol=0, atol=0)
    fresh(idx).sum().backward()  # the reloaded layers train
    optimizer = torch.optim.AdamW(fresh.parameters())
    optimizer.step()


def test_a_checkpoint_whose_bonds_do_not_chain_is_refused_naming_the_layer():
    model = _model()
    state = model.state_dict()
    # core 1 now ends in 3 ranks, core 2 still starts with 6
    state["1.cores.1"] = state["1.cores.1"][:, :, :3]
    with pytest.raises(RuntimeError, match=r"1\.: the checkpoint's cores and gates do not form one "
                                           r"tensor train"):
        _model().load_state_dict(state)


def test_other_mode_sizes_are_still_a_size_mismatch():
    model = _model()
    state = model.state_dict()
    state["1.cores.0"] = torch.zeros(1, 3, 6)  # mode size 3 instead of the layer's
    with pytest.raises(RuntimeError, match="size mismatch for 1.cores.0"):
        _model().load_state_dict(state)
