"""The analysis layer: what the runs table means, every statistic the reports show, defined once.

:func:`load` gives the :class:`Results` model of a results folder; the row predicates, the one time
statistic :func:`ratio` (a :class:`Ratio`) and which rows compare are here, and the reports only render
them (docs/architecture.md, "One analysis layer"; docs/measurement.md, "Ratios").
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
from scipy import stats

from harness.spec import DEFAULT_PURPOSE, PURPOSES, slug
from harness.core.timing import STABLE, finite, judge_rounds, quartiles
from harness.results import ResultsError, empty_frame, read_parquet
from harness.results.execution import graphed

TIME = "epoch_time_s"
"""The time column a ratio is asked for: a cell's time per epoch (docs/measurement.md, "Ratios")."""
CALL_TIME = "time_ms"
"""A micro-benchmark case's time per call (its median over rounds)."""
ROUND_VALUES = {TIME: "round_step_mean_ms", CALL_TIME: "round_time_ms"}
"""The per-round values behind each time column: a cell's round means, a micro-benchmark case's rounds."""
MEMORY = "peak_mem_bytes"
"""The memory column; a ratio needs both rows' memory of one kind (:func:`same_memory_kind`)."""
TIMING, QUALITY = PURPOSES  # the grid's purposes; a null purpose (older files) reads as DEFAULT_PURPOSE
"""Purposes of a cell: timed (a short run for time and memory) or trained (accuracy, rank adaptation)."""
INTERLEAVED = "median over rounds of per-round mean step time ratios"
NOT_INTERLEAVED = ("not interleaved: ratio of mean-based epoch times, spread from each side's round-mean "
                   "quartiles")
NO_SPREAD = ("not interleaved: ratio of mean-based epoch times, no spread (a side with fewer than 2 round "
             "means)")
VALUES = "ratio of the values"


# ---------------------------------------------------------------------------------------- row values

def json_column(value: Any, default: Any) -> Any:
    """A JSON column's value parsed (``settings``, ``extra``, ``ranks``, ``round_step_mean_ms``).

    Args:
        value: the cell of the column (a JSON string, or null).
        default: returned when the value is null, empty, not JSON, or not of ``default``'s type.

    Returns:
        The parsed value, or ``default``.
    """
    if not isinstance(value, str) or not value:
        return default
    try:
        data = json.loads(value)
    except ValueError:
        return default
    return data if isinstance(data, type(default)) else default


def settings_of(row: Any) -> dict[str, Any]:
    """A row's ``settings`` JSON (method settings, workload params, budget, execution); {} if none."""
    return json_column(getattr(row, "settings", None), {})


def extra_of(row: Any) -> dict[str, Any]:
    """A row's ``extra`` JSON (evaluation metrics, timing details, traceback); {} if none."""
    return json_column(getattr(row, "extra", None), {})


def ranks_of(row: Any) -> dict[str, list[int]]:
    """A row's ``ranks`` JSON (layer -> TT ranks at the end); {} if none."""
    return json_column(getattr(row, "ranks", None), {})


def model_size(settings: dict[str, Any], spec: dict[str, Any]) -> str:
    """The workload's size preset from a row's settings JSON, else its grid spec ("default" if none)."""
    return (settings.get("workload_params", {}).get("size") or spec.get("workload_params", {}).get("size")
            or "default")


# ------------------------------------------------------------------------------------ row predicates

def purpose_of(runs: pd.DataFrame) -> pd.Series:
    """Each row's purpose; null (files written before quality cells existed) reads as "timing"."""
    return runs.purpose.fillna(DEFAULT_PURPOSE)


def is_timing(runs: pd.DataFrame) -> pd.Series:
    """Which rows are timing cells (:func:`purpose_of` "timing")."""
    return purpose_of(runs) == TIMING


