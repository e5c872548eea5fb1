"""CoMERA's two-stage rank adaptation (arXiv 2405.14377, Sec. 3): stage objectives, switch and pruning.

Driven step by step by :class:`TwoStageRankAdaptation` under one of two rule sets (``RankSettings.rules``):
``"project"`` (default) or ``"paper"`` (the paper's and its official code's: :func:`gate_penalty`,
:func:`paper_late_objective`). The rules: docs/library-reference.md; why each is what it is:
docs/recipe.md.
"""
from __future__ import annotations

import math
import numbers
import typing
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

import torch
from torch import nn

from comera.prune import prune
from comera.running_loss import RunningLoss
from comera.paper import (  # noqa: F401 (gate_penalty and the constants are part of this module's API)
    PAPER_DEFAULTS, PAPER_FIXED, PAPER_LOSS_WEIGHT, PAPER_UNREAD, gate_penalty, paper_late_objective)
from comera.size import bond_sizes, gate_size, layout, rank_saving, tensorized_modules, tt_parameter_count

RULES = ("project", "paper")
SWITCH_RULES = ("converged", "step")
MASK_GATES = ("at_prune", "every_step")
LOSS_RISE_TOLERANCES, LOSS_RISE_MARGIN = 3, 0.05  # warn: running loss > switch's + 3 tolerances + 0.05
REACHED_WITHIN = 0.05  # a late stage ending within 5% above its size target reached it
NOISE_SIGMAS = 2.0  # the late stage tolerates this many standard deviations of the fast running loss
MAX_RANK = 2**16
"""The largest ``min_rank``: no TT bond holds more ranks (a core of that rank on both its bonds would hold
2**32 scalars for each index of its mode)."""


def smallest_saving(model: nn.Module, min_rank: int = 1) -> float:
    """The fewest scalars one rank's removal saves among the bonds above ``min_rank`` (inf if none)."""
    savings = [math.inf]
    for _, module in tensorized_modules(model):
        r = bond_sizes(module)
        savings += [rank_saving(module, k, r) for k in range(len(module.gates)) if r[k + 1] > min_rank]
    return min(savings)


def early_objective(task_loss: torch.Tensor, model: nn.Module, *, l1_weight: float,
                    l2_weight: float = 0.0) -> torch.Tensor:
    """``L + gamma S~ / S + beta sum_k ||G_k||_F^2`` (no host sync).

    Args:
        task_loss: this step's task loss ``L``.
        model: the model with TT / TTM layers.
        l1_weight: ``gamma``, the weight of the soft size over the stored size.
        l2_weight: ``beta``, the weight of the cores' squared norms.
    """
    parts = layout(model)
    objective = task_loss
    if l1_weight:
        relative = parts.soft_size() / max(parts.parameter_count(), 1)
        objective = objective + l1_weight * relative.to(task_loss)
    if l2_weight:
        objective = objective + l2_weight * parts.core_l2().to(task_loss)
    return objective


@dataclass
class LateTarget:
    """The late stage's reference point ``(L0, S0)`` and the scales of its two gaps.

    Attributes:
        loss_target: ``L0`` (a 0-dim tensor when it follows the best running loss).
        size_target: ``S0`` in scalars, a 0-dim tensor (a ramped target is updated in place).
        size_scale: ``S`` at the switch; the size term is divided by it.
        size_span: ``S_switch - S_final`` (at least 1): the size gap's unit.
        size_weight: ``w``, the weight of the size term in the size branch.
        tolerance: the tolerated rise of the loss over ``L0`` as a share of ``loss_fall``.
        loss_fall: how far the loss has fallen, ``L_first - L0`` (the driver's first running loss); a
            0-dim tensor when ``L0`` follows the best running loss.
    """

    loss_target: float | torch.Tensor
    size_target: torch.Tensor
    size_scale: float
    size_span: float
    size_weight: float
    tolerance: float
    loss_fall: float | torch.Tensor = 0.0


