"""baselines.dense.adamw: the implementation it picks, and that fused AdamW trains and prunes exactly like
the single-tensor loop (CoMERA slices its optimizer state when ranks shrink)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from baselines.dense import adamw
from comera.prune import prune
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding


def test_cpu_float_parameters_get_the_fused_kernel_groups_too():
    layer = nn.Linear(4, 3)
    opt, impl = adamw(layer.parameters(), lr=1e-3, weight_decay=0.0)
    assert impl == "fused" and opt.defaults["fused"]
    opt, impl = adamw([{"params": [layer.weight], "lr": 1e-2}, {"params": [layer.bias]}], lr=1e-3,
                      weight_decay=0.1)
    assert impl == "fused" and [g["lr"] for g in opt.param_groups] == [1e-2, 1e-3]


def test_non_float_parameters_fall_back_to_torchs_default():
    """No fused kernel for complex parameters; torch has no foreach kernels on CPU, so the loop."""
    z = nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    opt, impl = adamw([z], lr=1e-3, weight_decay=0.0)
    assert impl == "for-loop" and not opt.defaults["fused"] and opt.defaults["foreach"] is False
    z.grad = torch.ones_like(z)
    opt.step()
    assert torch.isfinite(torch.view_as_real(z)).all()


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = TTMEmbedding(64, 16, row_shape=(4, 4, 4), col_shape=(2, 2, 4), rank=6,
                                dtype=torch.float64)
        self.fc = TTLinear(16, 32, in_shape=(4, 4), out_shape=(4, 8), rank=6, dtype=torch.float64)

    def forward(self, idx):
        return self.fc(self.emb(idx).mean(1))


def _steps(model, opt, batches):
    for idx in batches:
        model(idx).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_matches_the_loop_through_pruning(weight_decay):
    torch.manual_seed(0)
    fused_model = _Model()
    loop_model = copy.deepcopy(fused_model)
    fused, impl = adamw(fused_model.parameters(), lr=1e-2, weight_decay=weight_decay)
    loop = torch.optim.AdamW(loop_model.parameters(), lr=1e-2, weight_decay=weight_decay, foreach=False)
    assert impl == "fused"
    batches = [torch.randint(0, 64, (8, 5)) for _ in range(6)]
    _steps(fused_model, fused, batches[:3])
    _steps(loop_model, loop, batches[:3])
    for model, opt in ((fused_model, fused), (loop_model, loop)):
        with torch.no_grad():
            for module in (model.emb, model.fc):
                module.gates[0][::2] = 0.0  # half of the first bond of each layer goes
        prune(model, 1e-2, [opt])
    assert fused_model.fc.ranks == loop_model.fc.ranks and fused_model.fc.ranks[1] < 6
    for p in fused_model.parameters():
        state = fused.state[p]
        assert state["exp_avg"].shape == state["exp_avg_sq"].shape == p.shape
    _steps(fused_model, fused, batches[3:])
    _steps(loop_model, loop, batches[3:])
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert float(fused.state[fused_model.fc.cores[0]]["step"]) == 6.0


@pytest.mark.parametrize("name", ["dense", "comera", "lte"])
def test_methods_use_it_and_record_the_implementation(name):
    from baselines import get_method
    from tests.baselines.conftest import make_toy_workload

    workload = make_toy_workload()
    prepared = get_method(name).prepare(workload.model, workload, {}, target_ratio=None, total_steps=10)
    assert prepared.settings["optimizer_impl"] == "fused"
    assert all(opt.defaults["fused"] for opt in prepared.optimizers)
