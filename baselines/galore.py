"""GaLore (arXiv 2403.03507) through the galore-torch package.

nn.Linear weights get GaLore's projection, the rest a plain AdamW group; variants ``layerwise`` and
``eight_bit`` (CUDA only, else ``Prepared.skipped``). Defaults and timing windows: docs/design-notes.md.
"""
from __future__ import annotations

import logging
import warnings
from functools import partial
from typing import Any, Literal

import torch
from torch import nn

from .base import Periodic, Prepared, trainable_parameters
from .dense import uncompressed_size, workload_lr
from .params import Field, Params, defaults, parse

PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")

class GaLoreParams(Params):
    """Parameters of the GaLore method (checked by :func:`baselines.params.parse`)."""

    lr: float | None = Field(None, gt=0)  # None: the workload's lr["dense"]
    weight_decay: float = Field(0.0, ge=0)
    rank: int = Field(128, gt=0)
    update_proj_gap: int = Field(200, gt=0)
    scale: float = Field(0.25, gt=0)
    proj_type: Literal[PROJ_TYPES] = "std"
    layerwise: bool = False
    eight_bit: bool = False


PARAMS_DEFAULTS: dict[str, Any] = defaults(GaLoreParams)


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """GaLore params with defaults filled; ValueError naming an unknown key or a bad value."""
    return parse("galore", GaLoreParams, params).as_dict()


PROJECTION = "galore projection"
"""GaLore's periodic work: the SVD of each projected gradient that gives its projection."""


def periodic(params: dict[str, Any]) -> dict[str, Periodic]:
    """GaLore's periodic work (checked params): the projection's SVD at the optimizer's first step and
    every ``update_proj_gap`` steps after it (galore_torch's ``GaLoreProjector.project``), forceable
    (:func:`force_projection`)."""
    gap = params["update_proj_gap"]
    return {PROJECTION: Periodic(gap, 0, forceable=True)} if gap > 1 else {}


def force_projection(optimizers: list[torch.optim.Optimizer], name: str = PROJECTION) -> None:
    """Make every GaLore projector of ``optimizers`` recompute its projection (its SVD) at its next
    step: galore_torch's projector recomputes it when it has none (``ortho_matrix`` None) as on its
    schedule; the optimizer's step count, and so the schedule after it, stay as they were."""
    if name != PROJECTION:
        raise ValueError(f"method 'galore': no periodic work {name!r}; it has {PROJECTION!r}")
    for optimizer in optimizers:
        for state in optimizer.state.values():
            projector = state.get("projector")
            if projector is not None:
                projector.ortho_matrix = None


def galore_weights(model: nn.Module) -> list[nn.Parameter]:
    """The trainable 2-D weights of the model's nn.Linear modules, excluding weights shared with an
    nn.Embedding (tied output layers), each once."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if (isinstance(module, nn.Linear) and module.weight.requires_grad
                and id(module.weight) not in embedding_ids):
            found.setdefault(id(module.weight), module.weight)
    return list(found.values())


BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
PROJECTOR = "galore_projector"
"""The key under which an optimizer's state dict holds a GaLore projector's attributes."""
"""bitsandbytes (imported by galore_torch) logs from here, on CPUs with AVX512-BF16, that it could not
fetch an optional 4-bit CPU kernel from the Hugging Face hub; GaLore never uses 4-bit kernels, so only
its errors are shown."""


def import_galore_torch():
    """galore_torch, imported without bitsandbytes' notices (BNB_CPU_LOGGER, its torch.jit warning)."""
    logging.getLogger(BNB_CPU_LOGGER).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import galore_torch
    return galore_torch


def _optimizer_class(eight_bit: bool):
    galore_torch = import_galore_torch()
    if eight_bit:
        return galore_torch.GaLoreAdamW8bit
    return partial(galore_torch.GaLoreAdamW, no_deprecation_warning=True)


