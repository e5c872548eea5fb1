"""Contraction plans for tensor-train linear layers, and the kernels that follow them.

A TT linear layer with input modes ``n_0..n_{m-1}``, output modes ``n_m..n_{d-1}`` and ranks
``r_0 = 1, r_1, ..., r_d = 1`` computes ``y = x W + b`` with ``W = H_0 H_1 ... H_{d-1}``, where the
effective core ``H_k = G_k * g_k`` is core ``k`` scaled along its last axis by its rank gate (the last
core has no gate). The bond ``m`` between the input and the output cores joins two sides through the
rank-``r_m`` activation ``z``:

* input side: ``z = x A`` with ``A = H_0 ... H_{m-1}`` (in, r_m);
* output side: ``y = z B + b`` with ``B = H_m ... H_{d-1}`` (r_m, out).

Each side is contracted group by group: its cores are split into consecutive groups, each group is
merged into one block (a chain of small matmuls on the cores alone) and the activations absorb the
blocks one after another. One group is the classic low-rank pair ("merge": form A, then one matmul with
x); one group per core contracts the activations core by core ("sequential"). The plan scores every
grouping of both sides for the token count at hand (a side of k cores has 2^(k-1) groupings) and takes
the cheapest (see below), or the "dense" strategy (form W = A B and use plain matmuls) when that has
fewer FLOPs, which happens only when r_m is close to full rank.

"Cheapest" weighs FLOPs, memory traffic and kernel launches:
``cost = flops + TRAFFIC_WEIGHT * traffic + KERNEL_COST * kernels``, where the traffic of a step is the
number of elements of its token-sized operands (read and written) and every kernel carries a fixed cost
measured on the machine (:func:`measure_kernel_cost`), as long as the plan's FLOPs stay within
``FLOP_SLACK`` of the fewest possible (else the FLOP-minimal plan). Every extra group adds
a pass over a token-sized intermediate; on CPUs and GPUs alike a float moved costs tens of FLOPs, so a
grouping that saves a few FLOPs but writes and re-reads an activation is slower in practice (measured:
after halving the ranks of a 768->768 layer, the FLOP-optimal groups(1,2) plan ran slower than merge).
At few tokens the FLOPs are tiny and the kernel count decides: a one-group side ("merge") launches the
fewest kernels; a one-group output side fuses the bias into its GEMM, or folds it in as an extra row.

FLOPs are counted the way ``opt_einsum`` counts them: a pairwise contraction with a summed index costs
``2 * prod(sizes of all its indices)`` (a multiply and an add per term), an elementwise product or a
sum one per element. Backward saves the inputs of each absorption (x and rank-sized intermediates) and
the merged blocks, never the full-width output. When the output side is one group, the bias rides in
its GEMM (``y = [z | 1] @ [B ; b]``), so the bias gradient comes out of the ``dB`` GEMM and no separate
pass over ``y`` or ``dy`` is made.

The token-sized products are skinny (one of their three sizes is a rank). Large float32 CPU products run
through oneDNN's inner product instead of torch.mm (see :data:`INNER_PRODUCT_MIN_MACS`; ``[B ; b]`` is
built transposed, the layout it reads fastest); both compute the same sums, and FlopCounterMode counts
both.

The kernels dispatch as few ATen ops as the contraction allows, since on small token counts each op's
fixed cost (Python, dispatch, launch) is the layer's time: every reshape is a single view, the 2-D views
of the cores and the merged blocks made in the forward are saved for the backward, ``a @ w^T`` goes to
oneDNN with ``w`` as it is, and on one token the absorptions before the bond are plain mm calls. One
forward+backward of a gated paper-shape layer with bias dispatches 72-77 ops on the CPU, 13 of them
autograd's accumulation of the 13 leaf gradients (docs/performance.md).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

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
    counts 2): each costs :data:`KERNEL_COST` FLOP-equivalents whatever its size."""


