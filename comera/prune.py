"""Physical rank pruning of TT / TTM layers, decided by each rank's share of its bond or by its gate.

:func:`prune` removes the ranks whose share (:func:`comera.size.rank_shares`), or gate (the paper's rule),
is at or below the threshold, slicing cores, gates, gradients and optimizer state.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from comera.size import bond_sizes, rank_saving, rank_shares, tensorized_modules, tt_parameter_count
from comera.tt import parameter_entries


@torch.no_grad()
def prune(model: nn.Module, threshold: float, optimizers: Iterable[torch.optim.Optimizer] = (),
          min_size: float | None = None, min_rank: int = 1, by: str = "share") -> dict:
    """Physically remove every rank whose share of its bond (:func:`rank_shares`), or gate, is
    ``<= threshold``.

    Args:
        model: a model with TT / TTM layers.
        threshold: a rank goes when its share of its bond's largest (``by="share"``) or its gate
            (``by="gate"``, signed: the ranks the official code's mask zeroes) is at or below it.
        optimizers: their state tensors shaped like a parameter are sliced with it.
        min_size: ranks are removed smallest share first, skipping one that would take
            :func:`~comera.size.tt_parameter_count` below it (the late stage's size target).
        min_rank: every bond keeps at least this many ranks (its largest shares). With 0 a bond may lose
            all of them: the layer's weight is then zero, and its other bonds are emptied too, so that it
            stores nothing (the layer is *removed*: a linear layer outputs its bias).

    Cores, gates, their gradients and every optimizer state tensor shaped like the parameter are sliced;
    the Parameter objects stay the same and scalar state (``step``) is kept. Call it between steps (after
    the optimizer step), never between a forward and its backward.

    Returns:
        ``{"ranks_before", "ranks_after", "params_before", "params_after", "removed"}``, ``removed`` the
        names of the layers this call removed.

    Raises:
        ValueError: ``min_rank`` not an integer >= 0, ``threshold`` not a finite number >= 0, or ``by``
            not "share" or "gate".
    """
    if isinstance(min_rank, bool) or not isinstance(min_rank, int) or min_rank < 0:
        raise ValueError(f"prune: min_rank must be an integer >= 0, got {min_rank!r}")
    if isinstance(threshold, bool) or not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"prune: threshold must be a finite number >= 0, got {threshold!r}")
    if by not in ("share", "gate"):
        raise ValueError(f"prune: by must be 'share' or 'gate', got {by!r}")
    optimizers = list(optimizers)
    named = tensorized_modules(model)
    before = {name: bond_sizes(module) for name, module in named}
    params_before = tt_parameter_count(model)
    if by == "share":
        shares = [rank_shares(module) for _, module in named]
    else:
        shares = [[g.detach() for g in parameter_entries(module.gates)] for _, module in named]
    drop = _ranks_to_drop([module for _, module in named], [list(before[name]) for name, _ in named], shares,
                          threshold, min_size, params_before, min_rank)
    removed = []
    for m, (name, module) in enumerate(named):
        emptied = any(len(drop.get((m, k), ())) == gate.numel() > 0 for k, gate in enumerate(module.gates))
        if emptied:  # the weight is zero whatever the other bonds hold: store nothing
            removed.append(name)
            drop.update({(m, k): set(range(gate.numel())) for k, gate in enumerate(module.gates)})
    for (m, k), gone in drop.items():
        module = named[m][1]
        gate = module.gates[k]
        keep = torch.tensor(sorted(set(range(gate.numel())) - gone), dtype=torch.long, device=gate.device)
        _slice_parameter(module.cores[k], -1, keep, optimizers)
        _slice_parameter(module.cores[k + 1], 0, keep, optimizers)
        _slice_parameter(gate, 0, keep, optimizers)
    return {"ranks_before": before, "ranks_after": {name: bond_sizes(module) for name, module in named},
            "params_before": params_before, "params_after": tt_parameter_count(model), "removed": removed}


def _ranks_to_drop(modules: list[nn.Module], bonds: list[list[int]], shares: list[list[torch.Tensor]],
                   threshold: float, min_size: float | None, size: int, min_rank: int
                   ) -> dict[tuple[int, int], set[int]]:
    """(module number, bond) -> indices of the ranks to remove: share ``<= threshold``, each bond keeping
    ``min_rank`` ranks, smallest share first within the size floor. ``bonds``: each module's bond sizes
    (counted down here as ranks go)."""
    candidates = []  # (share, module number, bond, index)
    for m, module_shares in enumerate(shares):
        for k, share in enumerate(module_shares):
            values = share.float().cpu()
            below = sorted((int(i) for i in (values <= threshold).nonzero().flatten()),
                           key=lambda i: float(values[i]))
            spare = max(0, values.numel() - min_rank)
            candidates += [(float(values[i]), m, k, i) for i in below[:spare]]
    drop: dict[tuple[int, int], set[int]] = {}
    if min_size is None:
        for _, m, k, i in candidates:
            drop.setdefault((m, k), set()).add(i)
        return drop
    for _, m, k, i in sorted(candidates):
        saved = rank_saving(modules[m], k, bonds[m])
        if size - saved < min_size:
            continue
        size -= saved
        bonds[m][k + 1] -= 1
        drop.setdefault((m, k), set()).add(i)
    return drop


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
    sliced = nn.Parameter(param.detach().index_select(dim, keep).contiguous(),
                          requires_grad=param.requires_grad)
    try:
        # A fresh tensor behind the same Python object: autograd graphs still alive from the last step
        # (e.g. the runner's ``loss``) keep the old gradient accumulator, which has the old shape.
        torch.utils.swap_tensors(param, sliced)
    except RuntimeError:  # the old tensor is referenced elsewhere (e.g. a graph not yet backwarded)
        param.data = sliced.data
    param.grad = None if grad is None else grad.index_select(dim, keep).contiguous()
