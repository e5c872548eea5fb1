"""Uncompressed training with AdamW, or (``match_target``) the size-matched dense model (docs/workloads.md).

Also what the other methods share: the workload's rate, an uncompressed model's size record,
:func:`adamw`.
"""
from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .base import Prepared, trainable_parameters
from .params import check, defaults, parse


@dataclass(frozen=True)
class DenseParams:
    """Parameters of the dense method (validated by :func:`baselines.params.parse`). ``match_target``: train
    the size-matched model instead (:func:`size_matched`); None: the workload's model."""

    lr: float | None = field(default=None, metadata=check(">0"))  # None: the workload's lr["dense"]
    weight_decay: float = field(default=0.0, metadata=check(">=0"))
    match_target: float | None = field(default=None, metadata=check(">0"))

    @staticmethod
    def resolve(given: dict[str, Any]) -> dict[str, Any]:
        """``match_target`` is a CoMERA target ratio: at most 1."""
        if (given.get("match_target") or 0) > 1:
            raise ValueError(f"method 'dense': parameter 'match_target' must be in (0, 1], got "
                             f"{given['match_target']!r}")
        return given


PARAMS_DEFAULTS: dict[str, Any] = defaults(DenseParams)


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """Dense params with defaults filled; ValueError naming an unknown key or a bad value."""
    return asdict(parse("dense", DenseParams, params))


def workload_needs(params: dict[str, Any]) -> dict[str, str]:
    """``sized_model`` (a smaller dense model of the workload's kind, :func:`size_matched`) when
    ``match_target`` is set, with why; else nothing."""
    if params.get("match_target") is None:
        return {}
    return {"sized_model": "its parameter 'match_target' trains the size-matched dense model, a smaller "
                           "model of the workload's kind"}


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


def comera_size(model: nn.Module, tt_spec: dict[str, dict[str, Any]], target: float) -> int:
    """CoMERA's parameter count at ``target``, computed without training: the model tensorized by
    ``tt_spec`` (a copy; the global RNG is left as it was) with its TT cores and gates scaled by
    ``target``, i.e. every parameter that is not a core or a gate plus ``target`` x the cores and gates at
    initialization. That is the size a CoMERA run reaches when its early stage prunes nothing and its late
    stage meets the target (the target is a share of the TT size at the stage switch)."""
    from comera.convert import tensorize  # the library only where a size is matched (a slow import)
    from comera.rank import tt_parameter_count

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CoMERA's cells give the conversion's warnings
        tt = copy.deepcopy(model)
        tensorize(tt, copy.deepcopy(tt_spec))
    total = sum(p.numel() for p in tt.parameters())
    return round(total - (1 - target) * tt_parameter_count(tt))


def size_matched(model: nn.Module, workload: Any, target: float) -> tuple[nn.Module, dict[str, Any]]:
    """The size-matched dense baseline: the workload's dense model of the width whose parameter count is
    nearest CoMERA's at ``target`` (:func:`comera_size` of ``model`` and ``workload.tt_spec``), and a record
    of it: ``target``, ``comera_params`` (the count matched), ``params``, ``full_params`` (``model``'s) and
    the workload params that set the width.

    Raises:
        ValueError: the workload cannot build a smaller model (its ``sized_model`` is None)."""
    if getattr(workload, "sized_model", None) is None:
        raise ValueError(f"method 'dense': parameter 'match_target' needs a workload that builds smaller "
                         f"models (Workload.sized_model); workload {workload.name!r} has none")
    wanted = comera_size(model, workload.tt_spec, target)
    small, dims = workload.sized_model(wanted)
    count = sum(p.numel() for p in small.parameters())
    return small, {"target": target, "comera_params": wanted, "params": count,
                   "full_params": sum(p.numel() for p in model.parameters()), **dims}


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
        matched = None
        if params["match_target"] is not None:
            model, matched = size_matched(model, workload, params["match_target"])
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer, impl = adamw(trainable, lr=lr, weight_decay=params["weight_decay"])
        settings = {"optimizer": "torch.optim.AdamW", "optimizer_impl": impl, "lr": lr,
                    "weight_decay": params["weight_decay"], "match_target": params["match_target"],
                    "trainable_params": trainable_parameters(model), "size_matched": matched}
        size = uncompressed_size(model, workload)
        if matched:  # compression: the full model's parameters over this one's, as for CoMERA
            size.update(compression_total=full["params_total"] / size["params_total"], compression_layers=(
                full["params_factorized_layers"] / size["params_factorized_layers"]))
        return Prepared(model=model, optimizers=[optimizer], settings=settings, size=lambda: dict(size))


METHOD = DenseMethod
