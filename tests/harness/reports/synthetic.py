"""A results folder shaped like a config's real output, without running a cell: every cell of the config's
grid gets a row (ok, with a few timing cells not stable) and the curves the reports read, with numbers of
the sizes a real run gives (the paper shapes' step times, CoMERA's compressions, a rank sweep whose largest
rank is slower than uncompressed training, accuracies that saturate on the synthetic task); the grid's
micro-benchmark specs get their rows. Layout tests draw every figure from it
(tests/harness/reports/test_layout.py); the documented commands run on it
(tests/docs/test_documented_commands.py)."""
from __future__ import annotations

import json
import math
import random
import zlib
from pathlib import Path
from typing import Any

import yaml

from harness.configs import grid as grids
from harness.configs.microbench_spec import check_spec
from harness.results import PROVENANCE_COLUMNS, RUNS_COLUMNS, to_frame, write_parquet_atomic
from harness.running import threads
from tests.harness.configs.test_grid import filled

ROOT = Path(__file__).resolve().parents[3]
MB = 1e6
# step time (ms) at batch 1 and its growth with the batch (exponent), per workload, size and method
STEP_MS = {("transformer", "paper"): {"dense": (222, 0.85), "comera": (56, 0.70), "galore": (299, 0.85),
                                     "lte": (240, 0.85)},
           ("transformer", "small"): {"dense": (9, 0.5), "comera": (12, 0.4), "galore": (14, 0.5),
                                      "lte": (11, 0.5)}}
MEMORY_MB = {"dense": (1100, 50), "comera": (79, 10), "galore": (940, 40), "lte": (1200, 55)}
SAMPLES = {"transformer": 392_702, "dlrm": 45_840_617, "mlm": 100_000}
ACCURACY = {"dense": 1.0, "comera": 0.998, "galore": 1.0, "lte": 0.93}  # the synthetic task saturates
MNLI_ACCURACY = {"dense": 0.66, "comera": 0.64, "galore": 0.63, "lte": 0.36}


def config_of(path: str | Path) -> dict[str, Any]:
    """A shipped config with the schema's defaults filled in and ``threads: auto`` as a quiet 2-core
    machine resolves it."""
    config = filled(yaml.safe_load(Path(path).read_text()))
    config["execution"]["threads"], _ = threads.resolve(config["execution"]["threads"], None, 0.0, cpus=2)
    return config


def _noise(rid: str, salt: str = "") -> random.Random:
    return random.Random(zlib.crc32(f"{rid}/{salt}".encode()))


def _tt_compression(spec: dict[str, Any]) -> float:
    """The tensorized layers' compression: the default CoMERA's 62x at the paper shapes, falling with rank
    (rank 120: about 7x, rank 600: about 1.3x, as measured)."""
    rank = spec["method_params"].get("rank")
    return 62.0 if rank is None else max(1.2, 62.0 * (30 / rank) ** 1.35)


def _step_ms(spec: dict[str, Any], size: str) -> float:
    w, method, batch = spec["workload"], spec["method"], spec["batch_size"]
    if w == "dlrm":
        base = {"dense": 30.0, "comera": 60.0}[method] * (2.0 if spec["variant"] == "naive-lookup" else 1.0)
        return base * batch / 1024
    if w == "mlm":
        seq = spec["workload_params"].get("seq_len") or 128
        return {"dense": 100.0, "comera": 80.0}[method] * seq / 128
    ms, exponent = STEP_MS.get((w, size), STEP_MS[("transformer", "paper")])[method]
    ms *= batch ** exponent
    rank = spec["method_params"].get("rank")
    if method == "comera" and rank is not None:
        ms *= (rank / 30) ** 0.6  # rank 600: slower than uncompressed training
    if spec["execution"].get("cuda_graph"):
        ms *= 0.6
    return ms


