"""CoMERA as a training method: the workload's model tensorized, AdamW, :class:`comera.RankAdaptation`.

Params: :class:`CoMERAParams`; the rank-adaptation defaults are the library's (docs/recipe.md), or with
``rules: paper`` the paper's (variant ``paper`` in the configs), the layers' settings the method's own
(docs/library-reference.md).
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Literal

import torch
from torch import nn

from baselines.base import Periodic, Prepared
from baselines.dense import adamw, matched_source
from baselines.params import Field, Params, defaults, model_validator, parse
from comera.size import ranks
from comera.adapt import RankAdaptation, learning_rates, param_groups
from comera.adapt import defaults as library_defaults
from comera.convert import model_size, tensorize
from comera.init import INIT_SCHEMES
from comera.rank import MASK_GATES, PAPER_UNREAD, RULES, SWITCH_RULES, RankSettings
from comera.ttm import LOOKUP_MODES

DENSE_INITS = ("workload", "official")
PAPER_CORES_LR = 1e-4
"""The cores' rate when neither the params nor the workload give one (the paper's AdamW rate); the other
groups then follow :func:`comera.adapt.learning_rates` (gates 5x, the rest at the cores' rate)."""
LIBRARY = library_defaults()
"""The rank-adaptation defaults: the library's (:func:`comera.adapt.defaults`), the one set."""
RANK_SETTINGS = tuple(key for key in LIBRARY if key != "early_fraction")
"""The params passed on to :class:`comera.RankAdaptation` as settings (fields of RankSettings)."""
PAPER = library_defaults("paper")
"""The defaults under ``rules: paper`` (the paper's rules; docs/library-reference.md)."""


def _library(key: str, **bounds: Any) -> Any:
    return Field(LIBRARY[key], **bounds)


class CoMERAParams(Params):
    """Parameters of the CoMERA method (module docstring), checked by :func:`baselines.params.parse`.
    The rank-adaptation fields take the library's defaults (``LIBRARY``)."""

    rules: Literal[RULES] = _library("rules")  # "paper": the paper's rules and their defaults (PAPER)
    # the method's own: None keeps the workload's (its tt_spec, its lr groups)
    rank: int | None = Field(None, ge=1)            # every TT linear layer
    embedding_rank: int | None = Field(None, ge=1)  # every TTM embedding
    lookup: Literal[LOOKUP_MODES] = "optimized"  # the TTM lookup; "naive" is variant "naive-lookup"
    lr_cores: float | None = Field(None, gt=0)
    lr_gates: float | None = Field(None, gt=0)
    lr_other: float | None = Field(None, gt=0)
    lr_embedding_cores: float | None = Field(None, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    l1_weight: float = _library("l1_weight", ge=0)
    l2_weight: float = _library("l2_weight", ge=0)
    threshold: float = _library("threshold", ge=0)
    prune_every: int = _library("prune_every", ge=0)
    min_rank: int = _library("min_rank", ge=0)
    early_fraction: float = _library("early_fraction", ge=0, le=1)
    switch_when: Literal[SWITCH_RULES] = _library("switch_when")
    converged_gain: float = _library("converged_gain", ge=0, le=1)
    loss_target: float | None = _library("loss_target")
    loss_tolerance: float = _library("loss_tolerance", ge=0)
    size_weight: float = _library("size_weight", ge=0)
    loss_average: float = _library("loss_average", ge=0, le=1)
    branch_average: float = _library("branch_average", ge=0, le=1)
    stop_at_target: bool = _library("stop_at_target")
    target_ramp: float = _library("target_ramp", ge=0, le=1)
    late_fraction: float = _library("late_fraction", ge=0, lt=1)
    recover_fraction: float = _library("recover_fraction", ge=0, lt=1)
    late_gate_travel: float = _library("late_gate_travel", ge=0)
    reach_target: bool = _library("reach_target")
    mask_gates: Literal[MASK_GATES] = _library("mask_gates")
    init: Literal[INIT_SCHEMES] = "official"     # the TT layers' init (comera.init)
    embedding_init_std: float | None = None      # the TTM table's std; None: the workload's, else init's
    dense_init: Literal[DENSE_INITS] = "workload"  # "official": the workload's official_init for the rest
    match_run: str | None = None  # fixed ranks matched to that cell's reached size (:func:`fixed_rank_spec`)

    @model_validator(mode="before")
    @classmethod
    def _paper_defaults(cls, given: Any) -> Any:
        """Under ``rules: paper`` the rank-adaptation params not given take the paper's defaults
        (``PAPER``); one the paper's rules do not read is a ValueError naming it."""
        if not isinstance(given, dict) or given.get("rules") != "paper":
            return given
        unread = sorted(set(given) & set(PAPER_UNREAD))
        if unread:
            raise ValueError(f"method 'comera': parameter {unread[0]!r} is not read under rules 'paper' "
                             f"(the project's convergence switch and loss guard: {list(PAPER_UNREAD)})")
        return {**PAPER, **given}

    @model_validator(mode="after")
    def _paper_fixed(self) -> CoMERAParams:
        """Under ``rules: paper`` a value the paper's rules fix is a ValueError naming it."""
        if self.rules == "paper":
            try:
                RankSettings(**{key: getattr(self, key) for key in RANK_SETTINGS
                                if key in self.model_fields_set}).check()
            except ValueError as err:
                raise ValueError(f"method 'comera': {err}") from err
        return self


PARAMS_DEFAULTS: dict[str, Any] = defaults(CoMERAParams)
VARIANTS = {"optimized": "default", "naive": "naive-lookup"}
FIXED_RANK = "fixed-rank"
"""The variant of a cell with ``match_run``: the TT model at fixed ranks (no pruning, no target)."""


PRUNING = "comera pruning"
"""CoMERA's periodic work: pruning the TT ranks (both stages)."""


def periodic(params: dict[str, Any]) -> dict[str, Periodic]:
    """CoMERA's periodic work (checked params): pruning after every ``prune_every``-th step (steps
    prune_every - 1, 2 x prune_every - 1, ...; comera.rank), not forceable (an extra pruning would change
    the ranks the run goes on with)."""
    every = params["prune_every"]
    return {PRUNING: Periodic(every, every - 1)} if every > 1 else {}


def check_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate CoMERA params and fill defaults; an unknown key or a bad value raises ValueError. Under
    ``rules: paper`` the params these rules do not read (``PAPER_UNREAD``) are left out."""
    out = parse("comera", CoMERAParams, params).as_dict()
    if out["rules"] == "paper":
        out = {key: value for key, value in out.items() if key not in PAPER_UNREAD}
    return out


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
        spec, matched = _spec(workload.tt_spec, p), None
        if p.match_run is not None:
            if target_ratio is not None or p.rank is not None or p.embedding_rank is not None:
                raise ValueError(f"comera: match_run {p.match_run!r} sets fixed ranks: target_ratio, rank "
                                 f"and embedding_rank must be null (got {target_ratio!r}, {p.rank!r}, "
                                 f"{p.embedding_rank!r})")
            matched = matched_source("comera", p.match_run)
            spec, fixed = fixed_rank_spec(model, spec, matched["params"])
            matched.update(fixed)
            p = p.model_copy(update={"prune_every": 0})  # fixed ranks: nothing pruned
            self.variant = FIXED_RANK
        report = tensorize(model, spec)
        if p.dense_init == "official" and getattr(workload, "official_init", None) is not None:
            workload.official_init(model)
        stated = {group: getattr(p, f"lr_{group}") or workload.lr.get(group)
                  for group in ("cores", "gates", "other", "embedding_cores")}
        lrs = learning_rates(stated["cores"] or PAPER_CORES_LR, cores=stated["cores"], gates=stated["gates"],
                             other=stated["other"], embedding_cores=stated["embedding_cores"])
        groups = param_groups(model, **{group: lrs[group] for group in ("cores", "gates", "other",
                                                                        "embedding_cores")})
        optimizer, impl = adamw(groups, lr=lrs["other"], weight_decay=p.weight_decay)
        read = library_defaults(p.rules)  # the settings these rules read
        adapt = RankAdaptation(model, optimizer, target=target_ratio, total_steps=total_steps,
                               early_fraction=p.early_fraction,
                               **{key: getattr(p, key) for key in RANK_SETTINGS if key in read})
        driver = adapt.driver  # the runner passes the step number (CUDA graphs capture the objective)
        return Prepared(
            model=model,
            optimizers=[optimizer],
            total_loss=driver.objective,
            after_step=driver.after_step,
            settings={**{key: value for key, value in p.as_dict().items()
                         if key in read or key not in LIBRARY},
                      "lr": lrs, "late_start_step": adapt.settings.late_start_step,
                      "target_ratio": target_ratio, "converged_window": adapt.settings.converged_window,
                      # pruning every prune_every steps (both stages) is periodic work: timing rounds hold
                      # whole periods of it (harness.core.timing.round_bounds)
                      "time_window_steps": p.prune_every if p.prune_every > 1 else None,
                      # both filled in as the run goes (recorded with the row at its end)
                      "switch": driver.switch, "outcome": driver.outcome, "conversion": report.as_dict(),
                      "optimizer": "torch.optim.AdamW", "optimizer_impl": impl, "matched": matched},
            ranks=lambda: ranks(model),
            size=lambda: model_size(model),
            stateful={"rank_adaptation": adapt},
            periodic=periodic(p.as_dict()),
        )


def _with_rank(spec: dict[str, dict[str, Any]], rank: int, scale: dict[str, float]
               ) -> dict[str, dict[str, Any]]:
    out = copy.deepcopy(spec)
    for name, entry in out.items():
        entry["rank"] = max(1, round(rank * scale[name])) if entry.get("kind") == "embedding" else rank
    return out


def fixed_rank_spec(model: nn.Module, spec: dict[str, dict[str, Any]], count: int
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``spec`` at the uniform rank whose tensorized ``model`` has the parameter count (cores, gates and
    every dense parameter, as the row's ``params_total``) nearest ``count`` (the lower rank on a tie): every
    TT linear layer at rank r from 1 to the largest rank of ``spec``'s linear layers, every TTM embedding at
    r times its rank over that largest one (rounded, at least 1), so the ratio of ``spec``'s ranks stays.
    The count is taken on copies of ``model`` (the global random state is left as it was).

    Returns:
        (the spec, ``{"rank": r, "embedding_rank": the first TTM's or None, "fixed_params": its count}``).
    """
    def most(rank: Any) -> int:
        return max(rank) if isinstance(rank, (list, tuple)) else int(rank)

    linear = [most(e["rank"]) for e in spec.values() if e.get("kind") != "embedding"]
    top = max(linear or [most(e["rank"]) for e in spec.values()])
    scale = {name: most(e["rank"]) / top for name, e in spec.items()}
    counts: dict[int, int] = {}

    def size(rank: int) -> int:
        if rank not in counts:
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the cell's own conversion gives its warnings
                counts[rank] = int(model_size(tensorize_copy(model, _with_rank(spec, rank, scale)))[
                    "params_total"])
        return counts[rank]

    low, high = 1, top  # the first rank with at least count parameters (sizes grow with the rank)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if size(mid) < count else (low, mid)
    rank = min(range(max(low - 1, 1), low + 1), key=lambda r: abs(size(r) - count))
    chosen = _with_rank(spec, rank, scale)
    embedding = next((e["rank"] for e in chosen.values() if e.get("kind") == "embedding"), None)
    return chosen, {"rank": rank, "embedding_rank": embedding, "fixed_params": size(rank)}


def tensorize_copy(model: nn.Module, spec: dict[str, dict[str, Any]]) -> nn.Module:
    """A tensorized copy of ``model`` (``model`` unchanged)."""
    copied = copy.deepcopy(model)
    tensorize(copied, copy.deepcopy(spec))
    return copied


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