TRAFFIC_WEIGHT = 32
"""FLOPs charged per element of token-sized traffic when plans are compared: the order of the
FLOP-per-float balance of current CPUs (~100 GFLOP/s vs ~3 Gfloat/s per core pair) and GPUs."""
KERNEL_COST = 2_500_000
"""FLOP-equivalents charged per kernel when plans are compared: the fixed time per kernel of a TT call
(dispatch, autograd bookkeeping, saved tensors, thread hand-off: ~12 us on one token) times the machine's
matmul rate (~170 GFLOP/s). At few tokens it makes the plan prefer fewer, larger products. The default
was measured on a 2-core AMD EPYC VM with torch 2.13 CPU (2.4-2.7M); :func:`comera.tt.measure_kernel_cost`
measures it on the machine at hand and :func:`set_kernel_cost` applies it."""
FOLD_BIAS_MIN_TOKENS = 2048
"""Token count from which a one-group output side folds the bias into its GEMM (see
:attr:`ContractionPlan.fold_bias`). The fold saves a pass over ``dy`` for the bias gradient, which pays
on many tokens of a wide output; below, padding ``z`` and building ``[B ; b]`` cost more than the pass.
Measured (rank-30 layers, 2-core AMD EPYC VM, interleaved): 768->768 at 1024 tokens 3.9 ms folded vs 3.3
unfolded, equal at 4096; 768->3072 at 2048 and 4096 tokens 4-7% faster folded."""
FLOP_SLACK = 0.5
"""The lowest-cost plan is taken only when its FLOPs exceed the fewest possible by at most this fraction;
otherwise the FLOP-minimal plan is (so traffic never buys a plan much above the FLOP optimum)."""