def _steps(spec: dict[str, Any]) -> tuple[int, int]:
    """(steps per epoch of the data, steps run per epoch)."""
    budget = spec["budget"]
    samples = spec["workload_params"].get("train_samples") or SAMPLES[spec["workload"]]
    per_epoch = max(1, samples // spec["batch_size"])
    return per_epoch, min(per_epoch, budget["max_steps_per_epoch"] or per_epoch)


def _quality_curves(rid: str, spec: dict[str, Any], steps: int, data: str | None) -> tuple[list[dict], dict]:
    """Eval curves (and CoMERA's size and rank records) of a quality cell, and its method settings."""
    rng = _noise(rid, "curves")
    method, target = spec["method"], spec["target_ratio"]
    end = (MNLI_ACCURACY if data == "mnli" else ACCURACY)[method]
    every = spec["budget"].get("eval_every_steps") or max(1, steps // 10)
    switch = round(steps * (spec["method_params"].get("early_fraction") or 0.45))
    evals = sorted({0, steps, *range(every, steps, every), *([switch] if target is not None else [])})
    curves, settings = [], {}
    for step in evals:
        acc = end - (end - 0.33) * math.exp(-step / (steps / 6)) + rng.uniform(-0.004, 0.004) * (step > 0)
        loss = 1.1 * math.exp(-step / (steps / 8)) + 0.002
        for name, value in (("accuracy", min(acc, 1.0)), ("loss", loss)):
            curves.append({"run_id": rid, "step": step, "epoch": 0, "split": "eval", "metric_name": name,
                           "value": value})
    if method != "comera":
        return curves, settings
    size0 = 32_116.0 if spec["workload_params"].get("size") == "small" else 2_100_000.0
    size_switch = 0.93 * size0
    record = max(1, steps // 300)
    for step in range(1, steps + 1, record):
        if target is None or step < switch:
            size = size0 - (size0 - size_switch) * step / max(switch, 1)
        else:
            size = size_switch * (target + (1 - target) * math.exp(-(step - switch) / (steps / 20)))
        curves.append({"run_id": rid, "step": step, "epoch": 0, "split": "method", "metric_name": "params_tt",
                       "value": size})
    blocks = 2 if spec["workload_params"].get("size") == "small" else 6
    for step, rank in ((0, 16), (switch, 13), (steps, max(1, round(13 * math.sqrt(target or 1.0))))):
        for b in range(blocks):
            for k, bond in enumerate([1, 8, rank, rank, rank, 8, 1]):
                curves.append({"run_id": rid, "step": step, "epoch": 0, "split": "ranks",
                               "metric_name": f"encoder.blocks.{b}.ffn_in[{k}]", "value": float(bond)})
    if target is not None:
        settings = {"switch": {"step": switch, "size": size_switch, "size_target": target * size_switch},
                    "late_start_step": switch, "target_ramp": 0.0}
    return curves, settings


def cell(rid: str, spec: dict[str, Any], device: dict[str, Any]
         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One cell's runs row and curves."""
    rng = _noise(rid)
    size = spec["workload_params"].get("size") or "default"
    data = spec["workload_params"].get("data") or ("synthetic" if spec["workload"] == "transformer" else None)
    quality = spec.get("purpose") == "quality"
    per_epoch, run = _steps(spec)
    epochs = spec["budget"]["epochs"]
    step_ms = _step_ms(spec, size) * rng.uniform(0.97, 1.03)
    rounds = spec["execution"].get("rounds") or 1
    noisy = not quality and rng.random() < 0.15
    timing = "stable" if not noisy else "noisy: IQR 41% of the median (> 25%)"
    method = spec["method"]
    tt = method == "comera"
    row = {c: None for c in RUNS_COLUMNS}
    curves: list[dict[str, Any]] = []
    method_settings: dict[str, Any] = {}
    metric = {"dlrm": ("nce", 0.97), "mlm": ("loss", 2.3)}.get(spec["workload"], ("accuracy", 0.6))
    if quality and spec["workload"] == "transformer":
        curves, method_settings = _quality_curves(rid, spec, run * epochs, data)
        metric = ("accuracy", [c["value"] for c in curves if c["metric_name"] == "accuracy"][-1])
    else:
        every = spec["budget"].get("eval_every_steps") or run
        split = "train" if spec["workload"] == "mlm" else "eval"
        for step in sorted({0, run, *range(every, run, every)}):
            value = metric[1] * (1.3 - 0.3 * step / max(run, 1))
            curves.append({"run_id": rid, "step": step, "epoch": 0, "split": split, "metric_name": metric[0],
                           "value": value})
    compression = _tt_compression(spec) if tt else 1.0
    mem_base, mem_per_batch = MEMORY_MB[method]
    params = 2_100_000 if size == "small" else 86_000_000
    dense_layers = 0.8 * params
    row.update(
        run_id=rid, workload=spec["workload"], method=method, variant=spec["variant"],
        batch_size=spec["batch_size"],
        seq_len=spec["workload_params"].get("seq_len") or 128, rank=spec["method_params"].get("rank") or 30,
        target_ratio=spec["target_ratio"], seed=spec["seed"], status="ok", error="",
        step_time_ms=step_ms, step_time_ms_iqr=step_ms * (0.41 if noisy else 0.04), steps_timed=run - 2,
        epoch_time_s=step_ms / 1000 * per_epoch * epochs,
        epoch_time_kind="measured" if run == per_epoch else "extrapolated",
        samples_per_s=spec["batch_size"] / step_ms * 1000,
        peak_mem_bytes=int((mem_base + mem_per_batch * spec["batch_size"] ** 0.5) * MB
                           * rng.uniform(0.98, 1.02)),
        peak_mem_kind=device["memory"], state_bytes=params * 16, metric_name=metric[0],
        metric_value=metric[1],
        final_train_loss=0.4 if tt else 0.3, epochs=float(epochs),
        params_total=int(params if not tt else params - dense_layers + dense_layers / compression),
        params_factorized_layers=int(dense_layers / compression) if tt else 0,
        compression_total=params / (params - dense_layers + dense_layers / compression) if tt else 1.0,
        compression_layers=compression,
        ranks=json.dumps({f"encoder.blocks.{b}.ffn_in": [1, 8, 16, 16, 16, 8, 1] for b in range(2)}
                         if tt else {}),
        device=device["device"], device_name=device["name"], num_threads=spec["execution"]["num_threads"],
        torch_version="2.13.0", cuda_version="", python_version="3.11.7", comera_bench_version="0.1.0",
        git_commit="0" * 40, git_dirty=False, cell_hash=spec["cell_hash"],
        execution_hash=spec["execution_hash"], hostname="synthetic",
        started_at="2026-01-01T00:00:00Z", matmul_precision=spec["execution"]["matmul_precision"],
        cuda_graph=spec["execution"]["cuda_graph"], compile=spec["execution"]["compile"],
        flops_per_step=1e9 / compression,
        target_reached=True if tt and spec["target_ratio"] is not None else None,
        purpose=spec.get("purpose"), timing_quality=timing, load_avg_1m=0.5, cpu_pressure=0.0,
        run_queue_frac=0.01, cpu_time_ratio=1.0, timing_group=spec["execution"].get("timing_group"),
        round_step_ms=json.dumps([step_ms] * rounds),
        round_step_mean_ms=json.dumps([step_ms * rng.uniform(0.98, 1.02) for _ in range(rounds)]),
        extra=json.dumps({"eval": {"loss": 0.002 if quality else 1.0, metric[0]: metric[1]}}),
        settings=json.dumps({"workload_params": spec["workload_params"], "budget": spec["budget"],
                             "method": method_settings, "workload_info": {"data": data},
                             "steps_in_epoch": run, "steps_per_epoch": per_epoch}))
    return row, curves


def microbench_rows(specs: dict[str, Any], device: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of every embedding and linear case of the config's micro-benchmark specs."""
    rows = []
    provenance = {**{c: None for c in PROVENANCE_COLUMNS}, "device": device["device"],
                  "device_name": device["name"], "num_threads": 2, "torch_version": "2.13.0",
                  "git_commit": "0" * 40, "hostname": "synthetic"}
    def timed(ms: float) -> dict[str, Any]:  # five rounds around the median, a stable timing
        return {"time_ms": ms, "time_ms_iqr": 0.05 * ms, "timing_quality": "stable",
                "round_time_ms": json.dumps([ms * f for f in (0.97, 0.99, 1.0, 1.01, 1.03)])}

    for name, raw in specs.items():
        spec = check_spec(raw, source=name)
        emb = spec.get("embedding") or {}
        for table in emb.get("tables", []):
            plain = f"{table['num_embeddings']}x{table['embedding_dim']}"
            plain_size = table["num_embeddings"] * table["embedding_dim"]
            rows_, cols_ = (",".join(map(str, table[k])) for k in ("row_shape", "col_shape"))
            ttm = f"{plain} [{rows_}|{cols_}]"
            for variant in emb["variants"]:
                for tokens in emb["indices"]:
                    for direction in emb["directions"]:
                        slow = {"dense_grad": 8.0, "sparse_grad": 0.2, "ttm_naive": 6.0, "ttm_order": 3.0,
                                "ttm_unique": 2.5, "ttm_optimized": 1.0}[variant]
                        rows.append({"op": "embedding", "variant": variant,
                                     "shape": ttm if variant.startswith("ttm") else plain, "tokens": tokens,
                                     "rank": table["rank"] if variant.startswith("ttm") else None,
                                     "direction": direction, **timed(slow * tokens / 1000),
                                     "peak_mem_bytes": int(slow * tokens * 2000),
                                     "param_bytes": 4 * plain_size,
                                     "output_bytes": 4 * tokens * table["embedding_dim"], "flops": 1e6,
                                     **provenance})
        lin = spec.get("linear") or {}
        for layer in lin.get("layers", []):
            n_in, n_out = math.prod(layer["in_shape"]), math.prod(layer["out_shape"])
            for tokens in lin["tokens"]:
                for rank in [None, *lin["ranks"]]:
                    for direction in lin["directions"]:
                        rows.append({"op": "linear", "variant": "dense" if rank is None else "tt",
                                     "shape": f"{n_in}x{n_out}", "tokens": tokens, "rank": rank,
                                     "direction": direction,
                                     **timed(tokens * (0.01 if rank is None else 0.004)),
                                     "peak_mem_bytes": tokens * 4000, "param_bytes": 4 * n_in * n_out,
                                     "output_bytes": 4 * tokens * n_out, "flops": 1e6, **provenance})
    return rows


DEVICES = {"cpu": {"device": "cpu", "name": "AMD EPYC 7B13", "memory": "cpu_rss_delta"},
           "cuda": {"device": "cuda", "name": "NVIDIA GeForce RTX 3090", "memory": "cuda_allocated"}}


def results_folder(config_path: str | Path, folder: Path, *, cells_dir: Path | None = None) -> Path:
    """``folder`` as the pipeline's merged results/<device> of the config (runs, curves, microbench,
    grid.json); with ``cells_dir``, also its per-cell files (results/runs/<device>). Returns ``folder``."""
    config = config_of(config_path)
    specs, sweeps = grids.expand_grid(config)
    cells = {rid: spec.to_dict() for rid, spec in specs.items()}
    device = DEVICES["cuda" if config["execution"]["device"] == "cuda" else "cpu"]
    rows, curves = [], []
    for rid, spec in cells.items():
        row, curve = cell(rid, spec, device)
        rows.append(row)
        curves += curve
        if cells_dir is not None:
            write_parquet_atomic(to_frame([row], "runs"), cells_dir / f"{rid}.runs.parquet", kind="runs")
            write_parquet_atomic(to_frame(curve, "curves"), cells_dir / f"{rid}.curves.parquet",
                                 kind="curves")
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(to_frame(rows, "runs"), folder / "runs.parquet", kind="runs")
    write_parquet_atomic(to_frame(curves, "curves"), folder / "curves.parquet", kind="curves")
    write_parquet_atomic(to_frame(microbench_rows(config["microbench"]["specs"], device), "microbench"),
                         folder / "microbench.parquet", kind="microbench")
    (folder / "grid.json").write_text(json.dumps({"cells": cells, "sweeps": sweeps}))
    return folder
