"""The size of a model's TT / TTM layers: ranks, exact parameter counts and the size terms of rank adaptation.

:func:`tt_parameter_count` (as stored), :func:`size_l0` (active gates only), :func:`soft_size` (soft
ranks, differentiable; why: docs/library-reference.md). The size formula: docs/design-notes.md.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from comera import plain
from comera.tt import bond_sizes as tt_bond_sizes, parameter_entries


def is_tensorized(module: nn.Module) -> bool:
    """Whether ``module`` has TT ``cores`` and rank ``gates`` (both ``nn.ParameterList``)."""
    # A ParameterList attribute lives in ``_modules``; reading it there skips Module.__getattr__'s
    # AttributeError on every other module (the model is walked a few times per training step).
    children = module._modules
    return isinstance(children.get("cores"), nn.ParameterList) and isinstance(children.get("gates"),
                                                                              nn.ParameterList)


def tensorized_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for every module with TT ``cores`` and rank ``gates``."""
    return [(name, module) for name, module in model.named_modules() if is_tensorized(module)]


def bond_sizes(module: nn.Module) -> list[int]:
    """``[1, r_1, ..., r_{d-1}, 1]`` of one tensorized module, read from its core shapes."""
    return list(tt_bond_sizes(parameter_entries(module.cores)))


def rank_saving(module: nn.Module, k: int, bonds: list[int] | None = None) -> int:
    """Scalars one rank fewer on internal bond ``k + 1`` (gate ``k``) of ``module`` saves: core ``k`` loses
    ``r_k u_k``, core ``k + 1`` loses ``u_{k+1} r_{k+2}``, and the gate one entry. ``bonds``: the bond sizes
    to count with (default: :func:`bond_sizes` of ``module``)."""
    r = bond_sizes(module) if bonds is None else bonds
    cores = module.cores
    return r[k] * math.prod(cores[k].shape[1:-1]) + math.prod(cores[k + 1].shape[1:-1]) * r[k + 2] + 1


def ranks(model: nn.Module) -> dict[str, list[int]]:
    """Current TT ranks ``[1, r_1, ..., 1]`` of every tensorized module."""
    return {name: bond_sizes(module) for name, module in tensorized_modules(model)}


def removed_layers(model: nn.Module) -> list[str]:
    """Names of the tensorized modules with a bond of rank 0: their weight is zero (a linear layer
    outputs its bias, an embedding zeros)."""
    return [name for name, module in tensorized_modules(model) if 0 in bond_sizes(module)]


@torch.no_grad()
def rank_shares(module: nn.Module) -> list[torch.Tensor]:
    """Per bond of one TT / TTM module, each rank's share of the bond's largest, in ``[0, 1]``.

    With the gates folded into the cores, the weight is ``W = sum_i g_i L_i (x) R_i`` on each bond: ``L_i``
    the product of the cores left of the bond ending in rank ``i``, ``R_i`` that of the cores right of it.
    Rank ``i`` contributes ``|g_i| ||L_i|| ||R_i||``, which, unlike ``g_i`` alone, stays the same whichever
    way the scale is split between gates and cores (the weight is the same for all of them). The norms come
    from the Gram matrices of the partial products, built bond by bond (``r^3`` work per mode). An empty
    bond gives an empty tensor, a bond whose ranks all contribute nothing zeros."""
    cores = [c.detach().reshape(c.shape[0], math.prod(c.shape[1:-1]), c.shape[-1])
             for c in parameter_entries(module.cores)]
    gates = [g.detach() for g in parameter_entries(module.gates)]
    gated = [core * gate for core, gate in zip(cores, gates)] + cores[len(gates):]
    ones = cores[0].new_ones((1, 1))
    lefts, gram = [], ones
    for core, gate in zip(cores, gates):  # Gram of everything left of each bond, its gate excluded
        gram = torch.einsum("anb,ac,cnd->bd", core, gram, core)
        lefts.append(gram)
        gram = gate[:, None] * gram * gate[None, :]
    rights, gram = [], ones
    for core in reversed(gated[1:]):      # Gram of everything right of each bond
        gram = torch.einsum("anb,bd,cnd->ac", core, gram, core)
        rights.append(gram)
    rights.reverse()
    shares = []
    for gate, left, right in zip(gates, lefts, rights):
        share = gate.abs() * (left.diagonal().clamp_min(0) * right.diagonal().clamp_min(0)).sqrt()
        shares.append(share / share.max().clamp_min(torch.finfo(share.dtype).tiny)
                      if share.numel() else share)
    return shares


def tt_parameter_count(model: nn.Module) -> int:
    """Exact number of stored TT scalars: every core (TT and TTM) and every gate."""
    return layout(model).parameter_count()


def size_l0(model: nn.Module, threshold: float) -> torch.Tensor:
    """The size ``S`` counting in each bond only the ranks whose share (:func:`rank_shares`) is above
    ``threshold``: the stored size after :func:`comera.prune.prune` with ``min_rank=0``. A 0-dim tensor."""
    parts = layout(model)
    counts = [int((share > threshold).sum()) for _, module in tensorized_modules(model)
              for share in rank_shares(module)]
    return parts.bond_size(torch.tensor(counts, dtype=parts.one.dtype, device=parts.one.device))


