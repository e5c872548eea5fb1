"""TTLinear: a linear layer whose weight is a tensor train with diagonal rank gates.

:class:`TTLinear` is the module, :func:`tt_linear` the functional form over a
:class:`~comera.contraction.ContractionPlan`, :class:`TTLinearFunction` their autograd Function (the
kernels of :mod:`comera.kernels`).
"""
from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence

import torch
from torch import nn

from comera import kernels, plain
from comera.contraction import DEFAULT_SETTINGS, ContractionPlan, PlanSettings, make_plan
from comera.init import INIT_SCHEMES, core_stds
from comera.reload import ResizeOnLoad
from comera.shapes import factorize
from comera.ttsvd import relative_error, tt_svd


def _full_ranks(rank: int | Sequence[int], modes: tuple[int, ...]) -> list[int]:
    """Bond sizes [1, r_1, ..., r_{d-1}, 1]; an int is clipped to the largest rank each bond can have."""
    d = len(modes)
    if isinstance(rank, bool):
        raise ValueError(f"TTLinear: rank must be an int or a list of {d + 1} ints, got {rank!r}")
    if isinstance(rank, numbers.Integral):
        rank = int(rank)
        if rank < 0:
            raise ValueError(f"TTLinear: rank must be >= 0, got {rank}")
        return [1] + [min(rank, math.prod(modes[:k]), math.prod(modes[k:])) for k in range(1, d)] + [1]
    try:
        ranks = [operator.index(r) for r in rank]
    except TypeError:
        raise ValueError(f"TTLinear: rank must be an int or a list of {d + 1} ints, got {rank!r}") from None
    if len(ranks) != d + 1 or ranks[0] != 1 or ranks[-1] != 1 or min(ranks) < 0:
        raise ValueError(f"TTLinear: rank list must be [1, r_1, ..., r_{d - 1}, 1] of length {d + 1} "
                         f"with r_k >= 0 for modes {list(modes)}, got {list(rank)}")
    return ranks


def _shape(features: int, shape: Sequence[int] | None, name: str, default_modes: int) -> tuple[int, ...]:
    if shape is None:
        return factorize(features, default_modes)
    shape = tuple(int(s) for s in shape)
    if not shape or min(shape) < 1 or math.prod(shape) != features:
        raise ValueError(f"TTLinear: {name}={list(shape)} must be positive mode sizes whose product "
                         f"is {features}")
    return shape


