"""What the tables and figures share: units, a run's label, the order of quality runs, their command line."""
from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from harness.reports import feeds
from harness.results.analysis import Results, load, settings_of
from harness.results.execution import execution_label

MB = 1e6
GIB = 2 ** 30


def configuration(method: str, variant: str | None) -> str:
    """A method configuration's name: the method, with its variant unless that is the default
    ("comera", "comera-reach")."""
    return method if variant in ("default", "", None) else f"{method}-{variant}"


def matched_name(variant: str | None) -> str:
    """How text names the CoMERA configuration a size-matched cell matched: "CoMERA" (the defaults), else
    its configuration ("comera-reach")."""
    return "CoMERA" if variant in ("default", "", None) else configuration("comera", variant)


def method_label(row: Any) -> str:
    """"comera (target 0.2)", "lte-tuned", "dense TF32 (high)", "comera + CUDA graph", "dense, size-matched
    to CoMERA target 0.2" and "comera-fixed-rank, size-matched to comera-reach target 0.2" (cells matched
    to the size a CoMERA cell reached, :func:`size_matched`, named after that cell's configuration unless
    it is the default): the method, its variant unless the default, its execution where not eager FP32
    (harness.results.execution.execution_label) and its target."""
    how = execution_label(row)
    label = configuration(row.method, row.variant) + how
    if pd.notna(row.target_ratio):
        label += f" (target {row.target_ratio:g})"
    matched = size_matched(row)
    if not matched:
        return label
    plain = row.variant in ("default", "size-matched", "", None)
    named = (row.method if plain else f"{row.method}-{row.variant}") + how
    target = "" if matched.get("target") is None else f" target {matched['target']:g}"
    return f"{named}, size-matched to {matched_name(matched.get('variant'))}{target}"


def size_matched(row: Any) -> dict[str, Any]:
    """The record of a cell matched to the size another cell reached (method param ``match_run``: the
    size-matched dense model, the fixed-rank TT model): ``run``, ``params`` (the count it matched),
    ``target``, ``target_reached`` of that cell, and the method's own (the dense model's, the ranks);
    {} for any other row."""
    return settings_of(row).get("method", {}).get("matched") or {}


def target_reached(row: Any) -> bool | None:
    """Whether a CoMERA run with a target reached it: False without a late stage
    (:func:`late_stage_missing`), else the row's ``target_reached`` column (the library's rule,
    comera.rank.TwoStageRankAdaptation.reached) where it has one, else whether its rank adaptation reported
    no shortfall; None for a run without a target or that failed. The one rule every table, figure and
    claim reads."""
    if row.method != "comera" or pd.isna(row.target_ratio) or row.status != "ok":
        return None
    if late_stage_missing(row):
        return False
    given = getattr(row, "target_reached", None)
    if given is not None and not pd.isna(given):
        return bool(given)
    return not (settings_of(row).get("method", {}).get("outcome") or {}).get("shortfall")


def status_note(row: Any) -> str:
    return "" if row.status == "ok" else f"{row.status}: {str(row.error or '')[:80]}"


def late_stage_missing(row: Any) -> str:
    """Why a CoMERA run with a target has no late stage to show: its failure, a stage switch that never
    came, or the shortfall its rank adaptation reported for that ("" when its late stage ran, or it is no
    such run; a late stage that ran but stopped short: :func:`target_shortfall`)."""
    if row.method != "comera" or pd.isna(row.target_ratio):
        return ""
    method = settings_of(row).get("method", {})
    if row.status != "ok":
        return status_note(row)
    if (method.get("switch") or {}).get("step"):
        return ""
    shortfall = (method.get("outcome") or {}).get("shortfall")
    return shortfall or f"late stage never started (late_start_step {method.get('late_start_step')})"


def target_missed(row: Any) -> bool:
    """Whether a run's late stage ran and stopped short of its size target (:func:`target_reached` is
    False); False for a run that reached it, has no target or no late stage (:func:`late_stage_missing`)."""
    return target_reached(row) is False and not late_stage_missing(row)


def target_shortfall(row: Any) -> str:
    """"target not reached: <why>" for a CoMERA run whose late stage ran and stopped short of its target
    (:func:`target_missed`; why: the shortfall its rank adaptation reported), else ""."""
    if not target_missed(row):
        return ""
    shortfall = (settings_of(row).get("method", {}).get("outcome") or {}).get("shortfall")
    return f"target not reached: {shortfall}" if shortfall else "target not reached"


QUALITY_ORDER = {"dense": 0, "comera": 1, "galore": 2, "lte": 3}


def quality_order(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs ordered dense, CoMERA (no target, then targets from the largest: 0.8, 0.5, 0.2), GaLore, LTE,
    other methods; within a method by variant, batch size and seed."""
    key = runs.assign(_m=runs.method.map(QUALITY_ORDER).fillna(len(QUALITY_ORDER)),
                      _t=-runs.target_ratio.fillna(float("inf")))
    return runs.loc[key.sort_values(["_m", "variant", "_t", "batch_size", "seed"]).index]


def report_args(prog: str, description: str, argv: list[str] | None, out_help: str = "output folder",
                not_drawn: bool = False) -> tuple[argparse.Namespace, Results]:
    """The command line shared by the tables and figures commands (--results, --device-label, --out; with
    ``not_drawn``, --not-drawn), parsed, with the results folder loaded (claims has its own: --compare)."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--results", required=True, help="results/<device> folder")
    ap.add_argument("--device-label", default=None)
    ap.add_argument("--out", required=True, help=out_help)
    if not_drawn:
        ap.add_argument("--not-drawn", nargs="*", default=[], choices=list(feeds.NEEDS), metavar="FIGURE",
                        help="figures the grid cannot feed (harness.reports.feeds): not drawn, listed once "
                             "in the overview")
    args = ap.parse_args(argv)
    return args, load(args.results, args.device_label)
