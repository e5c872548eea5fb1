"""``comera-bench bench``: the performance targets (harness.perf) measured in one run and judged.

    comera-bench bench [--quick] [--targets 1,2,3,4,5] [--device cpu|cuda|auto] [--threads N]
                       [--rounds R] [--block-s S] [--allocator reuse|system] [--step-rounds R]
                       [--goals GOALS.yaml]
                       [--out results/<device>/bench.parquet]

The table goes to stdout, the Parquet file, a Markdown file and a figure beside it (docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from harness.core import allocator as allocator_lib
from harness.core import timing
from harness.configs import grid
from harness.atomic import atomic_write
from harness.perf import figure
from harness.perf import goals as goals_lib
from harness.perf.config import Config
from harness.perf.report import TARGET_NAMES, to_markdown, write
from harness.perf.targets import run_targets
from harness.perf.worker import step_worker


def parse_targets(text: str) -> set[int]:
    try:
        targets = {int(t) for t in text.split(",") if t.strip()}
    except ValueError:
        raise ValueError(f"--targets {text!r}: expected comma-separated numbers from "
                         f"{sorted(TARGET_NAMES)}") from None
    unknown = targets - set(TARGET_NAMES)
    if unknown or not targets:
        raise ValueError(f"--targets {text!r}: unknown target(s) {sorted(unknown)}; known: "
                         f"{sorted(TARGET_NAMES)}")
    return targets


def default_out(device_type: str) -> Path:
    """results/<device label>/bench.parquet, the pipeline's folder for this machine (COMERA_BENCH_DEVICE,
    else "cpu" or the GPU's name; harness.configs.grid)."""
    label = grid.env_device_label() or grid.device_label({"execution": {"device": device_type}})
    return Path("results") / label / "bench.parquet"


def load_warning(busy: list[str], threads: int) -> str:
    """What a busy machine (the load readings before and after the run that were too high) means for the
    table ('' when the machine was not busy)."""
    readings = [b for b in busy if b]
    if not readings:
        return ""
    return (f"the machine was busy ({'; then '.join(readings)}) for a bench asking for {threads} thread(s): "
            "its ratios are noisy; a ratio above its own bound is marked impossible, and a pass or short "
            "here may not hold on a quiet machine")


def _step_worker_main(job_file: str, out: str, log: str) -> int:
    """A step worker process: its result JSON to ``out``; a failure's traceback tail to ``log``."""
    try:
        result = step_worker(json.loads(Path(job_file).read_text()))
    except Exception as exc:  # noqa: BLE001 -- the parent reports it as the configuration's error
        Path(log).write_text("".join(traceback.format_exception(exc))[-4000:])
        return 1
    atomic_write(out, lambda tmp: tmp.write_text(json.dumps(result, default=str)))
    return 0


def cli(argv: list[str]) -> int:
    """``comera-bench bench``: see the module docstring."""
    ap = argparse.ArgumentParser(prog="comera-bench bench", description="Measure and judge the performance "
                                 "targets (ratios measured in the same run).")
    ap.add_argument("--quick", action="store_true", help="reduced sizes and repeats (tests, smoke runs)")
    ap.add_argument("--targets", default="1,2,3,4,5", help="comma-separated target numbers (default all)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--goals", default=str(goals_lib.DEFAULT_PATH),
                    help="goals file (default harness/perf/goals.yaml)")
    ap.add_argument("--out", help="Parquet file, written atomically, with the Markdown table next to it "
                                  "(default results/<device>/bench.parquet)")
    ap.add_argument("--step-timeout", type=float, default=1800, help="seconds for all transformer-step "
                    "processes together")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds of the single-layer timings of targets 1 and 3 (default 3, "
                         "--quick 2)")
    ap.add_argument("--block-s", type=float, default=None,
                    help="seconds of calls per timing in a round of targets 1 and 3 (default 0.5, "
                         "--quick 0.05)")
    ap.add_argument("--step-rounds", type=int, default=None,
                    help="rounds of the transformer-step processes of targets 2 and 4, every configuration "
                         "once per round (default 3, --quick 1)")
    ap.add_argument("--allocator", choices=allocator_lib.POLICIES, default="reuse",
                    help="CPU allocator policy of this process and the step workers (default reuse; "
                         "see harness.core.allocator)")
    ap.add_argument("--step-worker-file", help=argparse.SUPPRESS)
    ap.add_argument("--step-out", help=argparse.SUPPRESS)
    ap.add_argument("--step-log", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step_worker_file:
        return _step_worker_main(args.step_worker_file, args.step_out, args.step_log)
    try:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}: need at least 1")
        if not args.step_timeout > 0:
            raise ValueError(f"--step-timeout {args.step_timeout:g}: need a positive number of seconds")
        targets = parse_targets(args.targets)
        cfg = Config.make(args.device, args.threads, args.quick, args.allocator, args.step_rounds, args.goals,
                          rounds=args.rounds, min_run_time_s=args.block_s)
        out = Path(args.out) if args.out else default_out(cfg.device.type)
    except (ValueError, RuntimeError, grid.ConfigError) as exc:
        print(f"comera-bench bench: {exc}", file=sys.stderr)
        return 2
    from harness.results import provenance

    busy = [timing.busy_load(cfg.num_threads)]
    if busy[0]:
        print(f"comera-bench bench: warning: {load_warning(busy, cfg.num_threads)}", file=sys.stderr)
    rows = run_targets(targets, cfg, step_timeout_s=args.step_timeout,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    busy.append(timing.busy_load(cfg.num_threads))
    load = load_warning(busy, cfg.num_threads)
    applied = f"{cfg.allocator}: {cfg.allocator_applied}"
    prov = provenance(cfg.device)
    md, pq = write(rows, out, prov, applied, load)
    try:  # after the table is written: a figure that cannot be drawn costs nothing measured
        drawn = figure.draw(rows, out, figure.title_of(prov))
    except Exception as exc:  # noqa: BLE001 -- reported, the table stands
        print(f"comera-bench bench: figure not drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
        drawn = []
    print(f"Allocator: {applied}\n")
    if load:
        print(f"Warning: {load}\n")
    print(to_markdown(rows))
    print(f"-> {', '.join(str(p) for p in [pq, md, *drawn])}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
