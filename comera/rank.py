"""Rank adaptation of CoMERA (Sec. 3): rank gates, the two-stage multi-objective training, and pruning.

Every tensorized module (``TTLinear``, ``TTMEmbedding``) exposes ``cores`` and ``gates``. Bond ``k+1``
sits between ``cores[k]`` (last axis) and ``cores[k+1]`` (first axis) and is gated by the diagonal
``D_{k+1} = diag(gates[k])``. A core of shape ``(r_k, *modes_k, r_{k+1})`` holds ``r_k u_k r_{k+1}``
scalars with ``u_k = prod(modes_k)`` (``n_k`` for TT, ``m_k n_k`` for TTM).

Objectives (arXiv 2405.14377, Sec. 3; the paper's text could not be fetched while writing this, so the
formulas are cited by role -- size, bi-objective problem, early stage, late stage -- not by number):

* model size: ``S(D) = sum_k u_k ||g_k||_0 ||g_{k+1}||_0`` with ``||g_0||_0 = ||g_d||_0 = 1``;
  here ``||g||_0`` counts gates with ``|g| > threshold``. Unlike the official code, which under-counts
  TTM cores, every core is counted exactly, and the gates themselves are added (``sum_k ||g_k||_0``) so
  that after pruning ``size_l0 == tt_parameter_count``.
* the bi-objective problem ``min_{G, D} (L(G, D), S(D))``.
* early stage, linear scalarization: ``L + gamma * P(D) + beta * sum_k ||G_k||_F^2``, where the gate
  penalty ``P`` relaxes the l0 norm of ``S`` to an l1 norm over the *active* gates (``g > threshold``).
  Its reduction follows the official code (ziyangjoy/CoMERA ``MNLI_trainer.rank_loss``): the sum of the
  active gates divided by their number (``l1_reduction="mean"``, default). The literal sum
  (``l1_reduction="sum"``) is ~4,000x stronger per gate at the paper's size (4,362 gates): at
  ``gamma = 0.01`` it outweighs the task gradient on almost every gate and prunes every rank within a
  few hundred steps, where the paper's early stage "prunes tensor ranks gently without hurting the model
  performance" (rebuttal). The l2 term on the cores (Prop. 3.1 and the rebuttal: with l1 alone the cores
  grow to compensate shrinking gates) is not in the official code; ``l2_weight`` is 0 by default
  (:class:`RankSettings`, docs/recipe.md).
* sign rule: a gate is active when ``g > threshold`` and pruned otherwise, negative gates included (the
  official ``get_rank_mask`` zeroes every gate ``<= threshold``); ``S(D)`` counts the active gates.
* late stage, achievement scalarization toward the reference point ``(L0, S0)``:
  ``max{w1 (L - L0), w2 (S - S0)} + rho (w1 L + w2 S)``. The max is decided with the exact l0 size
  ``S(D)``; the active branch is then minimized with the differentiable surrogate
  ``S_1(D) = sum_k u_k ||g_k||_1 ||g_{k+1}||_1`` (equal to ``S`` while all gates are 1), plus the same
  ``beta ||G||_F^2``. ``S`` is divided by the size at the start of the late stage so both objectives are
  of order one; ``S0 = target_ratio * S(start of late stage)``. Pruning in the late stage never takes
  the size below ``S0`` (the gates that cross the threshold in the same step are pruned smallest first,
  up to the target), so the run ends at its size target instead of overshooting it.
* the reference loss ``L0`` (``loss_reference``): ``"best"`` (default) is the lowest running (EMA) task
  loss so far, updated every step, and the branch test compares the running loss with it: the size is
  pushed only while the model is as good as it has been. ``"switch"`` fixes ``L0`` at the running loss of
  the switch and compares each step's loss: a model still learning then sits below ``L0`` and the size
  branch wins on every step, and one that switched on a plateau is held there (docs/recipe.md).
* late-stage formulation (``late_formulation``): ``"project"`` is the scalarization above.
  ``"official"`` reproduces the official code's late stage (ziyangjoy/CoMERA
  ``MNLI_trainer.Transformer_MNLI_Trainer._run_epoch_late_stage``): the size branch is taken when the
  relative size gap exceeds the relative loss gap, ``(L - L0) / L < (S - S0) / S``; the size term is the
  early stage's gate penalty ``P`` (mean of the active gates); the weights are fixed,
  ``0.1 L + 0.01 P + lambda P + (1 - lambda) L`` with ``lambda`` the branch indicator; and ``L0 = 0.8``
  (hard-coded there) unless ``loss_target`` is given. ``S`` is the exact l0 size of this module (the
  official ``compute_size`` leaves out the gates and under-counts TTM cores), ``S0 = target_ratio`` times
  it at the switch; pruning, ``stop_at_target`` and ``target_ramp_steps`` apply as in ``"project"``.
* gate masking (``mask_gates``): ``"at_prune"`` multiplies by the raw gates between prunings (negative
  ones included); ``"every_step"`` zeroes every gate ``<= threshold`` in each forward, as the official
  ``get_rank_mask`` does (see :func:`comera.tt.forward_gates`).
* optional target ramp (``target_ramp_steps``, not in the paper): ``S0`` starts at the size at the
  switch and falls linearly to its final value. With a fixed ``S0`` and a short late stage, a size weight
  large enough to reach the target shrinks every gate at once and the accuracy collapses (measured on the
  small CPU transformer: target 0.2 in 600 late steps ended at 0.33 accuracy with size_weight 10); with
  the ramp the size term only pushes while the size is above the moving ``S0`` and the loss branch repairs
  in between (same run: 0.993 accuracy, size within 0.1% of the target). Measured on an earlier,
  4-topic version of the small preset's task; see docs/pipeline.md "Configs" for the current default grid.
"""
from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn

