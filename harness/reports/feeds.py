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
    "fig9_dlrm_nce": "DLRM quality cells, or timing cells without a target",
    "fig10_mlm_loss": "MLM quality cells, or timing cells without a target",
    "fig12_time_vs_compression": "a CoMERA sweep (methods.<name>.sweep, e.g. rank)",
    "fig13_rank_adaptation": "transformer CoMERA cells with a target",
    "fig14_accuracy_vs_compression": "transformer cells",
}


TITLES = {
    "fig1_time_memory": "Fig 1: transformer time and memory", "fig5_ttm_lookup": "Fig 5: embedding lookup",
    "fig6_accuracy": "Fig 6: accuracy and loss over training", "fig7_cuda_graph": "Fig 7: CUDA graph",
    "fig8_dlrm_time_memory": "Fig 8: DLRM time and memory", "fig9_dlrm_nce": "Fig 9: DLRM NCE",
    "fig10_mlm_loss": "Fig 10: MLM loss", "fig12_time_vs_compression": "Fig 12: time vs compression",
    "fig13_rank_adaptation": "Rank adaptation (not in the paper)",
    "fig14_accuracy_vs_compression": "Accuracy vs compression (not in the paper)",
    "table1_ranks": "Table 1: TT ranks", "table_mnli_size": "Accuracy and size per method",
    "table2_dlrm": "Table 2: DLRM", "table_runs": "All runs",
}
"""Each figure and table of the report as its menu names it, in the paper's order (NEEDS's for figures)."""


def report_labels(name: str, view: str | None = None) -> dict[str, str]:
    """The Snakemake report labels of an output: its place in the paper's order (``#``, which the report
    sorts by), its title and, for a figure, ``view`` ("figure" or "notes": the report toggles between a
    figure and its notes)."""
    labels = {"#": f"{list(TITLES).index(name) + 1:02d}", "output": TITLES[name]}
    return {**labels, "view": view} if view else labels


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

    def curves(workload: str) -> Callable[[str, Spec], bool]:  # Fig 9 / 10: quality cells, else timing
        return lambda rid, s: untargeted(workload)(rid, s) or (s["workload"] == workload and not _timing(s)
                                                               and plain(rid, s))

    return {
        "fig1_time_memory": untargeted("transformer"),
        "fig6_accuracy": lambda rid, s: s["workload"] == "transformer" and plain(rid, s),
        "fig7_cuda_graph": lambda rid, s: s["workload"] == "transformer" and _timing(s) and _graph(s),
        "fig8_dlrm_time_memory": lambda rid, s: s["workload"] == "dlrm" and _timing(s) and plain(rid, s),
        "fig9_dlrm_nce": curves("dlrm"),
        "fig10_mlm_loss": curves("mlm"),
        "fig12_time_vs_compression": lambda rid, s: rid in sweeps and _timing(s),
        "fig13_rank_adaptation": lambda rid, s: (s["workload"] == "transformer" and s["method"] == "comera"
                                                 and s.get("target_ratio") is not None and plain(rid, s)),
        "fig14_accuracy_vs_compression": lambda rid, s: s["workload"] == "transformer" and plain(rid, s),
    }


def unfed(cells: Mapping[str, Spec], sweeps: Mapping[str, Any],
          microbench: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Figure -> what it needs, for each figure that no cell (run_id -> spec), sweep point or microbench
    spec of the grid feeds, in NEEDS order."""
    fed = {name for name, feeds in _tests(sweeps).items() if any(feeds(r, s) for r, s in cells.items())}
    if any("embedding" in spec for spec in microbench.values()):
        fed.add("fig5_ttm_lookup")
    return {name: why for name, why in NEEDS.items() if name not in fed}
