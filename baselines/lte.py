"""LTE, LoRA-the-Explorer (Huh et al., arXiv 2402.16828): parallel low-rank heads merged into a frozen weight.

Every nn.Linear not tied to an embedding becomes an :class:`LTELinear`; presets "default" (the package's)
and "tuned". The algorithm and the presets' runs: docs/design-notes.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .base import Periodic, Prepared, trainable_parameters
from .dense import adamw, uncompressed_size, workload_lr
from .params import Field, Params, defaults, model_validator, parse

PRESETS: dict[str, dict[str, Any]] = {
    "default": {"heads": 1, "rank": 8, "alpha": 16.0, "merge_every": 1, "lr": None},
    "tuned": {"heads": 4, "rank": 16, "alpha": 64.0, "merge_every": 10, "lr": None},
}


class LTEParams(Params):
    """Parameters of the LTE method (checked by :func:`baselines.params.parse`): ``preset`` fills every
    head setting not given (the defaults below are the "default" preset's)."""

    preset: Literal[tuple(PRESETS)] = "default"
    heads: int = Field(PRESETS["default"]["heads"], gt=0)
    rank: int = Field(PRESETS["default"]["rank"], gt=0)
    alpha: float = Field(PRESETS["default"]["alpha"], gt=0)
    merge_every: int = Field(PRESETS["default"]["merge_every"], gt=0)
    lr: float | None = Field(PRESETS["default"]["lr"], gt=0)  # None: lr["dense"]
    lr_other: float | None = Field(None, gt=0)  # None: the workload's lr["dense"]
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, given: Any) -> Any:
        """The preset's values under the keys given (an unknown preset: named by its field's check)."""
        if not isinstance(given, dict) or given.get("preset", "default") not in PRESETS:
            return given
        return {**PRESETS[given.get("preset", "default")], **given}


PARAMS_DEFAULTS: dict[str, Any] = defaults(LTEParams)


MERGE = "lte merge"
"""LTE's periodic work: merging the heads into the weights."""


def periodic(params: dict[str, Any]) -> dict[str, Periodic]:
    """LTE's periodic work (checked params): the merge after every ``merge_every``-th step, not
    forceable (an extra merge would change the run)."""
    every = params["merge_every"]
    return {MERGE: Periodic(every, every - 1)} if every > 1 else {}


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """LTE params: the preset's values, overridden by explicit keys; ValueError naming an unknown key
    or a bad value."""
    return parse("lte", LTEParams, params).as_dict()


class LTELinear(nn.Module):
    """A linear layer trained through H parallel low-rank heads merged into a frozen weight.

    ``weight`` (out, in) and ``bias`` follow nn.Linear's layout; ``lora_A`` (H, r, in), ``lora_B``
    (H, out, r) are the heads, ``snapshot_A``/``snapshot_B`` their values at the last merge (frozen
    parameters, so the generic state accounting counts their memory).
    """

    def __init__(self, linear: nn.Linear, *, heads: int, rank: int, alpha: float, name: str = ""):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.heads, self.rank, self.scaling, self.name = heads, rank, alpha / rank, name
        self.weight = nn.Parameter(linear.weight.detach().clone(), requires_grad=False)
        self.bias = linear.bias
        factory = {"device": linear.weight.device, "dtype": linear.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(heads, rank, self.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(heads, self.out_features, rank, **factory))
        with torch.no_grad():
            for head in self.lora_A:
                nn.init.orthogonal_(head)
                head.mul_(math.sqrt(self.in_features / rank))
        self.snapshot_A = nn.Parameter(self.lora_A.detach().clone(), requires_grad=False)
        self.snapshot_B = nn.Parameter(self.lora_B.detach().clone(), requires_grad=False)

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, 2r, in) and (H, out, 2r) whose product per head is B A - B' A' (the unmerged update)."""
        return (torch.cat([self.lora_A, self.snapshot_A], dim=1),
                torch.cat([self.lora_B, -self.snapshot_B], dim=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.training:
            return out
        batch = x.shape[0] if x.dim() > 1 else 1
        if batch % self.heads:
            raise ValueError(f"LTE layer {self.name or 'linear'!r}: batch size {batch} is not divisible by "
                             f"the number of heads {self.heads}")
        a, b = self._factors()
        chunks = x.reshape(self.heads, -1, self.in_features)
        update = torch.bmm(torch.bmm(chunks, a.transpose(1, 2)), b.transpose(1, 2))
        return out + self.scaling * update.reshape(out.shape)

    @torch.no_grad()
    def merge(self) -> None:
        """W += mean over heads of s (B_h A_h - B'_h A'_h); snapshots := current heads."""
        a, b = self._factors()
        stacked_b = b.permute(1, 0, 2).reshape(self.out_features, -1)  # (out, H*2r)
        stacked_a = a.reshape(-1, self.in_features)  # (H*2r, in)
        self.weight.addmm_(stacked_b, stacked_a, alpha=self.scaling / self.heads)
        self.snapshot_A.copy_(self.lora_A)
        self.snapshot_B.copy_(self.lora_B)

    def flops(self, tokens: int) -> int:
        """Matmul FLOPs of one training step (forward + backward) on ``tokens`` rows, as implemented:
        the frozen product (forward, input gradient) and the stacked current + snapshot factors (rank
        2r: forward, input gradient, factor gradients)."""
        frozen = 2 * tokens * self.in_features * self.out_features
        stacked = 2 * tokens * 2 * self.rank * (self.in_features + self.out_features)
        return 2 * frozen + 3 * stacked

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, heads={self.heads}, "
                f"rank={self.rank}, scaling={self.scaling:g}, bias={self.bias is not None}")


def convert_linears(model: nn.Module, *, heads: int, rank: int, alpha: float) -> list[str]:
    """Replace every nn.Linear of ``model`` in place by an LTELinear, except a Linear whose weight is
    shared with an nn.Embedding (tied output layer). Returns the converted module names."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and id(module.weight) not in embedding_ids]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LTELinear(module, heads=heads, rank=rank, alpha=alpha, name=name))
    return [name for name, _ in targets]


