"""CoMERA as a training method: tensorize the workload's model, AdamW on cores / gates / the rest, and
the two-stage rank adaptation of ``comera.rank`` as loss and per-step hook.

Params (``PARAMS_DEFAULTS``): ``rank`` (int) overrides the rank of every TT linear layer and
``embedding_rank`` that of every TTM embedding (a rank sweep of the linear layers keeps the embedding);
``lookup`` picks the TTM lookup ("optimized" -> variant "default", "naive" -> variant "naive-lookup");
``lr_cores`` / ``lr_gates`` / ``lr_other`` default to the workload's ``lr`` entries, else 1e-4 / 1e-3 /
5e-5 (docs/workloads.md); ``lr_embedding_cores`` (TTM cores) to the workload's ``embedding_cores`` entry,
else the cores' rate; ``l1_weight`` (gamma), ``l2_weight`` (beta), ``threshold``, ``prune_every``;
``early_fraction`` of ``total_steps`` runs the early stage, then -- only when a ``target_ratio`` is
given -- the late stage drives the TT size toward ``target_ratio`` times its size at the switch
(``loss_target`` L0 fixed, else ``loss_reference``: "best", the lowest running task loss so far, updated
every step and compared with the running loss, or "switch", the running loss at the switch, fixed;
``loss_weight``, ``size_weight``, ``rho`` (1: the task loss keeps half its weight in the size branch) of
the achievement scalarization; ``stop_at_target``: pruning never goes below S0;
``target_ramp``: the fraction of the late stage over which S0 falls from the size at the switch to its
value, 0 = fixed as in the paper). ``late_formulation`` "project" (default: the scalarization above) or
"official" (the official code's late stage: relative-gap branch test, gate-penalty size term, fixed
weights 0.1 / 0.01, ``loss_target`` 0.8 unless given; ``loss_weight`` / ``size_weight`` / ``rho`` must
keep their defaults); ``mask_gates`` "at_prune" (default: raw gates between prunings) or "every_step"
(gates <= threshold zeroed in every forward, as the official code); see comera.rank.
``l1_reduction`` "mean" (the official code's normalisation, default) or "sum" (the literal formula);
``l2_weight`` 0 by default (the paper's core penalty is an option; the official code has none, and 1e-4
cost accuracy on the small transformer: docs/recipe.md); ``embedding_init_std`` the TTM table's std (None:
the init scheme's); ``init``
"official" (default: the small CPU transformer learned its task in <= 1000 steps with it and not at all
with "default") or "default" (see comera.init); it sets the TT layers (cores, and a TT layer's bias:
"official" draws it in +-1/sqrt(out) as the official code). ``dense_init`` "workload" (default: what
stays dense keeps the workload's init, BERT's for the transformer) or "official": the workload's
``official_init`` re-initializes it as the official code (transformer: position / segment embeddings
N(0, 1), classifier fc2 PyTorch's default). Not the default: on the small CPU transformer's quality
cell, topic task (target 0.5, 1000 steps, seed 0), CoMERA stayed at the 0.674 plateau with it and
reached accuracy 1 without it.
"""
from __future__ import annotations

import copy
from typing import Any

from torch import nn

from baselines.base import Prepared
from baselines.dense import adamw
from comera import rank as rank_lib
from comera.adapt import param_groups
from comera.convert import model_size, tensorize
from comera.init import INIT_SCHEMES
from comera.rank import L1_REDUCTIONS, LATE_FORMULATIONS, LOSS_REFERENCES, MASK_GATES
from comera.ttm import LOOKUP_MODES

DENSE_INITS = ("workload", "official")
DEFAULT_LR = {"cores": 1e-4, "gates": 1e-3, "other": 5e-5}
PARAMS_DEFAULTS: dict[str, Any] = {
    "rank": None,
    "embedding_rank": None,
    "lookup": "optimized",
    "lr_cores": None,
    "lr_gates": None,
    "lr_other": None,
    "lr_embedding_cores": None,
    "weight_decay": 0.0,
    "l1_weight": 0.01,
    "l1_reduction": "mean",
    "l2_weight": 0.0,
    "threshold": 1e-2,
    "prune_every": 100,
    "early_fraction": 2 / 3,   # docs/workloads.md: 20 early + 10 late epochs
    "loss_target": None,
    "loss_reference": "best",
    "loss_weight": 1.0,
    "size_weight": 1.0,
    "rho": 1.0,
    "stop_at_target": True,
    "target_ramp": 0.0,        # fraction of the late stage over which S0 falls to its value (0: fixed)
    "late_formulation": "project",
    "mask_gates": "at_prune",
    "init": "official",
    "embedding_init_std": None,
    "dense_init": "workload",
}
VARIANTS = {"optimized": "default", "naive": "naive-lookup"}


