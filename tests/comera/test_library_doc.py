"""docs/library.md's worked example runs as written: the MLP reaches its size target within 15% at the
accuracy of its dense twin (within 0.02), reloaded from its saved state dict."""
import re
from pathlib import Path

import torch
from torch import nn

DOC = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def _worked_example() -> str:
    section = DOC.read_text().split("## Worked example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_worked_example_reaches_its_target_at_the_dense_twins_accuracy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(_worked_example(), str(DOC), "exec"), ns)
    adapt, model, fresh = ns["adapt"], ns["model"], ns["fresh"]
    assert adapt.stage == "late" and adapt.steps == ns["steps"]
    assert adapt.size_target <= adapt.size <= 1.15 * adapt.size_target
    assert ns["comera"].ranks(fresh) == ns["comera"].ranks(model) and (tmp_path / "mlp_tt.pt").exists()
    torch.manual_seed(1)  # the dense twin: same model, data, loop, optimizer and learning rate
    dense = ns["mlp"]()
    optimizer = torch.optim.AdamW(dense.parameters(), lr=1e-3)
    for _ in range(ns["steps"]):
        batch = torch.randint(0, len(ns["x_train"]), (64,))
        nn.functional.cross_entropy(dense(ns["x_train"][batch]), ns["y_train"][batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
    tt_accuracy, dense_accuracy = ns["accuracy"](fresh), ns["accuracy"](dense)
    assert tt_accuracy >= dense_accuracy - 0.02, (tt_accuracy, dense_accuracy)
