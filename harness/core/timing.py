"""Whether a timing can be trusted, measured while a cell runs (harness.results.analysis reads the rows).

:class:`MachineState`, the verdicts :func:`judge` and :func:`judge_rounds`, the rounds
(:func:`round_bounds`, :func:`round_means`) and :func:`quartiles`. Columns and thresholds:
docs/measurement.md.
"""
from __future__ import annotations

import math
import numbers
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

STABLE = "stable"
"""The verdict of a row whose timing crosses no threshold."""
MIN_TIMED_STEPS = 5
"""Fewer timed steps than this: too few for a median."""
MAX_IQR_OVER_MEDIAN = 0.25
"""Inter-quartile range of the step times above this share of their median: the steps disagree."""
MAX_MEAN_OVER_MEDIAN = 1.5
"""Mean step time (whole windows of periodic work) above this multiple of the median: outliers dominate.
Not applied to a cell whose rounds hold whole periods of its periodic work (:func:`judge`)."""
MIN_ROUNDS_FOR_SPREAD = 3
"""A cell with periodic work is judged by the spread of its per-round means from this many rounds on."""
MIN_ROUNDS = 2
"""Fewer rounds than this: a thing timed round by round (:func:`judge_rounds`) has no spread to judge."""
MAX_RUN_QUEUE_FRAC = 0.10
"""The cell's threads waited for a CPU more than this share of their runnable time: other work competed."""
MAX_CPU_PRESSURE = 0.25
"""Some task of the machine waited for a CPU during more than this share of the timed wall time."""

_PSI = Path("/proc/pressure/cpu")
_TASKS = Path("/proc/self/task")


# ------------------------------------------------------------------------------------- machine state

def psi_some_us() -> int | None:
    """Total microseconds some task waited for a CPU since boot (PSI), or None without PSI."""
    try:
        for line in _PSI.read_text().splitlines():
            if line.startswith("some"):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def schedstat_ns() -> tuple[int, int] | None:
    """(time on a CPU, time waiting on a run queue) in ns, summed over the process's threads."""
    on_cpu = waiting = 0
    try:
        tasks = list(_TASKS.iterdir())
    except OSError:
        return None
    seen = False
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            on_cpu += int(fields[0])
            waiting += int(fields[1])
            seen = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return (on_cpu, waiting) if seen else None


def load_avg_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def busy_load(threads: int) -> str:
    """"1-minute load average L on N CPUs" when the machine is already busier than a job asking for
    ``threads`` CPU threads can afford (the load above the CPUs left for it), else ''."""
    load, cpus = load_avg_1m(), os.cpu_count() or 1
    if load is None or load <= max(cpus - threads, 0) + 1.0:
        return ""
    return f"1-minute load average {load:.1f} on {cpus} CPUs"


def slowdown(load: float, cpus: int, threads: int) -> float:
    """How many times its quiet-machine time a job with ``threads`` CPU threads takes while ``load`` other
    tasks are runnable on ``cpus`` CPUs, if the CPUs are shared fairly (at least 1; a lower bound: threads
    that wait for each other at every parallel step lose more)."""
    alone = min(threads, cpus)
    shared = threads * cpus / (load + threads) if load + threads > cpus else alone
    return max(alone / shared, 1.0)


def busy_warning(threads: int, command: str = "") -> str:
    """A warning when the machine is already busier than a cell asking for ``threads`` CPU threads can
    afford ('' when it is not): the 1-minute load average above the CPUs left for the cell; how many
    times longer than on a quiet machine the cells will take (:func:`slowdown`); and ``command``, the
    run with one thread per cell, to type if the user wants to run anyway."""
    text = busy_load(threads)
    if not text:
        return ""
    load, cpus = load_avg_1m() or 0.0, os.cpu_count() or 1
    factor = slowdown(load, cpus, threads)
    warning = (f"the machine is busy ({text}) while each cell asks for {threads} thread(s): every cell, "
               f"and so the run, will take about {factor:.0f}x its time on a quiet machine or longer (the "
               "CPUs shared with the other jobs); timings will be noisy: cells whose timing is not stable "
               "are named at the end and left out of every verdict. Stop it (Ctrl-C) and run it when the "
               "machine is quiet")
    if command:
        warning += (", or run it anyway with one thread per cell, which waits less for a CPU (the cells "
                    f"record 1 thread; cells timed with {threads} run again): {command}")
    return warning + "."


