"""Targets 2 and 4: full training steps of the six-encoder transformer, one process per configuration.

Each configuration is an ordinary cell (harness.perf.worker) of one timing group; each ratio is
harness.results.analysis.ratio on the cells' rows (docs/performance.md).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from harness.core import interleave, measure
from harness.perf.config import Config
from harness.perf.report import BenchRow, make_row, per_round_text, quotient, value_of
from harness.perf.roofline import Roofline
from harness.results import analysis

STEP_CONFIGS = {  # name -> workload size (full, quick), method, batch size (full, quick), timed steps (full)
    "dense_b32": (("paper", "tiny"), "dense", (32, 8), 3),
    "comera_b32": (("paper", "tiny"), "comera", (32, 8), 3),
    "galore_b1": (("paper", "tiny"), "galore", (1, 1), 10),  # batch-1 steps are short: more of them
    "comera_b1": (("paper", "tiny"), "comera", (1, 1), 10),
    "small_dense_b32": (("small", "tiny"), "dense", (32, 8), 10),
    "small_comera_b32": (("small", "tiny"), "comera", (32, 8), 10),
    "small_dense_b1": (("small", "tiny"), "dense", (1, 1), 20),
    "small_comera_b1": (("small", "tiny"), "comera", (1, 1), 20),
}
STEP_ROWS = [  # goal key under "step", numerator and denominator configuration, measured key, better
    ("paper.speedup_vs_dense_b32", "dense_b32", "comera_b32", "step_time_ms", ">="),
    ("paper.memory_vs_dense_b32", "comera_b32", "dense_b32", "peak_mem_bytes", "<="),
    ("paper.speedup_vs_galore_b1", "galore_b1", "comera_b1", "step_time_ms", ">="),
    ("paper.memory_saving_vs_galore_b1", "galore_b1", "comera_b1", "peak_mem_bytes", ">="),
    ("small.speedup_vs_dense_b32", "small_dense_b32", "small_comera_b32", "step_time_ms", ">="),
    ("small.speedup_vs_dense_b1", "small_dense_b1", "small_comera_b1", "step_time_ms", ">="),
]
METHOD_NAMES = {"dense": "uncompressed", "galore": "GaLore", "comera": "CoMERA"}
OTHER_NAMES = {"dense": "the uncompressed model", "galore": "GaLore"}


def step_jobs(cfg: Config, targets: set[int]) -> dict[str, dict[str, Any]]:
    """The subprocess jobs targets 2 and 4 need (4 reuses comera_b32, which then also halves)."""
    names = set(STEP_CONFIGS) if 2 in targets else {"comera_b32"}
    jobs = {}  # two warm-up steps in full runs: under "reuse" the heap grows during the first steps
    for name, (sizes, method, batches, steps) in STEP_CONFIGS.items():
        if name in names:
            jobs[name] = {"method": method, "batch_size": batches[cfg.quick],
                          "workload_params": {"size": sizes[cfg.quick]}, "device": cfg.device.type, "seed": 0,
                          "threads": cfg.num_threads, "warmup": 1 if cfg.quick else 2,
                          "steps": 2 if cfg.quick else steps,
                          "halve": name == "comera_b32" and 4 in targets, "threshold": 1e-2,
                          "allocator": cfg.allocator}
    return jobs


def amdahl_bound(share: float, layer_speedup: float) -> float:
    """Step speedup when a share ``share`` of the step gets ``layer_speedup`` times faster."""
    return 1.0 / ((1.0 - share) + share / layer_speedup)


def before_halving(result: dict[str, Any], key: str) -> float | None:
    """What target 4 compares with ``{key}_halved`` (``key``: "step_time_ms" or "tt_layers_ms"): the full-rank
    model's median from the rounds alternating with its halved copy (``{key}_before_halving``), else the
    value measured before halving (``{key}``)."""
    return result.get(f"{key}_before_halving") or result.get(key)


HALVING = "the full-rank model and its halved copy alternating in rounds"


def halving_ratio(result: dict[str, Any], key: str) -> analysis.Ratio | None:
    """Before / after halving for ``key`` ("step_time_ms" or "tt_layers_ms"): the analysis layer's ratio of
    the alternated rounds' times (harness.results.analysis.rounds_ratio), else the ratio of the two values."""
    pairs = result.get(f"{key}_halving_rounds")
    if pairs:
        return analysis.rounds_ratio([b for b, _ in pairs], [a for _, a in pairs], basis=HALVING)
    value = quotient(before_halving(result, key), result.get(f"{key}_halved"))
    return analysis.Ratio(value, value, value, basis=analysis.VALUES) if value is not None else None


