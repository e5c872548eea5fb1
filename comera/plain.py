""":func:`plain_autograd`: the library's layers as ordinary autograd ops, for ``torch.func`` transforms.

Results are equal; autograd keeps more memory (docs/library.md, "Second derivatives
and torch.func").
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

_state = threading.local()

HINT = ("torch.func transforms (grad, vmap, jacrev, jvp, ...) need the comera layers as plain autograd "
        "ops: run them inside `with comera.plain_autograd():`")


@contextlib.contextmanager
def plain_autograd():
    """Within the block (this thread), TT and TTM layers, :func:`~comera.feed_forward` and rank
    adaptation's penalty run as ordinary autograd ops (no custom autograd Function), so ``torch.func``
    transforms apply to them.

    Example::

        >>> with comera.plain_autograd():
        ...     per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    """
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def active() -> bool:
    """Whether this thread is inside :func:`plain_autograd`."""
    return getattr(_state, "depth", 0) > 0


def apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """``function.apply(*args)``; under a ``torch.func`` transform (which refuses the Function) the error
    says to use :func:`plain_autograd`."""
    try:
        return function.apply(*args)
    except RuntimeError as error:
        if "setup_context" in str(error):
            raise RuntimeError(f"{function.__name__}: {HINT}") from error
        raise
