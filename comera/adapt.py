"""Rank adaptation for your own training loop: one object, called in two places, with the defaults that
train, and the optimizer's parameter groups (TT cores / rank gates / the rest).

    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=3e-3))
    adapt = comera.RankAdaptation(model, optimizer, target=0.3, total_steps=2000)
    for step in range(2000):
        loss = adapt.loss(task_loss(model, batch))   # the current stage's objective
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        adapt.step()                                  # stage switch and pruning

Built on :class:`comera.rank.TwoStageRankAdaptation`. The early stage (the first ``early_fraction`` of
``total_steps``) prunes ranks gently (gate penalty ``l1_weight`` 0.01, the paper's; no core penalty); the
late stage, only with a ``target``, drives the TT size to ``target`` times its size at the switch, the
target falling linearly over the first ``target_ramp`` of the late stage, and never prunes below it. Its
reference loss L0 is the best running task loss so far (``loss_reference="best"``) and ``rho`` is 1, so the
task loss keeps at least half its weight in the size branch.

These are the library's defaults (:func:`defaults`: the fields of :class:`comera.rank.RankSettings` and
this class's ``early_fraction`` 0.45 and ``target_ramp`` 0.8; size weight 5, pruning every 10 steps), and
the one set of CoMERA defaults: the pipeline's ``comera`` method takes them from here, and a config
overrides only what it states (the default grid's quality cells raise ``size_weight`` to 10 for their
short late stage; config/paper.yaml keeps the paper's schedule). How they were chosen: docs/recipe.md.
Layers built by ``tensorize`` use the official initialization, and the gates learn 5x faster than the
cores (``param_groups``).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Iterable

import torch
from torch import nn

from comera.convert import dense_equivalent
from comera.ttm import TTMEmbedding
from comera.rank import RankSettings, TwoStageRankAdaptation, ranks, tensorized_modules, tt_parameter_count

GATE_LR_FACTOR = 5.0
DERIVED = ("late_start_step", "target_ratio", "target_ramp_steps")  # set from target / total_steps


def learning_rates(lr: float = 1e-3, *, cores: float | None = None, gates: float | None = None,
                   other: float | None = None, embedding_cores: float | None = None) -> dict[str, float]:
    """The rate of each parameter group of :func:`param_groups`: ``cores`` (else ``lr``),
    ``embedding_cores`` (else the cores' rate), ``gates`` (else 5 x ``lr``), ``other`` (else ``lr``);
    ValueError naming a group whose rate is not positive."""
    core_lr = lr if cores is None else cores
    lrs = {"cores": core_lr, "embedding_cores": core_lr if embedding_cores is None else embedding_cores,
           "gates": GATE_LR_FACTOR * lr if gates is None else gates, "other": lr if other is None else other}
    for group, value in lrs.items():
        if not value > 0:
            raise ValueError(f"param_groups: the learning rate of {group!r} must be positive, got {value!r}")
    return lrs


def param_groups(model: nn.Module, lr: float = 1e-3, *, cores: float | None = None, gates: float | None = None,
                 other: float | None = None, embedding_cores: float | None = None) -> list[dict[str, Any]]:
    """Optimizer parameter groups ``cores`` (TT linear cores: ``cores`` or ``lr``), ``embedding_cores``
    (TTM embedding cores: ``embedding_cores``, else the cores' rate), ``gates`` (``gates`` or 5 x ``lr``)
    and ``other`` (every other trainable parameter: ``other`` or ``lr``); empty groups are left out."""
    lrs = learning_rates(lr, cores=cores, gates=gates, other=other, embedding_cores=embedding_cores)
    named: dict[str, list[nn.Parameter]] = {"cores": [], "embedding_cores": [], "gates": []}
    for _, module in tensorized_modules(model):
        named["embedding_cores" if isinstance(module, TTMEmbedding) else "cores"].extend(module.cores)
        named["gates"].extend(module.gates)
    tt_ids = {id(p) for ps in named.values() for p in ps}
    named["other"] = [p for p in model.parameters() if p.requires_grad and id(p) not in tt_ids]
    return [{"params": ps, "lr": lrs[group], "name": group} for group, ps in named.items() if ps]


def defaults() -> dict[str, Any]:
    """The library's rank-adaptation defaults: every keyword :class:`RankAdaptation` takes besides
    ``target`` and ``total_steps`` (``early_fraction``, ``target_ramp`` and the fields of
    :class:`comera.rank.RankSettings` not derived from them), with its default."""
    out = {f.name: f.default for f in dataclasses.fields(RankSettings) if f.name not in DERIVED}
    signature = inspect.signature(RankAdaptation)
    out.update((name, signature.parameters[name].default) for name in ("early_fraction", "target_ramp"))
    return out


class RankAdaptation:
    """CoMERA's two-stage rank adaptation driven by a training loop: ``loss`` and ``step``.

    ``optimizer``: one or a list; pruning slices their state with the parameters. ``target``: the final
    TT size as a fraction of the size at the stage switch (None: early stage only). ``total_steps``: the
    steps the loop will run (needed with a target). ``early_fraction`` of them is the early stage;
    ``target_ramp``: the fraction of the late stage over which the target falls (0: fixed, the paper).
    Keyword ``settings`` override the defaults (any field of :class:`comera.rank.RankSettings` but the
    three derived from ``target`` and ``total_steps``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
                 *, target: float | None = None, total_steps: int | None = None, early_fraction: float = 0.45,
                 target_ramp: float = 0.8, **settings: Any):
        fields = {f.name for f in dataclasses.fields(RankSettings)} - set(DERIVED)
        unknown = set(settings) - fields
        if unknown:
            raise TypeError(f"RankAdaptation: unknown setting(s) {sorted(unknown)}; settings: {sorted(fields)}")
        if not tensorized_modules(model):
            raise ValueError("RankAdaptation: the model has no TT / TTM layer; run comera.tensorize first")
        if target is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                   or total_steps < 2):
            raise ValueError(f"RankAdaptation: a target needs total_steps (an int >= 2), got {total_steps!r}")
        for name, value in (("early_fraction", early_fraction), ("target_ramp", target_ramp)):
            if not 0 <= value <= 1:
                raise ValueError(f"RankAdaptation: {name} must be in [0, 1], got {value!r}")
        late_start = None
        if target is not None:
            late_start = min(total_steps - 1, max(1, round(early_fraction * total_steps)))
        ramp = round(target_ramp * (total_steps - late_start)) if late_start else 0
        self.settings = RankSettings(**settings, late_start_step=late_start, target_ratio=target,
                                     target_ramp_steps=ramp)
        optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        for item in optimizers:
            if not isinstance(item, torch.optim.Optimizer):
                raise TypeError(f"RankAdaptation: optimizer must be a torch optimizer or a list of them (pruning "
                                f"slices their state), got {type(item).__name__}")
        self.model = model
        self.total_steps = total_steps
        self.driver = TwoStageRankAdaptation(model, self.settings, optimizers)
        self.steps = 0
        self.initial_size = tt_parameter_count(model)
        self._params_tt = float(self.initial_size)
        self.resized = False
        """Whether the last :meth:`step` pruned ranks, changing the shapes of cores and gates (same Parameter
        objects): a ``DistributedDataParallel`` wrapper must be built again then."""

    def loss(self, task_loss: torch.Tensor) -> torch.Tensor:
        """The objective to backpropagate for this step's task loss (early or late stage)."""
        return self.driver.objective(task_loss, self.steps)

    def step(self) -> dict[str, float]:
        """Call once per training step, after ``optimizer.step()``: switches stage, prunes. Returns the
        stage (0 early, 1 late), the TT size ``params_tt`` and the mean internal rank; :attr:`resized` says
        whether it pruned."""
        info = self.driver.after_step(self.steps)
        self.steps += 1
        self.resized = info["params_tt"] != self._params_tt
        self._params_tt = info["params_tt"]
        return info

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs besides the model's and the optimizers' state dicts: steps done, the
        size at the start, the stage, the switch point, the running losses and the late target, with the
        settings they belong to (plain Python values; ``torch.save`` it with the rest).

        Example::

            >>> torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            ...             "adapt": adapt.state_dict()}, "checkpoint.pt")
        """
        return {"steps": self.steps, "initial_size": self.initial_size, "total_steps": self.total_steps,
                "settings": dataclasses.asdict(self.settings), "driver": self.driver.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` left off. Build it as the saved run was (same ``target``,
        ``total_steps`` and settings; a difference is an error naming it) on the model with the
        checkpoint loaded, and its optimizer built after that loading, with its state loaded too.

        Example::

            >>> comera.tensorize(model, spec)
            >>> model.load_state_dict(checkpoint["model"])       # the checkpoint's ranks
            >>> optimizer = torch.optim.AdamW(comera.param_groups(model, lr=1e-3))
            >>> optimizer.load_state_dict(checkpoint["optimizer"])
            >>> adapt = comera.RankAdaptation(model, optimizer, target=0.3, total_steps=steps)
            >>> adapt.load_state_dict(checkpoint["adapt"])
        """
        ours = {**dataclasses.asdict(self.settings), "total_steps": self.total_steps}
        saved = {**state["settings"], "total_steps": state["total_steps"]}
        differ = sorted(k for k in ours if saved.get(k) != ours[k])
        if differ:
            raise ValueError("RankAdaptation.load_state_dict: the saved run had other settings: "
                             + ", ".join(f"{k}={saved.get(k)!r} (here {ours[k]!r})" for k in differ))
        self.steps = int(state["steps"])
        self.initial_size = int(state["initial_size"])
        self._params_tt = float(tt_parameter_count(self.model))
        self.driver.load_state_dict(state["driver"])

    @property
    def stage(self) -> str:
        return "late" if self.driver.stage == 1 else "early"

    @property
    def size(self) -> int:
        """TT scalars now (every core and gate of the model's TT / TTM layers)."""
        return tt_parameter_count(self.model)

    @property
    def size_target(self) -> float | None:
        """The late stage's final size in TT scalars (``target`` x the size at the switch); None before."""
        return self.driver.switch.get("size_target")

    def summary(self) -> str:
        """One line: steps, stage, TT size against its start, its dense equivalent and the target."""
        dense = sum(dense_equivalent(m) for _, m in tensorized_modules(self.model))
        size = self.size
        target = self.size_target
        text = (f"step {self.steps}, {self.stage} stage: {size:,} TT parameters ({size / self.initial_size:.3f} "
                f"of {self.initial_size:,} at the start; dense layers {dense:,}, compression {dense / max(size, 1):.1f}x)")
        if target is not None:
            text += (f"; target {target:,.0f} = {self.settings.target_ratio} x {self.driver.switch['size']:,.0f} "
                     f"at the switch (now {size / target:.3f} of it)")
        return text

    def ranks(self) -> dict[str, list[int]]:
        """Current TT ranks of every TT / TTM layer."""
        return ranks(self.model)