def halving_speedup(result: dict[str, Any], key: str) -> tuple[float | None, str]:
    """:func:`halving_ratio`'s value and ``"; per round ..."`` when it has several rounds (else "")."""
    r = halving_ratio(result, key)
    return value_of(r), per_round_text(r)


def halving_verdict(result: dict[str, Any], *keys: str) -> str:
    """The stability of the alternated rounds of ``keys`` (the spread of each side's per-round times,
    harness.results.analysis.rounds_verdict); "" without alternated rounds."""
    times = {}
    for key in keys:
        pairs = result.get(f"{key}_halving_rounds")
        if pairs:
            what = "steps" if key == "step_time_ms" else "layers"
            times.update({f"full-rank {what}": [b for b, _ in pairs],
                          f"halved {what}": [a for _, a in pairs]})
    return analysis.rounds_verdict(times) if times else ""


def profile_mismatch(step: float | None, layers: float | None) -> str:
    """Why a profile cannot be used: its tensorized layers, each re-run alone, took longer than the whole
    step they are part of ("" when the profile is consistent or not measured). A busy machine does this:
    a lone layer's median comes from few blocks of a 0.1 s timer, the step's from its rounds."""
    if not (step and layers) or layers < step:
        return ""
    return (f"profile not used: the tensorized layers re-run alone took {layers:.1f} ms, more than the "
            f"{step:.1f} ms step they are part of (timed at another moment: a busy machine?)")


def amdahl_estimate(result: dict[str, Any]) -> float | None:
    """Target 4's Amdahl estimate from a step worker's result (None when it was not measured, or its
    profile is inconsistent: :func:`profile_mismatch`)."""
    step, layers = before_halving(result, "step_time_ms"), before_halving(result, "tt_layers_ms")
    speedup, _ = halving_speedup(result, "tt_layers_ms")
    if not (step and layers and speedup) or profile_mismatch(step, layers):
        return None
    return amdahl_bound(layers / step, speedup)


def amdahl_note(result: dict[str, Any]) -> str:
    """How target 4's Amdahl estimate comes about ("" when it was not measured; why not, when its
    profile is inconsistent)."""
    step, layers = before_halving(result, "step_time_ms"), before_halving(result, "tt_layers_ms")
    estimate = amdahl_estimate(result)
    if estimate is None:
        return profile_mismatch(step, layers)
    share = layers / step
    speedup, _ = halving_speedup(result, "tt_layers_ms")
    return (f"Amdahl: TT/TTM layers fwd+bwd take f={share:.2f} of the step before halving "
            f"({layers:.1f} of {step:.1f} ms, {result.get('tt_layers_seen')} of "
            f"{result.get('tt_layers')} tensorized modules, each re-run alone on its step input), "
            f"s={speedup:.2f}x faster after halving ({result['tt_layers_ms_halved']:.1f} ms): "
            f"Amdahl estimate 1/((1-f)+f/s) = {estimate:.2f}x; even s=inf gives "
            f"{1 / (1 - share) if share < 1 else float('inf'):.2f}x (the step also sheds work the lone "
            f"layers do not show: the fused feed-forward's recomputation, smaller gate/penalty terms)")


