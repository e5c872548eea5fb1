"""Rank adaptation for your own loop: :class:`RankAdaptation`, :func:`param_groups`, :func:`defaults`.

Built on :class:`comera.rank.TwoStageRankAdaptation`. Worked example: docs/library.md; why the defaults are
what they are: docs/recipe.md.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterable

import torch
from torch import nn

from comera.convert import model_size
from comera.ttm import TTMEmbedding
from comera.rank import PAPER_DEFAULTS, PAPER_UNREAD, RULES, RankSettings, TwoStageRankAdaptation
from comera.size import ranks, removed_layers, tensorized_modules, tt_parameter_count

GATE_LR_FACTOR = 5.0
DERIVED = ("late_start_step", "target_ratio", "total_steps", "converged_window")  # from target, steps
CONVERGED_WINDOW = 0.1  # converged_window as a fraction of total_steps
EARLY_FRACTION = {"project": 0.45, "paper": 2 / 3}  # the paper: 20 early + 10 late epochs


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


def param_groups(model: nn.Module, lr: float = 1e-3, *, cores: float | None = None,
                 gates: float | None = None,
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


def defaults(rules: str = "project") -> dict[str, Any]:
    """The library's rank-adaptation defaults under ``rules`` ("project" or "paper"): every keyword
    :class:`RankAdaptation` takes besides ``target`` and ``total_steps`` (``early_fraction`` and the fields
    of :class:`comera.rank.RankSettings` not derived from them) that these rules read, with its default."""
    if rules not in RULES:
        raise ValueError(f"rank adaptation: rules={rules!r} must be one of {RULES}")
    out = {f.name: f.default for f in dataclasses.fields(RankSettings) if f.name not in DERIVED}
    if rules == "paper":
        out = {key: value for key, value in out.items() if key not in PAPER_UNREAD}
        out.update(PAPER_DEFAULTS, rules="paper")
    out["early_fraction"] = EARLY_FRACTION[rules]
    return out


def _check_optimizers_hold_tt_parameters(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """ValueError when optimizers are given and they lack some of the model's TT cores and gates (an
    optimizer built before :func:`comera.tensorize` holds the replaced dense weights instead)."""
    if not optimizers:
        return
    held = {id(p) for o in optimizers for group in o.param_groups for p in group["params"]}
    tt = [p for _, m in tensorized_modules(model) for p in (*m.cores, *m.gates)]
    lacking = sum(id(p) not in held for p in tt)
    if lacking:
        raise ValueError(f"RankAdaptation: the optimizer does not hold {lacking} of the model's {len(tt)} TT "
                         "parameters (cores and gates), so they would never train; build the optimizer after "
                         "comera.tensorize, e.g. torch.optim.AdamW(comera.param_groups(model, lr=...))")


class RankAdaptation:
    """CoMERA's two-stage rank adaptation driven by a training loop: ``loss`` and ``step``.

    Args:
        model: a model with TT / TTM layers (:func:`comera.tensorize`).
        optimizer: one or a list; pruning slices (and rescales) their state with the parameters.
        target: the final TT size as a fraction of the size at the stage switch (None: early stage only).
        total_steps: the steps the loop will run (needed with a target).
        early_fraction: the early stage lasts at least this fraction of ``total_steps``; the switch comes
            when the task loss has stopped improving after that (``switch_when="converged"``, default) or
            right then (``"step"``). None: 0.45, or 2/3 with ``rules="paper"``.
        settings: any field of :class:`comera.rank.RankSettings` but those derived from the arguments
            above (``late_start_step``, ``target_ratio``, ``total_steps``; ``converged_window`` is 10% of
            ``total_steps`` unless given). ``rules="paper"`` runs the paper's rules: the settings default
            to :func:`defaults` ``("paper")`` and those the paper's rules do not read are refused.

    Raises:
        TypeError: an unknown setting, one the chosen rules do not read, or an optimizer that is not a
            torch optimizer.
        ValueError: a model without TT / TTM layers, a target without ``total_steps``, a value out of range,
            an optimizer that lacks some of the model's TT cores and gates (built before ``tensorize``).

    Example::

        >>> adapt = comera.RankAdaptation(model, optimizer, target=0.5, total_steps=3000, rules="paper")
    """

    def __init__(self, model: nn.Module,
                 optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
                 *, target: float | None = None, total_steps: int | None = None,
                 early_fraction: float | None = None, **settings: Any):
        fields = {f.name for f in dataclasses.fields(RankSettings)} - set(DERIVED) | {"converged_window"}
        unknown = set(settings) - fields
        if unknown:
            raise TypeError(f"RankAdaptation: unknown setting(s) {sorted(unknown)}; settings: "
                            f"{sorted(fields)}")
        rules = settings.get("rules", "project")
        if rules not in RULES:
            raise ValueError(f"RankAdaptation: rules must be one of {RULES}, got {rules!r}")
        if rules == "paper":
            unread = sorted(set(settings) & set(PAPER_UNREAD))
            if unread:
                raise TypeError(f"RankAdaptation: rules='paper' does not read {unread} (the project's "
                                "convergence switch and loss guard)")
            settings = {**PAPER_DEFAULTS, **settings}
        if early_fraction is None:
            early_fraction = EARLY_FRACTION[rules]
        if not tensorized_modules(model):
            raise ValueError("RankAdaptation: the model has no TT / TTM layer; run comera.tensorize first")
        if target is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                   or total_steps < 2):
            raise ValueError(f"RankAdaptation: a target needs total_steps (an int >= 2), got {total_steps!r}")
        if not 0 <= early_fraction <= 1:
            raise ValueError(f"RankAdaptation: early_fraction must be in [0, 1], got {early_fraction!r}")
        late_start = None
        if target is not None:
            late_start = min(total_steps - 1, max(1, round(early_fraction * total_steps)))
        if total_steps is not None and "converged_window" not in settings:
            settings["converged_window"] = max(1, round(CONVERGED_WINDOW * total_steps))
        self.settings = RankSettings(**settings, late_start_step=late_start, target_ratio=target,
                                     total_steps=total_steps)
        optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        for item in optimizers:
            if not isinstance(item, torch.optim.Optimizer):
                raise TypeError("RankAdaptation: optimizer must be a torch optimizer or a list of them "
                                f"(pruning slices their state), got {type(item).__name__}")
        _check_optimizers_hold_tt_parameters(model, optimizers)
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
        if self.driver.outcome.get("shortfall"):  # set after the last of total_steps
            warnings.warn("rank adaptation: the size target was not reached: "
                          f"{self.driver.outcome['shortfall']}",
                          RuntimeWarning, stacklevel=2)
        return info

    @property
    def shortfall(self) -> str | None:
        """Why the size target is not reached (yet), in words; None when it is or there is none."""
        return self.driver.shortfall()

    @property
    def removed_layers(self) -> list[str]:
        """The layers whose weight is zero: a bond lost every rank (only with ``min_rank=0``)."""
        return removed_layers(self.model)

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
        """Steps, stage, TT size against its start and the target; the compression of the tensorized
        layers and of the whole model (:func:`comera.convert.model_size`: dense parameters / parameters now,
        biases on both sides, as in :func:`comera.tensorize`'s report); then, each on a line of its own, why
        the target is not reached (:attr:`shortfall`) and the removed layers. A model whose TT layers were
        all removed before this object was made (size 0 at the start) is said so."""
        sizes = model_size(self.model)
        size = self.size
        target = self.size_target
        start = (f"{size / self.initial_size:.3f} of {self.initial_size:,} at the start" if self.initial_size
                 else "every TT layer was removed before rank adaptation started")
        text = (f"step {self.steps}, {self.stage} stage: {size:,} TT parameters "
                f"({start}); compression: "
                f"tensorized layers {sizes['compression_layers']:.1f}x "
                f"({sizes['params_dense_layers']:,.0f} dense -> {sizes['params_factorized_layers']:,.0f}), "
                f"whole model {sizes['compression_total']:.2f}x ({sizes['params_dense_total']:,.0f} dense "
                f"-> {sizes['params_total']:,.0f})")
        if target is not None:
            now = f"now {size / target:.3f} of it" if target > 0 else f"now {size:,}"
            text += (f"; target {target:,.0f} = {self.settings.target_ratio} x "
                     f"{self.driver.switch['size']:,.0f} at the switch ({now})")
        if self.settings.target_ratio is not None and self.shortfall is not None:
            text += f"\ntarget not reached: {self.shortfall}"
        if self.removed_layers:
            text += f"\nremoved layers (weight zero): {', '.join(self.removed_layers)}"
        return text

    def ranks(self) -> dict[str, list[int]]:
        """Current TT ranks of every TT / TTM layer."""
        return ranks(self.model)