@dataclass(frozen=True)
class ContractionPlan:
    """How one TT linear layer contracts its forward and backward passes for a given token count.

    Plans are values: build them with :func:`make_plan` (cached); ``print(plan)`` lists the steps.
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
        """What the plan minimizes: ``flops + TRAFFIC_WEIGHT * traffic + KERNEL_COST * kernels``."""
        return _cost((self.steps,))

    @property
    def fold_bias(self) -> bool:
        """True when the bias rides in the output GEMM as an extra row (``y = [z | 1] @ [B ; b]``), which
        also gives its gradient; otherwise a one-group output side fuses it into the GEMM and
        backward sums ``dy`` for it (see :data:`FOLD_BIAS_MIN_TOKENS`)."""
        return not (self.dense or self.zero) and _folds_bias(self.bias, self.right_groups, self.tokens)

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
        lines += [f"  {s.phase:<8} {s.name:<{width}}  {s.flops:>14,d}  {s.expr}" for s in self.steps]
        lines.append(f"  forward {self.forward_flops:,d}  backward {self.backward_flops:,d}  "
                     f"total {self.flops:,d} FLOPs; token-sized traffic {self.traffic:,d} elements; "
                     f"{self.kernels} kernels")
        return "\n".join(lines)


def _folds_bias(bias: bool, right_groups: tuple[int, ...], tokens: int) -> bool:
    return bias and len(right_groups) == 1 and tokens >= FOLD_BIAS_MIN_TOKENS


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


def _bounds(groups: tuple[int, ...], offset: int = 0) -> list[tuple[int, int]]:
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
        fwd.append(Step("forward", f"merge{k}", f"{block}|{k} = {_fmt(f'H{k}', ranks[k] * modes[k], ranks[k + 1])}"
                        f" @ {block}|{k + 1}[{ranks[k + 1]},{cols}]", f))
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
                                  Step("forward", "y", f"y = x[{tokens},{n_in}] @ W[{n_in},{n_out}]", apply, io)]
    bwd = [Step("backward", "dW", f"dW = x^T @ dy[{tokens},{n_out}]", apply, io),
           Step("backward", "dx", "dx = dy @ W^T", apply, io),
           Step("backward", "dA", "dA = dW @ B^T", w), Step("backward", "dB", "dB = A^T @ dW", w)]
    return fwd, bwd + right_bwd + left_bwd


def _flops(steps) -> int:
    return sum(s.flops for part in steps for s in part)


def _cost(steps) -> int:
    return sum(s.flops + TRAFFIC_WEIGHT * s.traffic + KERNEL_COST * s.kernels for part in steps for s in part)


def set_kernel_cost(flops: int) -> None:
    """Set :data:`KERNEL_COST` (FLOP-equivalents per kernel) for plans made from now on (clears the plan
    cache; layers pick up new plans on their next call)."""
    global KERNEL_COST
    if not isinstance(flops, int) or isinstance(flops, bool) or flops < 0:
        raise ValueError(f"set_kernel_cost: flops must be an int >= 0, got {flops!r}")
    KERNEL_COST = flops
    make_plan.cache_clear()


@functools.cache
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


@functools.lru_cache(maxsize=4096)
def make_plan(in_shape: tuple[int, ...], out_shape: tuple[int, ...], ranks: tuple[int, ...],
              tokens: int, bias: bool = True, strategies: tuple | str | None = None) -> ContractionPlan:
    """The plan of the lowest :attr:`ContractionPlan.cost` (forward + backward FLOPs plus weighted
    token-sized traffic) among those within ``FLOP_SLACK`` of the fewest FLOPs, or the one forced by
    ``strategies``.

    ``strategies`` (for tests and micro-benchmarks) is "dense" or a (left, right) pair, each "merge",
    "sequential" or a tuple of group sizes. Steps are listed in execution order. Cached: the same
    arguments return the same object.
    """
    in_shape, out_shape, ranks = tuple(in_shape), tuple(out_shape), tuple(ranks)
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
    bias_fwd = [Step("forward", "bias", f"y += b[{n_out}]", tokens * n_out, 2 * tokens * n_out)] if bias else []
    bias_bwd = ([Step("backward", "dbias", f"db = sum_t dy[{tokens},{n_out}]", tokens * n_out, tokens * n_out)]
                if bias else [])
    if 0 in ranks:
        return ContractionPlan(in_shape, out_shape, ranks, tokens, bias, False, (), (),
                               tuple(bias_fwd + bias_bwd))
    gates_fwd, gates_bwd = _gate_steps(modes, ranks)
    dense_fwd, dense_bwd = _dense_steps(modes, ranks, tokens, m)
    left_group = functools.partial(_left_group, modes, ranks, tokens, m)
    right_group = functools.partial(_right_group, modes, ranks, tokens, m)
    dense = ContractionPlan(in_shape, out_shape, ranks, tokens, bias, True, (m,), (q,),
                            tuple(gates_fwd + dense_fwd + bias_fwd + bias_bwd + dense_bwd + gates_bwd))
    if strategies == "dense":
        return dense

    def sides(left: tuple[int, ...], right: tuple[int, ...]):
        fold = _folds_bias(bias, right, tokens)  # the bias rides in the output GEMM: no passes over y, dy
        left_fwd, left_bwd = _side_steps(left_group, _bounds(left))
        right_fwd, right_bwd = _side_steps(functools.partial(right_group, fold_bias=fold), _bounds(right, m))
        return left_fwd, right_fwd + ([] if fold else bias_fwd + bias_bwd) + right_bwd, left_bwd

    def grouped(left: tuple[int, ...], right: tuple[int, ...]) -> ContractionPlan:
        steps = gates_fwd + [s for part in sides(left, right) for s in part] + gates_bwd
        return ContractionPlan(in_shape, out_shape, ranks, tokens, bias, False, left, right, tuple(steps))

    if strategies is not None:
        return grouped(_groups_of(strategies[0], m, "left"), _groups_of(strategies[1], q, "right"))
    # Every grouping of both sides (at most 2^(d-2) pairs), scored without building plans.
    scored = [(_flops(parts), _cost(parts), left, right)
              for left in _partitions(m) for right in _partitions(q) for parts in [sides(left, right)]]
    gate_flops = _flops((gates_fwd, gates_bwd))  # the same in every plan that contracts through the bond
    fewest = min(flops for flops, *_ in scored) + gate_flops
    if dense.flops < fewest:
        return dense
    _, _, left, right = min((cost, flops, left, right) for flops, cost, left, right in scored
                            if flops + gate_flops <= (1 + FLOP_SLACK) * fewest)
    return grouped(left, right)


# --------------------------------------------------------------------------------------------------
# Kernels. ``cores`` are the effective (gated) cores H_k of one side, shape (r_k, n_k, r_{k+1}).

_INNER_PRODUCT = (getattr(torch.ops.mkldnn, "_linear_pointwise", None)
                  if torch.backends.mkldnn.is_available() else None)
"""oneDNN's inner product ``X @ W^T`` (the op PyTorch's compiler uses for CPU linear layers), or None."""
INNER_PRODUCT_MIN_MACS = (1 << 22, 1 << 25)
"""Multiply-adds from which a float32 CPU product goes to oneDNN instead of torch.mm (MKL): (products with
a narrow output, at most 64 columns; all others).