def halving_note(flop_ratio: float | None, traffic_ratio: float | None) -> str:
    """What halving every rank removes from the tensorized layers ("" when not counted)."""
    if not flop_ratio:
        return ""
    return (f"halving every rank cuts the layers' matmul FLOPs {flop_ratio:.2f}x and their compulsory "
            f"traffic {traffic_ratio or float('nan'):.2f}x (FlopCounterMode and the traffic counter on "
            "the same re-runs): the token-sized products scale with the bond rank (2x), only the core "
            "merges with its square, and x and y are read and written whatever the rank, so the layers' time "
            "can fall at most by the FLOP ratio (the bound column: the roofline of both counts where "
            "measured)")


def free_layers_cap(comera: dict[str, Any], other: dict[str, Any]) -> float | None:
    """``other``'s step time / the rest of the CoMERA step: the ratio if CoMERA's tensorized layers took no
    time (None when not measured or inconsistent: :func:`profile_mismatch`)."""
    step, layers, other_step = (comera.get("step_time_ms"), comera.get("tt_layers_ms"),
                                other.get("step_time_ms"))
    if not (step and layers and other_step) or profile_mismatch(step, layers):
        return None
    return other_step / (step - layers)


def share_note(comera: dict[str, Any], other_name: str) -> str:
    """Where a CoMERA step's time goes, from a step worker's result: the tensorized layers (each re-run
    alone) and the rest ("" when not measured; why not, when inconsistent: :func:`profile_mismatch`)."""
    step, layers = comera.get("step_time_ms"), comera.get("tt_layers_ms")
    mismatch = profile_mismatch(step, layers)
    if not (step and layers) or mismatch:
        return mismatch
    return (f"profile: tensorized layers fwd+bwd {layers:.1f} of the {step:.1f} ms CoMERA step "
            f"(f={layers / step:.2f}, {comera.get('tt_layers_seen')} modules re-run alone); the rest, "
            f"{step - layers:.1f} ms, is attention, GELU, LayerNorm, dropout, the other embeddings "
            f"and the loss, which {other_name} does too, and CoMERA's own rank penalty and l2 term and an "
            f"optimizer over its many small cores and gates: the bound column is the ratio even free "
            f"tensorized layers would give")


def _fmt_bytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def job_tag(job: dict[str, Any]) -> str:
    """A step configuration as it ran, e.g. ``tiny dense b8`` (a --quick run of ``dense_b32``)."""
    return f"{job['workload_params']['size']} {job['method']} b{job['batch_size']}"


def run_step_rounds(jobs: dict[str, dict[str, Any]], rounds: int, timeout_s: float,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, dict[str, Any]]:
    """Every configuration in its own process, all alive at once, timed in interleaved rounds by the
    coordinator of the pipeline's timing groups (harness.core.interleave): in each round one configuration
    at a time runs its timed steps, the order reversed every other round, so that a slow spell of the
    machine hits every configuration of a round; a last round (alone too) for the tensor peak, the
    profile and the halving. name -> the worker's result (harness.perf.worker.step_worker: the cell's runs
    columns, among them ``round_step_ms``, one median per
    round); ``{"error": ...}`` for a configuration that failed."""
    with tempfile.TemporaryDirectory(prefix="comera-bench-steps-") as tmp:
        cells = []
        for name, job in jobs.items():
            spec = Path(tmp) / f"{name}.json"
            spec.write_text(json.dumps({**job, "run_id": name, "rounds": rounds,
                                        "timing_group": TIMING_GROUP}))
            cells.append(interleave.Cell(str(spec), str(Path(tmp) / f"{name}.out.json"), "",
                                         str(Path(tmp) / f"{name}.log")))

        def command(cell: interleave.Cell) -> list[str]:
            return [sys.executable, "-m", "harness.perf.bench", "--step-worker-file", cell.spec,
                    "--step-out", cell.runs, "--step-log", cell.log]

        try:
            interleave.run_group(cells, rounds + 1, command=command, log=progress, timeout_s=timeout_s)
            timed_out = ""
        except TimeoutError:
            timed_out = f"timed out after {timeout_s:.0f} s"
        out = {}
        for name, cell in zip(jobs, cells):
            path, log = Path(cell.runs), Path(cell.log)
            if path.exists():
                out[name] = json.loads(path.read_text())
                continue
            tail = (log.read_text(errors="replace").strip().splitlines()
                    if log.exists() else []) or ["no output"]
            code = cell.proc.returncode if cell.proc is not None else None
            out[name] = {"error": timed_out or f"exit {code}: {tail[-1]}"}
    return out