from comera import plain
from comera.tt import parameter_entries

L1_REDUCTIONS = ("mean", "sum")
LOSS_REFERENCES = ("best", "switch")
LATE_FORMULATIONS = ("project", "official")
MASK_GATES = ("at_prune", "every_step")
OFFICIAL_LOSS_TARGET = 0.8       # L0 of the official late stage (MNLI_trainer.train: target_loss=0.8)
OFFICIAL_LATE_WEIGHTS = (0.1, 0.01)  # fixed weights of L and P in both official branches
LOSS_RISE_FACTOR, LOSS_RISE_MARGIN = 1.5, 0.05  # late stage: warn when running loss > 1.5 x switch's + 0.05


def tensorized_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for every module with TT ``cores`` and rank ``gates``."""
    return [(name, module) for name, module in model.named_modules() if _is_tensorized(module)]


def _is_tensorized(module: nn.Module) -> bool:
    # A ParameterList attribute lives in ``_modules``; reading it there skips Module.__getattr__'s
    # AttributeError on every other module (the model is walked a few times per training step).
    children = module._modules
    return isinstance(children.get("cores"), nn.ParameterList) and isinstance(children.get("gates"), nn.ParameterList)


def _check_reduction(where: str, name: str, reduction: str) -> None:
    if reduction not in L1_REDUCTIONS:
        raise ValueError(f"{where}: {name}={reduction!r}, expected one of {L1_REDUCTIONS}")


def ranks(model: nn.Module) -> dict[str, list[int]]:
    """Current TT ranks ``[1, r_1, ..., 1]`` of every tensorized module, read from the core shapes."""
    return {name: _bond_sizes(module) for name, module in tensorized_modules(model)}


def tt_parameter_count(model: nn.Module) -> int:
    """Exact number of stored TT scalars: every core (TT and TTM) and every gate."""
    return _layout(model).parameter_count()


def gate_penalty(model: nn.Module, threshold: float, reduction: str = "mean") -> torch.Tensor:
    """Early-stage size surrogate over the active gates (``g > threshold``): their sum, divided by
    their number for ``reduction="mean"`` (the official code), or not (``"sum"``). Zero when no gate is
    active; inactive gates get no gradient. No host sync."""
    _check_reduction("gate_penalty", "reduction", reduction)
    return _gate_penalty(_layout(model), threshold, reduction)


def core_l2(model: nn.Module) -> torch.Tensor:
    """``sum_k ||G_k||_F^2`` over all tensorized modules."""
    return _core_l2(_layout(model))


def size_l0(model: nn.Module, threshold: float) -> torch.Tensor:
    """Exact model size ``S(D)`` of the tensorized modules counting gates above ``threshold``.

    A tensor on the parameters' device (no host sync), computed with a fixed handful of kernels."""
    return _size_l0(_layout(model), threshold)


