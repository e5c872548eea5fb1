"""docs/library.md's worked example runs as written: the MLP reaches its size target within 15% at the
accuracy of its dense twin (within 0.02), reloaded from its saved state dict."""
import re
from pathlib import Path

import pytest
import torch
from torch import nn

DOC = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def _block(heading: str) -> str:
    section = DOC.read_text().split(f"## {heading}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _dense_accuracy(ns: dict) -> float:
    """The dense twin: same model, data, loop, optimizer and learning rate."""
    torch.manual_seed(1)
    dense = ns["mlp"]()
    optimizer = torch.optim.AdamW(dense.parameters(), lr=3e-3)
    for _ in range(ns["steps"]):
        batch = torch.randint(0, len(ns["x_train"]), (64,))
        nn.functional.cross_entropy(dense(ns["x_train"][batch]), ns["y_train"][batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return ns["accuracy"](dense)


@pytest.fixture(scope="module")
def worked(tmp_path_factory):
    """The worked example run once as written (in a temporary folder): its names, the random state right
    after it (where the next block of the page starts) and the dense twin's accuracy."""
    folder = tmp_path_factory.mktemp("worked")
    ns: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        exec(compile(_block("Worked example"), str(DOC), "exec"), ns)
    after = torch.get_rng_state()
    return ns, after, folder, _dense_accuracy(ns)


@pytest.mark.slow
def test_worked_example_reaches_its_target_at_the_dense_twins_accuracy(worked):
    ns, _, folder, dense_accuracy = worked
    adapt, model, fresh = ns["adapt"], ns["model"], ns["fresh"]
    assert adapt.stage == "late" and adapt.steps == ns["steps"]
    assert adapt.size_target <= adapt.size <= 1.15 * adapt.size_target
    assert ns["comera"].ranks(fresh) == ns["comera"].ranks(model) and (folder / "mlp_tt.pt").exists()
    tt_accuracy = ns["accuracy"](fresh)
    assert tt_accuracy >= dense_accuracy - 0.02, (tt_accuracy, dense_accuracy)


@pytest.mark.slow
def test_mixed_precision_with_accumulated_micro_batches_reaches_its_target_too(worked, monkeypatch):
    """The section "Mixed precision and gradient accumulation" after the worked example: a GradScaler,
    bfloat16 autocast and two micro-batches per step, one of whose task losses overflows (the scaler skips
    that step): the same size target and accuracy checks, and a finite running loss."""
    done, after, _, dense_accuracy = worked
    ns = dict(done)  # the worked example's names; this block binds its own model, optimizer and adaptation
    torch.set_rng_state(after)
    loss, calls = nn.functional.cross_entropy, iter(range(10 ** 6))
    # the 2001st task loss overflows: step 1000, late stage
    monkeypatch.setattr(nn.functional, "cross_entropy",
                        lambda *a: loss(*a) * (float("inf") if next(calls) == 2000 else 1.0))
    exec(compile(_block("Mixed precision and gradient accumulation"), str(DOC), "exec"), ns)
    adapt, model = ns["adapt"], ns["model"]
    assert adapt.stage == "late" and ns["scaler"].get_scale() < 2.0 ** 16  # the overflow halved the scale
    assert adapt.size_target <= adapt.size <= 1.15 * adapt.size_target
    assert torch.isfinite(torch.tensor(adapt.state_dict()["driver"]["running"]["slow"]))
    tt_accuracy, dense_accuracy = ns["accuracy"](model), _dense_accuracy(ns)
    assert tt_accuracy >= dense_accuracy - 0.02, (tt_accuracy, dense_accuracy)
