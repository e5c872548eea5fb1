""":func:`feed_forward`: ``second(activation(first(x)))`` of two TT layers that saves only rank-r products.

Results and gradients equal the plain composition's. What backward recomputes: docs/design-notes.md; its
cost: docs/performance.md, "Library tunables".
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from comera import kernels, plain
from comera.contraction import ContractionPlan
from comera.tt import (
    TTLinear,
    core_and_gate_grads,
    differentiated_grads,
    forward_gates,
    gated_cores,
    outside_autocast,
    parameter_entries,
    regroup,
    tt_linear,
)


def _layer_params(layer: TTLinear) -> list[torch.Tensor]:
    return parameter_entries(layer.cores) + forward_gates(layer)


def _split(params, d: int):
    return list(params[:d]), list(params[d:2 * d - 1])


def _present(t: torch.Tensor | None) -> list[torch.Tensor]:
    return [] if t is None else [t]


def _python_forward(plans, activation, x, bias1, bias2, cores1, gates1, cores2, gates2):
    """The forward with the Python kernels: ``(y, groups)``, the tensors the backward reads, in groups."""
    p1, p2 = plans
    eff1, eff2 = gated_cores(cores1, gates1), gated_cores(cores2, gates2)
    m1, m2 = len(p1.in_shape), len(p2.in_shape)
    z1, left1_in, left1 = kernels.left_forward(x, eff1[:m1], p1.left_groups)
    hidden = activation(kernels.right_forward(z1, eff1[m1:], p1.right_groups, bias1, p1.fold_bias)[0])
    z2, _, left2 = kernels.left_forward(hidden, eff2[:m2], p2.left_groups)
    del hidden
    y, right2_in, right2 = kernels.right_forward(z2, eff2[m2:], p2.right_groups, bias2, p2.fold_bias)
    return y, [[x], cores1, gates1, eff1, cores2, gates2, eff2, left1_in, *left1, *left2, right2_in, *right2,
               [z1], _present(bias1)]


def _python_backward(ctx, groups, dy):
    """Gradients of x, both biases, cores and gates from the groups of :func:`_python_forward`."""
    p1, p2 = ctx.plans
    cores1, gates1, eff1, cores2, gates2, eff2, left1_in = groups[1:8]
    n1, n2 = len(p1.left_groups), len(p2.left_groups)
    left1, left2 = groups[8:8 + n1], groups[8 + n1:8 + n1 + n2]
    right2_in, right2 = groups[8 + n1 + n2], groups[9 + n1 + n2:-2]
    (z1,), bias1 = groups[-2], (groups[-1] or [None])[0]
    m1, m2 = len(p1.in_shape), len(p2.in_shape)

    dz2, d_right2, dbias2 = kernels.right_backward(dy, eff2[m2:], right2_in, right2, p2.right_groups)
    if p2.bias and dbias2 is None:
        dbias2 = dy.sum(0)
    # Recompute the hidden activation from the rank-r product z1.
    y1, right1_in, right1 = kernels.right_forward(z1, eff1[m1:], p1.right_groups, bias1, p1.fold_bias)
    with torch.enable_grad():
        y1 = y1.detach().requires_grad_(True)
        hidden = ctx.activation(y1)
    left2_in = [hidden.detach()] if n2 == 1 else kernels.left_forward(hidden.detach(), eff2[:m2],
                                                                          p2.left_groups)[1]
    dhidden, d_left2 = kernels.left_backward(dz2, eff2[:m2], left2_in, left2, p2.left_groups, True)
    del left2_in
    (dy1,) = torch.autograd.grad(hidden, y1, dhidden)
    del hidden, y1, dhidden
    dz1, d_right1, dbias1 = kernels.right_backward(dy1, eff1[m1:], right1_in, right1, p1.right_groups)
    if p1.bias and dbias1 is None:
        dbias1 = dy1.sum(0)
    dx, d_left1 = kernels.left_backward(dz1, eff1[:m1], left1_in, left1, p1.left_groups,
                                            ctx.needs_input_grad[2])
    d_cores1, d_gates1 = core_and_gate_grads(d_left1 + d_right1, cores1, gates1)
    d_cores2, d_gates2 = core_and_gate_grads(d_left2 + d_right2, cores2, gates2)
    return (dx, dbias1, dbias2, *d_cores1, *d_gates1, *d_cores2, *d_gates2)


def _differentiated_replay(ctx, groups, dy):
    """Gradients for ``create_graph=True``: the composition of two :func:`~comera.tt.tt_linear` calls re-run
    on the saved inputs and differentiated by autograd (:func:`~comera.tt.differentiated_grads`), so second
    derivatives through the activation and both layers are exact. The second bias enters linearly: a zero
    one stands in for it, and its gradient is ``dy.sum(0)``."""
    p1, p2 = ctx.plans
    need = ctx.needs_input_grad
    (x,), cores1, gates1, _, cores2, gates2 = groups[:6]
    bias1 = (groups[-1] or [None])[0]
    bias2 = dy.new_zeros(dy.shape[1]) if p2.bias else None
    d1, d2 = len(cores1), len(cores2)

    def composition(x, bias1, *params):
        layer1, layer2 = params[:2 * d1 - 1], params[2 * d1 - 1:]
        hidden = ctx.activation(tt_linear(x, layer1[:d1], layer1[d1:], bias1, p1))
        return tt_linear(hidden, layer2[:d2], layer2[d2:], bias2, p2)

    dx, dbias1, *d_params = differentiated_grads(composition, [x, bias1, *cores1, *gates1, *cores2, *gates2],
                                                 [need[2], need[3], *need[5:]], dy)
    return (dx, dbias1, dy.sum(0) if p2.bias and need[4] else None, *d_params)


class _TTFeedForwardFunction(torch.autograd.Function):
    """y = L2(act(L1(x))) for TT layers L1, L2 following their plans; saves rank-r products only."""

    @staticmethod
    def forward(ctx, plans, activation, x, bias1, bias2, *params):
        p1, p2 = plans
        d1 = len(p1.ranks) - 1
        layers = (*_split(params[:2 * d1 - 1], d1), *_split(params[2 * d1 - 1:], len(p2.ranks) - 1))
        ctx.plans, ctx.activation = plans, activation
        y, groups = _python_forward(plans, activation, x, bias1, bias2, *layers)
        ctx.group_sizes = [len(g) for g in groups]
        ctx.save_for_backward(*(t for g in groups for t in g))
        return y

    @staticmethod
    def backward(ctx, dy):
        groups = regroup(ctx.saved_tensors, ctx.group_sizes)
        if torch.is_grad_enabled():
            return (None, None, *_differentiated_replay(ctx, groups, dy))
        return (None, None, *_python_backward(ctx, groups, dy))


def _fusable(p1: ContractionPlan, p2: ContractionPlan) -> bool:
    """Both layers contract through their rank-r bond (no dense weight formed, no rank-0 bond)."""
    return not (p1.dense or p2.dense or p1.zero or p2.zero)


def feed_forward(first: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor], second: nn.Module,
                 x: torch.Tensor, *, fuse_min_elements: int = 0) -> torch.Tensor:
    """``second(activation(first(x)))``, saving only rank-r products when both layers are TTLinear.

    Any other layer pair (nn.Linear, adapters), inference (grad disabled), :func:`comera.plain_autograd`,
    ``torch.compile`` (its tracer cannot follow the activation's derivative in the fused backward, and it
    decides what to recompute itself), no tokens, fewer than ``fuse_min_elements`` hidden elements, a layer
    at rank 0 or a plan that forms the dense weight falls back to the plain composition, with the same
    result.

    Args:
        first: the layer into the hidden features.
        activation: a deterministic elementwise function (it is re-run in backward; no dropout).
        second: the layer out of the hidden features.
        x: the input.
        fuse_min_elements: hidden-activation elements (tokens x hidden features) from which the fused path
            is taken; below, the plain composition saves its two hidden activations and skips the
            recomputed GEMM and activation. 0 (default): always fused, for the memory.

    Shape:
        - x: ``(*, first.in_features)``; output: ``(*, second.out_features)``.

    Example::

        >>> y = feed_forward(block.ffn_in, F.gelu, block.ffn_out, x)
    """
    if (not (isinstance(first, TTLinear) and isinstance(second, TTLinear)) or not torch.is_grad_enabled()
            or plain.active() or torch.compiler.is_compiling()):
        return second(activation(first(x)))
    if first.out_features != second.in_features:
        raise ValueError(f"feed_forward: first.out_features={first.out_features} does not match "
                         f"second.in_features={second.in_features}")
    if x.shape[-1] != first.in_features:
        raise ValueError(f"feed_forward: expected input with last dimension {first.in_features}, "
                         f"got shape {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, first.in_features)
    p1, p2 = first.plan(x2.shape[0]), second.plan(x2.shape[0])
    if x2.shape[0] == 0 or x2.shape[0] * first.out_features < fuse_min_elements or not _fusable(p1, p2):
        return second(activation(first(x)))
    y = outside_autocast(
        lambda x, b1, b2, *params: plain.apply(_TTFeedForwardFunction, (p1, p2), activation, x.contiguous(),
                                               b1, b2, *params),
        x.device.type, x2, first.bias, second.bias, *_layer_params(first), *_layer_params(second))
    return y.view(*lead, second.out_features)