def check_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate CoMERA params and fill defaults; an unknown key or a bad value raises ValueError."""
    from baselines import positive, validate_params  # the registry's shared checks

    merged = validate_params("comera", dict(params or {}), PARAMS_DEFAULTS)
    for key in ("rank", "embedding_rank"):
        if merged[key] is not None and (not isinstance(merged[key], int) or merged[key] < 1):
            raise ValueError(f"method 'comera': parameter {key!r} must be a positive integer or null, "
                             f"got {merged[key]!r}")
    for key, choices in (("l1_reduction", L1_REDUCTIONS), ("init", INIT_SCHEMES),
                         ("late_formulation", LATE_FORMULATIONS), ("mask_gates", MASK_GATES),
                         ("loss_reference", LOSS_REFERENCES),
                         ("dense_init", DENSE_INITS)):
        if merged[key] not in choices:
            raise ValueError(f"method 'comera': parameter {key!r} must be one of {list(choices)}, "
                             f"got {merged[key]!r}")
    if not isinstance(merged["stop_at_target"], bool):
        raise ValueError(f"method 'comera': parameter 'stop_at_target' must be true or false, "
                         f"got {merged['stop_at_target']!r}")
    if merged["lookup"] not in LOOKUP_MODES:
        raise ValueError(f"method 'comera': parameter 'lookup' must be one of {list(LOOKUP_MODES)}, "
                         f"got {merged['lookup']!r}")
    positive("comera", merged, "lr_cores", "lr_gates", "lr_other", "lr_embedding_cores")
    for key in ("weight_decay", "l1_weight", "l2_weight", "threshold", "loss_weight", "size_weight", "rho",
                "prune_every"):
        if merged[key] < 0:
            raise ValueError(f"method 'comera': parameter {key!r} must be >= 0, got {merged[key]!r}")
    if merged["late_formulation"] == "official":
        changed = [key for key in ("loss_weight", "size_weight", "rho") if merged[key] != PARAMS_DEFAULTS[key]]
        if changed:
            raise ValueError(f"method 'comera': late_formulation 'official' has fixed weights; drop {changed}")
    if not 0 <= merged["target_ramp"] <= 1:
        raise ValueError(f"method 'comera': parameter 'target_ramp' must be in [0, 1], "
                         f"got {merged['target_ramp']!r}")
    if not 0 <= merged["early_fraction"] <= 1:
        raise ValueError(f"method 'comera': parameter 'early_fraction' must be in [0, 1], "
                         f"got {merged['early_fraction']!r}")
    return merged


class CoMERAMethod:
    """Rank-adaptive tensor-compressed training (arXiv 2405.14377)."""

    name = "comera"

    def __init__(self, variant: str = "default"):
        self.variant = variant

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        params = check_params(params)
        if target_ratio is not None and not 0 < target_ratio <= 1:
            raise ValueError(f"comera: target_ratio={target_ratio!r} must be in (0, 1]")
        self.variant = VARIANTS[params["lookup"]]
        report = tensorize(model, _spec(workload.tt_spec, params))
        if params["dense_init"] == "official" and getattr(workload, "official_init", None) is not None:
            workload.official_init(model)
        lrs = {group: params[f"lr_{group}"] or workload.lr.get(group) or DEFAULT_LR[group]
               for group in DEFAULT_LR}
        lrs["embedding_cores"] = params["lr_embedding_cores"] or workload.lr.get("embedding_cores") or lrs["cores"]
        groups = _param_groups(model, lrs)
        optimizer, impl = adamw(groups, lr=lrs["other"], weight_decay=params["weight_decay"])
        late_start = None
        if target_ratio is not None:
            late_start = max(1, round(params["early_fraction"] * total_steps))
        settings = rank_lib.RankSettings(
            l1_weight=params["l1_weight"], l2_weight=params["l2_weight"], l1_reduction=params["l1_reduction"],
            threshold=params["threshold"], stop_at_target=params["stop_at_target"],
            target_ramp_steps=round(params["target_ramp"] * (total_steps - late_start)) if late_start else 0,
            prune_every=params["prune_every"], late_start_step=late_start, target_ratio=target_ratio,
            loss_target=params["loss_target"], loss_reference=params["loss_reference"],
            loss_weight=params["loss_weight"],
            size_weight=params["size_weight"], rho=params["rho"],
            late_formulation=params["late_formulation"], mask_gates=params["mask_gates"])
        adaptation = rank_lib.TwoStageRankAdaptation(model, settings, [optimizer])
        return Prepared(
            model=model,
            optimizers=[optimizer],
            total_loss=adaptation.objective,
            after_step=adaptation.after_step,
            settings={**params, "lr": lrs, "late_start_step": late_start, "target_ratio": target_ratio,
                      # pruning every prune_every steps (both stages) is periodic work: timing rounds hold
                      # whole periods of it (harness.core.timing.round_bounds)
                      "time_window_steps": params["prune_every"] if params["prune_every"] > 1 else None,
                      "switch": adaptation.switch,
                      "conversion": report.as_dict(), "optimizer": "torch.optim.AdamW", "optimizer_impl": impl},
            ranks=lambda: rank_lib.ranks(model),
            size=lambda: model_size(model),
        )


def _spec(tt_spec: dict[str, dict[str, Any]], params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = copy.deepcopy(tt_spec)
    for entry in spec.values():
        rank = params["embedding_rank" if entry.get("kind") == "embedding" else "rank"]
        if rank is not None:
            entry["rank"] = rank
        entry["init"] = params["init"]
        if entry.get("kind") == "embedding":
            entry["lookup"] = params["lookup"]
            entry["init_std"] = params["embedding_init_std"]
    return spec


def _param_groups(model: nn.Module, lrs: dict[str, float]) -> list[dict[str, Any]]:
    return param_groups(model, cores=lrs["cores"], gates=lrs["gates"], other=lrs["other"],
                        embedding_cores=lrs["embedding_cores"])


METHOD = CoMERAMethod
