"""Contraction plans for tensor-train linear layers: what one forward+backward computes, in which order.

:func:`make_plan` returns the cheapest :class:`ContractionPlan` for a token count under :class:`PlanSettings`;
plans are pure functions of their arguments, executed by :mod:`comera.kernels`. How a plan is chosen:
docs/design-notes.md; the settings' values: docs/performance.md, "Library tunables".
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Step:
    """One operation of a plan: where it runs, what it computes, and its FLOPs."""

    phase: str
    """"forward" or "backward"."""
    name: str
    expr: str
    """The operation with operand sizes, e.g. ``z = Z0[4096,768] @ A[768,30]``."""
    flops: int
    traffic: int = 0
    """Elements of the step's token-sized operands read and written (0 for steps on cores alone)."""
    kernels: int = 1
    """Kernels the step launches (a batched product that first copies its operand into batch layout
    counts 2): each costs :attr:`PlanSettings.kernel_cost` FLOP-equivalents whatever its size."""


@dataclass(frozen=True)
class PlanSettings:
    """The tunables of :func:`make_plan`: how plans are scored and when the bias is folded.

    A value (frozen, hashable): pass one to :func:`make_plan`, or set ``TTLinear.plan_settings`` (or the
    ``plan_settings`` argument of :class:`~comera.tt.TTLinear`) on the layers that should use it. Nothing
    is global: two layers can plan with different settings in one process.

    Args:
        kernel_cost: FLOP-equivalents charged per kernel launch: the fixed time per kernel of a TT call
            (dispatch, autograd bookkeeping, launch) times the machine's matmul rate. At few tokens it makes
            plans prefer fewer, larger products. The default was measured on a 2-core CPU;
            :func:`comera.tt.measure_kernel_cost` measures it on the machine at hand.
        traffic_weight: FLOPs charged per element of token-sized operands read or written (the
            FLOP-per-float balance of current CPUs and GPUs).
        flop_slack: the lowest-cost plan is taken only when its FLOPs exceed the fewest possible by at most
            this fraction; otherwise the FLOP-minimal plan is.
        fold_bias_min_tokens: token count from which a one-group output side folds the bias into its GEMM
            as an extra row (saves the pass over ``dy`` for the bias gradient; pays on many tokens).

    Example::

        >>> fast_launch = dataclasses.replace(PlanSettings(), kernel_cost=measure_kernel_cost("cuda"))
        >>> layer = TTLinear(768, 768, rank=30, plan_settings=fast_launch)
    """

    kernel_cost: int = 2_500_000
    traffic_weight: int = 32
    flop_slack: float = 0.5
    fold_bias_min_tokens: int = 2048

    def __post_init__(self):
        for name in ("kernel_cost", "traffic_weight", "fold_bias_min_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"PlanSettings: {name} must be an int >= 0, got {value!r}")
        if (isinstance(self.flop_slack, bool) or not isinstance(self.flop_slack, (int, float))
                or self.flop_slack < 0):
            raise ValueError(f"PlanSettings: flop_slack must be a number >= 0, got {self.flop_slack!r}")


DEFAULT_SETTINGS = PlanSettings()
"""The settings plans use unless told otherwise (read-only: a frozen value)."""
KERNEL_COST = DEFAULT_SETTINGS.kernel_cost
"""The default :attr:`PlanSettings.kernel_cost` (a constant; change a layer's settings, not this)."""


@dataclass(frozen=True)
class ContractionPlan:
    """How one TT linear layer contracts its forward and backward passes for a given token count.

    Plans are values (frozen): build them with :func:`make_plan`; ``print(plan)`` lists the steps with
    their FLOPs and traffic, the order (:attr:`order`) and the predicted cost; :meth:`summary` gives the
    same as values. :class:`comera.tt.TTLinearFunction` executes them.

    Example::

        >>> plan = make_plan((12, 8, 8), (8, 8, 12), (1, 12, 30, 30, 30, 12, 1), tokens=128)
        >>> plan.left_groups, plan.right_groups, plan.fold_bias
        ((3,), (3,), False)
        >>> plan.flops, plan.kernels
    """

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    ranks: tuple[int, ...]
    tokens: int
    bias: bool
    dense: bool
    """True when the plan forms the full weight W = A B and uses dense matmuls."""
    left_groups: tuple[int, ...]
    """Sizes of the consecutive groups of input cores, absorbed into x in this order (() at rank 0)."""
    right_groups: tuple[int, ...]
    """Sizes of the consecutive groups of output cores, absorbed into z in this order."""
    steps: tuple[Step, ...]
    settings: PlanSettings = field(compare=False)  # no default: Dynamo (torch 2.11) cannot wrap one
    """The settings the plan was chosen (and its :attr:`cost` is scored) with."""

    @property
    def left(self) -> str:
        """Input-side strategy: "merge", "sequential", "groups(2,1)", "dense" or "none" (rank 0)."""
        return _label(self.left_groups, self.dense)

    @property
    def right(self) -> str:
        """Output-side strategy, named like :attr:`left`."""
        return _label(self.right_groups, self.dense)

    @property
    def forward_flops(self) -> int:
        return sum(s.flops for s in self.steps if s.phase == "forward")

    @property
    def backward_flops(self) -> int:
        return sum(s.flops for s in self.steps if s.phase == "backward")

    @property
    def flops(self) -> int:
        """Forward plus backward FLOPs."""
        return self.forward_flops + self.backward_flops

    @property
    def traffic(self) -> int:
        """Forward plus backward elements of token-sized operands read and written."""
        return sum(s.traffic for s in self.steps)

    @property
    def kernels(self) -> int:
        """Forward plus backward kernel launches."""
        return sum(s.kernels for s in self.steps)

    @property
    def cost(self) -> int:
        """What the plan minimizes: ``flops + traffic_weight * traffic + kernel_cost * kernels``."""
        return _cost((self.steps,), self.settings)

    def traffic_bytes(self, element_size: int = 4) -> int:
        """Bytes of token-sized operands read and written, forward plus backward: :attr:`traffic` times
        ``element_size`` (4 for float32, 2 for bfloat16)."""
        if isinstance(element_size, bool) or not isinstance(element_size, int) or element_size <= 0:
            raise ValueError(f"ContractionPlan.traffic_bytes: element_size must be a positive int, "
                             f"got {element_size!r}")
        return self.traffic * element_size

    @property
    def order(self) -> str:
        """The contraction order in one line: which cores are merged into blocks, in which order they are
        absorbed, and where the bias goes, e.g. ``x @ (G0 G1 G2) -> z; z @ (G3 G4 G5) + b (folded) -> y``."""
        if self.zero:
            return "y = b (a bond of rank 0: nothing contracted)" if self.bias else "y = 0 (a bond of rank 0)"
        m = len(self.in_shape)
        if self.dense:
            return (f"W = ({' '.join(f'G{k}' for k in range(m))}) @ "
                    f"({' '.join(f'G{k}' for k in range(m, len(self.ranks) - 1))}); y = x @ W"
                    + (" + b" if self.bias else ""))

        def side(groups, offset, start, end):
            parts = [f"({' '.join(f'G{k}' for k in range(a, b))})" for a, b in bounds(groups, offset)]
            return f"{start} @ " + " @ ".join(parts) + f" -> {end}"

        bias = " + b (folded into the GEMM)" if self.fold_bias else (" + b" if self.bias else "")
        return f"{side(self.left_groups, 0, 'x', 'z')}; {side(self.right_groups, m, 'z', 'y')}{bias}"

    def summary(self, element_size: int = 4) -> dict:
        """The plan's choice and predicted cost as plain values (for logs and tables).

        Args:
            element_size: bytes per element of the activations (4: float32).

        Returns:
            dict: ``order``, ``left``, ``right``, ``fold_bias``, ``flops`` (forward + backward),
            ``traffic_bytes`` (token-sized operands read and written), ``kernels`` and ``cost`` (what
            :func:`make_plan` minimizes, in FLOP-equivalents).

        Example::

            >>> make_plan((12, 8, 8), (12, 16, 16), (1, 12, 30, 30, 30, 16, 1), 4096).summary()["order"]
            'x @ (G0 G1 G2) -> z; z @ (G3 G4 G5) -> y + b (folded into the GEMM)'
        """
        return {"order": self.order, "left": self.left, "right": self.right, "fold_bias": self.fold_bias,
                "flops": self.flops, "traffic_bytes": self.traffic_bytes(element_size),
                "kernels": self.kernels, "cost": self.cost}

    @property
    def fold_bias(self) -> bool:
        """True when the bias rides in the output GEMM as an extra row (``y = [z | 1] @ [B ; b]``), which
        also gives its gradient; otherwise a one-group output side fuses it into the GEMM and
        backward sums ``dy`` for it (see :attr:`PlanSettings.fold_bias_min_tokens`)."""
        return not (self.dense or self.zero) and _folds_bias(self.bias, self.right_groups, self.tokens,
                                                              self.settings)

    @property
    def zero(self) -> bool:
        """True when some bond has rank 0: the weight is zero and nothing is contracted."""
        return 0 in self.ranks

    def __str__(self) -> str:
        head = (f"ContractionPlan in={list(self.in_shape)} out={list(self.out_shape)} "
                f"ranks={list(self.ranks)} tokens={self.tokens} bias={self.bias} "
                f"left={self.left} right={self.right}")
        width = max((len(s.name) for s in self.steps), default=4)
        lines = [head]
        lines.append(f"  order: {self.order}")
        lines.append(f"  {'phase':<8} {'step':<{width}}  {'FLOPs':>14}  {'traffic':>11}  operation")
        lines += [f"  {s.phase:<8} {s.name:<{width}}  {s.flops:>14,d}  {s.traffic:>11,d}  {s.expr}"
                  for s in self.steps]
        lines.append(f"  forward {self.forward_flops:,d}  backward {self.backward_flops:,d}  "
                     f"total {self.flops:,d} FLOPs; token-sized traffic {self.traffic:,d} elements "
                     f"({self.traffic_bytes():,d} bytes in float32); {self.kernels} kernels")
        lines.append(f"  predicted cost {self.cost:,d} FLOP-equivalents = FLOPs + "
                     f"{self.settings.traffic_weight} x traffic + {self.settings.kernel_cost:,d} x kernels")
        return "\n".join(lines)


def _folds_bias(bias: bool, right_groups: tuple[int, ...], tokens: int, settings: PlanSettings) -> bool:
    return bias and len(right_groups) == 1 and tokens >= settings.fold_bias_min_tokens


def _label(groups: tuple[int, ...], dense: bool) -> str:
    if not groups:
        return "none"
    if dense:
        return "dense"
    if len(groups) == 1:
        return "merge"
    if all(g == 1 for g in groups):
        return "sequential"
    return f"groups({','.join(map(str, groups))})"


def _fmt(name: str, *dims: int) -> str:
    return f"{name}[{','.join(str(d) for d in dims)}]"


def bounds(groups: tuple[int, ...], offset: int = 0) -> list[tuple[int, int]]:
    """``(start, stop)`` core indices of each consecutive group of ``groups`` sizes, from ``offset``."""
    out, a = [], offset
    for size in groups:
        out.append((a, a + size))
        a += size
    return out


# --------------------------------------------------------------------------------------------------
# Step lists. Core indices are global (0..d-1); each function returns (forward steps, backward steps),
# both in execution order.

def _gate_steps(modes, ranks):
    fwd, bwd = [], []
    for k in range(len(modes) - 1):
        size = ranks[k] * modes[k] * ranks[k + 1]
        core = _fmt(f"G{k}", ranks[k], modes[k], ranks[k + 1])
        fwd.append(Step("forward", f"gate{k}", f"H{k} = {core} * g{k}[{ranks[k + 1]}]", size))
        bwd.append(Step("backward", f"dgate{k}", f"dg{k} = sum_ai dH{k} * {core}", 2 * size, 0, 2))
        bwd.append(Step("backward", f"dcore{k}", f"dG{k} = dH{k} * g{k}", size))
    return fwd, bwd


def _left_chain(modes, ranks, a, b, block):
    """Merge cores a..b-1 left to right into a (r_a n_a..n_{b-1}, r_b) block."""
    fwd, bwd = [], []
    rows = ranks[a] * modes[a]
    for k in range(a + 1, b):
        f = 2 * rows * ranks[k] * modes[k] * ranks[k + 1]
        fwd.append(Step("forward", f"merge{k}", f"{block}|{k} = {block}|{k - 1}[{rows},{ranks[k]}] @ "
                        f"{_fmt(f'H{k}', ranks[k], modes[k] * ranks[k + 1])}", f))
        bwd.append(Step("backward", f"dmerge{k}", f"dH{k} = {block}|{k - 1}^T @ d{block}|{k}", f))
        bwd.append(Step("backward", f"dmerge{k}'", f"d{block}|{k - 1} = d{block}|{k} @ H{k}^T", f))
        rows *= modes[k]
    return fwd, [s for i in range(len(bwd) - 2, -1, -2) for s in bwd[i:i + 2]], rows


def _right_chain(modes, ranks, a, b, block):
    """Merge cores a..b-1 right to left into a (r_a, n_a..n_{b-1} r_b) block."""
    fwd, bwd = [], []
    cols = modes[b - 1] * ranks[b]
    for k in range(b - 2, a - 1, -1):
        f = 2 * ranks[k] * modes[k] * ranks[k + 1] * cols
        fwd.append(Step("forward", f"merge{k}", f"{block}|{k} = "
                        f"{_fmt(f'H{k}', ranks[k] * modes[k], ranks[k + 1])} @ "
                        f"{block}|{k + 1}[{ranks[k + 1]},{cols}]", f))
        bwd.append(Step("backward", f"dmerge{k}", f"dH{k} = d{block}|{k} @ {block}|{k + 1}^T", f))
        bwd.append(Step("backward", f"dmerge{k}'", f"d{block}|{k + 1} = H{k}^T @ d{block}|{k}", f))
        cols *= modes[k]
    return fwd, [s for i in range(len(bwd) - 2, -1, -2) for s in bwd[i:i + 2]], cols


def _left_group(modes, ranks, tokens, m, a, b):
    """Steps of input-core group a..b-1: merge it into block K_a, absorb K_a into Z_a (T, r_a n_a.., rest)."""
    block = f"K{a}"
    chain_fwd, chain_bwd, rows = _left_chain(modes, ranks, a, b, block)
    rest = math.prod(modes[b:m])
    f = 2 * tokens * rows * ranks[b] * rest
    io = tokens * rows * rest + tokens * ranks[b] * rest  # Z_a and Z_b (or dZ_a and dZ_b)
    # Before the bond the products are batched over tokens (copy + bmm); one token needs no batch.
    kernels = 1 if b == m or tokens == 1 else 2
    fwd = chain_fwd + [Step("forward", f"absorb{a}", f"Z{b} = {block}[{rows},{ranks[b]}]^T @ "
                            f"{_fmt(f'Z{a}', tokens, rows, rest)}", f, io, kernels)]
    bwd = [Step("backward", f"dabsorb{a}", f"d{block} = sum_t Z{a} @ dZ{b}^T", f, io, kernels),
           Step("backward", "dx" if a == 0 else f"dabsorb{a}'", f"dZ{a} = {block} @ dZ{b}", f, io, kernels)]
    return fwd, bwd + chain_bwd


def _right_group(modes, ranks, tokens, m, a, b, fold_bias=False):
    """Steps of output-core group a..b-1: merge it into block K_a, absorb it: Y_b = Y_a (T.., r_a) @ K_a.
    With ``fold_bias`` (one group only) the bias rides along as an extra row of K_a against a column of
    ones, so y and the bias gradient come out of the same two GEMMs."""
    block = f"K{a}"
    chain_fwd, chain_bwd, cols = _right_chain(modes, ranks, a, b, block)
    rows = tokens * math.prod(modes[m:a])
    f = 2 * rows * ranks[a] * cols
    io = rows * ranks[a] + rows * cols  # Y_a and Y_b (or dY_a and dY_b)
    if fold_bias:
        fa = 2 * rows * (ranks[a] + 1) * cols
        fwd = chain_fwd + [Step("forward", f"absorb{a}", f"y = [Y{a}|1][{rows},{ranks[a] + 1}] @ "
                                f"[{block};b][{ranks[a] + 1},{cols}]", fa, io + rows)]
        bwd = [Step("backward", f"dabsorb{a}", f"[d{block};db] = [Y{a}|1]^T @ dy", fa, io + rows)]
    else:
        fwd = chain_fwd + [Step("forward", f"absorb{a}", f"Y{b} = {_fmt(f'Y{a}', rows, ranks[a])} @ "
                                f"{_fmt(block, ranks[a], cols)}", f, io)]
        bwd = [Step("backward", f"dabsorb{a}", f"d{block} = Y{a}^T @ dY{b}", f, io)]
    bwd.append(Step("backward", "dz" if a == m else f"dabsorb{a}'", f"dY{a} = dY{b} @ {block}^T", f, io))
    return fwd, bwd + chain_bwd


def _side_steps(group_steps, bounds):
    """Forward steps group by group, backward steps in reverse group order."""
    parts = [group_steps(a, b) for a, b in bounds]
    return ([s for fwd, _ in parts for s in fwd], [s for _, bwd in reversed(parts) for s in bwd])


def _dense_steps(modes, ranks, tokens, m):
    d = len(modes)
    n_in, n_out, r = math.prod(modes[:m]), math.prod(modes[m:]), ranks[m]
    left_fwd, left_bwd, _ = _left_chain(modes, ranks, 0, m, "A")
    right_fwd, right_bwd, _ = _right_chain(modes, ranks, m, d, "B")
    w, apply = 2 * n_in * r * n_out, 2 * tokens * n_in * n_out
    io = tokens * (n_in + n_out)
    fwd = left_fwd + right_fwd + [Step("forward", "weight", f"W = A[{n_in},{r}] @ B[{r},{n_out}]", w),
                                  Step("forward", "y", f"y = x[{tokens},{n_in}] @ W[{n_in},{n_out}]",
                                       apply, io)]
    bwd = [Step("backward", "dW", f"dW = x^T @ dy[{tokens},{n_out}]", apply, io),
           Step("backward", "dx", "dx = dy @ W^T", apply, io),
           Step("backward", "dA", "dA = dW @ B^T", w), Step("backward", "dB", "dB = A^T @ dW", w)]
    return fwd, bwd + right_bwd + left_bwd


def _flops(steps) -> int:
    return sum(s.flops for part in steps for s in part)


def _cost(steps, settings: PlanSettings) -> int:
    return sum(s.flops + settings.traffic_weight * s.traffic + settings.kernel_cost * s.kernels
               for part in steps for s in part)


def _partitions(count: int) -> tuple[tuple[int, ...], ...]:
    """Every split of ``count`` consecutive cores into groups (2^(count-1) of them)."""
    if count == 0:
        return ((),)
    return tuple((k,) + rest for k in range(1, count + 1) for rest in _partitions(count - k))


def _groups_of(choice, count: int, side: str) -> tuple[int, ...]:
    if choice == "merge":
        return (count,)
    if choice == "sequential":
        return (1,) * count
    if (isinstance(choice, tuple) and all(isinstance(g, int) and g > 0 for g in choice)
            and sum(choice) == count):
        return choice
    raise ValueError(f"make_plan: {side} strategy must be 'merge', 'sequential' or a tuple of positive "
                     f"group sizes summing to {count}, got {choice!r}")


_PLANS: dict[tuple, ContractionPlan] = {}
"""Memo of :func:`make_plan` (a pure function of its arguments, settings included): filled outside
traced code only, so torch.compile never sees it; cleared when it reaches :data:`_PLANS_MAX` entries."""
_PLANS_MAX = 4096


def make_plan(in_shape: tuple[int, ...], out_shape: tuple[int, ...], ranks: tuple[int, ...],
              tokens: int, bias: bool = True, strategies: tuple | str | None = None,
              settings: PlanSettings = DEFAULT_SETTINGS) -> ContractionPlan:
    """The contraction plan of a TT linear layer for ``tokens`` rows.

    The plan of the lowest :attr:`ContractionPlan.cost` among those within ``settings.flop_slack`` of the
    fewest FLOPs, or the one forced by ``strategies``. Steps are listed in execution order.

    Args:
        in_shape: input modes ``(n_0, ..., n_{m-1})``.
        out_shape: output modes ``(n_m, ..., n_{d-1})``.
        ranks: bond sizes ``(1, r_1, ..., r_{d-1}, 1)``; a 0 gives a plan that contracts nothing.
        tokens: rows of the 2-D input.
        bias: whether the layer adds a bias.
        strategies: for tests and micro-benchmarks: "dense" or a ``(left, right)`` pair, each "merge",
            "sequential" or a tuple of group sizes. None (default): the cheapest.
        settings: how plans are scored (:class:`PlanSettings`).

    Returns:
        ContractionPlan: memoized outside torch.compile (the same arguments return the same object);
        under torch.compile it is rebuilt while tracing, a pure function of the arguments.
    """
    if not isinstance(settings, PlanSettings):
        raise TypeError(f"make_plan: settings must be a PlanSettings, got {type(settings).__name__}")
    key = (tuple(in_shape), tuple(out_shape), tuple(ranks), int(tokens), bool(bias), strategies, settings)
    if torch.compiler.is_compiling():
        return _build_plan(*key)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _build_plan(*key)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _build_plan(in_shape, out_shape, ranks, tokens, bias, strategies, settings) -> ContractionPlan:
    m, q = len(in_shape), len(out_shape)
    modes = in_shape + out_shape
    if m < 1 or q < 1:
        raise ValueError(f"make_plan: need at least one input and one output mode, got "
                         f"in_shape={in_shape}, out_shape={out_shape}")
    if len(ranks) != m + q + 1 or ranks[0] != 1 or ranks[-1] != 1 or min(ranks) < 0:
        raise ValueError(f"make_plan: ranks must be [1, r_1, ..., r_{m + q - 1}, 1] (r_k >= 0) of length "
                         f"{m + q + 1}, got {list(ranks)}")
    if strategies not in (None, "dense") and (not isinstance(strategies, tuple) or len(strategies) != 2):
        raise ValueError(f"make_plan: strategies must be 'dense' or a (left, right) pair, got {strategies!r}")
    n_out = math.prod(out_shape)
    bias_fwd = [Step("forward", "bias", f"y += b[{n_out}]", tokens * n_out,
                     2 * tokens * n_out)] if bias else []
    bias_bwd = ([Step("backward", "dbias", f"db = sum_t dy[{tokens},{n_out}]", tokens * n_out,
                      tokens * n_out)]
                if bias else [])
    if 0 in ranks:
        return ContractionPlan(in_shape, out_shape, ranks, tokens, bias, False, (), (),
                               tuple(bias_fwd + bias_bwd), settings)
    gates_fwd, gates_bwd = _gate_steps(modes, ranks)
    dense_fwd, dense_bwd = _dense_steps(modes, ranks, tokens, m)
    left_group = functools.partial(_left_group, modes, ranks, tokens, m)
    right_group = functools.partial(_right_group, modes, ranks, tokens, m)
    dense = ContractionPlan(in_shape, out_shape, ranks, tokens, bias, True, (m,), (q,),
                            tuple(gates_fwd + dense_fwd + bias_fwd + bias_bwd + dense_bwd + gates_bwd),
                            settings)
    if strategies == "dense":
        return dense

    def sides(left: tuple[int, ...], right: tuple[int, ...]):
        fold = _folds_bias(bias, right, tokens, settings)  # the bias rides in the output GEMM
        left_fwd, left_bwd = _side_steps(left_group, bounds(left))
        right_fwd, right_bwd = _side_steps(functools.partial(right_group, fold_bias=fold), bounds(right, m))
        return left_fwd, right_fwd + ([] if fold else bias_fwd + bias_bwd) + right_bwd, left_bwd

    def grouped(left: tuple[int, ...], right: tuple[int, ...]) -> ContractionPlan:
        steps = gates_fwd + [s for part in sides(left, right) for s in part] + gates_bwd
        return ContractionPlan(in_shape, out_shape, ranks, tokens, bias, False, left, right,
                               tuple(steps), settings)

    if strategies is not None:
        return grouped(_groups_of(strategies[0], m, "left"), _groups_of(strategies[1], q, "right"))
    # Every grouping of both sides (at most 2^(d-2) pairs), scored without building plans.
    scored = [(_flops(parts), _cost(parts, settings), left, right)
              for left in _partitions(m) for right in _partitions(q) for parts in [sides(left, right)]]
    gate_flops = _flops((gates_fwd, gates_bwd))  # the same in every plan that contracts through the bond
    fewest = min(flops for flops, *_ in scored) + gate_flops
    if dense.flops < fewest:
        return dense
    # min() of a list, not of a generator: torch.compile's tracer follows only the former
    _, _, left, right = min([(cost, flops, left, right) for flops, cost, left, right in scored
                             if flops + gate_flops <= (1 + settings.flop_slack) * fewest])
    return grouped(left, right)
