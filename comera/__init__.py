"""CoMERA: tensor-train (TT) linear layers and TT-matrix (TTM) embeddings with rank-adaptive training.

The method library of comera-bench; it depends on torch only. Guide: docs/library.md; reference:
docs/library-reference.md.
"""
from comera.adapt import RankAdaptation, param_groups
from comera.convert import ConversionReport, model_size, tensorize
from comera.contraction import PlanSettings
from comera.feedforward import feed_forward
from comera.kernels import register_flop_formulas
from comera.plain import plain_autograd
from comera.prune import prune
from comera.rank import RankSettings, TwoStageRankAdaptation, gate_penalty
from comera.size import rank_shares, ranks, removed_layers, tt_parameter_count
from comera.tt import TTLinear
from comera.ttm import TTMEmbedding

__all__ = [
    "TTLinear",
    "TTMEmbedding",
    "feed_forward",
    "plain_autograd",
    "PlanSettings",
    "register_flop_formulas",
    "tensorize",
    "RankAdaptation",
    "param_groups",
    "RankSettings",
    "model_size",
    "ConversionReport",
    "TwoStageRankAdaptation",
    "gate_penalty",
    "rank_shares",
    "prune",
    "removed_layers",
    "ranks",
    "tt_parameter_count",
]
