"""One throwaway training step before a memory baseline: :func:`warm_up`.

One eager step of the method on the workload's "tiny" instance, then everything dropped and the random
states restored, so the run's numbers do not change. Why: docs/design-notes.md.
"""
from __future__ import annotations

import gc
import random
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from harness.spec import MATCH_PARAM

#: Per workload: the params that give it data for one training batch of the given size (and one eval
#: sample), over the "tiny" preset.
ONE_BATCH: dict[str, Callable[[int], dict[str, Any]]] = {
    "transformer": lambda b: {"train_samples": b, "eval_samples": 1},
    "dlrm": lambda b: {"synthetic_rows": 2 * b},  # 10% are split off for evaluation
    "mlm": lambda b: {"max_train_blocks": b, "max_eval_blocks": 1},
}
#: The cell's params the tiny instance keeps when the cell has them.
CARRIED = ("cache_dir", "dropout", "tensorize_embedding")
_LONG = 10 ** 6
"""total_steps given to the method: no schedule reaches a later stage in the one step."""


def _tiny_params(workload: str, cell_params: Mapping[str, Any], batch_size: int) -> dict[str, Any]:
    """The params of the tiny instance of ``workload`` for a cell with ``cell_params``."""
    one_batch = ONE_BATCH.get(workload, lambda b: {})(batch_size)
    carried = {k: cell_params[k] for k in CARRIED if k in cell_params}
    return {"size": "tiny", **one_batch, **carried}


def warm_up(workload: str, method: str, *, batch_size: int, device: torch.device,
            workload_params: Mapping[str, Any] | None = None, method_params: Mapping[str, Any] | None = None,
            target_ratio: float | None = None, seed: int = 0,
            build_workload: Callable[..., Any] | None = None,
            get_method: Callable[[str], Any] | None = None) -> str:
    """One training step of ``method`` (with its checked ``method_params``, less the cell a size-matched
    cell matches: it trains the method's own model) on the tiny ``workload``
    (see :func:`_tiny_params`; ``workload_params`` are the cell's), everything dropped afterwards and
    the random states untouched. ``build_workload``/``get_method`` default to the real registries.

    Returns "ok", or "method skipped: <reason>" when the method cannot run here (nothing ran). A failing
    step raises (its frames cleared, so the tiny model does not outlive it). Nothing it built is referenced
    afterwards; reference cycles among it wait for the caller's ``gc.collect()`` before the baseline (a full
    collection, which a process full of imports makes slow), except on CUDA, where they are collected here to
    empty the cache."""
    if build_workload is None or get_method is None:
        import baselines
        import harness.workloads as workloads

        build_workload = build_workload or workloads.build_workload
        get_method = get_method or baselines.get_method
    device = torch.device(device)
    try:
        with _random_states_kept(device):
            return _one_step(build_workload, get_method, workload, method, batch_size=batch_size,
                             device=device, workload_params=_tiny_params(workload, workload_params or {},
                                                                        batch_size),
                             method_params=_warm_up_params(method_params), target_ratio=target_ratio,
                             seed=seed)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)  # the failed step's locals hold the tiny model
        raise
    finally:
        if device.type == "cuda":  # its cached blocks would count as reserved in the measured region
            gc.collect()
            torch.cuda.empty_cache()


def _warm_up_params(method_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The cell's method params without the cell it matches (``harness.spec.MATCH_PARAM``): the tiny
    instance has no such cell, and a size-matched method would choose its model first."""
    return {k: v for k, v in (method_params or {}).items() if k != MATCH_PARAM}


def _one_step(build_workload: Callable[..., Any], get_method: Callable[[str], Any], workload: str,
              method: str, *, batch_size: int, device: torch.device, workload_params: dict[str, Any],
              method_params: dict[str, Any], target_ratio: float | None, seed: int) -> str:
    built = build_workload(workload, workload_params, batch_size=batch_size, seed=seed, device=device)
    prepared = get_method(method).prepare(built.model, built, method_params, target_ratio=target_ratio,
                                          total_steps=_LONG)
    if prepared.skipped:
        return f"method skipped: {prepared.skipped}"
    batch = next(iter(built.train_batches(0)), None)
    if batch is None:
        raise RuntimeError(f"the tiny {workload!r} (params {workload_params}) yields no training batch "
                           f"of size {batch_size}")
    prepared.model.train()
    float(prepared.train_step(built, batch, 0).loss)
    return "ok"


@contextmanager
def _random_states_kept(device: torch.device) -> Iterator[None]:
    """Restores python's, numpy's and torch's (CPU and ``device``'s) global random states on exit."""
    py_state, np_state = random.getstate(), np.random.get_state()
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