TIMING_GROUP = "bench-steps"
"""The timing group of the step configurations' cells: timed together, so that the analysis layer pairs
their rounds (harness.results.analysis.timed_together)."""
COLUMNS = {"step_time_ms": analysis.TIME, "peak_mem_bytes": analysis.MEMORY}
"""A measured key of a step row -> the column the analysis layer's ratio is asked for."""


def step_ratio(results: dict[str, dict[str, Any]], num: str, den: str, key: str) -> analysis.Ratio | None:
    """``num`` / ``den`` (configurations) for ``key`` ("step_time_ms", "peak_mem_bytes" or another value of
    the results): harness.results.analysis.ratio on the two cells' rows -- for time, the median over the
    rounds of the ratio of the rounds' mean step times, the number the claims and figures give for the same
    pair -- whatever the rows' verdicts (the row shows them, :func:`step_verdict`); None where either
    configuration failed or the value is missing."""
    a, b = results.get(num, {}), results.get(den, {})
    if "error" in a or "error" in b:
        return None
    return analysis.ratio(a, b, COLUMNS.get(key, key), require_stable=False)


def target_steps(cfg: Config, targets: set[int], timeout_s: float,
                 progress: Callable[[str], None] = lambda line: None,
                 roof: Roofline | None = None) -> list[BenchRow]:
    """Targets 2 and 4 from one process per configuration, timed in interleaved rounds; each time ratio is
    the median over the rounds of the ratio within a round. ``roof`` (this machine's roofline) bounds
    target 4's layer speedup; without it the FLOP ratio does."""
    jobs = step_jobs(cfg, targets)
    res = run_step_rounds(jobs, cfg.step_rounds, timeout_s, progress)
    errors = "; ".join(f"{n}: {r['error']}" for n, r in res.items() if "error" in r)

    def get(name: str, key: str) -> float | None:
        return res.get(name, {}).get(key)

    def rounds_ratio(num: tuple[str, str], den: tuple[str, str]) -> tuple[float | None, str]:
        """:func:`step_ratio`'s value, and the per-round list when there are several rounds."""
        r = step_ratio(res, num[0], den[0], num[1])
        return value_of(r), per_round_text(r)

    def step_verdict(*names: str) -> str:
        """The cells' stability verdicts (their ``timing_quality``, harness.results.analysis.verdict_of);
        "" where a configuration failed."""
        if any("error" in res.get(name, {"error": ""}) for name in names):
            return ""
        return analysis.verdict_of({tag(name): res[name] for name in names})

    def tag(name: str) -> str:
        """What a configuration ran (size preset, method, batch), not its full-run name."""
        return job_tag(jobs[name])

    # The memory goals are the paper's GPU allocator peaks: on CUDA the cells' cuda_allocated (absolute, the
    # model included); on the CPU its analogue, the tensor-allocation peak the worker measures after the
    # steps (cpu_allocated). The cells' cpu_rss_delta (growth over the training region: the parameters,
    # allocated before it, do not count) follows each pair as an info row.
    memory_key = "tensor_peak_bytes" if cfg.device.type == "cpu" else "peak_mem_bytes"
    memory_kind = measure.CPU_ALLOCATED if cfg.device.type == "cpu" else measure.CUDA_ALLOCATED

    def pair(a: str, b: str, memory: str = "peak_mem_bytes") -> str:
        return f"{tag(a)} {get(a, 'step_time_ms') or float('nan'):.1f} ms / {_fmt_bytes(get(a, memory))}, " \
               f"{tag(b)} {get(b, 'step_time_ms') or float('nan'):.1f} ms / {_fmt_bytes(get(b, memory))}"

    kind = next((r["peak_mem_kind"] for r in res.values() if "peak_mem_kind" in r), "n/a")
    differing = sorted({r["allocator"] for r in res.values() if r.get("allocator", cfg.allocator_applied)
                        != cfg.allocator_applied})  # the workers normally apply what this process did
    some_job = next(iter(jobs.values()))
    counts = ", ".join(f"{tag(name)} {job['steps']}" for name, job in jobs.items())
    base = (f"one process per config, {cfg.step_rounds} interleaved round(s) "
            f"(harness.core.interleave; time ratio: median over rounds of the ratio of the rounds' mean step "
            f"times, harness.results.analysis.ratio), "
            f"median of timed steps ({counts}) after {some_job['warmup']} warm-up, memory {memory_kind}"
            + (f" (info rows: {kind})" if kind != memory_kind else "")
            + (f", worker allocator {' / '.join(differing)}" if differing else ""))

    def timing_note(name: str) -> str:
        """A configuration's timing verdict when it is not stable (the cells' judge,
        harness.core.timing.judge, in the runs column ``timing_quality``)."""
        quality = res.get(name, {}).get("timing_quality")
        return f"{tag(name)} timing {quality}" if quality and quality != "stable" else ""

    def settings(name: str) -> str:
        return f"transformer size={jobs[name]['workload_params']['size']}, {base}"

    rows = []
    if 2 in targets:
        for key, num, den, metric, better in STEP_ROWS:
            group, goal = key.split(".")
            comera, other = (den, num) if jobs[den]["method"] == "comera" else (num, den)
            size = jobs[comera]["workload_params"]["size"]
            preset = f", {size} preset" if group == "small" or cfg.quick else ""  # what ran (--quick: tiny)
            batch = f"batch {jobs[comera]['batch_size']}"
            if metric == "step_time_ms":
                what = f"CoMERA vs {METHOD_NAMES[jobs[other]['method']]} step speedup{preset}, {batch}"
                cap = free_layers_cap(res.get(comera, {}), res.get(other, {}))
                profile = share_note(res.get(comera, {}), OTHER_NAMES[jobs[other]["method"]])
                extra = {"bound": cap, "bound_basis": "free tensorized layers" if cap else "",
                         "stability": step_verdict(other, comera),
                         "note": "; ".join(filter(None, [profile, timing_note(other),
                                                         timing_note(comera), errors]))}
            else:
                names = f"{METHOD_NAMES[jobs[num]['method']]} / {METHOD_NAMES[jobs[den]['method']]}"
                what = f"{names} peak memory ({memory_kind}){preset}, {batch}"
                metric, extra = memory_key, {"note": errors}
            measured, per_round = rounds_ratio((num, metric), (den, metric))
            rows.append(make_row(2, what, cfg.goals["step"][group][goal], measured, better=better,
                                 goal_key=f"step.{key}", settings=settings(comera),
                                 medians=pair(other, comera, memory_key) + per_round, **extra))
            if metric == memory_key and cfg.device.type == "cpu" and get(comera, "peak_mem_bytes"):
                measured, _ = rounds_ratio((num, "peak_mem_bytes"), (den, "peak_mem_bytes"))
                rows.append(make_row(
                    2, f"{names}, {batch}, peak RSS growth ({measure.CPU_RSS_DELTA}: over the training "
                       "region)",
                    None, measured, settings=settings(comera),
                    medians=f"{tag(num)} {_fmt_bytes(get(num, 'peak_mem_bytes'))}, "
                            f"{tag(den)} {_fmt_bytes(get(den, 'peak_mem_bytes'))}",
                    note="; ".join(filter(None, [
                        f"informational: the {measure.CPU_ALLOCATED} row above carries the goal, "
                        f"the quantity a GPU's {measure.CUDA_ALLOCATED} measures (the paper's); "
                        "RSS growth leaves out what was allocated before the training region (the "
                        "parameters) and counts memory outside tensors (library workspaces and JIT code, "
                        "heap, Python)", errors]))))
    if 4 in targets:
        rows += halving_rows(cfg, res.get("comera_b32", {}), jobs["comera_b32"]["batch_size"],
                             settings("comera_b32"), errors, roof)
    return rows