def size_l1(model: nn.Module) -> torch.Tensor:
    """Differentiable size surrogate ``sum_k u_k ||g_k||_1 ||g_{k+1}||_1`` (late stage)."""
    return _size_l1(_layout(model))


def early_objective(task_loss: torch.Tensor, model: nn.Module, *, l1_weight: float, l2_weight: float,
                    threshold: float, l1_reduction: str = "mean") -> torch.Tensor:
    """Linear scalarization of the early stage: ``L + gamma P(D) + beta sum ||G||_F^2`` with the gate
    penalty ``P`` of :func:`gate_penalty`."""
    _check_reduction("early_objective", "l1_reduction", l1_reduction)
    layout = _layout(model)
    objective = task_loss
    if l1_weight:
        objective = objective + l1_weight * _gate_penalty(layout, threshold, l1_reduction).to(task_loss)
    return _add_core_l2(objective, layout, l2_weight)


@dataclass
class RankSettings:
    """Settings of the two-stage rank adaptation. The defaults are the library's recipe, the one set of
    CoMERA defaults: :class:`comera.RankAdaptation` and the pipeline's ``comera`` method
    (``baselines/comera.py``) take theirs from here; how they were chosen: docs/recipe.md."""

    l1_weight: float = 0.01         # gamma (early stage)
    l2_weight: float = 0.0          # beta (both stages)
    l1_reduction: str = "mean"      # gate penalty over the active gates: "mean" (official code) or "sum"
    threshold: float = 1e-2         # gates at or below are pruned
    prune_every: int = 10           # steps between physical prunings (0: never during a stage)
    late_start_step: int | None = None  # steps of the early stage; None: early stage only
    target_ratio: float | None = None   # S0 / S(start of late stage); None: no late stage
    loss_target: float | None = None    # L0 fixed; None: from loss_reference (project), 0.8 (official)
    loss_reference: str = "best"        # L0 when loss_target is None (project): "best" running loss so far,
                                        # or "switch" (the running loss at the stage switch, fixed)
    loss_weight: float = 1.0            # w1, w2, rho: "project" only ("official" has fixed weights)
    size_weight: float = 5.0            # 10 killed README's MLP at the switch (docs/recipe.md)
    rho: float = 1.0                    # the task loss keeps at least half its weight in the size branch
    late_formulation: str = "project"   # late-stage branch test / size term / weights: "project" or "official"
    mask_gates: str = "at_prune"        # forward with raw gates ("at_prune") or gates <= threshold zeroed
    loss_average: float = 0.98      # EMA factor of the running task loss used for L0
    stop_at_target: bool = True     # late-stage pruning never takes the size below S0
    target_ramp_steps: int = 0      # 0: S0 fixed (the paper); n: S0 falls linearly to its value in n steps


@dataclass
class LateTarget:
    """Reference point and weights of the late-stage achievement scalarization."""

    loss_target: float | torch.Tensor  # L0 (a 0-dim tensor when it follows the best running loss)
    size_target: torch.Tensor   # S0, in scalars (a 0-dim tensor: a ramped target updates in place)
    size_scale: float           # S at the start of the late stage; sizes are divided by it
    loss_weight: float = RankSettings.loss_weight    # w1
    size_weight: float = RankSettings.size_weight    # w2
    rho: float = RankSettings.rho                    # augmentation weight
    formulation: str = "project"  # "project" or "official" (see the module docstring)


