"""A family of small tasks and networks on which README's recipe ("CoMERA in your own model") is checked
against the same TT model trained without rank adaptation (its twin) and the dense model.

Labels (each task 20,000 points, 2,000 of them held out; digits has its own 1,797, a fifth held out):

* ``clusters``: 10 Gaussian clusters in 100 dimensions (learned within a few hundred steps).
* ``tt_teacher``: the argmax of a random rank-4 TT linear map of Gaussian inputs.
* ``linear``: the argmax of a random dense linear map: separable, and still being learned at 600 steps.
* ``relu_teacher``: the argmax of a random one-hidden-layer ReLU network.
* ``digits``: scikit-learn's 8x8 handwritten digits, a real data set (UCI optdigits).

Networks: ``plain`` (in-256-256-classes, ReLU, no residual connection) and ``residual`` (in-256, two
residual ReLU blocks, LayerNorm, 256-classes). Training: README's recipe literally (``tensorize`` all
linear layers at rank 16, ``param_groups(lr=3e-3)``, AdamW, ``RankAdaptation`` with the library's
defaults), 600 steps, one torch thread; the dense model at the same rate.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import comera

STEPS, LR, RANK = 600, 3e-3, 16
POINTS, HELD_OUT = 20000, 2000


def _gaussian(seed: int, dims: int = 100) -> tuple[torch.Tensor, torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(POINTS, dims, generator=gen), gen


def clusters(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(10, 100, generator=gen)
    labels = torch.randint(0, 10, (POINTS,), generator=gen)
    return centers[labels] + 2.5 * torch.randn(POINTS, 100, generator=gen), labels


def tt_teacher(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, _ = _gaussian(seed)
    torch.manual_seed(1000 + seed)
    teacher = nn.Sequential(nn.Linear(100, 10))
    comera.tensorize(teacher, "all-linear", rank=4, init="default")
    with torch.no_grad():
        return x, teacher(x).argmax(1)


def linear(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, gen = _gaussian(seed)
    return x, (x @ torch.randn(100, 10, generator=gen)).argmax(1)


def relu_teacher(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, gen = _gaussian(seed)
    hidden = torch.relu(x @ (torch.randn(100, 64, generator=gen) / 10))
    return x, (hidden @ (torch.randn(64, 10, generator=gen) / 8)).argmax(1)


def digits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)


TASKS = {"clusters": clusters, "tt_teacher": tt_teacher, "linear": linear, "relu_teacher": relu_teacher,
         "digits": digits}


class Residual(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(torch.relu(self.inner(x)))


def network(kind: str, inputs: int, classes: int, width: int = 256) -> nn.Module:
    if kind == "plain":
        return nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, classes))
    return nn.Sequential(nn.Linear(inputs, width), Residual(width), Residual(width), nn.LayerNorm(width),
                         nn.Linear(width, classes))


NETWORKS = ("plain", "residual")
BATCHES, TARGETS = (128, 64, 32), (0.5, 0.2)
CASES = [(task, kind, seed, BATCHES[i % 3], TARGETS[i % 2]) for i, (task, kind, seed) in enumerate(
    (t, k, s) for t in TASKS for k in NETWORKS for s in (0, 1))]
"""(task, network, seed, batch, target): every task and network, two seeds, batches and targets spread."""
SUITE = [case for case in CASES if case[2] == (list(TASKS).index(case[0]) + NETWORKS.index(case[1])) % 2]
"""The cases the test suite runs: every task and network once, the seed alternating between them (both
seeds and both targets appear); ``scripts/task_family_table.py`` runs every case of :data:`CASES`."""


@dataclass
class Outcome:
    """One training run: held-out accuracy, and for CoMERA its size against its target and why not."""

    accuracy: float
    size_ratio: float | None = None   # TT size at the end / at the stage switch
    shortfall: str | None = None
    reached: bool | None = None       # the library's rule (comera.rank.TwoStageRankAdaptation.reached)
    switch_step: int | None = None
    removed: tuple[str, ...] = ()


def split(task: str, seed: int) -> tuple[torch.Tensor, ...]:
    x, y = TASKS[task](seed)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(10_000 + seed))
    held = HELD_OUT if len(x) > 2 * HELD_OUT else len(x) // 5
    test, train = order[:held], order[held:]
    return x[train], y[train], x[test], y[test]


def train(task: str, kind: str, seed: int, method: str, *, target: float | None = None, batch: int = 128,
          steps: int = STEPS, on_step=None, **settings) -> Outcome:
    """README's recipe (``method`` "comera", with ``target`` and any rank-adaptation ``settings``), the TT
    twin ("tt") or the dense model ("dense"); ``on_step(step, model, adapt)`` after each step."""
    torch.set_num_threads(1)
    x, y, x_test, y_test = split(task, seed)
    torch.manual_seed(seed)
    model = network(kind, x.shape[1], int(y.max()) + 1)
    adapt = None
    if method == "dense":
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    else:
        comera.tensorize(model, "all-linear", rank=RANK)
        optimizer = torch.optim.AdamW(comera.param_groups(model, lr=LR))
        if method == "comera":
            adapt = comera.RankAdaptation(model, optimizer, target=target, total_steps=steps, **settings)
    batches = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        pick = torch.randint(0, len(x), (batch,), generator=batches)
        loss = nn.functional.cross_entropy(model(x[pick]), y[pick])
        (adapt.loss(loss) if adapt else loss).backward()
        optimizer.step()
        optimizer.zero_grad()
        if adapt:
            adapt.step()
        if on_step:
            on_step(step, model, adapt)
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    if adapt is None:
        return Outcome(accuracy)
    switch = adapt.driver.switch
    return Outcome(accuracy, size_ratio=adapt.size / switch["size"] if switch else 1.0,
                   shortfall=adapt.shortfall, reached=adapt.driver.reached(),
                   switch_step=switch.get("step"),
                   removed=tuple(adapt.removed_layers))