def gate_size(model: nn.Module, threshold: float = 1e-2) -> torch.Tensor:
    """The official code's ``compute_size``: the cores' scalars counting in each bond only the ranks whose
    gate is above ``threshold`` (signed: a negative gate counts as gone, as the official mask has it).

    A module with a bond of no such rank counts 0 (its weight is zero). Gates are not counted; a TTM core
    counts all its scalars (the official code counts one of its two mode sizes). A 0-dim tensor in the
    cores' dtype, on their device (no host sync).

    Args:
        model: the model with TT / TTM layers.
        threshold: a rank counts while its gate is above it.

    Example::

        >>> layer = TTLinear(8, 8, in_shape=(2, 4), out_shape=(2, 4), rank=3)
        >>> float(gate_size(layer))  # gates at 1: every rank counts (ranks [1, 2, 3, 3, 1])
        58.0
    """
    parts = layout(model)
    counts = []
    for module in _tensorized(model):
        gates = parameter_entries(module.gates)
        if not gates:
            continue
        alive = torch.stack([(g > threshold).sum() for g in gates]).to(parts.one.dtype)
        counts.append(alive * (alive.amin() > 0))
    if not counts:
        return parts.bond_size(parts.one[None][:0], count_gates=False)
    return parts.bond_size(torch.cat(counts), count_gates=False)


def soft_size(model: nn.Module) -> torch.Tensor:
    """The size ``S`` with every bond's rank replaced by its soft rank ``(||g||_1 / ||g||_2)^2``.

    Differentiable and unchanged when a bond's gates are scaled together (so it cannot be lowered by
    shrinking every gate at once, which shrinks the layer instead of its rank); equal to :func:`size_l0`
    when each bond's active gates are equal and the others zero."""
    return layout(model).soft_size()


def core_l2(model: nn.Module) -> torch.Tensor:
    """``sum_k ||G_k||_F^2`` over the cores of all tensorized modules."""
    return layout(model).core_l2()


@dataclass
class Layout:
    """The cores and gates of a model's tensorized modules with the index tensors that turn per-gate
    values into sizes in a few vectorized kernels (cached per model by :func:`layout`).

    Attributes:
        key: identity of the parameters and their bond sizes, device and dtype (the cache key).
        cores, gates: every core and gate, module by module.
        one: a scalar 1 on the device and in the dtype of the sizes.
        left, right: per core, the index of its left / right bond's value in ``[per-gate values..., 1]``.
        unit: per core, ``u_k``, the product of its mode sizes.
    """

    key: tuple
    cores: list[nn.Parameter]
    gates: list[nn.Parameter]
    one: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    unit: torch.Tensor

    def parameter_count(self) -> int:
        """Scalars in the cores and the gates."""
        return sum(p.numel() for p in self.cores) + sum(p.numel() for p in self.gates)

    def bond_size(self, per_gate: torch.Tensor, count_gates: bool = True) -> torch.Tensor:
        """``sum_cores u_k v_left v_right`` (``+ sum v`` with ``count_gates``) for per-gate values ``v``."""
        values = torch.cat([per_gate, self.one.reshape(1)])
        size = (self.unit * values[self.left] * values[self.right]).sum()
        return size + per_gate.sum() if count_gates else size

    def soft_ranks(self) -> torch.Tensor:
        """Per gate, its soft rank ``(||g||_1 / ||g||_2)^2`` (0 for an empty or all-zero bond)."""
        if not self.gates:
            return self.one[None][:0]
        l1 = torch.stack(torch._foreach_norm(self.gates, 1)).to(self.one.dtype)
        l2 = torch.stack(torch._foreach_norm(self.gates, 2)).to(self.one.dtype)
        return (l1 / l2.clamp_min(torch.finfo(l2.dtype).tiny)).square()

    def soft_size(self) -> torch.Tensor:
        """:func:`soft_size` of the modules laid out here."""
        return self.bond_size(self.soft_ranks())

    def core_l2(self) -> torch.Tensor:
        """:func:`core_l2` of the modules laid out here."""
        if not self.cores:
            return self.one * 0
        if plain.active():
            return torch.stack([c.square().sum() for c in self.cores]).to(self.one.dtype).sum()
        return plain.apply(_SumOfSquares, self.one, *self.cores)


class _SumOfSquares(torch.autograd.Function):
    """``sum_k ||T_k||_F^2`` (in the dtype of ``like``) with the gradient ``2 g T_k`` of every tensor from
    one multi-tensor kernel (autograd through ``_foreach_norm`` and ``square`` runs several per tensor)."""

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


_LAYOUTS: "weakref.WeakKeyDictionary[nn.Module, Layout]" = weakref.WeakKeyDictionary()


def _tensorized(model: nn.Module) -> list[nn.Module]:
    """The modules of :func:`tensorized_modules`, in the same order, without building their names."""
    found, seen, stack = [], set(), [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if is_tensorized(module):
            found.append(module)
        stack.extend(child for child in reversed(module._modules.values()) if child is not None)
    return found


def layout(model: nn.Module) -> Layout:
    """The :class:`Layout` of ``model``'s tensorized modules, rebuilt only when a parameter, a bond size,
    the device or the dtype changed (pruning keeps the Parameter objects and slices them)."""
    modules = _tensorized(model)
    cores = [c for module in modules for c in parameter_entries(module.cores)]
    gates = [g for module in modules for g in parameter_entries(module.gates)]
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
    ones_slot = offset  # index of the constant 1 appended after the per-gate values
    built = Layout(
        key=key, cores=cores, gates=gates,
        one=torch.ones((), dtype=reference.dtype, **factory),
        left=torch.tensor([i if i >= 0 else ones_slot for i in left], dtype=torch.long, **factory),
        right=torch.tensor([i if i >= 0 else ones_slot for i in right], dtype=torch.long, **factory),
        unit=torch.tensor(unit, dtype=reference.dtype, **factory))
    _LAYOUTS[model] = built
    return built