def late_objective(task_loss: torch.Tensor, model: nn.Module, target: LateTarget, *, threshold: float,
                   l2_weight: float, branch_loss: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Achievement scalarization of the late stage.

    Returns ``(objective, size_active)``; ``size_active`` is a bool tensor, true when the l0 size term
    ``w2 (S - S0)`` exceeds the loss term ``w1 (L - L0)`` (then the size surrogate gets weight
    ``(1 + rho) w2`` and the loss ``rho w1``; otherwise the other way round). ``branch_loss`` is the ``L``
    of that test (default: ``task_loss``; the driver passes the running loss). With
    ``target.formulation == "official"`` the branch test, size term and weights are the official code's
    (:func:`official_late_objective`)."""
    if target.formulation == "official":
        objective, size_active = official_late_objective(task_loss, model, target, threshold=threshold)
        return _add_core_l2(objective, _layout(model), l2_weight), size_active
    layout = _layout(model)
    scale = target.size_scale
    compared = task_loss.detach() if branch_loss is None else branch_loss.detach().to(task_loss)
    loss_gap = target.loss_weight * (compared - target.loss_target)
    size_gap = target.size_weight * (_size_l0(layout, threshold) - target.size_target).to(task_loss) / scale
    size_active = size_gap > loss_gap
    surrogate = _size_l1(layout).to(task_loss) / scale
    w1, w2, rho = target.loss_weight, target.size_weight, target.rho
    size_branch = rho * w1 * task_loss + (1 + rho) * w2 * surrogate
    loss_branch = (1 + rho) * w1 * task_loss + rho * w2 * surrogate
    objective = _add_core_l2(torch.where(size_active, size_branch, loss_branch), layout, l2_weight)
    return objective, size_active


def official_late_objective(task_loss: torch.Tensor, model: nn.Module, target: LateTarget, *,
                            threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The official late stage: ``lambda = [(L - L0) / L < (S - S0) / S]`` with the exact l0 size ``S``,
    objective ``0.1 L + 0.01 P + lambda P + (1 - lambda) L`` with the gate penalty ``P`` (mean of the
    active gates). Returns ``(objective, size_active)``, ``size_active = lambda`` as a bool tensor."""
    layout = _layout(model)
    loss = task_loss.detach()
    size = _size_l0(layout, threshold).to(task_loss)
    size_active = (loss - target.loss_target) / loss < (size - target.size_target.to(task_loss)) / size
    penalty = _gate_penalty(layout, threshold, "mean").to(task_loss)
    lam = size_active.to(task_loss.dtype)
    w_loss, w_penalty = OFFICIAL_LATE_WEIGHTS
    return w_loss * task_loss + w_penalty * penalty + lam * penalty + (1 - lam) * task_loss, size_active


@torch.no_grad()
def prune(model: nn.Module, threshold: float, optimizers: Iterable[torch.optim.Optimizer] = (),
          min_size: float | None = None) -> dict:
    """Physically remove every rank whose gate is inactive (``g <= threshold``, negative gates included).

    With ``min_size``, inactive ranks are removed smallest gate first and one is skipped when removing it
    would take :func:`tt_parameter_count` below ``min_size`` (the late stage's size target).
    Cores, gates, their gradients and every optimizer state tensor shaped like the parameter
    (AdamW ``exp_avg``, ``exp_avg_sq``, ...) are sliced; the Parameter objects stay the same and scalar
    state (``step``) is kept. A bond may shrink to size 0 (the module's weight is then zero). Call it
    between steps (after the optimizer step), never between a forward and its backward.
    Returns ``{"ranks_before", "ranks_after", "params_before", "params_after"}``."""
    optimizers = list(optimizers)
    before, params_before = ranks(model), tt_parameter_count(model)
    modules = [module for _, module in tensorized_modules(model)]
    drop = _ranks_to_drop(modules, threshold, min_size, params_before)
    for (m, k), gone in drop.items():
        module = modules[m]
        gate = module.gates[k]
        keep = torch.tensor(sorted(set(range(gate.numel())) - gone), dtype=torch.long, device=gate.device)
        _slice_parameter(module.cores[k], -1, keep, optimizers)
        _slice_parameter(module.cores[k + 1], 0, keep, optimizers)
        _slice_parameter(gate, 0, keep, optimizers)
    return {"ranks_before": before, "ranks_after": ranks(model),
            "params_before": params_before, "params_after": tt_parameter_count(model)}


def _ranks_to_drop(modules: list[nn.Module], threshold: float, min_size: float | None,
                   size: int) -> dict[tuple[int, int], set[int]]:
    """(module number, bond) -> indices of the inactive ranks to remove, within the size floor."""
    candidates = []  # (gate value, module number, bond, index)
    for m, module in enumerate(modules):
        for k, gate in enumerate(module.gates):
            values = gate.detach().float().cpu()
            candidates += [(float(values[i]), m, k, int(i)) for i in (values <= threshold).nonzero().flatten()]
    drop: dict[tuple[int, int], set[int]] = {}
    if min_size is None:
        for _, m, k, i in candidates:
            drop.setdefault((m, k), set()).add(i)
        return drop
    bonds = [_bond_sizes(module) for module in modules]
    for _, m, k, i in sorted(candidates):
        cores, r = modules[m].cores, bonds[m]
        # one rank less on bond k+1: core k loses r_k u_k scalars, core k+1 u_{k+1} r_{k+2}, plus the gate
        saved = (r[k] * math.prod(cores[k].shape[1:-1]) + math.prod(cores[k + 1].shape[1:-1]) * r[k + 2] + 1)
        if size - saved < min_size:
            continue
        size -= saved
        r[k + 1] -= 1
        drop.setdefault((m, k), set()).add(i)
    return drop


def _running(average: torch.Tensor | None, loss: torch.Tensor, factor: float) -> torch.Tensor:
    """The running average of the task loss after ``loss``: a non-finite loss (a step a GradScaler skips)
    leaves it as it was, and a finite one replaces a non-finite average; no host sync (CUDA graphs)."""
    if average is None:
        return loss.clone()
    blended = torch.where(torch.isfinite(average), factor * average + (1 - factor) * loss, loss)
    return torch.where(torch.isfinite(loss), blended, average)


class TwoStageRankAdaptation:
    """Stateful driver of the two stages: objective per step, stage switch and periodic pruning."""

    def __init__(self, model: nn.Module, settings: RankSettings,
                 optimizers: Iterable[torch.optim.Optimizer] = ()):
        if settings.target_ratio is not None and not 0 < settings.target_ratio <= 1:
            raise ValueError(f"target_ratio={settings.target_ratio} must be in (0, 1]")
        if settings.l1_reduction not in L1_REDUCTIONS:
            raise ValueError(f"l1_reduction={settings.l1_reduction!r} must be one of {L1_REDUCTIONS}")
        if settings.late_formulation not in LATE_FORMULATIONS:
            raise ValueError(f"late_formulation={settings.late_formulation!r} must be one of {LATE_FORMULATIONS}")
        if settings.loss_reference not in LOSS_REFERENCES:
            raise ValueError(f"loss_reference={settings.loss_reference!r} must be one of {LOSS_REFERENCES}")
        if settings.mask_gates not in MASK_GATES:
            raise ValueError(f"mask_gates={settings.mask_gates!r} must be one of {MASK_GATES}")
        threshold = settings.threshold if settings.mask_gates == "every_step" else None
        for _, module in tensorized_modules(model):
            module.gate_threshold = threshold
        self.model = model
        self.settings = settings
        self.optimizers = list(optimizers)
        self.stage = 0
        self.target: LateTarget | None = None
        self.last_size_active: torch.Tensor | None = None
        self._loss_ema: torch.Tensor | None = None
        self._loss_best: torch.Tensor | None = None  # lowest running loss so far (no host sync)
        self._l0_follows_best = False  # set at the switch: L0 is the best running loss, updated every step
        self._switch_loss: float | None = None  # running loss at the switch, for the loss-rise warning
        self._warned_loss_rise = False
        self.switch: dict[str, float] = {}  # the late stage's start: step, size, reference point

    def objective(self, task_loss: torch.Tensor, step: int) -> torch.Tensor:
        """Training objective of the current stage (early or late stage) for one step's task loss."""
        s = self.settings
        self._loss_ema = _running(self._loss_ema, task_loss.detach(), s.loss_average)
        self._loss_best = self._loss_ema.clone() if self._loss_best is None else torch.fmin(
            self._loss_best, self._loss_ema)  # fmin: a NaN best (from a first NaN loss) gives way
        if self.stage == 0:
            return early_objective(task_loss, self.model, l1_weight=s.l1_weight, l2_weight=s.l2_weight,
                                   threshold=s.threshold, l1_reduction=s.l1_reduction)
        if self._l0_follows_best:
            self.target.loss_target = self._loss_best
        objective, self.last_size_active = late_objective(
            task_loss, self.model, self.target, threshold=s.threshold, l2_weight=s.l2_weight,
            branch_loss=self._loss_ema if self._l0_follows_best else None)
        return objective

    def after_step(self, step: int) -> dict[str, float]:
        """Stage switch after ``late_start_step`` steps, pruning every ``prune_every`` steps.

        Returns the curve values ``stage``, ``params_tt``, ``rank_mean`` and, on late-stage pruning
        steps (which sync with the device anyway), ``size_active`` of the last objective."""
        s = self.settings
        done = step + 1
        pruned = False
        if self.stage == 1 and s.target_ramp_steps:
            progress = min(1.0, (done - self.switch["step"]) / s.target_ramp_steps)
            size, final = self.switch["size"], self.switch["size_target"]
            self.target.size_target.fill_(size - (size - final) * progress)
        if (self.stage == 0 and s.late_start_step is not None and s.target_ratio is not None
                and done >= s.late_start_step):
            self.start_late_stage(step=done)
            pruned = True
        elif s.prune_every and done % s.prune_every == 0:
            floor = float(self.target.size_target) if self.stage == 1 and s.stop_at_target else None
            prune(self.model, s.threshold, self.optimizers, min_size=floor)
            pruned = True
        layout = _layout(self.model)
        gate_sizes = [g.shape[0] for g in layout.gates]  # gate k spans internal bond k+1
        info = {"stage": float(self.stage), "params_tt": float(layout.parameter_count()),
                "rank_mean": sum(gate_sizes) / len(gate_sizes) if gate_sizes else 0.0}
        if pruned and self.stage == 1 and self.last_size_active is not None:
            info["size_active"] = float(self.last_size_active)
            self._warn_if_the_loss_rose(done)
        return info

    def _warn_if_the_loss_rose(self, done: int) -> None:
        """Warn once when the running task loss is well above its value at the switch (checked on pruning
        steps, which sync with the device anyway)."""
        if self._warned_loss_rise or self._switch_loss is None:
            return
        running = float(self._loss_ema)
        if running > LOSS_RISE_FACTOR * self._switch_loss + LOSS_RISE_MARGIN:
            self._warned_loss_rise = True
            warnings.warn(
                f"rank adaptation, late stage, step {done}: the running task loss {running:.4g} is well above "
                f"its {self._switch_loss:.4g} at the switch (step {self.switch['step']}); the size target "
                f"{self.settings.target_ratio} may be too aggressive for the steps left: give more steps, a "
                f"larger target or a smaller size_weight (docs/recipe.md)", RuntimeWarning, stacklevel=4)

    def start_late_stage(self, loss_target: float | None = None, step: int | None = None) -> LateTarget:
        """Prune, then fix the reference point ``(L0, S0)`` from the current size and loss; ``switch``
        records them with ``step`` (training steps done)."""
        s = self.settings
        prune(self.model, s.threshold, self.optimizers)
        start_size = float(tt_parameter_count(self.model))
        if loss_target is None:
            loss_target = s.loss_target
        if loss_target is None and s.late_formulation == "official":
            loss_target = OFFICIAL_LOSS_TARGET
        self._l0_follows_best = loss_target is None and s.loss_reference == "best"
        self._switch_loss = None if self._loss_ema is None else float(self._loss_ema)
        if loss_target is None:
            if self._loss_ema is None:
                raise RuntimeError("late stage needs loss_target or at least one early-stage step")
            loss_target = float(self._loss_best if self._l0_follows_best else self._loss_ema)
        final = s.target_ratio * start_size
        self.target = self._late_target(loss_target, start_size, start_size if s.target_ramp_steps else final)
        self.switch.update(step=step or 0, size=start_size, size_target=final, loss_target=loss_target)
        self.stage = 1
        return self.target

    def _late_target(self, loss_target: float | torch.Tensor, start_size: float, size_target: float) -> LateTarget:
        s = self.settings
        reference = next(self.model.parameters())
        return LateTarget(loss_target=loss_target,
                          size_target=torch.tensor(size_target, dtype=torch.float64, device=reference.device),
                          size_scale=max(start_size, 1.0), loss_weight=s.loss_weight, size_weight=s.size_weight,
                          rho=s.rho, formulation=s.late_formulation)

    def state_dict(self) -> dict[str, Any]:
        """The driver's state (stage, switch point, running losses, the late target as it stands now), plain
        Python values: with the model's and the optimizers' state dicts, what a resumed run needs."""
        def value(t: torch.Tensor | float | None) -> float | None:
            return None if t is None else float(t)

        return {"stage": self.stage, "switch": dict(self.switch), "loss_ema": value(self._loss_ema),
                "loss_best": value(self._loss_best), "l0_follows_best": self._l0_follows_best,
                "switch_loss": self._switch_loss, "warned_loss_rise": self._warned_loss_rise,
                "size_target_now": value(self.target.size_target) if self.target is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a driver built with the same settings on the reloaded model."""
        reference = next(self.model.parameters())

        def tensor(v: float | None) -> torch.Tensor | None:
            return None if v is None else torch.tensor(v, dtype=reference.dtype, device=reference.device)

        self.stage = int(state["stage"])
        self.switch = dict(state["switch"])
        self._loss_ema, self._loss_best = tensor(state["loss_ema"]), tensor(state["loss_best"])
        self._l0_follows_best = bool(state["l0_follows_best"])
        self._switch_loss = state["switch_loss"]
        self._warned_loss_rise = bool(state["warned_loss_rise"])
        self.last_size_active = None
        self.target = None
        if self.stage == 1:
            loss_target = self._loss_best if self._l0_follows_best else self.switch["loss_target"]
            self.target = self._late_target(loss_target, self.switch["size"], state["size_target_now"])


def _add_core_l2(objective: torch.Tensor, layout: "_Layout", l2_weight: float) -> torch.Tensor:
    return objective + l2_weight * _core_l2(layout).to(objective) if l2_weight else objective


def _gate_penalty(layout: "_Layout", threshold: float, reduction: str) -> torch.Tensor:
    if not layout.gates:
        return layout.one * 0
    entries = torch.cat(layout.gates).to(layout.one.dtype)  # gates are 1-D: no per-gate view nodes
    active = entries > threshold
    total = torch.where(active, entries, torch.zeros_like(entries)).sum()
    return total if reduction == "sum" else total / active.sum().clamp_min(1).to(total.dtype)


def _core_l2(layout: "_Layout") -> torch.Tensor:
    if not layout.cores:
        return layout.one * 0
    if plain.active():
        return torch.stack([c.square().sum() for c in layout.cores]).to(layout.one.dtype).sum()
    return plain.apply(_SumOfSquares, layout.one, *layout.cores)


class _SumOfSquares(torch.autograd.Function):
    """``sum_k ||T_k||_F^2`` (in the dtype of ``like``) with the gradient ``2 g T_k`` of every tensor
    from one multi-tensor kernel: autograd through ``_foreach_norm`` and ``square`` runs several kernels
    per tensor (measured: 0.5 ms of a 12 ms CoMERA step of the small transformer, 81 cores)."""

    @staticmethod
    def forward(ctx, like, *tensors):
        ctx.save_for_backward(*tensors)
        return torch.stack(torch._foreach_norm(tensors, 2)).to(like.dtype).square().sum()

    @staticmethod
    def backward(ctx, grad):
        tensors = list(ctx.saved_tensors)
        scale = (2 * grad).to(tensors[0].dtype)
        if torch.is_grad_enabled():  # create_graph: _foreach_mul by a 0-d tensor has no double backward
            return (None, *(t * scale for t in tensors))
        return (None, *torch._foreach_mul(tensors, scale))


def _size_l0(layout: "_Layout", threshold: float) -> torch.Tensor:
    if not layout.gates:
        return layout.bond_size(layout.one[None][:0], count_gates=True)
    entries = torch.cat([g.detach() for g in layout.gates])
    counts = torch.zeros(len(layout.gates), device=layout.one.device, dtype=layout.one.dtype)
    counts = counts.index_add(0, layout.segment, (entries > threshold).to(counts.dtype))
    return layout.bond_size(counts, count_gates=True)


def _size_l1(layout: "_Layout") -> torch.Tensor:
    return layout.bond_size(_per_tensor_norms(layout.gates, 1, layout), count_gates=False)


def _bond_sizes(module: nn.Module) -> list[int]:
    return [module.cores[0].shape[0]] + [core.shape[-1] for core in module.cores]


@dataclass
class _Layout:
    """Index tensors that turn per-gate norms into sizes with a few vectorized kernels."""

    key: tuple
    cores: list[nn.Parameter]
    gates: list[nn.Parameter]
    one: torch.Tensor       # a scalar 1 (device and dtype of the sizes)
    segment: torch.Tensor   # gate number of every gate entry, for the l0 counts
    left: torch.Tensor      # per core: index of its left-bond norm in [gate norms..., 1]
    right: torch.Tensor     # per core: index of its right-bond norm
    unit: torch.Tensor      # per core: u_k = prod of its mode sizes

    def parameter_count(self) -> int:
        """Scalars in the cores and the gates."""
        return sum(p.numel() for p in self.cores) + sum(p.numel() for p in self.gates)

    def bond_size(self, gate_norms: torch.Tensor, count_gates: bool) -> torch.Tensor:
        """``sum_cores u_k v_left v_right`` (+ ``sum v`` over gates) for per-gate values ``v``."""
        values = torch.cat([gate_norms, self.one.reshape(1)])
        size = (self.unit * values[self.left] * values[self.right]).sum()
        return size + gate_norms.sum() if count_gates else size


_LAYOUTS: "weakref.WeakKeyDictionary[nn.Module, _Layout]" = weakref.WeakKeyDictionary()


def _tensorized(model: nn.Module) -> list[nn.Module]:
    """The modules of :func:`tensorized_modules`, in the same order, without building their names (the
    layout is looked up a few times per training step)."""
    found, seen, stack = [], set(), [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if _is_tensorized(module):
            found.append(module)
        stack.extend(child for child in reversed(module._modules.values()) if child is not None)
    return found


def _layout(model: nn.Module) -> _Layout:
    modules = _tensorized(model)
    cores = [c for module in modules for c in parameter_entries(module.cores)]
    gates = [g for module in modules for g in parameter_entries(module.gates)]
    # Parameters keep their identity through pruning and .to(), so the bond sizes (a gate's length; pruning
    # slices a bond's gate with its two cores), device and dtype are in the key; map() keeps it cheap.
    key = (tuple(map(id, cores)), tuple(map(id, gates)), tuple(map(len, gates)),
           (cores[0].device, cores[0].dtype) if cores else None)
    cached = _LAYOUTS.get(model)
    if cached is not None and cached.key == key:
        return cached
    reference = cores[0] if cores else torch.zeros(())
    factory = {"device": reference.device}
    left, right, unit, offset = [], [], [], 0
    for module in modules:
        count = len(module.gates)
        for k, core in enumerate(module.cores):
            left.append(offset + k - 1 if k > 0 else -1)
            right.append(offset + k if k < count else -1)
            unit.append(math.prod(core.shape[1:-1]))
        offset += count
    ones_slot = offset  # index of the constant 1 appended after the gate norms
    layout = _Layout(
        key=key, cores=cores, gates=gates,
        one=torch.ones((), dtype=reference.dtype, **factory),
        segment=torch.cat([torch.full((g.shape[0],), i, dtype=torch.long) for i, g in enumerate(gates)]
                          ).to(**factory) if gates else torch.zeros(0, dtype=torch.long, **factory),
        left=torch.tensor([i if i >= 0 else ones_slot for i in left], dtype=torch.long, **factory),
        right=torch.tensor([i if i >= 0 else ones_slot for i in right], dtype=torch.long, **factory),
        unit=torch.tensor(unit, dtype=reference.dtype, **factory))
    _LAYOUTS[model] = layout
    return layout


def _per_tensor_norms(tensors: list[torch.Tensor], order: int, layout: _Layout) -> torch.Tensor:
    """Vector of per-tensor ``order``-norms (one fused ``foreach`` kernel where available)."""
    if not tensors:
        return layout.one[None][:0]
    return torch.stack(torch._foreach_norm(tensors, order)).to(layout.one.dtype)


def _slice_parameter(param: nn.Parameter, dim: int, keep: torch.Tensor,
                     optimizers: list[torch.optim.Optimizer]) -> None:
    shape = param.shape
    for opt in optimizers:
        state = opt.state.get(param)
        if not state:
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == shape:
                state[key] = value.index_select(dim, keep.to(value.device)).contiguous()
    grad = param.grad
    sliced = nn.Parameter(param.detach().index_select(dim, keep).contiguous(), requires_grad=param.requires_grad)
    try:
        # A fresh tensor behind the same Python object: autograd graphs still alive from the last step
        # (e.g. the runner's ``loss``) keep the old gradient accumulator, which has the old shape.
        torch.utils.swap_tensors(param, sliced)
    except RuntimeError:  # the old tensor is referenced elsewhere (e.g. a graph not yet backwarded)
        param.data = sliced.data
    param.grad = None if grad is None else grad.index_select(dim, keep).contiguous()