def late_objective(task_loss: torch.Tensor, model: nn.Module, target: LateTarget, *,
                   size: torch.Tensor | float, l2_weight: float = 0.0,
                   branch_loss: torch.Tensor | None = None,
                   noise: torch.Tensor | float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The late stage's objective for one step (no host sync).

    Args:
        task_loss: this step's task loss.
        model: the model with TT / TTM layers.
        target: the reference point and scales.
        size: the l0 size ``S`` of the branch test (the driver passes the stored size after its last
            pruning, which removed every rank its threshold counts out).
        l2_weight: ``beta``, as in the early stage.
        branch_loss: the ``L`` of the branch test (default: ``task_loss``; the driver passes its fast
            running loss).
        noise: the standard deviation of ``branch_loss``; twice it is added to the tolerated rise.

    Returns:
        ``(objective, size_active)``: ``size_active`` a bool tensor, true in the size branch.
    """
    parts = layout(model)
    compared = (task_loss if branch_loss is None else branch_loss).detach().to(task_loss)
    reference = torch.as_tensor(target.loss_target, dtype=task_loss.dtype, device=task_loss.device)
    fall = torch.as_tensor(target.loss_fall).to(task_loss).clamp_min(0)
    tolerance = (target.tolerance * fall
                 + NOISE_SIGMAS * torch.as_tensor(noise).to(task_loss)).clamp_min(1e-8)
    loss_gap = (compared - reference) / tolerance
    size_gap = (torch.as_tensor(size).to(task_loss) - target.size_target.to(task_loss)) / target.size_span
    size_active = size_gap > loss_gap
    surrogate = parts.soft_size().to(task_loss) / target.size_scale
    objective = task_loss + torch.where(size_active, target.size_weight * surrogate, surrogate * 0)
    if l2_weight:
        objective = objective + l2_weight * parts.core_l2().to(task_loss)
    return objective, size_active


@dataclass
class RankSettings:
    """Settings of the two-stage rank adaptation. The defaults are the library's recipe, the one set of
    CoMERA defaults (:class:`comera.RankAdaptation` and the pipeline's ``comera`` method take theirs from
    here); how they were chosen: docs/recipe.md. ``rules="paper"`` runs the paper's rules instead
    (``PAPER_DEFAULTS``, of which ``PAPER_FIXED`` may not change; the fields in ``PAPER_UNREAD`` are
    not read): docs/library-reference.md."""

    rules: str = "project"          # "project": the rules below; "paper": the paper's (module docstring)
    l1_weight: float = 0.0          # gamma: early-stage weight of the soft size over the stored size (the
                                    # paper's 0.01 held the small transformer on its plateau: recipe.md);
                                    # paper rules: the weight of gate_penalty in both stages
    l2_weight: float = 0.0          # beta: weight of the cores' squared norms (both stages)
    threshold: float = 1e-2         # ranks whose share of their bond is at or below are pruned (paper
                                    # rules: whose gate is at or below)
    prune_every: int = 10           # steps between prunings (0: never during a stage)
    min_rank: int = 1               # ranks every bond keeps; 0 lets a layer go (its weight zero)
    late_start_step: int | None = None  # the earliest stage switch; None: early stage only
    switch_when: str = "converged"  # "converged": once the running loss stopped improving; "step": then
    converged_window: int = 100     # steps over which "converged" looks back
    converged_gain: float = 0.02    # converged: the best running loss fell by less than this fraction of
                                    # its fall so far over the window
    target_ratio: float | None = None   # S0 / S(at the switch); None: no late stage
    loss_target: float | None = None    # L0 fixed; None: the best running loss so far
    loss_tolerance: float = 0.05    # tolerated rise of the running loss over L0, as a share of its fall from
                                    # the first running loss to L0 (+ twice its noise)
    size_weight: float = 10.0       # w: weight of the soft size over S(at the switch) in the size branch
    mask_gates: str = "at_prune"    # forward with raw gates ("at_prune") or gates <= threshold zeroed
    loss_average: float = 0.98      # EMA factor of the slow running loss (L0, convergence)
    branch_average: float = 0.9     # EMA factor of the fast running loss (the branch test)
    stop_at_target: bool = True     # late-stage pruning never takes the size below S0
    target_ramp: float = 0.5        # S0 falls linearly to its value over this fraction of the late stage
                                    # (0: fixed, the paper)
    late_fraction: float = 1 / 3    # the late stage's least share of total_steps: the switch comes at the
                                    # latest at (1 - late_fraction) x total_steps, converged or not (0: never)
    recover_fraction: float = 0.2   # the late stage's last share trains the task loss alone at the ranks it
                                    # reached: no size term, no pruning (0: none)
    late_gate_travel: float = 0.0   # at the switch, every optimizer group of gates alone gets at least this
                                    # over the late stage's steps as its rate (0: rates unchanged; the
                                    # paper's rules: PAPER_DEFAULTS)
    reach_target: bool = False      # the target as a deadline: late-stage pruning also removes the ranks of
                                    # smallest share above a ceiling that falls linearly from the size at
                                    # the switch to S0 at the recovery's start, whatever the loss (False:
                                    # accuracy first, the guard alone decides how far the size falls)
    total_steps: int | None = None  # steps of the whole run (the ramp's length; the last step's check)

    def check(self) -> None:
        """ValueError naming the first setting of the wrong type or out of its range: each field of its
        annotated type (an ``int`` field takes an integer, not a float or a bool; a ``float`` field a finite
        real number, not a bool), ``min_rank`` at most :data:`MAX_RANK`, the weights and ``threshold`` at
        least 0."""
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            optional = type(None) in typing.get_args(hint)
            kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            if optional and value is None:
                continue
            if kind is bool:
                ok, what = isinstance(value, bool), "true or false"
            elif kind is int:
                ok, what = isinstance(value, numbers.Integral) and not isinstance(value, bool), "an integer"
            elif kind is float:
                ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
                      and math.isfinite(value))
                what = "a finite number"
            else:
                continue  # the words: checked against their choices below
            if not ok:
                raise ValueError(f"rank adaptation: {f.name}={value!r} must be {what}"
                                 + (" or None" if optional else ""))
        rules = [("rules", self.rules in RULES, f"one of {RULES}"),
                 ("target_ratio", self.target_ratio is None or 0 < self.target_ratio <= 1, "in (0, 1]"),
                 ("switch_when", self.switch_when in SWITCH_RULES, f"one of {SWITCH_RULES}"),
                 ("mask_gates", self.mask_gates in MASK_GATES, f"one of {MASK_GATES}"),
                 ("min_rank", 0 <= self.min_rank <= MAX_RANK, f"in [0, {MAX_RANK}]"),
                 ("prune_every", self.prune_every >= 0, ">= 0"),
                 ("threshold", self.threshold >= 0, ">= 0"),
                 ("l1_weight", self.l1_weight >= 0, ">= 0"), ("l2_weight", self.l2_weight >= 0, ">= 0"),
                 ("late_start_step", self.late_start_step is None or self.late_start_step >= 0, ">= 0"),
                 ("total_steps", self.total_steps is None or self.total_steps >= 1, ">= 1"),
                 ("converged_window", self.converged_window >= 1, ">= 1"),
                 ("converged_gain", 0 <= self.converged_gain <= 1, "in [0, 1]"),
                 ("target_ramp", 0 <= self.target_ramp <= 1, "in [0, 1]"),
                 ("late_fraction", 0 <= self.late_fraction < 1, "in [0, 1)"),
                 ("recover_fraction", 0 <= self.recover_fraction < 1, "in [0, 1)"),
                 ("late_gate_travel", self.late_gate_travel >= 0, ">= 0"),
                 ("reach_target", not (self.reach_target and self.total_steps is None),
                  "false without total_steps (its ceiling's schedule)"),
                 ("loss_tolerance", self.loss_tolerance >= 0, ">= 0"),
                 ("size_weight", self.size_weight >= 0, ">= 0"),
                 ("loss_average", 0 <= self.loss_average < 1, "in [0, 1)"),
                 ("branch_average", 0 <= self.branch_average < 1, "in [0, 1)")]
        for name, ok, rule in rules:
            if not ok:
                raise ValueError(f"rank adaptation: {name}={getattr(self, name)!r} must be {rule}")
        if self.rules == "paper":
            for name, value in PAPER_FIXED.items():
                if getattr(self, name) != value:
                    raise ValueError(f"rank adaptation: rules='paper' fixes {name}={value!r}, got "
                                     f"{getattr(self, name)!r}")


@dataclass
class _Progress:
    """What the driver saw of its run: the best slow loss at each check (for the switch), the late steps,
    those after the target's ramp and how many of these took the size branch, the layers removed."""

    checks: list[tuple[int, float]] = field(default_factory=list)
    late_steps: int = 0
    final_steps: int = 0
    size_branch_steps: torch.Tensor | None = None  # among the final steps
    removed: list[str] = field(default_factory=list)


class TwoStageRankAdaptation:
    """Stateful driver of the two stages: the objective per step, the stage switch and periodic pruning.

    Args:
        model: the model with TT / TTM layers.
        settings: :class:`RankSettings`.
        optimizers: their state is sliced (and rescaled) with the parameters when pruning.
    """

    def __init__(self, model: nn.Module, settings: RankSettings,
                 optimizers: Iterable[torch.optim.Optimizer] = ()):
        settings.check()
        threshold = settings.threshold if settings.mask_gates == "every_step" else None
        for _, module in tensorized_modules(model):
            module.gate_threshold = threshold
        self.model = model
        self.settings = settings
        self.optimizers = list(optimizers)
        self.stage = 0
        self.target: LateTarget | None = None
        self.last_size_active: torch.Tensor | None = None
        self.running = RunningLoss(settings.loss_average, settings.branch_average)
        self.progress = _Progress()
        self._size: torch.Tensor | None = None  # stored TT size after the last pruning (the branch test's S)
        self._switch_loss: float | None = None  # slow running loss at the switch (the loss-rise warning)
        self._warned_loss_rise = False
        self.switch: dict[str, float] = {}  # the late stage's start: step, size, reference point
        self.outcome: dict[str, Any] = {}  # after the last of total_steps: reached, shortfall, removed layers
        self._pruned({"params_after": tt_parameter_count(model), "removed": []})

    def objective(self, task_loss: torch.Tensor, step: int) -> torch.Tensor:
        """The training objective of the current stage for one step's task loss (no host sync)."""
        s = self.settings
        self.running.update(task_loss.detach())
        paper = s.rules == "paper"
        if self.stage == 0 and paper:
            objective = task_loss + s.l1_weight * gate_penalty(self.model, s.threshold).to(task_loss)
            if s.l2_weight:
                objective = objective + s.l2_weight * layout(self.model).core_l2().to(task_loss)
            return objective
        if self.stage == 0 or self.recovering(step):
            return early_objective(task_loss, self.model, l1_weight=0.0 if self.stage else s.l1_weight,
                                   l2_weight=s.l2_weight)
        if paper:
            objective, self.last_size_active = paper_late_objective(
                task_loss, self.model, loss_target=self.target.loss_target,
                size=gate_size(self.model, s.threshold), size_target=self.target.size_target,
                penalty_weight=s.l1_weight, threshold=s.threshold, l2_weight=s.l2_weight)
            self._count_branch()
            return objective
        if s.loss_target is None:
            self.target.loss_target = self.running.best
        self.target.loss_fall = self.running.first - self.target.loss_target
        objective, self.last_size_active = late_objective(
            task_loss, self.model, self.target, size=self._size, l2_weight=s.l2_weight,
            branch_loss=self.running.fast, noise=self.running.fast_noise())
        if self.progress.late_steps >= self.switch["ramp_steps"]:  # S0 at its final value
            self._count_branch()
        return objective

    def _count_branch(self) -> None:
        """Count a late step at the final target, and whether it took the size branch (on the device)."""
        counted = self.progress.size_branch_steps
        active = self.last_size_active.to(torch.int64)
        self.progress.size_branch_steps = active if counted is None else counted + active
        self.progress.final_steps += 1

    def after_step(self, step: int) -> dict[str, float]:
        """Ramp, stage switch and pruning after the optimizer step of step ``step`` (0-based).

        Returns the curve values ``stage``, ``params_tt``, ``rank_mean`` and, on late-stage pruning
        steps (which sync with the device anyway), ``size_active`` of the last objective."""
        s = self.settings
        done = step + 1
        pruned = False
        if self.stage == 1:
            self.progress.late_steps += 1
            if self.switch["ramp_steps"]:
                progress = min(1.0, (done - self.switch["step"]) / self.switch["ramp_steps"])
                size, final = self.switch["size"], self.switch["size_target"]
                self.target.size_target.fill_(size - (size - final) * progress)
        every = s.prune_every or 10
        if self.stage == 0 and done % every == 0 and self.running.best is not None:
            self.progress.checks.append((done, float(self.running.best)))
        if self.stage == 0 and self._switch_due(done):
            self.start_late_stage(step=done)
            pruned = True
        elif s.prune_every and done % s.prune_every == 0 and not self.recovering(step):
            floor = float(self.target.size_target) if self.stage == 1 and s.stop_at_target else None
            self._pruned(prune(self.model, s.threshold, self.optimizers, min_size=floor, min_rank=s.min_rank,
                               by=self._prune_by))
            ceiling = self._ceiling(done) if self.stage == 1 and s.reach_target else math.inf
            if float(self._size) > ceiling:
                self._pruned(prune(self.model, 1.0, self.optimizers, min_size=ceiling, min_rank=s.min_rank,
                                   by="share"))
            pruned = True
        parts = layout(self.model)
        gate_sizes = [g.shape[0] for g in parts.gates]  # gate k spans internal bond k+1
        info = {"stage": float(self.stage), "params_tt": float(parts.parameter_count()),
                "rank_mean": sum(gate_sizes) / len(gate_sizes) if gate_sizes else 0.0}
        if pruned and self.stage == 1 and self.last_size_active is not None:
            info["size_active"] = float(self.last_size_active)
            if s.rules == "project":
                self._warn_if_the_loss_rose(done)
        if done == s.total_steps:
            self.outcome.update(reached=self.reached(), shortfall=self.shortfall(),
                                removed=list(self.progress.removed))
        return info

    def _ceiling(self, done: int) -> float:
        """``reach_target``'s ceiling after ``done`` steps: the switch's size falling linearly to ``S0`` at
        the last pruning step before the recovery (before the run's end without one)."""
        every = self.settings.prune_every or 10
        start = self.switch["step"]
        end = (self.switch.get("recover_step") or self.settings.total_steps) // every * every
        progress = min(1.0, (done - start) / max(1, end - start))
        return self.switch["size"] - (self.switch["size"] - self.switch["size_target"]) * progress

    def recovering(self, step: int) -> bool:
        """Whether step ``step`` (0-based) is in the late stage's recovery: its last ``recover_fraction``,
        where the task loss alone is trained at the ranks reached and nothing is pruned."""
        start = self.switch.get("recover_step")
        return self.stage == 1 and start is not None and step >= start

    def _switch_due(self, done: int) -> bool:
        s = self.settings
        if s.target_ratio is None or s.late_start_step is None or done < s.late_start_step:
            return False
        if s.switch_when == "step":
            return True
        if s.late_fraction and s.total_steps is not None and done >= s.total_steps - round(
                s.late_fraction * s.total_steps):
            return True  # the late stage keeps its share of the run, converged or not
        return bool(self.progress.checks) and self.progress.checks[-1][0] == done and self.converged()

    def converged(self) -> bool:
        """Whether the best slow running loss fell by less than ``converged_gain`` of its fall since the
        first check over the last ``converged_window`` steps (checked every ``prune_every`` steps)."""
        checks = self.progress.checks
        s = self.settings
        if len(checks) < 2 or checks[-1][0] - checks[0][0] < s.converged_window:
            return False
        now, best = checks[-1]
        then = next(value for step, value in reversed(checks) if now - step >= s.converged_window)
        fallen = checks[0][1] - best
        return math.isfinite(fallen) and (fallen <= 0 or then - best < s.converged_gain * fallen)

    def _pruned(self, report: dict) -> None:
        """Record a pruning: the stored size (in place: a captured CUDA graph reads the same tensor), and
        a warning per removed layer."""
        if self._size is None:
            reference = next(self.model.parameters())
            self._size = torch.tensor(float(report["params_after"]), dtype=torch.float64,
                                      device=reference.device)
        else:
            self._size.fill_(float(report["params_after"]))
        for name in report["removed"]:
            self.progress.removed.append(name)
            warnings.warn(f"rank adaptation removed layer {name!r}: a bond lost every rank, so its weight is "
                          f"zero (min_rank=0 allows this; the default 1 keeps a rank per bond)",
                          RuntimeWarning, stacklevel=4)

    def _warn_if_the_loss_rose(self, done: int) -> None:
        """Warn once when the slow running loss is above its value at the switch by more than three times
        the late stage's tolerance (the guard should keep it within one; checked on pruning steps, which
        sync with the device anyway)."""
        if self._warned_loss_rise or self._switch_loss is None:
            return
        running, fall = float(self.running.slow), float(self.target.loss_fall)
        allowed = self._switch_loss + LOSS_RISE_TOLERANCES * self.settings.loss_tolerance * max(fall, 0.0)
        if running > allowed + LOSS_RISE_MARGIN:
            self._warned_loss_rise = True
            warnings.warn(
                f"rank adaptation, late stage, step {done}: the running task loss {running:.4g} is well "
                f"above its {self._switch_loss:.4g} at the switch (step {self.switch['step']})",
                RuntimeWarning, stacklevel=4)

    @property
    def _prune_by(self) -> str:
        return "gate" if self.settings.rules == "paper" else "share"

    def start_late_stage(self, loss_target: float | None = None, step: int | None = None) -> LateTarget:
        """Prune, then fix the reference point ``(L0, S0)`` from the current size and loss; ``switch``
        records them with ``step`` (training steps done). Under the paper's rules ``L0`` is
        ``loss_target`` (else the slow running loss now) and ``S0`` is ``target_ratio`` x
        :func:`comera.size.gate_size` now (``switch["gate_size"]``, ``switch["gate_size_target"]``);
        ``switch["size"]`` and ``switch["size_target"]`` are the stored size and its ``target_ratio``."""
        s = self.settings
        self._pruned(prune(self.model, s.threshold, self.optimizers, min_rank=s.min_rank, by=self._prune_by))
        start_size = float(tt_parameter_count(self.model))
        self._speed_up_gates(step)
        if s.rules == "paper":
            return self._start_paper_late_stage(loss_target, step, start_size)
        if loss_target is None:
            loss_target = s.loss_target
        if loss_target is None and self.running.best is None:
            raise RuntimeError("late stage needs loss_target or at least one early-stage step")
        self._switch_loss = None if self.running.slow is None else float(self.running.slow)
        final = s.target_ratio * start_size
        reference = loss_target if loss_target is not None else self.running.best
        left = (s.total_steps - (step or 0)) if s.total_steps is not None else 0
        ramp_steps = max(0, round(s.target_ramp * left))
        recovery = round(s.recover_fraction * left)
        self.target = self._late_target(reference, start_size, final, start_size if ramp_steps else final)
        self.switch.update(step=step or 0, size=start_size, size_target=final, loss_target=float(reference),
                           ramp_steps=ramp_steps,
                           recover_step=s.total_steps - recovery if recovery and s.total_steps else None)
        self.stage = 1
        return self.target

    def _speed_up_gates(self, step: int | None) -> None:
        """Raise the rate of every optimizer group that holds gates alone to ``late_gate_travel`` over the
        late stage's steps where it is below (``switch["gate_lr"]``: the highest such rate after, when
        there is such a group).
        Adam moves a parameter by about its rate per step at most, so a gate can travel at most rate x
        steps in the late stage; a short late stage at the early stage's rate ends before the gates reach
        the threshold (docs/recipe.md, "The gates' travel")."""
        s = self.settings
        if not s.late_gate_travel or s.total_steps is None:
            return
        left = max(1, s.total_steps - (step or 0))
        gates = {id(g) for _, m in tensorized_modules(self.model) for g in m.gates}
        rates = []
        for opt in self.optimizers:
            for group in opt.param_groups:
                if group["params"] and all(id(p) in gates for p in group["params"]):
                    group["lr"] = max(group["lr"], s.late_gate_travel / left)
                    rates.append(group["lr"])
        if rates:
            self.switch["gate_lr"] = max(rates)

    def _start_paper_late_stage(self, loss_target: float | None, step: int | None,
                                start_size: float) -> LateTarget:
        s = self.settings
        if loss_target is None:
            loss_target = s.loss_target
        if loss_target is None and self.running.slow is None:
            raise RuntimeError("late stage needs loss_target or at least one early-stage step")
        reference = float(loss_target if loss_target is not None else self.running.slow)
        counted = float(gate_size(self.model, s.threshold))
        self.switch.update(step=step or 0, size=start_size, size_target=s.target_ratio * start_size,
                           loss_target=reference, ramp_steps=0, gate_size=counted,
                           gate_size_target=s.target_ratio * counted)
        self.target = self._paper_target()
        self.stage = 1
        return self.target

    def _paper_target(self) -> LateTarget:
        """The paper's fixed ``(L0, S0)``, ``S0`` in :func:`comera.size.gate_size`'s count."""
        reference = next(self.model.parameters())
        counted, final = self.switch["gate_size"], self.switch["gate_size_target"]
        return LateTarget(loss_target=self.switch["loss_target"],
                          size_target=torch.tensor(final, dtype=torch.float64, device=reference.device),
                          size_scale=max(counted, 1.0), size_span=max(counted - final, 1.0),
                          size_weight=0.0, tolerance=0.0)

    def _late_target(self, loss_target: float | torch.Tensor, start_size: float, final: float,
                     size_target: float) -> LateTarget:
        s = self.settings
        reference = next(self.model.parameters())
        return LateTarget(loss_target=loss_target,
                          size_target=torch.tensor(size_target, dtype=torch.float64, device=reference.device),
                          size_scale=max(start_size, 1.0), size_span=max(start_size - final, 1.0),
                          size_weight=s.size_weight, tolerance=s.loss_tolerance)

    def reached(self) -> bool | None:
        """Whether the size target is reached: the late stage ran and the TT size is at most
        ``REACHED_WITHIN`` (5%) of the target above it, or no rank above ``min_rank`` can go without taking
        it below the target (one rank's saving). None when there is no target. The one rule: the
        shortfall, each run's ``target_reached`` column and the reports read it."""
        s = self.settings
        if s.target_ratio is None:
            return None
        if self.stage == 0:
            return False
        size, target = tt_parameter_count(self.model), self.switch["size_target"]
        return size - target <= max(smallest_saving(self.model, s.min_rank), REACHED_WITHIN * target)

    def shortfall(self) -> str | None:
        """Why the size target is not reached (None when it is, or when there is none: :meth:`reached`),
        in words."""
        s = self.settings
        if self.reached() is not False:
            return None
        if self.stage == 0:
            return ("no late stage: the task loss was still improving (the stage switch waits until it "
                    "converges; give more steps, or switch_when='step')")
        size = tt_parameter_count(self.model)
        where = (f"stopped at {size / self.switch['size']:.3f} of the size at the switch, "
                 f"target {s.target_ratio}")
        p = self.progress
        final = p.final_steps
        shrinking = float(p.size_branch_steps) / final if final and p.size_branch_steps is not None else 1.0
        if s.rules == "paper":
            if shrinking > 0.5:
                return f"{where}: the late stage ({p.late_steps} steps) ended first; give it more steps"
            return (f"{where}: the loss branch took {1 - shrinking:.0%} of the {final} late steps (the task "
                    f"loss further above L0 = {self.switch['loss_target']:.4g}, relatively, than the size "
                    f"above S0: the paper's rule; loss_target)")
        if s.reach_target:
            return (f"{where}: every bond is down to the min_rank={s.min_rank} ranks it keeps (reach_target "
                    "prunes no further)")
        if shrinking > 0.5:
            return (f"{where}: the late stage ({p.late_steps} steps) ended first; give it more steps or a "
                    f"higher late_gate_travel (Adam moves a gate about its rate per step)")
        return (f"{where}: shrinking was held back on {1 - shrinking:.0%} of the {final} steps at the final "
                f"target, where it would have raised the task loss beyond its tolerance (loss_tolerance; "
                f"reach_target=True reaches the target whatever the loss)")

    def state_dict(self) -> dict[str, Any]:
        """The driver's state (stage, switch point, running losses, the late target as it stands now,
        what it saw), plain Python values."""
        p = self.progress
        return {"stage": self.stage, "switch": dict(self.switch), "running": self.running.state_dict(),
                "switch_loss": self._switch_loss, "warned_loss_rise": self._warned_loss_rise,
                "size_target_now": float(self.target.size_target) if self.target is not None else None,
                "checks": list(p.checks), "late_steps": p.late_steps, "final_steps": p.final_steps,
                "removed": list(p.removed),
                "size_branch_steps": None if p.size_branch_steps is None else int(p.size_branch_steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a driver built with the same settings on the reloaded model."""
        reference = next(self.model.parameters())
        self.stage = int(state["stage"])
        self.switch = dict(state["switch"])
        self.running.load_state_dict(state["running"], reference)
        self._switch_loss = state["switch_loss"]
        self._warned_loss_rise = bool(state["warned_loss_rise"])
        counted = state["size_branch_steps"]
        self.progress = _Progress(checks=[tuple(c) for c in state["checks"]], late_steps=state["late_steps"],
                                  final_steps=state["final_steps"], removed=list(state["removed"]),
                                  size_branch_steps=None if counted is None else torch.tensor(
                                      counted, device=reference.device))
        self.last_size_active = None
        self.target = None
        self._size = None
        self._pruned({"params_after": tt_parameter_count(self.model), "removed": []})
        if self.stage == 1 and self.settings.rules == "paper":
            self.target = self._paper_target()
        elif self.stage == 1:
            loss_target = self.settings.loss_target
            if loss_target is None:
                loss_target = self.running.best
            self.target = self._late_target(loss_target, self.switch["size"], self.switch["size_target"],
                                            state["size_target_now"])
