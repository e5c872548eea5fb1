"""Execution of a contraction plan (:mod:`comera.contraction`): a TT linear layer's products and core merges.

Large float32 CPU products run through oneDNN from :data:`INNER_PRODUCT_MIN_MACS` multiply-adds (counted
once :func:`register_flop_formulas` ran). Thresholds: docs/performance.md; what is saved:
docs/design-notes.md.
"""
from __future__ import annotations

import math

import torch

from comera import plain
from comera.contraction import bounds

_INNER_PRODUCT = (getattr(torch.ops.mkldnn, "_linear_pointwise", None)
                  if torch.backends.mkldnn.is_available() else None)
"""oneDNN's inner product ``X @ W^T (+ b)``, or None where this PyTorch build has none. Never rebound."""
INNER_PRODUCT_MIN_MACS = (1 << 22, 1 << 25)
"""Multiply-adds from which a float32 CPU product goes to oneDNN instead of torch.mm (MKL): (products with a
narrow output, at most 64 columns; all others). Below, oneDNN's per-call set-up costs more than it saves
(measured on the products of rank-30 layers: docs/performance.md, "oneDNN inner product")."""


def register_flop_formulas() -> None:
    """Teach :class:`torch.utils.flop_counter.FlopCounterMode` the FLOPs of oneDNN's inner product.

    FlopCounterMode counts ``aten.mm`` but not ``mkldnn._linear_pointwise``, which large float32 CPU
    products of a TT layer run through.
    Call this once before counting FLOPs of TT layers (the harness does where it counts them); it changes
    torch's global ``flop_registry``, which is why importing :mod:`comera` does not. Idempotent.

    Example::

        >>> from torch.utils.flop_counter import FlopCounterMode
        >>> comera.register_flop_formulas()
        >>> with FlopCounterMode(display=False) as counter:
        ...     layer(x).sum().backward()
    """
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    if _INNER_PRODUCT is None:
        return

    if _INNER_PRODUCT in flop_registry:
        return

    @register_flop_formula(_INNER_PRODUCT)
    def _inner_product_flops(x_shape, w_shape, *args, **kwargs) -> int:
        """``X @ W^T`` counted like aten.mm: 2 FLOPs per multiply-add."""
        return 2 * math.prod(x_shape) * w_shape[0]


def _inner_product_fits(a: torch.Tensor, w: torch.Tensor, cols: int, bias: torch.Tensor | None) -> bool:
    """Whether the product of ``a`` and ``w`` (either layout) with ``cols`` output columns (+ bias) goes to
    oneDNN's inner product: a large float32 CPU product with a contiguous ``a`` that autograd does not
    record (the inner product has no autograd formula), outside :func:`comera.plain_autograd` and
    torch.compile (the compiler picks the kernels; its lowering of the inner product needs a constant
    weight)."""
    return (a.shape[0] * a.shape[1] * cols >= INNER_PRODUCT_MIN_MACS[cols > 64]  # cheapest test first
            and _INNER_PRODUCT is not None and a.dtype == torch.float32 and w.dtype == torch.float32
            and a.device.type == "cpu" and not torch.compiler.is_compiling() and not plain.active()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and a.is_contiguous() and not (torch.is_grad_enabled() and (a.requires_grad or w.requires_grad)))