@dataclass
class MachineState:
    """The machine's state over the segments in which a cell's steps ran (docs/measurement.md, "The
    machine's state")."""

    wall_s: float = 0.0
    psi_us: int | None = None
    on_cpu_ns: int | None = None
    waiting_ns: int | None = None
    load_max: float | None = None
    _start: tuple[float, int | None, tuple[int, int] | None] | None = field(default=None, repr=False)

    def _load(self) -> None:
        load = load_avg_1m()
        if load is not None:
            self.load_max = load if self.load_max is None else max(self.load_max, load)

    def begin(self) -> None:
        """Start a segment (idempotent while one is open)."""
        if self._start is None:
            self._load()
            self._start = (time.perf_counter(), psi_some_us(), schedstat_ns())

    def end(self) -> None:
        """Close the open segment, adding its deltas."""
        if self._start is None:
            return
        wall0, psi0, sched0 = self._start
        self._start = None
        self.wall_s += time.perf_counter() - wall0
        psi1, sched1 = psi_some_us(), schedstat_ns()
        if psi0 is not None and psi1 is not None:
            self.psi_us = (self.psi_us or 0) + psi1 - psi0
        if sched0 is not None and sched1 is not None:
            self.on_cpu_ns = (self.on_cpu_ns or 0) + max(sched1[0] - sched0[0], 0)
            self.waiting_ns = (self.waiting_ns or 0) + max(sched1[1] - sched0[1], 0)
        self._load()

    def columns(self) -> dict[str, float | None]:
        """The runs columns load_avg_1m, cpu_pressure and run_queue_frac."""
        pressure = (min(self.psi_us / 1e6 / self.wall_s, 1.0)
                    if self.psi_us is not None and self.wall_s > 0 else None)
        busy = (self.on_cpu_ns or 0) + (self.waiting_ns or 0)
        queue = self.waiting_ns / busy if self.waiting_ns is not None and busy > 0 else None
        return {"load_avg_1m": self.load_max, "cpu_pressure": pressure, "run_queue_frac": queue}


def cpu_time_ratio(cpu_ms: Sequence[float], wall_ms: Sequence[float], num_threads: int) -> float | None:
    """The process's CPU time over wall time x threads during the timed steps (None without steps)."""
    wall = sum(wall_ms)
    return sum(cpu_ms) / (wall * num_threads) if wall > 0 and num_threads > 0 else None


# ------------------------------------------------------------------------------------------ verdicts

