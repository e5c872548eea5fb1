"""A toy classification workload (harness/workloads/base.py Workload) and the runner's training loop
(baselines/base.py), so every method can be trained and measured in a second on CPU."""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from baselines.base import Prepared
from harness.workloads.base import Batch, Workload

FEATURES, CATEGORIES, CLASSES = 16, 10, 3


class ToyNet(nn.Module):
    """Embedding + norm + two Linear layers: every kind of parameter a baseline treats differently."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.emb = nn.Embedding(CATEGORIES, 8)
        self.norm = nn.LayerNorm(FEATURES + 8)
        self.fc1 = nn.Linear(FEATURES + 8, hidden)
        self.fc2 = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.cat([x, self.emb(cat)], dim=-1))
        return self.fc2(torch.relu(self.fc1(h)))


def _dataset(n: int, seed: int) -> Batch:
    """Labels from a fixed random teacher over the features and the category (learnable, not linear
    in the raw input because of the category)."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(FEATURES, CLASSES, generator=teacher)
    c = 2.0 * torch.randn(CATEGORIES, CLASSES, generator=teacher)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    cat = torch.randint(0, CATEGORIES, (n,), generator=gen)
    return {"x": x, "cat": cat, "y": (x @ w + c[cat]).argmax(-1)}


def make_toy_workload(batch_size: int = 32, seed: int = 0, steps_per_epoch: int = 50,
                      lr: float = 1e-2) -> Workload:
    torch.manual_seed(seed)
    model = ToyNet()
    train = _dataset(batch_size * steps_per_epoch, seed + 1)
    test = _dataset(1024, seed + 2)

    def batches(data: Batch, size: int) -> Iterator[Batch]:
        for i in range(0, len(data["y"]), size):
            yield {k: v[i:i + size] for k, v in data.items()}

    def loss(m: nn.Module, batch: Batch) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch["x"], batch["cat"]), batch["y"])

    def evaluate(m: nn.Module) -> dict[str, float]:
        was_training = m.training
        m.eval()
        with torch.no_grad():
            correct = sum((m(b["x"], b["cat"]).argmax(-1) == b["y"]).sum().item() for b in batches(test, 256))
        m.train(was_training)
        return {"metric_name": "accuracy", "metric_value": correct / len(test["y"])}

    return Workload(
        name="toy", model=model,
        tt_spec={"fc1": {"kind": "linear", "in_shape": [4, 6], "out_shape": [4, 8], "rank": 4},
                 "emb": {"kind": "embedding", "row_shape": [2, 5], "col_shape": [2, 4], "rank": 4}},
        train_batches=lambda epoch: batches(train, batch_size), eval_batches=lambda: batches(test, 256),
        loss=loss, evaluate=evaluate, steps_per_epoch=steps_per_epoch, metric_name="accuracy",
        lr={"dense": lr, "cores": lr, "other": lr, "gates": 1e-2})


def train(prepared: Prepared, workload: Workload, epochs: int = 1,
          on_step: Callable[[int], None] | None = None) -> float:
    """The runner's loop (baselines/base.py) for ``epochs``; returns the eval metric after before_eval."""
    prepared.model.train()
    step = 0
    for epoch in range(epochs):
        for batch in workload.train_batches(epoch):
            loss = prepared.total_loss(workload.loss(prepared.model, batch), step)
            loss.backward()
            for opt in prepared.optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            prepared.after_step(step)
            if on_step is not None:
                on_step(step)
            step += 1
    prepared.before_eval()
    return workload.evaluate(prepared.model)["metric_value"]

