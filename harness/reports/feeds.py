"""Which figures a grid can feed. The pipeline draws only those; the overview lists the others once,
with what each would need (``python -m harness.reports.figures --not-drawn NAME ...``)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from harness.spec import DEFAULT_PURPOSE

Spec = Mapping[str, Any]

NEEDS = {
    "fig1_time_memory": "transformer timing cells without a target",
    "fig5_ttm_lookup": "embedding microbenchmarks (config microbench.specs.<name>.embedding)",
    "fig6_accuracy": "transformer cells",
    "fig7_cuda_graph": "transformer cells with execution.cuda_graph true (CUDA only)",
    "fig8_dlrm_time_memory": "DLRM timing cells",
    "fig9_dlrm_nce": "DLRM timing cells without a target",
    "fig10_mlm_loss": "MLM timing cells without a target",
    "fig12_time_vs_compression": "a CoMERA sweep (methods.<name>.sweep, e.g. rank)",
    "fig13_rank_adaptation": "transformer CoMERA cells with a target",
}


def _timing(spec: Spec) -> bool:
    return (spec.get("purpose") or DEFAULT_PURPOSE) == DEFAULT_PURPOSE


def _graph(spec: Spec) -> bool:
    return bool(spec.get("execution", {}).get("cuda_graph"))


def _tests(sweeps: Mapping[str, Any]) -> dict[str, Callable[[str, Spec], bool]]:
    """Figure -> whether one cell (run_id, spec) feeds it."""
    def plain(rid: str, s: Spec) -> bool:
        return rid not in sweeps and not _graph(s)

    def untargeted(workload: str) -> Callable[[str, Spec], bool]:
        return lambda rid, s: (s["workload"] == workload and _timing(s) and plain(rid, s)
                               and s.get("target_ratio") is None)

    return {
        "fig1_time_memory": untargeted("transformer"),
        "fig6_accuracy": lambda rid, s: s["workload"] == "transformer" and plain(rid, s),
        "fig7_cuda_graph": lambda rid, s: s["workload"] == "transformer" and _timing(s) and _graph(s),
        "fig8_dlrm_time_memory": lambda rid, s: s["workload"] == "dlrm" and _timing(s) and plain(rid, s),
        "fig9_dlrm_nce": untargeted("dlrm"),
        "fig10_mlm_loss": untargeted("mlm"),
        "fig12_time_vs_compression": lambda rid, s: rid in sweeps and _timing(s),
        "fig13_rank_adaptation": lambda rid, s: (s["workload"] == "transformer" and s["method"] == "comera"
                                                 and s.get("target_ratio") is not None and plain(rid, s)),
    }


def unfed(cells: Mapping[str, Spec], sweeps: Mapping[str, Any],
          microbench: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Figure -> what it needs, for each figure that no cell (run_id -> spec), sweep point or microbench
    spec of the grid feeds, in NEEDS order."""
    fed = {name for name, feeds in _tests(sweeps).items() if any(feeds(r, s) for r, s in cells.items())}
    if any("embedding" in spec for spec in microbench.values()):
        fed.add("fig5_ttm_lookup")
    return {name: why for name, why in NEEDS.items() if name not in fed}