@dataclass
class MergeCount:
    """LTE's counters: training steps taken and merges done (a merge every ``merge_every`` steps, and one
    before every evaluation); a resumed run restores them."""

    steps: int = 0
    count: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps, self.count = int(state["steps"]), int(state["count"])


class LTEMethod:
    """LTE on the dense model (the algorithm: docs/design-notes.md)."""

    name = "lte"
    variant = "default"

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        params = check_params(params)
        self.variant = params["preset"]
        lr_heads = workload_lr(self.name, workload, params["lr"])
        lr_other = workload_lr(self.name, workload, params["lr_other"])
        converted = convert_linears(model, heads=params["heads"], rank=params["rank"], alpha=params["alpha"])
        if not converted:
            raise ValueError(f"method 'lte': model of workload {workload.name!r} has no nn.Linear to adapt")
        layers = [m for m in model.modules() if isinstance(m, LTELinear)]
        head_ids = {id(p) for m in layers for p in (m.lora_A, m.lora_B)}
        heads = [p for m in layers for p in (m.lora_A, m.lora_B)]
        other = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
        groups = [{"params": heads, "lr": lr_heads}] + ([{"params": other, "lr": lr_other}] if other else [])
        optimizer, impl = adamw(groups, lr=lr_heads, weight_decay=params["weight_decay"])
        snapshot_ids = {id(p) for m in layers for p in (m.snapshot_A, m.snapshot_B)}
        deployed = [p for p in model.parameters() if id(p) not in head_ids | snapshot_ids]
        size = uncompressed_size(model, workload, deployed)
        merges = MergeCount()

        def merge_all() -> None:
            for layer in layers:
                layer.merge()
            merges.count += 1

        def after_step(step: int) -> dict[str, float]:
            merges.steps += 1
            if merges.steps % params["merge_every"]:
                return {}
            merge_all()
            return {"lte_merges": float(merges.count)}

        settings = {
            "optimizer": "torch.optim.AdamW", "optimizer_impl": impl, "preset": params["preset"],
            "heads": params["heads"],
            "rank": params["rank"], "alpha": params["alpha"], "scaling": params["alpha"] / params["rank"],
            "merge_every": params["merge_every"], "restart": "resetless (snapshot subtracted)",
            # the merge is periodic work: timing rounds hold whole periods of it (harness.core.timing)
            "time_window_steps": params["merge_every"] if params["merge_every"] > 1 else None,
            "lr": lr_heads, "lr_other": lr_other, "weight_decay": params["weight_decay"],
            "lte_layers": converted, "head_params": sum(p.numel() for p in heads),
            "other_trainable_params": sum(p.numel() for p in other),
            "trainable_params": trainable_parameters(model),
        }
        return Prepared(model=model, optimizers=[optimizer], after_step=after_step, before_eval=merge_all,
                        settings=settings, size=lambda: dict(size), stateful={"merges": merges},
                        periodic=periodic(params))


METHOD = LTEMethod