def _inner_product(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """oneDNN's ``a @ w^T (+ bias)``, or None when this build cannot run it on this machine (e.g. "could
    not create a primitive descriptor" on an unsupported CPU); the caller then takes torch.mm."""
    try:
        return _INNER_PRODUCT(a, w, bias, "none", [], "")
    except RuntimeError:
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


NARROW_COLS, NARROW_MIN_INNER, NARROW_MIN_ROWS = 32, 256, 16
"""A CPU product ``a @ b`` with at most ``NARROW_COLS`` output columns, an inner dimension of at least
``NARROW_MIN_INNER`` and at least ``NARROW_MIN_ROWS`` rows, that oneDNN does not take, runs as
``(b^T a^T)^T`` (:func:`_narrow_mm`): MKL runs that layout faster (docs/performance.md)."""


def _narrow(a: torch.Tensor, other: torch.Tensor, cols: int) -> bool:
    """Whether ``a`` times ``other`` (or its transpose), ``cols`` output columns, is a narrow CPU product
    below oneDNN's sizes (:data:`NARROW_COLS`)."""
    return (cols <= NARROW_COLS and a.shape[1] >= NARROW_MIN_INNER and a.shape[0] >= NARROW_MIN_ROWS
            and a.device.type == "cpu" and not _inner_product_fits(a, other, cols, None))


def _narrow_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of 2-D tensors for a result read as a matrix (never reshaped): :func:`_mm`, except that a
    narrow CPU product below oneDNN's sizes (:func:`_narrow`) is computed as ``(b^T a^T)^T``, a
    transposed view of a contiguous ``(cols, rows)`` result."""
    return torch.mm(b.t(), a.t()).t() if _narrow(a, b, b.shape[1]) else _mm(a, b)


def _narrow_mm_t(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w^T`` as :func:`_narrow_mm` computes ``a @ b``: ``(w a^T)^T`` for a narrow CPU product below
    oneDNN's sizes, else :func:`_mm_t`."""
    return torch.mm(w, a.t()).t() if _narrow(a, w, w.shape[0]) else _mm_t(a, w)


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
    """Input side ``z = x A``, group by group.

    Args:
        x: the layer input, contiguous.
        cores: the effective (gated) input cores ``H_0 .. H_{m-1}``.
        groups: the plan's ``left_groups``.

    Returns:
        ``(z, inputs, chains)``; ``inputs`` (the input of each group's absorption: ``[x]`` for one group;
        before the bond ``(T, rows, rest)``, or ``(rows, rest)`` on one token) and ``chains`` feed
        :func:`left_backward`.

    Shape:
        - x: ``(T, in_features)``; z: ``(T, r_m)``.
    """
    tokens = x.shape[0]
    z, inputs, chains = x, [], []
    for a, b in bounds(groups):
        chain = _merge_left(cores[a:b])
        block = _left_block(chain)
        if b == len(cores):
            inputs.append(_rows(z, tokens))
            z = _narrow_mm(inputs[-1], block)
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
    computed as ``(dz^T Z)^T`` and copied (one op for the small (in, r) result): MKL runs that layout faster
    (docs/performance.md); otherwise one product."""
    if zin.device.type == "cpu" and zin.shape[0] > 1:
        return torch.t_copy(torch.mm(dz.t(), zin))
    return torch.mm(zin.t(), dz)


def left_backward(dz: torch.Tensor, cores, inputs, chains, groups, need_dx: bool, need_cores: bool = True):
    """Backward of :func:`left_forward`.

    Args:
        dz: gradient of ``z``, ``(T, r_m)``.
        cores: tensors of the shapes of the cores given to :func:`left_forward` (only their shapes are read:
            the gated cores or the cores themselves).
        groups: as given to :func:`left_forward`.
        inputs, chains: what :func:`left_forward` returned.
        need_dx: whether to compute the input gradient.
        need_cores: whether to compute the cores' gradients (else they are None).

    Returns:
        ``(dx or None, [dH_0, .., dH_{m-1}])``: ``dx`` is ``(T, in_features)``, each ``dH_k`` the shape of
        its core, or None without ``need_cores``.
    """
    tokens = dz.shape[0]
    grads = [None] * len(cores)
    if not (need_dx or need_cores):
        return None, grads
    spans = bounds(groups)
    for g in range(len(spans) - 1, -1, -1):
        a, b = spans[g]
        block, zin = _left_block(chains[g]), inputs[g]
        wanted = g > 0 or need_dx
        if b == len(cores):
            dz = _rows(dz, tokens)
            dblock = _input_block_grad(zin, dz) if need_cores else None
            dzin = _mm_t(dz, block) if wanted else None
        elif tokens == 1:
            dz = _rows(dz, block.shape[1])
            dblock = torch.mm(zin, dz.t()) if need_cores else None
            dzin = torch.mm(block, dz) if wanted else None
        else:
            dz = dz.view(tokens, block.shape[1], -1)
            dblock = torch.einsum("tcs,tbs->cb", zin, dz) if need_cores else None
            dzin = torch.matmul(block, dz) if wanted else None
        if need_cores:
            grads[a:b] = _merge_left_backward(dblock, cores[a:b], chains[g])
        dz = dzin
    return (_rows(dz, tokens) if need_dx else None), grads


def right_forward(z: torch.Tensor, cores, groups, bias, fold_bias: bool = False):
    """Output side ``y = z B + b``, group by group.

    Args:
        z: the rank-``r_m`` activation.
        cores: the effective output cores ``H_m .. H_{d-1}``.
        groups: the plan's ``right_groups``.
        bias: the bias or None. With one group it rides in the output GEMM: fused (``addmm``), or, with
            ``fold_bias``, folded in as an extra row, ``y = [z | 1] @ [B ; b]`` (``inputs`` is then
            ``[[z | 1]]`` and :func:`right_backward` returns the bias gradient).
        fold_bias: the plan's :attr:`~comera.contraction.ContractionPlan.fold_bias`.

    Returns:
        ``(y, inputs, chains)``; the last two feed :func:`right_backward`.

    Shape:
        - z: ``(T, r_m)``; y: ``(T, out_features)``.
    """
    tokens = z.shape[0]
    y, inputs, chains = z, [], []
    for a, b in bounds(groups):
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


def right_backward(dy: torch.Tensor, cores, inputs, chains, groups, need_cores: bool = True):
    """Backward of :func:`right_forward`.

    Args:
        dy: gradient of ``y``, ``(T, out_features)``.
        cores: tensors of the shapes of the cores given to :func:`right_forward` (only their shapes are
            read).
        groups: as given to :func:`right_forward`.
        inputs, chains: what :func:`right_forward` returned.
        need_cores: whether to compute the cores' gradients (else they are None).

    Returns:
        ``(dz, [dH_m, .., dH_{d-1}], db)``: ``db`` only when the bias was folded in, else None (the caller
        sums ``dy``).
    """
    grads = [None] * len(cores)
    dbias = None
    spans = bounds(groups)
    for g in range(len(spans) - 1, -1, -1):
        a, b = spans[g]
        block, yin = chains[g][0], inputs[g]
        dy = _rows(dy, yin.shape[0])
        folded = yin.shape[1] > block.shape[0]  # folded bias: the last row of [dB ; db] is db
        if need_cores:
            dblock = torch.mm(yin.t(), dy)
            if folded:
                dblock, dbias = dblock[:-1], dblock[-1]
            grads[a:b] = _merge_right_backward(dblock, cores[a:b], chains[g])
        elif folded:
            dbias = dy.sum(0)
        dy = _narrow_mm_t(dy, block) if g == 0 else _mm_t(dy, block)  # dz is read as a matrix
    return _rows(dy, inputs[0].shape[0]), grads, dbias


def dense_forward(x: torch.Tensor, left_cores, right_cores, bias):
    """The dense strategy ``y = x W + b`` with ``W = A B`` formed.

    Returns:
        ``(y, weight, left chain, right chain)``; the last three feed :func:`dense_backward`.
    """
    left, right = _merge_left(left_cores), _merge_right(right_cores)
    weight = torch.mm(_left_block(left), right[0])
    y = torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)
    return y, weight, left, right


def dense_backward(dy, x, weight, left_cores, right_cores, left, right, need_dx: bool,
                   need_cores: bool = True):
    """Backward of :func:`dense_forward`: ``(dx or None, [dH_k] of both sides, or Nones without
    ``need_cores``)``; of the cores only the shapes are read."""
    dx = torch.mm(dy, weight.t()) if need_dx else None
    if not need_cores:
        return dx, [None] * (len(left_cores) + len(right_cores))
    dweight = torch.mm(x.t(), dy)
    da, db = torch.mm(dweight, right[0].t()), torch.mm(_left_block(left).t(), dweight)
    return dx, _merge_left_backward(da, left_cores, left) + _merge_right_backward(db, right_cores, right)
