"""Uncompressed training with AdamW, or (``match_run``) the size-matched dense model (docs/workloads.md).

Also what the other methods share: the workload's rate, an uncompressed model's size record,
:func:`adamw`, the size a matched cell matches (:func:`matched_source`).
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .base import Prepared, trainable_parameters
from .params import Field, Params, defaults, parse

CELLS_DIR_ENV = "COMERA_BENCH_CELLS_DIR"
"""The folder of the cells' runs files (``<results>/runs/<device>``), where a matched cell finds the row of
the cell it matches; the runner sets it to the folder of the cell's own ``--runs-out``."""
LR_FACTORS = (1 / 3, 1.0, 3.0)
"""The size-matched dense model tries each shape at the workload's dense rate (or ``lr``) times these."""
HIGHER_IS_BETTER = ("accuracy",)
"""Held-out metrics where more is better; any other (a loss, NCE) is better lower."""


class DenseParams(Params):
    """Parameters of the dense method (checked by :func:`baselines.params.parse`). ``match_run``: train
    the size-matched model instead (:func:`select_matched`), matched to that cell's reached size; None: the
    workload's model."""

    lr: float | None = Field(None, gt=0)  # None: the workload's lr["dense"]
    weight_decay: float = Field(0.0, ge=0)
    match_run: str | None = None      # the run_id of the cell whose reached params_total is matched
    select_fraction: float = Field(0.25, gt=0, le=1)  # of the steps, per candidate
    holdout_fraction: float = Field(0.1, gt=0, lt=1)  # of the training samples


PARAMS_DEFAULTS: dict[str, Any] = defaults(DenseParams)


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """Dense params with defaults filled; ValueError naming an unknown key or a bad value."""
    return parse("dense", DenseParams, params).as_dict()


def workload_needs(params: dict[str, Any]) -> dict[str, str]:
    """``sized_models`` (smaller dense models of the workload's kind) when ``match_run`` is set (a
    configuration with ``match``), with why; else nothing."""
    if params.get("match_run") is None:
        return {}
    return {"sized_models": "its size-matched dense model (match) is chosen among smaller models of the "
                            "workload's kind"}


def workload_lr(method: str, workload: Any, lr: float | None) -> float:
    """``lr`` when given, else the workload's ``lr["dense"]`` (ValueError naming both when neither)."""
    if lr is not None:
        return float(lr)
    if "dense" not in workload.lr:
        raise ValueError(f"method {method!r}: parameter 'lr' is null and workload {workload.name!r} "
                         f"gives no lr['dense'] (it has {sorted(workload.lr)})")
    return float(workload.lr["dense"])


def adamw(params: Iterable[Any], *, lr: float, weight_decay: float) -> tuple[torch.optim.AdamW, str]:
    """torch's AdamW with the fastest implementation torch offers for these parameters, and its name:
    "fused" (one kernel over all tensors: CUDA, and CPU since torch 2.4) where every parameter is a
    floating-point tensor on a device torch has fused kernels for, else "foreach" (multi-tensor), else
    "for-loop". ``params`` are tensors or param-group dicts, as for torch.optim.AdamW."""
    params = list(params)
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    try:  # torch's own rule for choosing fused / foreach (private; absent in old versions)
        from torch.optim.optimizer import _default_to_fused_or_foreach
        fused, foreach = _default_to_fused_or_foreach(tensors, differentiable=False, use_fused=True)
    except (ImportError, TypeError):
        fused, foreach = False, False
    impl = "fused" if fused else "foreach" if foreach else "for-loop"
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None,
                                  foreach=foreach if not fused else None)
    return optimizer, impl


def matched_source(method: str, match_run: str) -> dict[str, Any]:
    """The cell a matched cell matches: its row in ``<CELLS_DIR_ENV>/<match_run>.runs.parquet`` as
    ``{"run": match_run, "variant": its variant, "params": its params_total, "target": its target_ratio,
    "target_reached": bool (None without a target), "compression_total": ...}``. ``target_reached``:
    the row's column where it has one, else whether its rank adaptation reported no shortfall.

    Raises:
        ValueError: the folder is not set, the file is missing or unreadable, or its row is not ok or has
            no params_total (each naming the file)."""
    import pandas as pd

    folder = os.environ.get(CELLS_DIR_ENV)
    if not folder:
        raise ValueError(f"method {method!r}: parameter 'match_run' needs the folder of the cells' runs "
                         f"files (environment variable {CELLS_DIR_ENV}, set by the runner from --runs-out)")
    path = Path(folder) / f"{match_run}.runs.parquet"
    if not path.is_file():
        raise ValueError(f"method {method!r}: match_run {match_run!r}: {path} does not exist (that cell has "
                         "not run)")
    try:
        row = pd.read_parquet(path).iloc[0]
    except (OSError, ValueError, IndexError) as err:
        raise ValueError(f"method {method!r}: match_run {match_run!r}: cannot read {path}: {err}") from err
    if row.get("status") != "ok" or not pd.notna(row.get("params_total")):
        raise ValueError(f"method {method!r}: match_run {match_run!r}: {path} has status "
                         f"{row.get('status')!r} (params_total {row.get('params_total')}); only an ok row "
                         "gives a size to match")
    target = None if pd.isna(row.get("target_ratio")) else float(row["target_ratio"])
    reached = row.get("target_reached")
    if reached is None or (not isinstance(reached, (bool, str)) and pd.isna(reached)):
        settings = json.loads(row.get("settings") or "{}").get("method", {})
        reached = None if target is None else not (settings.get("outcome") or {}).get("shortfall")
    compression = row.get("compression_total")
    variant = row.get("variant")
    return {"run": match_run, "variant": variant if isinstance(variant, str) else None,
            "params": int(row["params_total"]), "target": target,
            "target_reached": None if reached is None else bool(reached),
            "compression_total": float(compression) if pd.notna(compression) else None}