Measured here (AMD EPYC, AVX2, MKL 2024.2, oneDNN 3.12, one thread) on the products of a TT layer at
rank 30: with a narrow output (``z = x A``, ``dz = dy B^T``) oneDNN is 1.3x faster at 256 tokens and
1.7-2.4x at 4096 (``dy[4096,3072] @ B^T[3072,30]``: 16 ms vs 39 ms), but a whole layer at 128 tokens
was slower with it; with a rank-sized inner dimension (``y = z B``) MKL is faster up to ~2000 tokens x
768 columns, oneDNN 1.3-2x beyond. Below these sizes oneDNN's per-call setup costs more than it saves.
Re-measured with two threads (docs/performance.md): the products alone favour oneDNN from ~1.5M
multiply-adds, yet whole layers at 128-4096 tokens were as fast or faster with these thresholds."""

if _INNER_PRODUCT is not None:
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    if torch.ops.mkldnn._linear_pointwise not in flop_registry:
        @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
        def _inner_product_flops(x_shape, w_shape, *args, **kwargs) -> int:
            """FlopCounterMode counts ``X @ W^T`` like aten.mm: 2 FLOPs per multiply-add."""
            return 2 * math.prod(x_shape) * w_shape[0]


def _inner_product_fits(a: torch.Tensor, w: torch.Tensor, cols: int, bias: torch.Tensor | None) -> bool:
    """Whether the product of ``a`` and ``w`` (either layout) with ``cols`` output columns (+ bias) goes to
    oneDNN's inner product: a large float32 CPU product with a contiguous ``a`` that autograd does not
    record (the inner product has no autograd formula), outside torch.compile (the compiler picks the
    kernels; its lowering of the inner product needs a constant weight)."""
    return (_INNER_PRODUCT is not None and not torch.compiler.is_compiling() and a.dtype == torch.float32
            and w.dtype == torch.float32 and a.device.type == "cpu"
            and a.shape[0] * a.shape[1] * cols >= INNER_PRODUCT_MIN_MACS[cols > 64]
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and a.is_contiguous() and not (torch.is_grad_enabled() and (a.requires_grad or w.requires_grad)))


def _inner_product(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """oneDNN's ``a @ w^T (+ bias)``, or None (for good) when this build cannot run it on this machine."""
    global _INNER_PRODUCT
    try:
        return _INNER_PRODUCT(a, w, bias, "none", [], "")
    except RuntimeError:  # e.g. "could not create a primitive descriptor" on an unsupported CPU
        _INNER_PRODUCT = None
        return None