def _projectors_as_data(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each parameter's GaLore projector (an object) as a dict of its attributes
    (tensors and plain values), so that a checkpoint is data (``torch.load(weights_only=True)``); the
    optimizer's own state is left as it is."""
    state = {key: {**value, "projector": {PROJECTOR: dict(vars(value["projector"]))}}
             if not isinstance(value.get("projector", {}), dict) else value
             for key, value in state_dict["state"].items()}
    return {**state_dict, "state": state}


def _projectors_from_data(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_projectors_as_data`, before the optimizer loads ``state_dict``."""
    GaLoreProjector = import_galore_torch().galore_projector.GaLoreProjector  # noqa: N806 -- the class

    def projector(saved: dict[str, Any]) -> Any:
        made = GaLoreProjector.__new__(GaLoreProjector)
        made.__dict__.update(saved[PROJECTOR])
        return made

    state = {key: {**value, "projector": projector(value["projector"])}
             if isinstance(value.get("projector"), dict) and PROJECTOR in value["projector"] else value
             for key, value in state_dict["state"].items()}
    return {**state_dict, "state": state}


def _data_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` whose state dict holds its projectors as data (:func:`_projectors_as_data`)."""
    optimizer.register_state_dict_post_hook(_projectors_as_data)
    optimizer.register_load_state_dict_pre_hook(_projectors_from_data)
    return optimizer


def _groups(plain: list[nn.Parameter], projected: list[nn.Parameter], params: dict[str, Any]) -> list[dict]:
    galore = {"rank": params["rank"], "update_proj_gap": params["update_proj_gap"],
              "scale": params["scale"], "proj_type": params["proj_type"]}
    groups = [{"params": plain}] if plain else []
    return groups + ([{"params": projected, **galore}] if projected else [])


def _step_and_free(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def layerwise_state_bytes(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> int:
    """Analytic training state of layer-wise GaLore: parameters, the optimizers' state, and the
    gradient of ONE parameter (the largest), since each gradient is freed right after its own step."""
    from .base import state_bytes

    all_grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    largest = max((p.numel() * p.element_size() for p in model.parameters() if p.requires_grad), default=0)
    return state_bytes(model, optimizers) - all_grads + largest


class GaLoreMethod:
    """GaLoreAdamW on the dense model (see the module docstring for the variants)."""

    name = "galore"
    variant = "default"

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        params = check_params(params)
        self.variant = "-".join(v for v, on in (("layerwise", params["layerwise"]),
                                                ("8bit", params["eight_bit"])) if on) or "default"
        lr = workload_lr(self.name, workload, params["lr"])
        projected = galore_weights(model)
        if not projected:
            raise ValueError(f"method 'galore': model of workload {workload.name!r} has no trainable "
                             "nn.Linear weight to project")
        projected_ids = {id(p) for p in projected}
        plain = [p for p in model.parameters() if p.requires_grad and id(p) not in projected_ids]
        settings = {
            "optimizer": ("galore_torch.GaLoreAdamW8bit" if params["eight_bit"]
                          else "galore_torch.GaLoreAdamW"),
            "lr": lr, "weight_decay": params["weight_decay"], "rank": params["rank"],
            "update_proj_gap": params["update_proj_gap"], "scale": params["scale"],
            "proj_type": params["proj_type"], "layerwise": params["layerwise"],
            "eight_bit": params["eight_bit"], "time_window_steps": params["update_proj_gap"],
            "galore_params": sum(p.numel() for p in projected), "galore_tensors": len(projected),
            "plain_params": sum(p.numel() for p in plain),
            "trainable_params": trainable_parameters(model),
        }
        size = uncompressed_size(model, workload)
        device = projected[0].device
        if params["eight_bit"] and device.type != "cuda":
            return Prepared(model=model, optimizers=[], settings=settings, size=lambda: dict(size),
                            skipped=f"8-bit GaLore needs CUDA (bitsandbytes); not run on {device.type}")
        make = partial(_optimizer_class(params["eight_bit"]), lr=lr, weight_decay=params["weight_decay"])
        if not params["layerwise"]:
            optimizer = _data_state(make(_groups(plain, projected, params)))
            return Prepared(model=model, optimizers=[optimizer], settings=settings, size=lambda: dict(size),
                            periodic=periodic(params), force=partial(force_projection, [optimizer]))
        per_param = [(p, make(_groups([p], [], params))) for p in plain]
        per_param += [(p, _data_state(make(_groups([], [p], params)))) for p in projected]
        for p, optimizer in per_param:
            p.register_post_accumulate_grad_hook(partial(_step_and_free, optimizer))
        prepared = Prepared(model=model, optimizers=[], settings=settings, size=lambda: dict(size),
                            stateful={f"layerwise_optimizer.{k}": opt
                                      for k, (_, opt) in enumerate(per_param)},
                            periodic=periodic(params),
                            force=partial(force_projection, [opt for _, opt in per_param]))
        # The optimizers live in the hooks, so the generic state_bytes(model, []) would miss their state
        # and count every gradient; harness/running/cell.py reads prepared.state_bytes() when it exists.
        prepared.state_bytes = partial(layerwise_state_bytes, model, [opt for _, opt in per_param])
        return prepared


METHOD = GaLoreMethod