def halving_rows(cfg: Config, result: dict[str, Any], batch: int, settings: str, errors: str,
                 roof: Roofline | None = None) -> list[BenchRow]:
    """Target 4: the tensorized layers' speedup after halving every rank (bound: their time before over the
    roofline time of the halved layers' counted FLOPs and traffic, or the FLOP ratio without a roofline),
    and the step's speedup as a fraction of its Amdahl estimate."""
    goals = cfg.goals["halving"]
    before, after = result.get("ranks") or {}, result.get("ranks_halved") or {}
    sample = next(iter(before), None)
    settings += f"; {sample}: {before.get(sample)} -> {after.get(sample)}" if sample else ""
    layers, layer_rounds = halving_speedup(result, "tt_layers_ms")
    flop_ratio = quotient(result.get("tt_layers_flops"), result.get("tt_layers_flops_halved"))
    traffic_ratio = quotient(result.get("tt_layers_traffic"), result.get("tt_layers_traffic_halved"))
    halved = [result.get(k) for k in ("tt_layers_flops_halved", "tt_layers_traffic_halved")]
    full_ms = before_halving(result, "tt_layers_ms")
    if roof is not None and all(halved) and full_ms:
        bound, basis = roof.speedup_bound(full_ms / 1e3, (halved[0], halved[1])), "roofline"
    else:
        bound, basis = flop_ratio, "FLOPs" if flop_ratio else ""
    step, step_rounds = halving_speedup(result, "step_time_ms")
    estimate = amdahl_estimate(result)

    def ms(key: str) -> str:
        before, after = before_halving(result, key), result.get(f"{key}_halved")
        return f"{before or float('nan'):.1f} ms, after {after or float('nan'):.1f} ms"

    def alternated(key: str, per_round: str) -> str:
        pairs = result.get(f"{key}_halving_rounds")
        if not pairs:
            return ""
        return f"the full-rank model and its halved copy alternating in {len(pairs)} rounds{per_round}"

    def parenthesized(*parts: str) -> str:
        text = "; ".join(p for p in parts if p)
        return f" ({text})" if text else ""

    return [
        make_row(4, f"tensorized layers fwd+bwd speedup after halving every rank, batch {batch}",
                 goals["layers_speedup"], layers, goal_key="halving.layers_speedup",
                 flop_ratio=flop_ratio, traffic_ratio=traffic_ratio,
                 bound=bound, bound_basis=basis,
                 medians=f"before {ms('tt_layers_ms')}"
                         + parenthesized(f"{result.get('tt_layers_seen')} modules, each re-run alone on its "
                                         "step input",
                                         alternated("tt_layers_ms", layer_rounds)),
                 settings=settings, stability=halving_verdict(result, "tt_layers_ms"),
                 note="; ".join(filter(None, [halving_note(flop_ratio, traffic_ratio), errors]))),
        make_row(4, f"CoMERA step speedup after halving every rank / its Amdahl estimate, batch {batch}",
                 goals["amdahl_fraction"], quotient(step, estimate), goal_key="halving.amdahl_fraction",
                 medians=f"step before {ms('step_time_ms')}"
                         f"{parenthesized(alternated('step_time_ms', step_rounds))}: "
                         f"{step or float('nan'):.2f}x; Amdahl estimate {estimate or float('nan'):.2f}x",
                 settings=settings, stability=halving_verdict(result, "step_time_ms", "tt_layers_ms"),
                 note="; ".join(filter(None, [amdahl_note(result), errors]))),
    ]
