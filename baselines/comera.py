"""CoMERA as a training method: tensorize the workload's model, AdamW on cores / gates / the rest, and
the library's :class:`comera.RankAdaptation` (its driver's objective and per-step hook).

Params: one dataclass, :class:`CoMERAParams`. Every rank-adaptation parameter (``l1_weight`` ...
``target_ramp``, ``early_fraction``) defaults to the library's value (:func:`comera.adapt.defaults`, the
one set of CoMERA defaults; docs/recipe.md); a config overrides only what it states, with its reason.
``rank`` (int) overrides the rank of every TT linear layer and
``embedding_rank`` that of every TTM embedding (a rank sweep of the linear layers keeps the embedding);
``lookup`` picks the TTM lookup ("optimized" -> variant "default", "naive" -> variant "naive-lookup");
``lr_cores`` / ``lr_gates`` / ``lr_other`` / ``lr_embedding_cores`` (TTM cores) default to the workload's
``lr`` entries (docs/workloads.md), else the library's rule from the cores' rate (1e-4, the paper's, when
neither gives it): gates 5x, the rest and the TTM cores at the cores' rate
(:func:`comera.adapt.learning_rates`); ``l1_weight`` (gamma), ``l2_weight`` (beta), ``threshold``,
``prune_every``; ``early_fraction`` of ``total_steps`` (rounded, at least 1 step and at most
``total_steps - 1``: the library's rule) runs the early stage, then -- only when a ``target_ratio`` is
given -- the late stage drives the TT size toward ``target_ratio`` times its size at the switch
(``loss_target`` L0 fixed, else ``loss_reference``: "best", the lowest running task loss so far, updated
every step and compared with the running loss, or "switch", the running loss at the switch, fixed;
``loss_weight``, ``size_weight``, ``rho`` (1: the task loss keeps half its weight in the size branch) of
the achievement scalarization; ``loss_average`` the EMA factor of the running loss;
``stop_at_target``: pruning never goes below S0;
``target_ramp``: the fraction of the late stage over which S0 falls from the size at the switch to its
value, 0 = fixed as in the paper). ``late_formulation`` "project" (default: the scalarization above) or
"official" (the official code's late stage: relative-gap branch test, gate-penalty size term, fixed
weights 0.1 / 0.01, ``loss_target`` 0.8 unless given; ``loss_weight`` / ``size_weight`` / ``rho`` must
not be given); ``mask_gates`` "at_prune" (default: raw gates between prunings) or "every_step"
(gates <= threshold zeroed in every forward, as the official code); see comera.rank.
``l1_reduction`` "mean" (the official code's normalisation, default) or "sum" (the literal formula);
``l2_weight`` 0 by default (the paper's core penalty is an option; the official code has none, and 1e-4
cost accuracy on the small transformer: docs/recipe.md); ``embedding_init_std`` the TTM table's std (None:
the workload's ``init_std`` where its tt_spec gives one, else the init scheme's); ``init``
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
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torch import nn

from baselines.base import Prepared
from baselines.dense import adamw
from baselines.params import check, defaults, parse
from comera import rank as rank_lib
from comera.adapt import RankAdaptation, learning_rates, param_groups
from comera.adapt import defaults as library_defaults
from comera.convert import model_size, tensorize
from comera.init import INIT_SCHEMES
from comera.rank import L1_REDUCTIONS, LATE_FORMULATIONS, LOSS_REFERENCES, MASK_GATES
from comera.ttm import LOOKUP_MODES

DENSE_INITS = ("workload", "official")
PAPER_CORES_LR = 1e-4
"""The cores' rate when neither the params nor the workload give one (the paper's AdamW rate); the other
groups then follow :func:`comera.adapt.learning_rates` (gates 5x, the rest at the cores' rate)."""
LIBRARY = library_defaults()
"""The rank-adaptation defaults: the library's (:func:`comera.adapt.defaults`), the one set."""
RANK_SETTINGS = tuple(key for key in LIBRARY if key not in ("early_fraction", "target_ramp"))
"""The params passed on to :class:`comera.RankAdaptation` as settings (fields of RankSettings)."""


def _library(key: str, rule: str | None = None) -> Any:
    return field(default=LIBRARY[key], metadata=check(rule) if rule else {})


@dataclass(frozen=True)
class CoMERAParams:
    """Parameters of the CoMERA method (module docstring), validated by :func:`baselines.params.parse`.
    The rank-adaptation fields take the library's defaults (``LIBRARY``)."""

    rank: int | None = field(default=None, metadata=check(">=1"))
    embedding_rank: int | None = field(default=None, metadata=check(">=1"))
    lookup: Literal[LOOKUP_MODES] = "optimized"
    lr_cores: float | None = field(default=None, metadata=check(">0"))
    lr_gates: float | None = field(default=None, metadata=check(">0"))
    lr_other: float | None = field(default=None, metadata=check(">0"))
    lr_embedding_cores: float | None = field(default=None, metadata=check(">0"))
    weight_decay: float = field(default=0.0, metadata=check(">=0"))
    l1_weight: float = _library("l1_weight", ">=0")
    l1_reduction: Literal[L1_REDUCTIONS] = _library("l1_reduction")
    l2_weight: float = _library("l2_weight", ">=0")
    threshold: float = _library("threshold", ">=0")
    prune_every: int = _library("prune_every", ">=0")
    early_fraction: float = _library("early_fraction", "[0,1]")
    loss_target: float | None = _library("loss_target")
    loss_reference: Literal[LOSS_REFERENCES] = _library("loss_reference")
    loss_weight: float = _library("loss_weight", ">=0")
    size_weight: float = _library("size_weight", ">=0")
    rho: float = _library("rho", ">=0")
    loss_average: float = _library("loss_average", "[0,1]")
    stop_at_target: bool = _library("stop_at_target")
    target_ramp: float = _library("target_ramp", "[0,1]")
    late_formulation: Literal[LATE_FORMULATIONS] = _library("late_formulation")
    mask_gates: Literal[MASK_GATES] = _library("mask_gates")
    init: Literal[INIT_SCHEMES] = "official"
    embedding_init_std: float | None = None
    dense_init: Literal[DENSE_INITS] = "workload"

    @staticmethod
    def resolve(given: dict[str, Any]) -> dict[str, Any]:
        """``late_formulation: official`` has fixed weights: stating any of the project's is an error."""
        if given.get("late_formulation") == "official":
            stated = [key for key in ("loss_weight", "size_weight", "rho") if key in given]
            if stated:
                raise ValueError(f"method 'comera': late_formulation 'official' has fixed weights; drop {stated}")
        return given


PARAMS_DEFAULTS: dict[str, Any] = defaults(CoMERAParams)
VARIANTS = {"optimized": "default", "naive": "naive-lookup"}


def check_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate CoMERA params and fill defaults; an unknown key or a bad value raises ValueError."""
    return asdict(parse("comera", CoMERAParams, params))


class CoMERAMethod:
    """Rank-adaptive tensor-compressed training (arXiv 2405.14377): the library's
    :class:`comera.RankAdaptation` on a tensorized copy of the workload's model."""

    name = "comera"

    def __init__(self, variant: str = "default"):
        self.variant = variant

    def prepare(self, model: nn.Module, workload: Any, params: dict[str, Any], *,
                target_ratio: float | None, total_steps: int) -> Prepared:
        p = parse("comera", CoMERAParams, params)
        if target_ratio is not None and not 0 < target_ratio <= 1:
            raise ValueError(f"comera: target_ratio={target_ratio!r} must be in (0, 1]")
        self.variant = VARIANTS[p.lookup]
        report = tensorize(model, _spec(workload.tt_spec, p))
        if p.dense_init == "official" and getattr(workload, "official_init", None) is not None:
            workload.official_init(model)
        stated = {group: getattr(p, f"lr_{group}") or workload.lr.get(group)
                  for group in ("cores", "gates", "other", "embedding_cores")}
        lrs = learning_rates(stated["cores"] or PAPER_CORES_LR, cores=stated["cores"], gates=stated["gates"],
                             other=stated["other"], embedding_cores=stated["embedding_cores"])
        groups = param_groups(model, **{group: lrs[group] for group in ("cores", "gates", "other",
                                                                        "embedding_cores")})
        optimizer, impl = adamw(groups, lr=lrs["other"], weight_decay=p.weight_decay)
        adapt = RankAdaptation(model, optimizer, target=target_ratio, total_steps=total_steps,
                               early_fraction=p.early_fraction, target_ramp=p.target_ramp,
                               **{key: getattr(p, key) for key in RANK_SETTINGS})
        driver = adapt.driver  # the runner passes the step number (CUDA graphs capture the objective)
        return Prepared(
            model=model,
            optimizers=[optimizer],
            total_loss=driver.objective,
            after_step=driver.after_step,
            settings={**asdict(p), "lr": lrs, "late_start_step": adapt.settings.late_start_step,
                      "target_ratio": target_ratio, "target_ramp_steps": adapt.settings.target_ramp_steps,
                      # pruning every prune_every steps (both stages) is periodic work: timing rounds hold
                      # whole periods of it (harness.core.timing.round_bounds)
                      "time_window_steps": p.prune_every if p.prune_every > 1 else None,
                      "switch": driver.switch, "conversion": report.as_dict(),
                      "optimizer": "torch.optim.AdamW", "optimizer_impl": impl},
            ranks=lambda: rank_lib.ranks(model),
            size=lambda: model_size(model),
            stateful={"rank_adaptation": adapt},
        )


def _spec(tt_spec: dict[str, dict[str, Any]], p: CoMERAParams) -> dict[str, dict[str, Any]]:
    """The workload's tt_spec with the method's settings: a param left unset (None) keeps the workload's
    value (its ranks, its TTM table std); ``init`` and ``lookup`` are the method's own choices."""
    spec = copy.deepcopy(tt_spec)
    for entry in spec.values():
        embedding = entry.get("kind") == "embedding"
        stated = {"rank": p.embedding_rank if embedding else p.rank, "init": p.init}
        if embedding:
            stated.update(lookup=p.lookup, init_std=p.embedding_init_std)
        entry.update({key: value for key, value in stated.items() if value is not None})
    return spec


METHOD = CoMERAMethod