def finite(value: Any) -> bool:
    """Whether ``value`` is a finite real number (Python's or numpy's; not a bool, None, NaN or pd.NA)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def relative_iqr(values: Sequence[float | None]) -> float | None:
    """The inter-quartile range of the finite ``values`` over their median (:func:`quartiles`); None for
    fewer than two values or a median that is not positive. The one spread test of per-round times: a
    cell's per-round mean step times (:func:`judge`) and a micro-benchmark's per-round times."""
    kept = [v for v in values if finite(v)]
    if len(kept) < 2:
        return None
    q1, mid, q3 = quartiles(kept)
    return (q3 - q1) / mid if mid > 0 else None


def spread_reason(values: Sequence[float | None], what: str) -> str:
    """``"<what> spread N% of their median (> 25%)"`` when :func:`relative_iqr` of ``values`` is above
    :data:`MAX_IQR_OVER_MEDIAN`, else ''."""
    spread = relative_iqr(values)
    if spread is None or spread <= MAX_IQR_OVER_MEDIAN:
        return ""
    return f"{what} spread {spread:.0%} of their median (> {MAX_IQR_OVER_MEDIAN:.0%})"


def ordinary_steps(step_ms: Sequence[float], step_index: Sequence[int], period: int) -> list[float]:
    """The steps without the periodic work: ``step_ms`` less the steps at the place in the period
    (``step_index`` mod ``period``) whose median time is the highest. The steps at one place in the period
    do the same work, so what spreads among the others is noise; where the periodic work costs no more
    than a step, the place left out is one of ordinary steps.

    Args:
        step_ms: the counted steps' times.
        step_index: each step's index among all the cell's steps.
        period: the steps between two periodic steps (at least 2).

    Returns:
        The times of the steps at every other place in the period, in their order.
    """
    by_place: dict[int, list[float]] = {}
    for i, ms in zip(step_index, step_ms):
        by_place.setdefault(i % period, []).append(ms)
    costly = max(by_place, key=lambda place: statistics.median(by_place[place]), default=None)
    return [ms for i, ms in zip(step_index, step_ms) if i % period != costly]


def judge(*, step_time_ms: float | None, step_time_ms_iqr: float | None, steps_timed: int | None,
          step_time_ms_mean: float | None = None, run_queue_frac: float | None = None,
          cpu_pressure: float | None = None, outside_rounds: bool = False, period: int | None = None,
          round_means: Sequence[float | None] = (), step_ms: Sequence[float] = (),
          step_index: Sequence[int] = (), untimed: Sequence[str] = ()) -> str:
    """``stable`` or ``noisy: <reason>; <reason>`` from the thresholds of this module.

    Args:
        step_time_ms, step_time_ms_iqr, steps_timed, step_time_ms_mean: the row's step-time summary
            (harness.core.measure.StepTimer.summary).
        run_queue_frac, cpu_pressure: the machine's state (:class:`MachineState`).
        outside_rounds: a cell of a timing group that was not timed in its group's rounds (its
            coordinator unreachable).
        period: the cell's periodic work (steps between two of its periodic steps) when its rounds hold
            whole periods of it (:class:`Rounds` ``period``), else None.
        round_means: the mean step time of each round (:func:`round_means`).
        step_ms, step_index: the counted steps' times and their indices among all the cell's steps
            (harness.core.measure.StepTimer ``timed_ms``, ``timed_index``); used with a ``period``.
        untimed: the periodic work that is in none of the step times, in words (:meth:`PeriodicPlan.text`
            of a :data:`NOT_TIMED` plan): each a reason (the mean would leave it out).

    Returns:
        The verdict. With a ``period`` and the steps, the IQR test is of the steps without the periodic
        work (:func:`ordinary_steps`): with a period of 4 steps or fewer the periodic steps reach the
        third quartile of all steps, whose IQR then measures the periodic work, not noise. With a
        ``period`` and at least :data:`MIN_ROUNDS_FOR_SPREAD` round means, the spread of the round means
        is judged (relative IQR above :data:`MAX_IQR_OVER_MEDIAN`: noisy) instead of the mean / median
        test, which periodic work crosses by design (every 5th step at 5x: mean 1.8x the median);
        otherwise the mean / median test (:data:`MAX_MEAN_OVER_MEDIAN`), which catches outliers.
    """
    reasons = []
    if outside_rounds:
        reasons.append("not timed in its group's interleaved rounds (no round coordinator reached)")
    if not steps_timed or steps_timed < MIN_TIMED_STEPS:
        reasons.append(f"{steps_timed or 0} timed steps (< {MIN_TIMED_STEPS})")
    by_rounds = bool(period) and sum(finite(m) for m in round_means) >= MIN_ROUNDS_FOR_SPREAD
    if period and step_ms:
        spread = relative_iqr(ordinary_steps(step_ms, step_index, period))
        if spread is not None and spread > MAX_IQR_OVER_MEDIAN:
            reasons.append(f"IQR {spread:.0%} of the median of the steps without the periodic work (every "
                           f"{period} steps; > {MAX_IQR_OVER_MEDIAN:.0%})")
    if finite(step_time_ms) and step_time_ms > 0:
        if (not (period and step_ms) and finite(step_time_ms_iqr)
                and step_time_ms_iqr / step_time_ms > MAX_IQR_OVER_MEDIAN):
            reasons.append(f"IQR {step_time_ms_iqr / step_time_ms:.0%} of the median "
                           f"(> {MAX_IQR_OVER_MEDIAN:.0%})")
        if (not by_rounds and finite(step_time_ms_mean)
                and step_time_ms_mean / step_time_ms > MAX_MEAN_OVER_MEDIAN):
            reasons.append(f"mean {step_time_ms_mean / step_time_ms:.2f}x the median "
                           f"(> {MAX_MEAN_OVER_MEDIAN:g}x)")
    if by_rounds:
        spread = spread_reason(round_means, f"per-round mean step times (rounds of whole periods of {period} "
                                            "steps)")
        if spread:
            reasons.append(spread)
    reasons += machine_reasons(run_queue_frac, cpu_pressure)
    reasons += list(untimed)
    return "noisy: " + "; ".join(reasons) if reasons else STABLE


def machine_reasons(run_queue_frac: float | None, cpu_pressure: float | None) -> list[str]:
    """The machine's state past its thresholds (:data:`MAX_RUN_QUEUE_FRAC`, :data:`MAX_CPU_PRESSURE`), in
    words; [] when neither is crossed or measured."""
    reasons = []
    if finite(run_queue_frac) and run_queue_frac > MAX_RUN_QUEUE_FRAC:
        reasons.append(f"its threads waited for a CPU {run_queue_frac:.0%} of their runnable time "
                       f"(> {MAX_RUN_QUEUE_FRAC:.0%})")
    if finite(cpu_pressure) and cpu_pressure > MAX_CPU_PRESSURE:
        reasons.append(f"CPU pressure {cpu_pressure:.0%} (> {MAX_CPU_PRESSURE:.0%})")
    return reasons


def judge_rounds(values: Sequence[float | None], what: str = "per-round times", *,
                 run_queue_frac: float | None = None, cpu_pressure: float | None = None) -> str:
    """``stable`` or ``noisy: <reasons>`` for one thing timed round by round without a cell's steps (a
    micro-benchmark case, a performance-bench run, the halving's alternated rounds: their per-round values,
    harness.core.measure.time_rounds): fewer than :data:`MIN_ROUNDS` finite rounds (no spread to judge: one
    round of one block has an IQR of 0), per-round values spread more than a cell's round means may
    (:func:`spread_reason`), or the machine's state while they ran (:func:`machine_reasons`)."""
    reasons = []
    counted = sum(finite(v) for v in values)
    if counted < MIN_ROUNDS:
        reasons.append(f"{what}: {counted} round(s) (< {MIN_ROUNDS})")
    reasons += [r for r in [spread_reason(values, what)] if r] + machine_reasons(run_queue_frac, cpu_pressure)
    return "noisy: " + "; ".join(reasons) if reasons else STABLE