def timing_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows of timing cells (:func:`is_timing`)."""
    return runs[is_timing(runs)]


def is_stable(row: Mapping[str, Any] | pd.Series) -> bool:
    """Whether one row's timing is stable: its ``timing_quality`` verdict (harness.core.timing.judge) is
    "stable"; a row written before the verdict existed is not.

    Args:
        row: a runs row (a mapping or a pandas row).

    Returns:
        True when the row may enter a time ratio.
    """
    return row.get("timing_quality") == STABLE


def stable(runs: pd.DataFrame) -> pd.Series:
    """:func:`is_stable` of every row of a runs frame."""
    return runs.timing_quality.fillna("") == STABLE


def stable_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``runs`` whose timing is stable (:func:`stable`)."""
    return runs[stable(runs)] if len(runs) else runs


def unstable_timing_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Ok timing cells whose timing is not stable: the rows no time ratio uses."""
    cells = timing_cells(runs)
    return cells[(cells.status == "ok") & ~stable(cells)]


def verdict_of(rows: Mapping[str, Mapping[str, Any] | pd.Series]) -> str:
    """One verdict for the rows a number divides (name -> runs row): "stable" when every row is
    (:func:`is_stable`), else ``noisy: <name>: <reason>; ...`` for each row that is not."""
    noisy = [f"{name}: {noisy_reason(row)}" for name, row in rows.items() if not is_stable(row)]
    return "noisy: " + "; ".join(noisy) if noisy else STABLE


def rounds_verdict(times: Mapping[str, Sequence[float | None]]) -> str:
    """One verdict for things timed round by round that a number divides (the performance bench's runs,
    the halving's alternated rounds; name -> per-round times): "stable" when each name's is
    (:func:`harness.core.timing.judge_rounds`, the rules of a micro-benchmark row's ``timing_quality``),
    else ``noisy: <reasons>``."""
    verdicts = [judge_rounds(values, f"{name} per-round times") for name, values in times.items()]
    reasons = [v.removeprefix("noisy: ") for v in verdicts if v != STABLE]
    return "noisy: " + "; ".join(reasons) if reasons else STABLE


def noisy_reason(row: Mapping[str, Any] | pd.Series) -> str:
    """Why a row is not stable: its verdict's reasons, or that it has none (written before the column)."""
    value = row.get("timing_quality")
    if not isinstance(value, str) or not value:
        return "no timing verdict (written before timing_quality existed)"
    return value.removeprefix("noisy: ")


def describe_left_out(rows: Iterable[Mapping[str, Any] | pd.Series]) -> list[str]:
    """``run_id: reason`` for each row that is not stable (for notes under tables and claims)."""
    return [f"{row.get('run_id')}: {noisy_reason(row)}" for row in rows if not is_stable(row)]


def step_time_spread(runs: pd.DataFrame) -> pd.Series:
    """Each row's step-time IQR over its median step time (NaN where either is unknown or zero): the
    spread of one cell's steps, drawn as its bar in the figures (harness.core.timing.relative_iqr is the
    spread of a list of values, e.g. a cell's per-round means)."""
    return (runs.step_time_ms_iqr / runs.step_time_ms).where(runs.step_time_ms > 0)


# ------------------------------------------------------------------------------------- comparability

def on_gpu(device: Any, device_name: Any, gpu: str) -> bool:
    """Whether a row ran on a CUDA device of the GPU model ``gpu``: the device name's slug is the GPU's
    slug or ends with "-" + it ("NVIDIA GeForce RTX 3090" is an RTX 3090; "RTX 3090 Ti", "RTX 4090" or an
    H200 are not).

    Args:
        device: the row's ``device`` ("cuda", "cpu").
        device_name: the row's ``device_name``.
        gpu: a GPU model as the paper names it ("RTX 3090").

    Returns:
        True for that GPU model.
    """
    name, want = slug(str(device_name or "")), slug(gpu)
    return device == "cuda" and (name == want or name.endswith("-" + want))


def gpu_rows(df: pd.DataFrame, gpu: str) -> pd.Series:
    """Rows (runs or microbench) measured on the GPU model ``gpu`` (:func:`on_gpu`)."""
    return pd.Series([on_gpu(d, n, gpu) for d, n in zip(df.device, df.device_name)], index=df.index, dtype=bool)


def timed_together(num: Mapping[str, Any], den: Mapping[str, Any]) -> bool:
    """Whether two runs rows were timed in the same interleaved rounds: the same ``timing_group`` on the
    same host and device (the same group name on two machines is two groups)."""
    group = num.get("timing_group")
    return isinstance(group, str) and bool(group) and all(num.get(c) == den.get(c) for c in ("timing_group", "hostname", "device_name"))


def same_memory_kind(num: Mapping[str, Any], den: Mapping[str, Any]) -> bool:
    """Whether two rows' peak memories are of one kind (``cuda_allocated`` and ``cpu_rss_delta`` are not
    comparable)."""
    return str(num.get("peak_mem_kind")) == str(den.get("peak_mem_kind"))


# ------------------------------------------------------------------------------------------- ratios

@dataclass(frozen=True)
class Ratio:
    """A ratio of two cells' quantities with its spread (docs/measurement.md, "Ratios").

    Attributes:
        value: the ratio (median over rounds where interleaved).
        low: the first quartile of the per-round ratios; timed apart, the low end from each side's
            round-mean quartiles (:func:`apart_ratio`); ``value`` without rounds.
        high: the third quartile of the per-round ratios, or the high end as for ``low``.
        n: how many rounds it is the median of; timed apart, the fewer of the two sides' rounds; 1
            without rounds.
        interleaved: whether it comes from per-round ratios of cells timed together.
        basis: how it was computed, in words.
        per_round: the per-round ratios (empty without rounds).
    """

    value: float
    low: float
    high: float
    n: int = 1
    interleaved: bool = False
    basis: str = NOT_INTERLEAVED
    per_round: tuple[float, ...] = field(default=(), compare=False)
    """The per-round ratios the median is taken over (empty without rounds)."""
    ci_low: float | None = None
    """The low end of the ratio's :data:`CONFIDENCE` confidence interval over rounds (:func:`interval`);
    ``value`` where the ratio has no spread to give one (a ratio of values, a single round)."""
    ci_high: float | None = None
    """The high end, as ``ci_low``."""

    def __post_init__(self) -> None:
        if self.ci_low is None:
            object.__setattr__(self, "ci_low", self.value)
        if self.ci_high is None:
            object.__setattr__(self, "ci_high", self.value)

    def text(self, digits: int = 2) -> str:
        """"2.40x [2.31-2.52]" (with rounds: the IQR over rounds, or timed apart the spread from each
        side's round-mean quartiles) or "2.40x"."""
        if self.n > 1:
            return f"{self.value:.{digits}f}x [{self.low:.{digits}f}-{self.high:.{digits}f}]"
        return f"{self.value:.{digits}f}x"

    @property
    def has_interval(self) -> bool:
        """Whether the ratio has a confidence interval wider than its value (it has rounds to give one)."""
        return self.ci_high - self.ci_low > SAME_LOG * abs(self.value)

    def ci_text(self, digits: int = 2) -> str:
        """"95% CI 2.28-2.55", or "" without an interval (:attr:`has_interval`)."""
        if not self.has_interval:
            return ""
        return f"{CONFIDENCE:.0%} CI {self.ci_low:.{digits}f}-{self.ci_high:.{digits}f}"


CONFIDENCE = 0.95
"""The confidence level of every ratio's interval (:func:`interval`) and so of the claims' verdicts."""
SAME_LOG = 1e-9
"""A standard error of log ratios at most this is no spread (rounds equal but for rounding)."""


def interval(value: float, logs: Sequence[float], df: float | None = None, scale: float | None = None
             ) -> tuple[float, float]:
    """A :data:`CONFIDENCE` confidence interval of a ratio from its spread over rounds: a Student t
    interval (``scipy.stats.t.interval``) of the ratio's logarithm around ``log(value)``, back to a ratio.

    Args:
        value: the ratio (positive).
        logs: the per-round log ratios (cells timed together); their standard error of the mean
            (``scipy.stats.sem``) is the scale, with ``len(logs) - 1`` degrees of freedom.
        df, scale: instead of ``logs``: the degrees of freedom and the standard error (cells timed apart,
            :func:`apart_ratio`).

    Returns:
        (low, high); (value, value) with fewer than two rounds or no spread among them.

    Example:
        >>> low, high = interval(3.0, [math.log(x) for x in (2.9, 3.0, 3.1)])
        >>> round(low, 2), round(high, 2)
        (2.76, 3.26)
    """
    if scale is None:
        kept = [x for x in logs if math.isfinite(x)]
        if len(kept) < 2:
            return value, value
        df, scale = len(kept) - 1, float(stats.sem(kept))
    if not (df and scale and math.isfinite(scale) and scale > SAME_LOG):
        return value, value
    low, high = stats.t.interval(CONFIDENCE, df, loc=math.log(value), scale=scale)
    return math.exp(low), math.exp(high)


def round_means_of(row: Mapping[str, Any], column: str = TIME) -> list[float | None]:
    """The per-round values behind a row's time (:data:`ROUND_VALUES`): a cell's mean step time of each
    timing round, a micro-benchmark case's ms per call of each round; [] when the row has none."""
    return json_column(row.get(ROUND_VALUES[column]), [])


def rounds_ratio(num: Sequence[float | None], den: Sequence[float | None], basis: str = INTERLEAVED
                 ) -> Ratio | None:
    """The ratio of two things timed in the same rounds: per round ``num`` / ``den``, then the median over
    the rounds with the IQR of the per-round ratios (:func:`harness.core.timing.quartiles`). The one
    round statistic: :func:`ratio` for two cells timed together (their per-round mean step times) and the
    performance bench (harness.perf: micro-benchmarks' per-round times, the halving's alternated rounds).

    Args:
        num: the numerator's time in each round.
        den: the denominator's time in each round. Round r of both is the same round (a timing group's
            coordinator runs round r of every cell before round r + 1); rounds only one side has -- a
            cell whose rounds hold whole periods of its periodic work may have fewer than its group's
            others (harness.core.timing.round_bounds) -- are left out.
        basis: how the times were taken, in words (:attr:`Ratio.basis`).

    Returns:
        The ratio, or None when no round has two finite times (a positive denominator).

    Example:
        >>> rounds_ratio([800, 1200, 900], [100, 400, 300]).text()
        '3.00x [3.00-5.50]'
    """
    per_round = [x / y for x, y in zip(num, den) if finite(x) and finite(y) and y > 0]
    if not per_round:
        return None
    low, mid, high = quartiles(per_round)
    ci = interval(mid, [math.log(x) for x in per_round if x > 0]) if mid > 0 else (mid, mid)
    return Ratio(mid, low, high, len(per_round), True, basis, tuple(per_round), *ci)


def ratio(num: Mapping[str, Any], den: Mapping[str, Any], column: str = TIME, *,
          require_stable: bool = True) -> Ratio | None:
    """``num`` / ``den`` for two runs rows (or two micro-benchmark rows): the one statistic every report
    shows.

    Args:
        num: the numerator's row (a mapping or a pandas row).
        den: the denominator's row.
        column: :data:`TIME` (the time statistic of docs/measurement.md: per-round mean step time
            ratios of cells timed together, else the ratio of their mean-based epoch times; both rows
            must be stable, :func:`is_stable`), :data:`CALL_TIME` (two micro-benchmark cases, timed apart:
            the ratio of their medians with the spread of each side's rounds; both stable),
            :data:`MEMORY` (the ratio of the values, of one memory kind) or another numeric column (the
            ratio of the values).
        require_stable: False: a time ratio whatever the rows' verdicts (the performance bench, which
            shows each row's verdict beside its number, :func:`verdict_of`); the number is the same.

    Returns:
        The ratio, or None when either side is missing, the denominator is not positive, or the rows
        may not be compared (a time of an unstable row, memories of two kinds).
    """
    if column in ROUND_VALUES and require_stable and not (is_stable(num) and is_stable(den)):
        return None
    if column == MEMORY and not same_memory_kind(num, den):
        return None
    if column == TIME and timed_together(num, den):
        found = rounds_ratio(round_means_of(num), round_means_of(den))
        if found is not None:
            return found
    x, y = num.get(column), den.get(column)
    if not (finite(x) and finite(y)) or y <= 0:
        return None
    if column in ROUND_VALUES:  # timed apart, or together without a round both have: as cells timed apart
        return apart_ratio(x / y, round_means_of(num, column), round_means_of(den, column))
    return Ratio(x / y, x / y, x / y, 1, False, VALUES)


def apart_ratio(value: float, num: Sequence[float | None], den: Sequence[float | None]) -> Ratio:
    """The spread of a time ratio of two cells timed apart (two devices, two runs), which share no round:
    each side's round means (:func:`harness.core.timing.quartiles`) carried into the ratio, the widest way.

    Args:
        value: the ratio (of mean-based epoch times).
        num: the numerator's mean step time of each of its rounds (``round_step_mean_ms``).
        den: the denominator's.

    Returns:
        The :class:`Ratio` with ``low`` = value x (Q1 / median of ``num``) / (Q3 / median of ``den``) and
        ``high`` = value x (Q3 / median of ``num``) / (Q1 / median of ``den``), ``n`` the fewer of the two
        sides' rounds (basis :data:`NOT_INTERLEAVED`); without a spread (basis :data:`NO_SPREAD`) where a
        side has fewer than two finite, positive round means.

    Example:
        >>> apart_ratio(2.0, [9, 10, 11], [4, 5, 6]).text()
        '2.00x [1.73-2.33]'
    """
    a, b = ([m for m in means if finite(m) and m > 0] for means in (num, den))
    if min(len(a), len(b)) < 2:
        return Ratio(value, value, value, 1, False, NO_SPREAD)
    (a1, a2, a3), (b1, b2, b3) = quartiles(a), quartiles(b)
    la, lb = [math.log(m) for m in a], [math.log(m) for m in b]
    sa, sb = float(stats.sem(la)), float(stats.sem(lb))
    scale = math.hypot(sa, sb)
    welch = scale ** 4 / (sa ** 4 / (len(la) - 1) + sb ** 4 / (len(lb) - 1)) if scale > SAME_LOG else None
    ci = interval(value, (), welch, scale) if value > 0 else (value, value)  # Welch-Satterthwaite df
    return Ratio(value, value * a1 / a2 * b2 / b3, value * a3 / a2 * b2 / b1, min(len(a), len(b)), False,
                 NOT_INTERLEAVED, (), *ci)


def pair_ratio(a: pd.DataFrame, b: pd.DataFrame, column: str = TIME) -> Ratio | None:
    """``column`` of the rows ``a`` over the rows ``b`` (two method configurations at one key): per seed
    the :func:`ratio` of the seed's rows, then the median over seeds (the middle one; the upper middle
    for an even count). Time ratios use stable rows only (:func:`stable_only`: a stable repeat of a seed
    counts where another is not).

    Args:
        a: the numerator configuration's rows (one per seed).
        b: the denominator configuration's rows.
        column: as for :func:`ratio`.

    Returns:
        The median ratio over the seeds both have, or None when there is none.
    """
    if column == TIME:
        a, b = stable_only(a), stable_only(b)
    found = []
    for seed, ra in a.groupby("seed", dropna=False):
        rb = b[b.seed == seed] if pd.notna(seed) else b[b.seed.isna()]
        if len(rb):
            r = ratio(ra.iloc[0], rb.iloc[0], column)
            if r is not None:
                found.append(r)
    if not found:
        return None
    found.sort(key=lambda r: r.value)
    return found[len(found) // 2]


# ------------------------------------------------------------------------------------ quality runs

LEARNING_TAIL = 0.2
"""The last share of a trained run's steps over which its validation accuracy should have settled."""
LEARNING_RISE = 0.02
"""How much that accuracy may still rise over them and count as settled (10 of 500 evaluation samples)."""


def still_learning(accuracy: pd.DataFrame) -> str:
    """Why a run's validation accuracy had not settled at its end, "" when it had.

    Args:
        accuracy: the run's evaluations, columns ``step`` and ``value``, in step order.

    Returns:
        "" when the last accuracy is at most LEARNING_RISE above the best before the last LEARNING_TAIL
        of the steps (a dip and its recovery, as after CoMERA's stage switch, count as settled), when it
        is 1 (nothing left to learn), or when no evaluation precedes that span; else the reason, e.g.
        "still learning at its end: validation accuracy 0.856 -> 0.976 over its last 20% of steps".
    """
    if len(accuracy) < 2 or accuracy.value.iloc[-1] >= 1.0:
        return ""
    before = accuracy[accuracy.step <= accuracy.step.iloc[-1] * (1 - LEARNING_TAIL)]
    if not len(before):
        return ""
    best, last = float(before.value.max()), float(accuracy.value.iloc[-1])
    if last - best <= LEARNING_RISE + 1e-9:  # 1.0 - 0.98 is 0.020000000000000018
        return ""
    return (f"still learning at its end: validation accuracy {best:.3f} -> {last:.3f} over its last "
            f"{LEARNING_TAIL:.0%} of steps")


# ------------------------------------------------------------------------------------ results model

def budget_text(budget: dict[str, Any]) -> str:
    """A cell's budget in words ("1 epoch(s), <= 16 steps/epoch, evaluated every 16 steps")."""
    steps = budget.get("max_steps_per_epoch")
    text = f"{budget['epochs']} epoch(s), " + (f"<= {steps} steps/epoch" if steps else "full epochs")
    return text + (f", evaluated every {budget['eval_every_steps']} steps" if budget.get("eval_every_steps") else "")


@dataclass
class Results:
    """One device's merged results folder: runs, curves, microbench and the grid it came from."""

    label: str
    runs: pd.DataFrame
    curves: pd.DataFrame
    microbench: pd.DataFrame
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    sweeps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def main_runs(self, workload: str) -> pd.DataFrame:
        """Timing runs of a workload outside any sweep and without CUDA graph (the Fig 1/8 cells)."""
        return self.plain(timing_cells(self.runs[self.runs.workload == workload]))

    def quality_runs(self, workload: str) -> tuple[pd.DataFrame, str]:
        """(runs, source): the workload's quality cells (trained to compare accuracy and rank
        adaptation) outside any sweep and without CUDA graph, or its timing runs when the grid has no
        quality cell (said in ``source``)."""
        df = self.plain(self.runs[(self.runs.workload == workload) & (purpose_of(self.runs) == QUALITY)])
        if len(df):
            return df, "quality cells"
        return self.main_runs(workload), "timing cells (this grid has no quality cells)"

    def plain(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``df`` outside any sweep and without CUDA graph
        (harness.results.execution.graphed)."""
        return df[~df.run_id.isin(list(self.sweeps)) & ~graphed(df)]

    def series(self, run_id: str, split: str, metric: str) -> pd.DataFrame:
        """One run's curve of one metric (its ``curves`` rows of ``split`` / ``metric``), in step order."""
        c = self.curves
        return c[(c.run_id == run_id) & (c.split == split) & (c.metric_name == metric)].sort_values(
            "step", kind="stable")

    def switch(self, row: Any) -> dict[str, float]:
        """A CoMERA run's stage switch: step, TT size (from its settings), accuracy right after it and
        the TT size at the end (from its curves); empty when the late stage never started."""
        info = dict(settings_of(row).get("method", {}).get("switch") or {})
        if not info.get("step"):
            return {}
        acc = self.series(row.run_id, "eval", "accuracy")
        acc = acc[acc.step == info["step"]]
        info["accuracy"] = float(acc.value.iloc[-1]) if len(acc) else None
        info["size_end"] = self.tt_size(row.run_id)
        return info

    def still_learning(self, row: Any) -> str:
        """:func:`still_learning` of a quality cell's validation accuracy; "" for a timing cell, whose few
        steps are not meant to converge."""
        if row.purpose != QUALITY:
            return ""
        return still_learning(self.series(row.run_id, "eval", "accuracy"))

    def tt_size(self, run_id: str, first: bool = False) -> float | None:
        """A run's TT size (curves method/params_tt, recorded after every step): the last record, or with
        ``first`` the one after the first step (the size before training unless that step pruned)."""
        c = self.series(run_id, "method", "params_tt")
        return float(c.value.iloc[0 if first else -1]) if len(c) else None

    def settings_line(self, workload: str | None = None, runs: pd.DataFrame | None = None) -> str:
        """Device + settings for captions: device name, threads, torch, workload params and budget of the
        first of ``runs`` (default: the workload's runs, timing cells first)."""
        if runs is None:
            runs = self.runs if workload is None else self.runs[self.runs.workload == workload]
            runs = runs.loc[(~is_timing(runs)).sort_values(kind="stable").index]
        if not len(runs):
            return f"device {self.label}: no runs"
        first = runs.iloc[0]
        threads = f"{first.num_threads} thread" + ("" if pd.notna(first.num_threads) and first.num_threads == 1 else "s")
        parts = [f"device {self.label} ({first.device_name}, {first.device}, {threads})",
                 f"torch {first.torch_version}"]
        spec = self.cells.get(first.run_id)
        if spec is not None and workload is not None:
            params = ", ".join(f"{k}={v}" for k, v in sorted(spec["workload_params"].items())) or "defaults"
            parts.append(f"{workload} [{params}]")
            parts.append(budget_text(spec["budget"]))
        kinds = sorted(runs.peak_mem_kind.dropna().unique())
        if kinds:
            parts.append("memory = " + "/".join(kinds))
        return "; ".join(parts)


def load(folder: str | Path, label: str | None = None) -> Results:
    """Read results/<device>/ (runs.parquet required; curves, microbench, grid.json when present).

    Args:
        folder: the device's merged results folder.
        label: the device's name in the reports (default: the folder's name).

    Returns:
        The folder's :class:`Results` (ResultsError naming a table of another schema).
    """
    folder = Path(folder)
    if not (folder / "runs.parquet").is_file():
        found = sorted(str(p.parent) for p in folder.glob("*/runs.parquet")) if folder.is_dir() else []
        raise ResultsError(f"{folder} holds no merged runs.parquet: give a results/<device> folder (after "
                           "`snakemake ... figures` or `comera-bench merge`)"
                           + (f"; below it: {', '.join(found)}" if found else ""))
    runs = read_parquet(folder / "runs.parquet", "runs")

    def optional(name: str, kind: str) -> pd.DataFrame:
        path = folder / name
        return read_parquet(path, kind) if path.exists() else empty_frame(kind)

    grid = json.loads((folder / "grid.json").read_text()) if (folder / "grid.json").exists() else {}
    return Results(label or folder.name, runs, optional("curves.parquet", "curves"),
                   optional("microbench.parquet", "microbench"), grid.get("cells", {}),
                   grid.get("sweeps", {}))