def _train_for(model: nn.Module, workload: Any, batches: Any, steps: int, lr: float,
               weight_decay: float) -> None:
    optimizer, _ = adamw([p for p in model.parameters() if p.requires_grad], lr=lr,
                         weight_decay=weight_decay)
    model.train()
    done, epoch = 0, 0
    while done < steps:
        for batch in batches(epoch):
            workload.loss(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
        epoch += 1


def select_matched(workload: Any, count: int, lr: float, weight_decay: float, total_steps: int,
                   select_fraction: float, holdout_fraction: float) -> tuple[Any, float, dict[str, Any]]:
    """The size-matched dense model a user would train: each of ``workload.sized_models(count)``'s shapes
    at ``lr`` x :data:`LR_FACTORS`, trained for ``select_fraction`` x ``total_steps`` steps on the training
    data without its last ``holdout_fraction`` (``workload.holdout``) and scored there; the eval split is
    never read. The random streams are left as they were (the winner then trains as any cell).

    Returns:
        (the winning :class:`harness.workloads.base.SizedModel`, its rate, the record: ``shape``,
        ``dims``, ``lr``, ``params``, ``metric``, ``tied`` (how many candidates had the best score: more
        than 1, the held-out loss chose among them), ``steps``, ``holdout_fraction``, ``seconds`` and
        ``candidates``: each shape and rate with its held-out ``score`` and ``loss``).

    Raises:
        ValueError: the workload cannot build smaller models or has no held-out split."""
    missing = [key for key in ("sized_models", "holdout") if getattr(workload, key, None) is None]
    if missing:
        raise ValueError(f"method 'dense': parameter 'match_run' needs a workload that builds smaller models "
                         f"and holds training data out (Workload.{' and Workload.'.join(missing)}); workload "
                         f"{workload.name!r} has none")
    started = time.perf_counter()
    held = workload.holdout(holdout_fraction)
    steps = max(1, round(select_fraction * total_steps))
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    candidates, tried = workload.sized_models(count), []
    with torch.random.fork_rng(devices=devices):
        for i, candidate in enumerate(candidates):
            for factor in LR_FACTORS:
                model = candidate.build()
                _train_for(model, workload, held.train_batches, steps, lr * factor, weight_decay)
                result = held.evaluate(model)
                tried.append({"shape": candidate.shape, "dims": dict(candidate.dims), "lr": lr * factor,
                              "params": candidate.params, "score": float(result["metric_value"]),
                              "loss": result.get("loss"), "metric": result["metric_name"], "index": i})
    sign = 1.0 if tried[0]["metric"] in HIGHER_IS_BETTER else -1.0
    best = max(tried, key=lambda t: (sign * t["score"] if math.isfinite(t["score"]) else -math.inf,
                                     -(t["loss"] if t["loss"] is not None and math.isfinite(t["loss"])
                                       else math.inf)))
    record = {key: best[key] for key in ("shape", "dims", "lr", "params", "metric")}
    record.update(tied=sum(t["score"] == best["score"] for t in tried), steps=steps,
                  holdout_fraction=holdout_fraction, seconds=time.perf_counter() - started,
                  candidates=[{k: v for k, v in t.items() if k not in ("index", "metric")} for t in tried])
    return candidates[best["index"]], best["lr"], record


def uncompressed_size(model: nn.Module, workload: Any, deployed: list[nn.Parameter] | None = None
                      ) -> dict[str, float]:
    """Size record (docs/schema.md) of an uncompressed model: ``params_total`` counts ``deployed`` (default:
    every parameter), ``params_factorized_layers`` the dense size of the modules CoMERA would tensorize
    (``workload.tt_spec``), so the appendix table can put both methods' layer sizes side by side."""
    deployed = list(model.parameters()) if deployed is None else deployed
    deployed_ids = {id(p) for p in deployed}
    modules = dict(model.named_modules())
    layer_params = {id(p): p for name in workload.tt_spec if name in modules
                    for p in modules[name].parameters() if id(p) in deployed_ids}
    return {"params_total": float(sum(p.numel() for p in deployed)),
            "params_factorized_layers": float(sum(p.numel() for p in layer_params.values())),
            "compression_total": 1.0, "compression_layers": 1.0}


class DenseMethod:
    """Plain AdamW on every trainable parameter of the dense model."""

    name = "dense"
    variant = "default"

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        params = check_params(params)
        lr = workload_lr(self.name, workload, params["lr"])
        full = uncompressed_size(model, workload)
        matched = selection = None
        if params["match_run"] is not None:
            matched = matched_source(self.name, params["match_run"])
            winner, lr, selection = select_matched(
                workload, matched["params"], lr, params["weight_decay"], total_steps,
                params["select_fraction"], params["holdout_fraction"])
            model = winner.build()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer, impl = adamw(trainable, lr=lr, weight_decay=params["weight_decay"])
        settings = {"optimizer": "torch.optim.AdamW", "optimizer_impl": impl, "lr": lr,
                    "weight_decay": params["weight_decay"], "match_run": params["match_run"],
                    "trainable_params": trainable_parameters(model), "matched": matched,
                    "selection": selection}
        size = uncompressed_size(model, workload)
        if matched:  # compression: the full model's parameters over this one's, as for CoMERA
            layers = size["params_factorized_layers"]
            size.update(compression_total=full["params_total"] / size["params_total"], compression_layers=(
                full["params_factorized_layers"] / layers if layers else None))
        return Prepared(model=model, optimizers=[optimizer], settings=settings, size=lambda: dict(size))


METHOD = DenseMethod