def bond_sizes(cores: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The bond sizes ``(r_0, r_1, ..., r_d)`` (``r_0 = r_d = 1``) of TT or TTM cores, each of shape
    ``(r_k, ..., r_{k+1})``."""
    return (cores[0].shape[0], *[c.shape[-1] for c in cores])


def parameter_entries(params: nn.ParameterList) -> list[torch.Tensor]:
    """The parameters of ``params`` in order, as a plain list.

    Same as ``list(params)`` without going through ``Module.__getattr__`` once per entry, a per-call cost
    that shows at small token counts (docs/performance.md). For layers' ``cores`` and ``gates``.

    Example::

        >>> cores = parameter_entries(layer.cores)
    """
    return list(params._parameters.values())


def forward_gates(module: nn.Module) -> list[torch.Tensor]:
    """The gates the forward of a TT module (:class:`TTLinear`, TTMEmbedding) multiplies by.

    As stored, or, when ``module.gate_threshold`` is set (rank adaptation's ``mask_gates="every_step"``),
    with every entry ``<= gate_threshold`` zeroed (negative ones included), as the official code's
    ``get_rank_mask``; a zeroed entry gets no gradient.
    """
    gates = parameter_entries(module.gates)
    threshold = module.gate_threshold
    if threshold is None:
        return gates
    return [torch.nn.functional.threshold(g, threshold, 0.0) for g in gates]


def autocasting(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for a device without autocast, e.g. ``meta``)."""
    if torch.compiler.is_compiling():  # Dynamo (torch 2.11) cannot trace the availability query
        return torch.is_autocast_enabled(device_type)
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def outside_autocast(fn: Callable[..., torch.Tensor], device_type: str,
                     *tensors: torch.Tensor | None) -> torch.Tensor:
    """``fn(*tensors)``; under autocast for ``device_type`` the tensors are cast to the autocast dtype and
    ``fn`` runs with autocast off (custom autograd kernels pick no per-op dtypes). None passes through.
    A device without autocast (``meta``) runs ``fn`` as it is."""
    if not autocasting(device_type):
        return fn(*tensors)
    dtype = torch.get_autocast_dtype(device_type)
    with torch.autocast(device_type, enabled=False):
        return fn(*(t.to(dtype) if t is not None else None for t in tensors))


def gated_cores(cores: Sequence[torch.Tensor], gates: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Effective cores ``H_k = G_k * g_k`` (gate on the last axis; the last core has no gate), in one
    multi-tensor product."""
    return [*torch._foreach_mul(list(cores[:-1]), list(gates)), cores[-1]]


def core_and_gate_grads(d_eff: Sequence[torch.Tensor], cores: Sequence[torch.Tensor],
                        gates: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gradients of the cores and of the gates from the gradients of the effective cores."""
    d_eff_gated = list(d_eff[:-1])
    d_gates = [p.sum((0, 1)) for p in torch._foreach_mul(d_eff_gated, list(cores[:-1]))]
    return [*torch._foreach_mul(d_eff_gated, list(gates)), d_eff[-1]], d_gates


def regroup(tensors: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[list[torch.Tensor]]:
    """``tensors`` (a Function's saved tensors, flattened from groups) back in groups of ``sizes``."""
    flat = iter(tensors)
    return [[next(flat) for _ in range(size)] for size in sizes]


def _python_forward(plan: ContractionPlan, x, bias, cores, gates):
    """The forward with the Python kernels: ``(y, groups)``, the tensors the backward reads, in groups (the
    gated cores only as the views the chains hold: the backward takes their shapes from ``cores``)."""
    eff = gated_cores(cores, gates)
    m = len(plan.in_shape)
    if plan.dense:
        y, weight, left, right = kernels.dense_forward(x, eff[:m], eff[m:], bias)
        return y, [cores, gates, [x, weight], left, right]
    z, left_in, left = kernels.left_forward(x, eff[:m], plan.left_groups)
    y, right_in, right = kernels.right_forward(z, eff[m:], plan.right_groups, bias, plan.fold_bias)
    return y, [cores, gates, left_in, *left, right_in, *right]


class TTLinearFunction(torch.autograd.Function):
    """``y = x W + b`` with ``W = H_0 ... H_{d-1}``, ``H_k = cores[k] * gates[k]``, following a plan.

    ``TTLinearFunction.apply(plan, x, bias, *cores, *gates)``; backward returns the gradients of ``x``,
    ``bias``, every core and every gate (None for each that needs none; when no core or gate needs one,
    no core gradient is formed). Saves ``x``, rank-sized intermediates and the merged core blocks,
    never a full-width tensor. Under ``create_graph=True`` the backward re-runs the
    forward under autograd (:func:`differentiated_grads`): derivatives of every order are exact.
    :func:`tt_linear` is the functional form.

    Shape:
        - x: ``(tokens, in_features)``, contiguous, ``tokens == plan.tokens``.
        - bias: ``(out_features,)`` or None (``plan.bias`` says which).
        - cores[k]: ``(r_k, n_k, r_{k+1})`` with ``plan.ranks``; gates[k]: ``(r_{k+1},)``, one per core but
          the last.
        - output: ``(tokens, out_features)``.
    """

    @staticmethod
    def forward(ctx, plan: ContractionPlan, x, bias, *params):
        d = len(plan.ranks) - 1
        cores, gates = params[:d], params[d:]
        ctx.plan = plan
        ctx.has_bias = bias is not None
        ctx.constant = plan.zero or x.shape[0] == 0  # y = b: a rank-0 bond, or no tokens
        if ctx.constant:
            ctx.shapes = [p.shape for p in params]
            ctx.x_shape = x.shape
            y = x.new_zeros(x.shape[0], math.prod(plan.out_shape))
            return y if bias is None else y.add_(bias)
        y, groups = _python_forward(plan, x, bias, cores, gates)
        ctx.group_sizes = [len(g) for g in groups]
        ctx.save_for_backward(x, *(t for g in groups for t in g))
        return y

    @staticmethod
    def backward(ctx, dy):
        plan = ctx.plan
        need = ctx.needs_input_grad
        if ctx.constant:
            zeros = [dy.new_zeros(s) for s in ctx.shapes]
            dx = dy.new_zeros(ctx.x_shape) if need[1] else None
            return (None, dx, dy.sum(0) if ctx.has_bias and need[2] else None, *zeros)
        d = len(plan.ranks) - 1
        x, *rest = ctx.saved_tensors
        cores, gates = rest[:d], rest[d:2 * d - 1]
        if torch.is_grad_enabled():
            return (None, *_differentiated_replay(plan, x, cores, gates, dy, ctx.has_bias, need))
        groups = regroup(rest, ctx.group_sizes)
        m = len(plan.in_shape)
        need_params = any(need[3:])  # else (frozen cores and gates) no core gradient is formed
        dbias = dy.sum(0) if ctx.has_bias and need[2] and not plan.fold_bias else None
        if plan.dense:
            (x, weight), left, right = groups[2:]
            dx, d_eff = kernels.dense_backward(dy, x, weight, cores[:m], cores[m:], left, right, need[1],
                                               need_params)
        else:
            nl = len(plan.left_groups)
            left_in, left = groups[2], groups[3:3 + nl]
            right_in, right = groups[3 + nl], groups[4 + nl:]
            dz, d_right, folded_dbias = kernels.right_backward(dy, cores[m:], right_in, right,
                                                                   plan.right_groups, need_params)
            if folded_dbias is not None:
                dbias = folded_dbias if need[2] else None
            dx, d_left = kernels.left_backward(dz, cores[:m], left_in, left, plan.left_groups, need[1],
                                               need_params)
            d_eff = d_left + d_right
        if not need_params:
            return (None, dx, dbias, *([None] * (2 * d - 1)))
        d_cores, d_gates = core_and_gate_grads(d_eff, cores, gates)
        return (None, dx, dbias, *d_cores, *d_gates)


def differentiated_grads(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor | None],
                         wanted: Sequence[bool], dy: torch.Tensor) -> list[torch.Tensor | None]:
    """The gradients of ``fn(*inputs)`` against ``dy`` for the ``wanted`` inputs (None for the others), with
    a graph of their own: ``fn`` re-runs under autograd and autograd differentiates it (create_graph).

    For the backward of a Function called with ``create_graph=True``: what its forward saved was computed
    without a graph, so a hand-written backward over it treats those tensors as constants and every second
    derivative through them is lost. The replay costs one forward more and keeps its intermediates; the
    derivatives of every order are exact.
    """
    chosen = [t for t, w in zip(inputs, wanted) if w]
    if not chosen:
        return [None] * len(inputs)
    with torch.enable_grad():
        grads = iter(torch.autograd.grad(fn(*inputs), chosen, dy, create_graph=True, allow_unused=True))
    return [next(grads) if w else None for w in wanted]


def _differentiated_replay(plan: ContractionPlan, x, cores, gates, dy, has_bias: bool, need):
    """``(dx, dbias, *d_cores, *d_gates)`` of :class:`TTLinearFunction` for ``create_graph=True`` (see
    :func:`differentiated_grads`): the Python kernels re-run; the bias enters linearly, so a zero one stands
    in for it (its gradient is ``dy.sum(0)``)."""
    bias = dy.new_zeros(dy.shape[1]) if has_bias else None
    d = len(cores)
    dx, *d_params = differentiated_grads(
        lambda x, *params: _python_forward(plan, x, bias, params[:d], params[d:])[0],
        [x, *cores, *gates], [need[1], *need[3:]], dy)
    return (dx, dy.sum(0) if has_bias and need[2] else None, *d_params)


def tt_linear(x: torch.Tensor, cores: Sequence[torch.Tensor], gates: Sequence[torch.Tensor],
              bias: torch.Tensor | None, plan: ContractionPlan) -> torch.Tensor:
    """Functional TT linear map ``x W + b`` following ``plan``.

    Args:
        x: the input, 2-D and contiguous.
        cores: the TT cores, ``len(plan.ranks) - 1`` of them.
        gates: the rank gates, one per core but the last (as the forward should see them, see
            :func:`forward_gates`).
        bias: the bias or None, as ``plan.bias`` says.
        plan: from :func:`comera.contraction.make_plan` for ``x.shape[0]`` tokens and the cores' ranks.

    Shape:
        - x: ``(tokens, in_features)``; output: ``(tokens, out_features)``.

    Example::

        >>> plan = layer.plan(x.shape[0])
        >>> y = tt_linear(x, list(layer.cores), list(layer.gates), layer.bias, plan)
    """
    if plain.active():
        return _python_forward(plan, x, bias, list(cores), list(gates))[0]
    return plain.apply(TTLinearFunction, plan, x, bias, *cores, *gates)



def measure_kernel_cost(device: str | torch.device = "cpu", *, min_run_time_s: float = 0.3) -> int:
    """:attr:`~comera.contraction.PlanSettings.kernel_cost` measured on ``device``.

    A one-token forward+backward of a 768->768 rank-30 TTLinear (its FLOPs are negligible, so its time is
    fixed cost) divided by its plan's kernels, times the FLOP rate of a 512x512x512 float32 matmul.

    Args:
        device: where to measure.
        min_run_time_s: time spent per measurement (two of them).

    Returns:
        int: FLOP-equivalents per kernel.

    Example::

        >>> settings = dataclasses.replace(PlanSettings(), kernel_cost=measure_kernel_cost("cuda"))
        >>> for module in model.modules():
        ...     if isinstance(module, TTLinear):
        ...         module.plan_settings = settings
    """
    from torch.utils.benchmark import Timer

    device = torch.device(device)
    sync = "; torch.cuda.synchronize()" if device.type == "cuda" else ""

    def median_s(stmt: str, **names) -> float:
        timer = Timer(stmt=stmt + sync, globals={"torch": torch, **names},
                      num_threads=torch.get_num_threads())
        return timer.blocked_autorange(min_run_time=min_run_time_s).median

    big = torch.randn(512, 512, device=device)
    rate = 2 * 512 ** 3 / median_s("torch.mm(a, a)", a=big)
    layer = TTLinear(768, 768, in_shape=(12, 8, 8), out_shape=(8, 8, 12), rank=30, device=device)
    x = torch.randn(1, 768, device=device, requires_grad=True)
    grad = torch.randn(1, 768, device=device)
    wrt = [x, *layer.parameters()]
    call = median_s("torch.autograd.backward(layer(x), grad, inputs=wrt)", layer=layer, x=x,
                    grad=grad, wrt=wrt)
    return int(call / layer.plan(1).kernels * rate)


class TTLinear(ResizeOnLoad, nn.Module):
    r"""Linear layer ``y = x W + b`` whose weight ``W`` (in_features x out_features) is a tensor train.

    ``W = H_0 H_1 ... H_{d-1}`` contracted over the bonds, ``H_k = cores[k] * gates[k]``: core ``k`` has
    shape ``(r_k, n_k, r_{k+1})``, the first ``len(in_shape)`` cores index the input modes, and
    ``gates[k]`` (shape ``(r_{k+1},)``, initialised to ones) is the diagonal rank gate on the bond between
    ``cores[k]`` and ``cores[k+1]``. A bond of size 0 makes the weight zero. Each call contracts with the
    plan :meth:`plan` picks for its token count (:mod:`comera.contraction`).

    Args:
        in_features: size of each input sample.
        out_features: size of each output sample.
        in_shape: modes whose product is ``in_features`` (default: three, automatic).
        out_shape: modes whose product is ``out_features`` (default: three, automatic).
        rank: one int for every bond (clipped to the largest rank each bond can have) or the list
            ``[1, r_1, ..., r_{d-1}, 1]``.
        bias: whether to learn an additive bias.
        init: "default" (Var(W_ij) = 1 / (3 in_features), nn.Linear's) or "official" (the CoMERA code's),
            see :mod:`comera.init`.
        plan_settings: how contraction plans are scored (:class:`~comera.contraction.PlanSettings`;
            default: the library's). Also an attribute, which may be reassigned.
        device, dtype: factory arguments of the parameters.

    Attributes:
        gate_threshold: None (raw gates) or a threshold below which the forward zeroes gate entries, see
            :func:`forward_gates`.
        reconstruction_error: set by :meth:`from_linear`.

    Shape:
        - Input: ``(*, in_features)``.
        - Output: ``(*, out_features)``.

    Example::

        >>> layer = TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=30)
        >>> layer(torch.randn(32, 128, 768)).shape
        torch.Size([32, 128, 3072])
    """

    gate_threshold: float | None = None
    plan_settings: PlanSettings = DEFAULT_SETTINGS  # also the value of layers pickled before the attribute

    def __init__(self, in_features: int, out_features: int, *, in_shape: Sequence[int] | None = None,
                 out_shape: Sequence[int] | None = None, rank: int | Sequence[int], bias: bool = True,
                 init: str = "default", plan_settings: PlanSettings | None = None, device=None, dtype=None):
        super().__init__()
        self.plan_settings = DEFAULT_SETTINGS if plan_settings is None else plan_settings
        if init not in INIT_SCHEMES:
            raise ValueError(f"TTLinear: init={init!r}, expected one of {INIT_SCHEMES}")
        self.init = init
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.in_shape = _shape(self.in_features, in_shape, "in_shape", 3)
        self.out_shape = _shape(self.out_features, out_shape, "out_shape", 3)
        modes = self.in_shape + self.out_shape
        ranks = _full_ranks(rank, modes)
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(ranks[k], n, ranks[k + 1], **factory)) for k, n in enumerate(modes))
        self.gates = nn.ParameterList(
            nn.Parameter(torch.ones(ranks[k + 1], **factory)) for k in range(len(modes) - 1))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.reconstruction_error: float | None = None  # set by the TT-SVD constructor
        self.reset_parameters()

    @property
    def ranks(self) -> list[int]:
        """Current bond sizes [1, r_1, ..., r_{d-1}, 1] (read from the cores, so pruning shows)."""
        return list(bond_sizes(parameter_entries(self.cores)))

    def reset_parameters(self) -> None:
        """Cores normal with Var(W_ij) = 1 / (3 in_features) (nn.Linear's default uniform init), one std
        for all cores (init "default"), or the official code's Var(W_ij) = 1 / (in + out) with core k
        scaled by 1 / sqrt(r_{k+1}) (init "official"); gates to ones; bias uniform in +-1/sqrt(in_features)
        like nn.Linear, or +-1/sqrt(out_features) as the official ``TensorizedLinear_module`` (init
        "official")."""
        if self.init == "official":
            target = math.sqrt(1.0 / (self.in_features + self.out_features))
        else:
            target = math.sqrt(1.0 / (3.0 * self.in_features))
        with torch.no_grad():
            for core, std in zip(self.cores, core_stds(self.ranks, target, self.init)):
                core.normal_(0.0, std)
            for gate in self.gates:
                gate.fill_(1.0)
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.out_features if self.init == "official" else self.in_features)
                self.bias.uniform_(-bound, bound)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, rank: int | Sequence[int],
                    in_shape: Sequence[int] | None = None,
                    out_shape: Sequence[int] | None = None) -> "TTLinear":
        """A TTLinear holding the TT-SVD of a trained ``linear``'s weight at ``rank`` (bias copied).

        A bond keeps fewer ranks than asked where the weight's unfolding has fewer singular values.
        ``reconstruction_error`` on the result is ``||W - W_tt||_F / ||W||_F`` of the weight."""
        return cls.from_weight(linear.weight.T, linear.bias, rank=rank, in_shape=in_shape,
                               out_shape=out_shape)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, *, rank: int | Sequence[int],
                    in_shape: Sequence[int] | None = None,
                    out_shape: Sequence[int] | None = None) -> "TTLinear":
        """As :meth:`from_linear`, from a weight laid out ``(in_features, out_features)`` (``y = x W + b``,
        the layout of Hugging Face's ``Conv1D``) and a bias or None."""
        weight = weight.detach()
        layer = cls(weight.shape[0], weight.shape[1], in_shape=in_shape, out_shape=out_shape, rank=rank,
                    bias=bias is not None, device=weight.device, dtype=weight.dtype)
        cores = tt_svd(weight, layer.in_shape + layer.out_shape, layer.ranks)
        layer.cores = nn.ParameterList(nn.Parameter(c.to(weight)) for c in cores)
        layer.gates = nn.ParameterList(nn.Parameter(weight.new_ones(c.shape[-1])) for c in cores[:-1])
        with torch.no_grad():
            if layer.bias is not None:
                layer.bias.copy_(bias)
            layer.reconstruction_error = relative_error(weight, layer.dense_weight())
        return layer

    def plan(self, tokens: int) -> ContractionPlan:
        """The contraction plan for ``tokens`` rows at the current ranks and :attr:`plan_settings` (memoized
        by :func:`~comera.contraction.make_plan`; pruning a rank changes the plan on the next call).
        ``print(layer.plan(tokens))`` lists its order, steps and predicted cost; ``.summary()`` gives them
        as values.

        Example::

            >>> layer = TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=30)
            >>> layer.plan(4096).order
            'x @ (G0 G1 G2) -> z; z @ (G3 G4 G5) -> y + b (folded into the GEMM)'
        """
        return self._plan(int(tokens), parameter_entries(self.cores))

    def _plan(self, tokens: int, cores: Sequence[torch.Tensor]) -> ContractionPlan:
        """:meth:`plan` with the ranks read from ``cores``, the layer's core tensors at hand."""
        return make_plan(self.in_shape, self.out_shape, bond_sizes(cores), tokens, self.bias is not None,
                         None, self.plan_settings)

    def flops(self, tokens: int) -> int:
        """Forward plus backward FLOPs of the plan for ``tokens`` rows."""
        return self.plan(tokens).flops

    def dense_weight(self) -> torch.Tensor:
        """The effective weight (in_features, out_features), gates included (differentiable)."""
        if 0 in self.ranks:
            ref = self.cores[0]
            return ref.new_zeros(self.in_features, self.out_features)
        w = self.cores[0].reshape(-1, self.cores[0].shape[-1])
        for core, gate in zip(self.cores[1:], forward_gates(self)):
            w = (w * gate) @ core.reshape(core.shape[0], -1)
            w = w.reshape(-1, core.shape[-1])
        return w.reshape(self.in_features, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W + b`` over the last axis of ``x``, contracted with :meth:`plan` of its token count (one
        :class:`TTLinearFunction` call; under autocast in the autocast dtype)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"TTLinear: expected input with last dimension {self.in_features}, "
                             f"got shape {tuple(x.shape)}")
        cores = parameter_entries(self.cores)
        device_type = x.device.type
        autocast = autocasting(device_type)
        if x.dtype != cores[0].dtype and not autocast:
            raise TypeError(f"TTLinear: input dtype {x.dtype} differs from the layer's "
                            f"{cores[0].dtype}; cast one of them, or run under torch.autocast")
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        bias = self.bias
        plan = self._plan(x2.shape[0], cores)
        if autocast:
            d = len(cores)
            y = outside_autocast(lambda x, b, *p: tt_linear(x.contiguous(), p[:d], p[d:], b, plan),
                                 device_type, x2, bias, *cores, *forward_gates(self))
        else:
            y = tt_linear(x2.contiguous(), cores, forward_gates(self), bias, plan)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"in_shape={list(self.in_shape)}, out_shape={list(self.out_shape)}, ranks={self.ranks}, "
                f"bias={self.bias is not None}")
