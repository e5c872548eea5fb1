"""The one interface every training method implements: :class:`Method` prepares a :class:`Prepared`.

The runner never branches on a method's name. Every training step is :meth:`Prepared.train_step`::

    task_loss = workload.loss(prepared.model, batch)
    loss = prepared.total_loss(task_loss, step)
    loss.backward()                     # layer-wise methods step inside post-accumulate-grad hooks
    for opt in prepared.optimizers:
        opt.step()                      # up to here: Prepared.update, what a CUDA graph captures
    for opt in prepared.optimizers:
        opt.zero_grad(set_to_none=True)
    info = prepared.after_step(step)    # pruning, stage switches, LTE merges; values go to the curves

and before every evaluation ``prepared.before_eval()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol

import torch
from torch import nn


def _no_info(step: int) -> dict[str, float]:
    return {}


def _nothing() -> None:
    return None


class StepResult(NamedTuple):
    """What one training step (:meth:`Prepared.train_step`) returns."""

    task_loss: torch.Tensor
    """The workload's loss (detached)."""
    loss: torch.Tensor
    """The objective the method minimized: task loss plus its own terms (detached)."""
    info: dict[str, float]
    """``after_step``'s values (pruning, stage switches, ...), for the curves table."""


@dataclass(frozen=True)
class Periodic:
    """Work a method does on one step in ``every`` (GaLore's projection update, CoMERA's pruning, LTE's
    merge), which the runner times at its rate (docs/measurement.md, "Periodic work").

    Attributes:
        every: the steps between two of its steps (1: every step, nothing to time apart).
        phase: step ``s`` (0-based, counted from the run's first step) does it when ``s % every == phase``.
        forceable: the method's :attr:`Prepared.force` can make the next step do it off its schedule.

    Example:
        >>> Periodic(every=20, phase=0, forceable=True)  # GaLore: an SVD at steps 0, 20, 40, ...
        Periodic(every=20, phase=0, forceable=True)
    """

    every: int
    phase: int = 0
    forceable: bool = False


@dataclass
class Prepared:
    """What a method hands the runner: the model to train and how to train it."""

    model: nn.Module
    optimizers: list[torch.optim.Optimizer]
    total_loss: Callable[[torch.Tensor, int], torch.Tensor] = lambda task_loss, step: task_loss
    after_step: Callable[[int], dict[str, float]] = _no_info
    before_eval: Callable[[], None] = _nothing
    settings: dict[str, Any] = field(default_factory=dict)
    """The method's own settings (lr, rank, heads, ...), recorded as JSON in the results row."""
    ranks: Callable[[], dict[str, list[int]]] = dict
    """Current TT ranks per factorized layer (empty for methods without any)."""
    size: Callable[[], dict[str, float]] = dict
    """params_total, params_factorized_layers, compression_total, compression_layers (see docs/schema.md)."""
    state_bytes: Callable[[], int] | None = None
    """The method's own analytic state count when the generic one (``state_bytes(model, optimizers)``)
    cannot see its state, e.g. layer-wise optimizers living in gradient hooks."""
    periodic: dict[str, Periodic] = field(default_factory=dict)
    """Name -> the method's periodic work (e.g. ``{"galore projection": Periodic(200)}``); the same as
    the method module's ``periodic(params)``, which the config check reads before anything is built."""
    force: Callable[[str], None] | None = None
    """``force(name)``: the next training step does the periodic work ``name`` (a forceable one) off its
    schedule; the runner calls it before one timed step of a timing cell whose counted steps hold none."""
    skipped: str | None = None
    """A reason when the method cannot run here (e.g. 8-bit GaLore without CUDA); the runner records it."""
    stateful: dict[str, Any] = field(default_factory=dict)
    """Name -> object with ``state_dict()`` / ``load_state_dict()`` that a resumed run needs besides the
    model and ``optimizers`` (CoMERA's rank adaptation, layer-wise GaLore's optimizers); restored in this
    order, after them (:meth:`load_state_dict`)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a run that stopped needs to go on as if it had not: the model's, every optimizer's
        and every ``stateful`` object's state dicts."""
        return {"model": self.model.state_dict(), "optimizers": [opt.state_dict() for opt in self.optimizers],
                "stateful": {name: obj.state_dict() for name, obj in self.stateful.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of the same method prepared the same way. A parameter whose
        saved shape differs (ranks pruned in the saved run) takes that shape in place, as pruning does:
        the optimizers keep the same Parameter objects."""
        params = dict(self.model.named_parameters())
        for name, saved in state["model"].items():
            param = params.get(name)
            if param is not None and saved.shape != param.shape and saved.dim() == param.dim():
                torch.utils.swap_tensors(param, nn.Parameter(param.new_empty(saved.shape),
                                                             requires_grad=param.requires_grad))
        self.model.load_state_dict(state["model"])
        if len(state["optimizers"]) != len(self.optimizers):
            raise ValueError(f"the saved state has {len(state['optimizers'])} optimizer(s), this method "
                             f"{len(self.optimizers)}")
        for opt, saved in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(saved)
        missing = sorted(set(self.stateful) ^ set(state["stateful"]))
        if missing:
            raise ValueError(f"the saved state and this method differ in their stateful objects: {missing}")
        for name, obj in self.stateful.items():
            obj.load_state_dict(state["stateful"][name])

    def update(self, workload: Any, batch: Any, step: int, model: nn.Module | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The capturable part of a training step: forward through ``model`` (default ``self.model``; the
        runner passes its ``torch.compile`` wrapper), the objective, backward and every optimizer's step.
        Returns (task loss, objective), both detached. The gradients stay: :meth:`train_step` drops them,
        a CUDA graph of this call (harness.running.cudagraph.GraphedStep) keeps them static."""
        task_loss = workload.loss(self.model if model is None else model, batch)
        loss = self.total_loss(task_loss, step)
        loss.backward()
        for opt in self.optimizers:
            opt.step()
        return task_loss.detach(), loss.detach()

    def train_step(self, workload: Any, batch: Any, step: int, *, model: nn.Module | None = None,
                   update: Callable[[Any, int], tuple[torch.Tensor, torch.Tensor]] | None = None
                   ) -> StepResult:
        """One training step as in the module docstring -- the one definition the cell runner
        (harness.running.run), the bench's step targets (through the runner) and the warm-up use:
        :meth:`update`, the gradients dropped, then ``after_step``. ``update(batch, step)``: a replacement
        of the eager :meth:`update` that manages its own gradients (a CUDA-graph replay of it); they are
        then left alone."""
        if update is None:
            task_loss, loss = self.update(workload, batch, step, model)
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        else:
            task_loss, loss = update(batch, step)
        return StepResult(task_loss, loss, self.after_step(step) or {})


class Method(Protocol):
    """A training method. ``name`` and ``variant`` identify it in the results table."""

    name: str
    variant: str

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        ...


def trainable_parameters(model: nn.Module) -> int:
    """Number of scalars that receive gradients."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def state_bytes(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> int:
    """Analytic training-state bytes: every parameter, a gradient per trainable parameter, and every
    tensor held in the optimizers' state (moments, projection matrices, step counters)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    opt_state = 0
    for opt in optimizers:
        for st in opt.state.values():
            opt_state += _tensor_bytes(st)
    return params + grads + opt_state


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return sum(_tensor_bytes(v) for v in vars(obj).values()) if hasattr(obj, "__dict__") else 0