def _mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` of 2-D tensors: oneDNN's inner product (bias fused) for large float32 CPU
    products (fastest when ``b`` is a transposed view of a contiguous matrix, see
    :func:`_inner_product_fits`), else torch.mm / torch.addmm."""
    if _inner_product_fits(a, b, b.shape[1], bias):
        out = _inner_product(a, b.t(), bias)
        if out is not None:
            return out
    return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)


def _mm_t(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w^T`` (one op when the inner product takes it: it reads ``w`` as it is)."""
    if _inner_product_fits(a, w, w.shape[0], None):
        out = _inner_product(a, w, None)
        if out is not None:
            return out
    return torch.mm(a, w.t())


# A merged group is saved as one flat list ("chain"): its blocks, then its cores as the matrices the
# merge multiplied (2-D views made once in the forward and reused by the backward).

def _chain_parts(chain):
    """(blocks, matrices) of a chain of k cores: k blocks, k - 1 matrices."""
    k = (len(chain) + 1) // 2
    return chain[:k], chain[k:]


def _merge_left(cores):
    """Merge cores left to right: blocks ``K|k`` (r_a n_a..n_k, r_{k+1}), the last one the group's block,
    then cores a+1.. as (r_k, n_k r_{k+1}) matrices."""
    block = cores[0].reshape(-1, cores[0].shape[-1])
    blocks, mats = [block], []
    for h in cores[1:]:
        mat = h.reshape(h.shape[0], -1)
        block = torch.mm(block, mat).view(-1, h.shape[-1])
        blocks.append(block)
        mats.append(mat)
    return blocks + mats


def _left_block(chain) -> torch.Tensor:
    return _chain_parts(chain)[0][-1]


def _merge_left_backward(dblock, cores, chain):
    """Core gradients from the gradient of the group's block (r_a n_a.., r_b)."""
    blocks, mats = _chain_parts(chain)
    grads = [None] * len(cores)
    for i in range(len(cores) - 1, 0, -1):
        d = dblock.reshape(blocks[i - 1].shape[0], -1)
        grads[i] = torch.mm(blocks[i - 1].t(), d).view(cores[i].shape)
        dblock = torch.mm(d, mats[i - 1].t())
    grads[0] = dblock.reshape(cores[0].shape)
    return grads


def _merge_right(cores):
    """Merge cores right to left: blocks ``K|k`` (r_k, n_k..n_{b-1} r_b), the first one the group's block,
    then cores a..b-2 as (r_k n_k, r_{k+1}) matrices."""
    block = cores[-1].reshape(cores[-1].shape[0], -1)
    blocks, mats = [block], []
    for h in reversed(cores[:-1]):
        mat = h.reshape(-1, h.shape[-1])
        block = torch.mm(mat, block).view(h.shape[0], -1)
        blocks.append(block)
        mats.append(mat)
    return blocks[::-1] + mats[::-1]


def _merge_right_backward(dblock, cores, chain):
    """Core gradients from the gradient of the group's block (r_a, n_a.. r_b)."""
    blocks, mats = _chain_parts(chain)
    grads = [None] * len(cores)
    for i in range(len(cores) - 1):
        d = dblock.reshape(mats[i].shape[0], -1)
        grads[i] = torch.mm(d, blocks[i + 1].t()).view(cores[i].shape)
        dblock = torch.mm(mats[i].t(), d)
    grads[-1] = dblock.reshape(cores[-1].shape)
    return grads


def _rows(t: torch.Tensor, count: int) -> torch.Tensor:
    """``t`` as a (count, -1) matrix (no op when it already is one)."""
    return t if t.dim() == 2 and t.shape[0] == count else t.reshape(count, -1)


def left_forward(x: torch.Tensor, cores, groups):
    """z = x A for a contiguous x (T, in). Returns (z, inputs, chains); the last two feed the backward.
    ``inputs`` holds the input of each group's absorption (``[x]`` for one group); before the bond a
    group's input is (T, rows, rest), or (rows, rest) on one token."""
    tokens = x.shape[0]
    z, inputs, chains = x, [], []
    for a, b in _bounds(groups):
        chain = _merge_left(cores[a:b])
        block = _left_block(chain)
        if b == len(cores):
            inputs.append(_rows(z, tokens))
            z = _mm(inputs[-1], block)
        elif tokens == 1:
            inputs.append(_rows(z, block.shape[0]))
            z = torch.mm(block.t(), inputs[-1])
        else:
            inputs.append(z.view(tokens, block.shape[0], -1))
            z = torch.matmul(block.t(), inputs[-1])
        chains.append(chain)
    return z, inputs, chains


def _input_block_grad(zin: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """``dK = Z^T dz`` of the last input group, contiguous. On the CPU, for more than one token, it is
    computed as ``(dz^T Z)^T`` and copied: MKL runs that layout faster (whole 768->768 layers, one thread:
    1.03x at 128 tokens, 1.2x at 4096), and the copy of the small (in, r) result is one op; otherwise one
    product."""
    if zin.device.type == "cpu" and zin.shape[0] > 1:
        return torch.t_copy(torch.mm(dz.t(), zin))
    return torch.mm(zin.t(), dz)


def left_backward(dz: torch.Tensor, cores, inputs, chains, groups, need_dx: bool):
    """Gradients (dx or None, [dH_k]) of the input side."""
    tokens = dz.shape[0]
    grads = [None] * len(cores)
    bounds = _bounds(groups)
    for g in range(len(bounds) - 1, -1, -1):
        a, b = bounds[g]
        block, zin = _left_block(chains[g]), inputs[g]
        wanted = g > 0 or need_dx
        if b == len(cores):
            dz = _rows(dz, tokens)
            dblock = _input_block_grad(zin, dz)
            dzin = _mm_t(dz, block) if wanted else None
        elif tokens == 1:
            dz = _rows(dz, block.shape[1])
            dblock = torch.mm(zin, dz.t())
            dzin = torch.mm(block, dz) if wanted else None
        else:
            dz = dz.view(tokens, block.shape[1], -1)
            dblock = torch.einsum("tcs,tbs->cb", zin, dz)
            dzin = torch.matmul(block, dz) if wanted else None
        grads[a:b] = _merge_left_backward(dblock, cores[a:b], chains[g])
        dz = dzin
    return (_rows(dz, tokens) if need_dx else None), grads


def right_forward(z: torch.Tensor, cores, groups, bias, fold_bias: bool = False):
    """y = z B + b for z (T, r). Returns (y, inputs, chains); the last two feed the backward.
    With ``fold_bias`` (one group and a bias) the bias is folded into the GEMM: y = [z | 1] @ [B ; b], and
    ``inputs`` is ``[[z | 1]]``; with one group otherwise it is fused into the GEMM."""
    tokens = z.shape[0]
    y, inputs, chains = z, [], []
    for a, b in _bounds(groups):
        chain = _merge_right(cores[a:b])
        block = chain[0]
        chains.append(chain)
        if len(groups) == 1 and bias is not None:
            if fold_bias:
                z1 = torch.nn.functional.pad(z, (0, 1), value=1.0)
                inputs.append(z1)
                # [B ; b] built transposed (out, r + 1): the layout the inner product reads fastest.
                return _mm_t(z1, torch.cat([block.t(), bias.unsqueeze(1)], 1)), inputs, chains
            inputs.append(z)
            return _mm(z, block, bias), inputs, chains
        inputs.append(_rows(y, y.numel() // block.shape[0]))
        y = _mm(inputs[-1], block)
    y = _rows(y, tokens)
    return (y if bias is None else y.add_(bias)), inputs, chains


def right_backward(dy: torch.Tensor, cores, inputs, chains, groups):
    """Gradients (dz, [dH_k], db or None) of the output side; db when the bias was folded in."""
    grads = [None] * len(cores)
    dbias = None
    bounds = _bounds(groups)
    for g in range(len(bounds) - 1, -1, -1):
        a, b = bounds[g]
        block, yin = chains[g][0], inputs[g]
        dy = _rows(dy, yin.shape[0])
        dblock = torch.mm(yin.t(), dy)
        if yin.shape[1] > block.shape[0]:  # folded bias: the last row is db
            dblock, dbias = dblock[:-1], dblock[-1]
        dy = _mm_t(dy, block)
        grads[a:b] = _merge_right_backward(dblock, cores[a:b], chains[g])
    return _rows(dy, inputs[0].shape[0]), grads, dbias


def dense_forward(x: torch.Tensor, left_cores, right_cores, bias):
    """y = x (A B) + b. Returns (y, weight, left chain, right chain)."""
    left, right = _merge_left(left_cores), _merge_right(right_cores)
    weight = torch.mm(_left_block(left), right[0])
    y = torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)
    return y, weight, left, right


def dense_backward(dy, x, weight, left_cores, right_cores, left, right, need_dx: bool):
    """Gradients (dx or None, [dH_k] of both sides)."""
    dweight = torch.mm(x.t(), dy)
    dx = torch.mm(dy, weight.t()) if need_dx else None
    da, db = torch.mm(dweight, right[0].t()), torch.mm(_left_block(left).t(), dweight)
    return dx, _merge_left_backward(da, left_cores, left) + _merge_right_backward(db, right_cores, right)