# ------------------------------------------------------------------------------------------- rounds

def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (inclusive method; one value is all three).

    Args:
        values: at least one number.

    Returns:
        (q1, median, q3).
    """
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _by_round(step_ms: Sequence[float], step_round: Sequence[int], summary: Any) -> list[float | None]:
    if not step_round:
        return []
    by_round: dict[int, list[float]] = {}
    for ms, r in zip(step_ms, step_round):
        by_round.setdefault(r, []).append(ms)
    return [summary(by_round[r]) if r in by_round else None for r in range(max(step_round) + 1)]


def round_medians(step_ms: Sequence[float], step_round: Sequence[int]) -> list[float | None]:
    """Median step time of each round (None for a round without a timed step).

    Args:
        step_ms: the counted steps' times.
        step_round: the round of each of those steps.

    Returns:
        One value per round, rounds 0 to the last.
    """
    return _by_round(step_ms, step_round, statistics.median)


def round_means(step_ms: Sequence[float], step_round: Sequence[int]) -> list[float | None]:
    """Mean step time of each round: the round's total time over its counted steps, so that periodic
    work (every k-th step) is counted (None for a round without a timed step).

    Args:
        step_ms: the counted steps' times.
        step_round: the round of each of those steps.

    Returns:
        One value per round, rounds 0 to the last.
    """
    return _by_round(step_ms, step_round, statistics.fmean)


@dataclass(frozen=True)
class Rounds:
    """Where a cell's timing rounds start (:func:`round_bounds`).

    Attributes:
        starts: the step index (0-based) at which each round starts; the first is the first counted step.
        period: the period of the cell's periodic work when every round's counted steps are a whole
            number of periods of it, else None.
        alignment: how the rounds were laid out, in words (a row's ``extra.round_alignment``).
    """

    starts: list[int]
    period: int | None
    alignment: str


def round_bounds(first_timed: int, total_steps: int, rounds: int, steps_per_round: int = 1,
                 period: int | None = None) -> Rounds:
    """Split the timed steps into rounds.

    Args:
        first_timed: the first step after warm-up.
        total_steps: the steps the cell runs.
        rounds: the rounds asked for (``execution.rounds``).
        steps_per_round: at least this many steps to a round (2 when a round's first step is a re-warm
            step that is not counted: interleaved rounds).
        period: the cell's periodic work, every ``period`` steps (a method's ``time_window_steps``:
            GaLore's projection update, CoMERA's pruning, LTE's merge); None or 1 for none.

    Returns:
        The :class:`Rounds`. Without a period, the timed steps split evenly. With one, every round's
        counted steps (those after its re-warm step) are a whole number of periods -- any ``n x period``
        consecutive steps hold exactly ``n`` periodic steps, so each round's mean counts the periodic work
        at its true rate --, in as many rounds as asked where the timed steps hold a period for each,
        else in fewer, down to 2 (1 when 1 was asked); the timed steps left over (fewer than a period) go
        to the warm-up before the first round. Where even that does not fit, the rounds split evenly and
        ``period`` is None.
    """
    timed = max(total_steps - first_timed, 0)
    rewarm = max(steps_per_round - 1, 0)
    if period and period > 1 and timed:
        for count in range(max(rounds, 1), min(rounds, 2) - 1, -1):
            whole = (timed - count * rewarm) // period
            if whole >= count:
                left = timed - count * rewarm - whole * period
                starts, step = [], first_timed + left
                for r in range(count):
                    starts.append(step)
                    step += rewarm + period * ((r + 1) * whole // count - r * whole // count)
                fewer = f" (fewer than the {rounds} asked)" if count < rounds else ""
                spare = f"; the first {left} timed step(s) added to the warm-up" if left else ""
                return Rounds(starts, period, f"{count} rounds{fewer} of whole periods of {period} steps "
                                              f"({whole} periods in all){spare}")
        plain = round_bounds(first_timed, total_steps, rounds, steps_per_round)
        return Rounds(plain.starts, None, f"not aligned: {timed} timed steps hold fewer than "
                                          f"{min(rounds, 2)} round(s) of a whole period of {period} steps; "
                                          f"{len(plain.starts)} rounds split evenly")
    count = max(1, min(rounds, timed // max(steps_per_round, 1))) if timed else 1
    return Rounds([first_timed + (r * timed) // count for r in range(count)], None,
                  f"no periodic work declared: {count} round(s) split evenly")


# ------------------------------------------------------------------------------------ periodic work

WHOLE_PERIODS, NATURAL, FORCED, NOT_TIMED = "whole periods", "timed where it fell", "forced", "not timed"
"""How a cell's periodic work was timed (:class:`PeriodicPlan` ``how``; docs/measurement.md, "Periodic
work")."""


@dataclass(frozen=True)
class PeriodicPlan:
    """How one periodic work of a cell (a method's ``Prepared.periodic`` entry) is timed.

    Attributes:
        every: the steps between two of its periodic steps.
        how: :data:`WHOLE_PERIODS` (the rounds hold whole periods of it: every round's mean counts it at
            its rate), :data:`NATURAL` (counted steps that do it on schedule are timed apart and added at
            1 / ``every``), :data:`FORCED` (no counted step does it on schedule: the method is made to do it
            on one counted step, timed apart and added at 1 / ``every``) or :data:`NOT_TIMED`.
        steps: the counted steps (0-based indices among all the cell's steps) that do it.
    """

    every: int
    how: str
    steps: tuple[int, ...] = ()

    def text(self, name: str) -> str:
        """How it was timed, in words (a row's ``extra.periodic`` entry ``timed``)."""
        head, at = f"{name} every {self.every} steps: ", ", ".join(map(str, self.steps))
        return head + {
            WHOLE_PERIODS: "rounds of whole periods (each round's mean counts it at its rate)",
            NATURAL: f"its step(s) {at} timed apart, added at 1/{self.every} per step",
            FORCED: f"none on a counted step, so made to run at step {at}, timed apart, added at "
                    f"1/{self.every} per step",
            NOT_TIMED: "on no counted step, and the method cannot be made to run it: not in the step times",
        }[self.how]


def counted_steps(rounds: Rounds, total_steps: int, rewarm: bool) -> list[int]:
    """The steps a cell's step times count: from its first round's start to ``total_steps``, less each
    round's first step where ``rewarm`` (interleaved rounds: the step after a pause is not counted)."""
    starts = set(rounds.starts) if rewarm else set()
    return [s for s in range(rounds.starts[0], total_steps) if s not in starts]


def plan_periodic(rounds: Rounds, total_steps: int, rewarm: bool,
                  works: dict[str, tuple[int, int, bool]]) -> dict[str, PeriodicPlan]:
    """How each periodic work of a cell is timed (:class:`PeriodicPlan`).

    Args:
        rounds: the cell's rounds (:func:`round_bounds`; ``period`` set where they hold whole periods).
        total_steps: the steps the cell runs.
        rewarm: whether each round's first step is left uncounted (interleaved rounds).
        works: name -> (every, phase, forceable): the work runs on step s when s % every == phase;
            ``forceable``: the method can be made to run it on a chosen step.

    Returns:
        name -> plan, for each work with ``every`` > 1: whole periods where the rounds hold them; else the
        counted steps on its schedule; else, if forceable, the last counted step of the round with the most
        counted steps (the middle one of a tie), a step no other work uses; else :data:`NOT_TIMED`.

    Example:
        >>> r = round_bounds(2, 16, 5, steps_per_round=2)
        >>> plan_periodic(r, 16, True, {"svd": (20, 0, True)})["svd"]
        PeriodicPlan(every=20, how='forced', steps=(9,))
    """
    counted = counted_steps(rounds, total_steps, rewarm) if rounds.starts else []
    by_round: dict[int, list[int]] = {}
    bounds = [*rounds.starts, total_steps]
    for s in counted:
        r = max(i for i, start in enumerate(rounds.starts) if start <= s)
        by_round.setdefault(r, []).append(s)
    plans, taken = {}, set()
    for name, (every, phase, forceable) in works.items():
        if every <= 1:
            continue
        natural = tuple(s for s in counted if s % every == phase % every)
        if rounds.period == every:
            plans[name] = PeriodicPlan(every, WHOLE_PERIODS, natural)
        elif natural:
            plans[name] = PeriodicPlan(every, NATURAL, natural)
        elif forceable and counted:
            most = max(len(steps) for steps in by_round.values())
            widest = [r for r in sorted(by_round) if len(by_round[r]) == most]
            order = sorted(widest, key=lambda r: abs(r - (len(bounds) - 2) / 2))
            free = [s for r in order for s in reversed(by_round[r]) if s not in taken]
            plans[name] = PeriodicPlan(every, FORCED, (free[0],)) if free else PeriodicPlan(every, NOT_TIMED)
        else:
            plans[name] = PeriodicPlan(every, NOT_TIMED)
        taken.update(plans[name].steps)
    return plans


@dataclass(frozen=True)
class Weighted:
    """A cell's step times with its periodic work at its rate (:func:`weigh_periodic`).

    Attributes:
        mean_ms: the ordinary steps' mean plus each periodic work's extra cost over ``every``.
        round_means: each round's ordinary steps' mean plus the same (None for a round without one).
        ordinary_ms: the counted steps that do no periodic work.
        extra_ms: name -> the periodic steps' mean time less the ordinary steps' median.
    """

    mean_ms: float
    round_means: list[float | None]
    ordinary_ms: list[float]
    extra_ms: dict[str, float]


def weigh_periodic(step_ms: Sequence[float], step_index: Sequence[int], step_round: Sequence[int],
                   plans: dict[str, PeriodicPlan]) -> Weighted | None:
    """The mean step time with periodic work timed apart and added at its rate:
    mean = mean(ordinary steps) + sum over works of (mean(its steps) - median(ordinary steps)) / every,
    i.e. ((every - 1) ordinary steps + one periodic step) / every for one work.

    Args:
        step_ms: the counted steps' times.
        step_index: each counted step's index among all the cell's steps.
        step_round: each counted step's round.
        plans: :func:`plan_periodic`'s plans; those :data:`NATURAL` or :data:`FORCED` with a timed step
            are weighed.

    Returns:
        The :class:`Weighted` times, or None when no plan is weighed or no ordinary step is left.

    Example:
        >>> plans = {"svd": PeriodicPlan(10, FORCED, (3,))}
        >>> weigh_periodic([10, 10, 10, 110], [0, 1, 2, 3], [0, 0, 1, 1], plans).mean_ms
        20.0
    """
    timed = {name: [ms for ms, i in zip(step_ms, step_index) if i in plan.steps]
             for name, plan in plans.items() if plan.how in (NATURAL, FORCED)}
    timed = {name: values for name, values in timed.items() if values}
    periodic = {i for name in timed for i in plans[name].steps}
    ordinary = [(ms, r) for ms, i, r in zip(step_ms, step_index, step_round) if i not in periodic]
    if not timed or not ordinary:
        return None
    base = statistics.median(ms for ms, _ in ordinary)
    extra = {name: statistics.fmean(values) - base for name, values in timed.items()}
    add = sum(extra[name] / plans[name].every for name in extra)
    means = round_means([ms for ms, _ in ordinary], [r for _, r in ordinary])
    return Weighted(statistics.fmean(ms for ms, _ in ordinary) + add,
                    [m + add if m is not None else None for m in means],
                    [ms for ms, _ in ordinary], extra)
