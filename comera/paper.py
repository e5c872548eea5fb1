"""The paper's rank-adaptation rules (arXiv 2405.14377 and its official code, ziyangjoy/CoMERA): the gate
penalty ``rank_loss`` (:func:`gate_penalty`) and the late stage's two-branch objective
(:func:`paper_late_objective`), with the settings the rules fix. :class:`comera.rank.TwoStageRankAdaptation`
runs them with ``rules="paper"``; where the default rules depart from them: docs/library-reference.md.
"""
from __future__ import annotations

import torch
from torch import nn

from comera.size import layout, tensorized_modules
from comera.tt import parameter_entries

PAPER_LOSS_WEIGHT = 0.1  # the paper's late objective keeps the task loss at this weight in both branches
PAPER_FIXED = {"switch_when": "step", "target_ramp": 0.0, "mask_gates": "every_step", "stop_at_target": False,
               "late_fraction": 0.0, "recover_fraction": 0.0, "reach_target": False}
"""Settings the paper's rules fix: the switch at a fixed step, S0 fixed, gates <= threshold masked in every
forward (so pruning them changes nothing), pruning by the threshold alone, no switch deadline, no recovery
steps and no size ceiling (the project's late_fraction, recover_fraction and reach_target)."""
OFFICIAL_LATE_EPOCH_STEPS = 392_702 // 32
"""Steps of one epoch of the official MNLI run (392,702 training pairs, batch 32, the last batch dropped);
its late stage is 10 of them."""
OFFICIAL_LOSS_TARGET = 0.8
"""The official MNLI run's ``L0`` (``target_loss=0.8`` in its driver), read here as the loss level its model
had reached by the switch: a three-class model near the accuracy its script's checkpoint name gives
(0.643) has a loss of that order (an inference: the official logs are not available)."""
PAPER_DEFAULTS = {"l1_weight": 0.01, "min_rank": 0, "loss_target": None,
                  "late_gate_travel": 1e-3 * OFFICIAL_LATE_EPOCH_STEPS, **PAPER_FIXED}
"""The paper's rules' defaults: the official code's penalty weight, no rank kept per bond; ``L0`` the slow
running loss at the switch (``loss_target`` None: the official 0.8 translated to a task whose loss has
another scale; 0.8 on MNLI, config/paper.yaml); the gates' travel over the late stage (rate x steps) of
one official late epoch at its gate rate 1e-3 (12.3; its 10 epochs give 123): a late stage of a few
hundred steps gets the rate that makes it up (docs/library-reference.md, "The paper's rules")."""
PAPER_UNREAD = ("converged_window", "converged_gain", "loss_tolerance", "size_weight", "branch_average")
"""Settings the paper's rules do not read (the project's convergence switch and loss guard)."""


def gate_penalty(model: nn.Module, threshold: float = 1e-2, reduction: str = "mean") -> torch.Tensor:
    """The official code's ``rank_loss``: the gate entries above ``threshold``, summed, over their count.

    ``R = sum_{x > tol} x / #{x > tol}`` over every gate entry ``x`` of the model's TT / TTM layers
    (signed: a negative entry is below the threshold). The count is a constant for the gradient, so each
    entry above the threshold gets ``1 / #{x > tol}`` and every other entry 0. With no entry above the
    threshold (or no TT layer) the penalty is 0 with zero gradients (the official code divides 0 by 0
    there). A 0-dim tensor; no host sync.

    Args:
        model: the model with TT / TTM layers.
        threshold: ``tol``; entries at or below it count nothing.
        reduction: ``"mean"`` (the official ``rank_loss``) or ``"sum"`` (the numerator alone).

    Example::

        >>> layer = TTLinear(16, 16, rank=4)          # gates start at 1
        >>> gate_penalty(layer)                       # every entry counts: their mean
        tensor(1., grad_fn=<DivBackward0>)
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"gate_penalty: reduction must be 'mean' or 'sum', got {reduction!r}")
    gates = [g.reshape(-1) for _, module in tensorized_modules(model)
             for g in parameter_entries(module.gates)]
    if not gates:
        return layout(model).one * 0
    entries = torch.cat(gates)
    total = torch.nn.functional.threshold(entries, threshold, 0.0).sum()
    if reduction == "sum":
        return total
    return total / (entries > threshold).sum().clamp_min(1).to(total.dtype)


def paper_late_objective(task_loss: torch.Tensor, model: nn.Module, *, loss_target: float,
                         size: torch.Tensor | float, size_target: torch.Tensor | float,
                         penalty_weight: float = 0.01, threshold: float = 1e-2,
                         l2_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's late-stage objective for one step (the official ``_run_epoch_late_stage``; no host sync).

    ``lambda = [(L - L0) / L < (S - S0) / S]``, then
    ``0.1 L + penalty_weight R + lambda R + (1 - lambda) L`` with ``R`` = :func:`gate_penalty`: while the
    size is further above ``S0``, relatively, than the loss above ``L0``, the gates are pushed down at full
    weight; otherwise the task loss is.

    Args:
        task_loss: this step's task loss ``L`` (also the branch test's).
        model: the model with TT / TTM layers.
        loss_target: ``L0``.
        size: ``S``, :func:`comera.size.gate_size` now.
        size_target: ``S0``, counted as ``size``.
        penalty_weight: the weight of ``R`` in both branches (the official 0.01).
        threshold: the gate threshold of ``R``.
        l2_weight: ``beta``, the weight of the cores' squared norms (not in the paper; 0 there).

    Returns:
        ``(objective, size_active)``: ``size_active`` (``lambda``) a bool tensor, true in the size branch.
    """
    penalty = gate_penalty(model, threshold).to(task_loss)
    loss = task_loss.detach()
    size = torch.as_tensor(size).to(task_loss)
    size_active = (loss - loss_target) / loss < (size - torch.as_tensor(size_target).to(task_loss)) / size
    lam = size_active.to(task_loss.dtype)
    objective = (PAPER_LOSS_WEIGHT * task_loss + penalty_weight * penalty + lam * penalty
                 + (1 - lam) * task_loss)
    if l2_weight:
        objective = objective + l2_weight * layout(model).core_l2().to(task_loss)
    return objective, size_active
