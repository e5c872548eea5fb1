"""DLRM on Criteo Kaggle click logs (docs/workloads.md): bottom MLP, 26 embedding tables, dot interactions.

Metric "accuracy", plus "nce"; data synthetic (default) or ``train.txt``. The "paper" configuration, NCE,
rates and params: docs/design-notes.md.
"""
from __future__ import annotations

import json
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from harness.data import batching, criteo
from harness.data.cache import atomic_write, cache_dir, cached_tensors, fingerprint
from harness.workloads.base import Batch, Workload, evaluating, seeded_model
from harness.workloads.params import Field, WorkloadParams, require
from harness.workloads.tt_spec import embedding_spec, tt_parameter_count

NAME = "dlrm"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(embedding_dim=8, bottom_mlp=[32, 8], top_mlp=[32], max_table_rows=1000, rank=8,
                 tt_min_rows=500, synthetic_rows=8192, synthetic_categories=50),
    "small": dict(embedding_dim=16, bottom_mlp=[64, 16], top_mlp=[64, 32], max_table_rows=20000, rank=16,
                  tt_min_rows=2000, synthetic_rows=100000, synthetic_categories=5000),
    "paper": dict(embedding_dim=16, bottom_mlp=[512, 256, 64, 16], top_mlp=[512, 256], max_table_rows=None,
                  rank=48, tt_min_rows=10000, synthetic_rows=2000000, synthetic_categories=200000),
}


class DLRMParams(WorkloadParams):
    """DLRM's parameters; those without a default come from the size preset (PRESETS)."""

    embedding_dim: int = Field(gt=0)
    bottom_mlp: list[int]
    top_mlp: list[int]
    max_table_rows: int | None = Field(gt=0)
    rank: int = Field(gt=0)
    tt_min_rows: int = Field(gt=0)
    synthetic_rows: int = Field(gt=0)
    synthetic_categories: int = Field(gt=0)
    data: Literal["synthetic", "criteo"] = "synthetic"
    data_path: str | None = None
    max_rows: int | None = Field(None, gt=0)
    eval_fraction: float = Field(0.1, gt=0, lt=1)
    table_sizes: list[int] | None = None
    cache_dir: str | None = None
    data_seed: int = 0
    eval_batch_size: int | None = Field(None, gt=0)


PARAMS = DLRMParams
LR = {"dense": 1e-3, "cores": 1e-3, "other": 1e-3, "gates": 1e-2}


def validate(p: dict[str, Any]) -> None:
    """The relations between params (each param's own bounds: :class:`DLRMParams`)."""
    require(bool(p["bottom_mlp"]) and p["bottom_mlp"][-1] == p["embedding_dim"], NAME, "bottom_mlp",
            p["bottom_mlp"], f"must end with embedding_dim={p['embedding_dim']}")
    require(all(w > 0 for w in p["bottom_mlp"] + p["top_mlp"]), NAME, "top_mlp", p["top_mlp"],
            "widths must be positive")
    require(p["table_sizes"] is None or (len(p["table_sizes"]) == criteo.NUM_SPARSE
                                         and all(s > 0 for s in p["table_sizes"])),
            NAME, "table_sizes", p["table_sizes"], f"must be {criteo.NUM_SPARSE} positive sizes")
    require(p["data"] != "criteo" or p["data_path"] is not None, NAME, "data_path", p["data_path"],
            "is required when data='criteo' (the Kaggle train.txt)")


def table_sizes(p: dict[str, Any]) -> list[int]:
    """Rows of the 26 tables: ``table_sizes`` or the Kaggle sizes capped at ``max_table_rows``."""
    if p["table_sizes"] is not None:
        return list(p["table_sizes"])
    cap = p["max_table_rows"] or max(criteo.KAGGLE_TABLE_SIZES)
    return [min(s, cap) for s in criteo.KAGGLE_TABLE_SIZES]


def _mlp(widths: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if final_activation or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """forward(dense (B, 13), sparse (B, 26) table indices) -> click logits (B,)."""

    def __init__(self, table_sizes: list[int], embedding_dim: int, bottom_mlp: list[int], top_mlp: list[int]):
        super().__init__()
        self.bottom = _mlp([criteo.NUM_DENSE, *bottom_mlp], final_activation=True)
        self.embeddings = nn.ModuleList(nn.Embedding(n, embedding_dim) for n in table_sizes)
        vectors = len(table_sizes) + 1
        rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = _mlp([embedding_dim + rows.numel(), *top_mlp, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        sparse = sparse.long()
        vectors = torch.stack([x, *(emb(sparse[:, i]) for i, emb in enumerate(self.embeddings))], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(-1)


def build_model(p: dict[str, Any]) -> DLRM:
    return DLRM(table_sizes(p), p["embedding_dim"], p["bottom_mlp"], p["top_mlp"])


def tt_spec(p: dict[str, Any]) -> dict[str, dict]:
    spec = {}
    for i, rows in enumerate(table_sizes(p)):
        if rows < p["tt_min_rows"]:
            continue
        entry = embedding_spec(rows, p["embedding_dim"], p["rank"], num_modes=3)
        if tt_parameter_count(entry) < rows * p["embedding_dim"]:
            spec[f"embeddings.{i}"] = entry
    return spec


def load_data(p: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    sizes = table_sizes(p)
    folder = cache_dir(p["cache_dir"], "dlrm")
    if p["data"] == "synthetic":
        cats = [min(s, p["synthetic_categories"]) for s in criteo.KAGGLE_TABLE_SIZES]
        path = folder / f"synthetic-{fingerprint(p['synthetic_rows'], cats, p['data_seed'])}.txt"
        stats_path = path.with_suffix(".json")
        if not (path.exists() and stats_path.exists()):
            stats = criteo.write_synthetic(path, p["synthetic_rows"], categories=cats, seed=p["data_seed"])
            atomic_write(stats_path, lambda tmp: tmp.write_text(json.dumps(stats)))
        info = {"data": "synthetic", "data_file": str(path), **json.loads(stats_path.read_text())}
    else:
        path = p["data_path"]
        info = {"data": "criteo", "data_file": str(path)}
    key = fingerprint(sizes, p["max_rows"], files=[path])
    data = cached_tensors(folder / f"parsed-{key}.pt", lambda: criteo.read(path, sizes, p["max_rows"]),
                          keys=("dense", "sparse", "labels"))
    n = batching.num_rows(data)
    n_eval = max(1, int(round(n * p["eval_fraction"])))
    if n - n_eval < 1:
        raise ValueError(f"workload 'dlrm': {path} has {n} rows, too few to split off an eval fraction")
    train = {k: t[:n - n_eval] for k, t in data.items()}
    evals = {k: t[n - n_eval:] for k, t in data.items()}
    return train, evals, info


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(batch["dense"], batch["sparse"]), batch["labels"])


def _entropy(rate: float) -> float | None:
    if rate <= 0.0 or rate >= 1.0:
        return None
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


def build(p: dict[str, Any], *, batch_size: int, seed: int, device: torch.device) -> Workload:
    train, evals, info = load_data(p)
    model = seeded_model(build_model, p, seed, device)
    eval_bs = p["eval_batch_size"] or max(batch_size, 1024)
    eval_rate = evals["labels"].mean().item()
    entropy = _entropy(eval_rate)

    def evaluate(m: nn.Module) -> dict[str, float]:
        correct, bce, n = 0, 0.0, 0
        with evaluating(m):
            for batch in batching.eval_batches(evals, eval_bs, device):
                logits = m(batch["dense"], batch["sparse"])
                bce += F.binary_cross_entropy_with_logits(logits, batch["labels"], reduction="sum").item()
                correct += ((logits >= 0).float() == batch["labels"]).sum().item()
                n += batch["labels"].shape[0]
        nce = {} if entropy is None else {"nce": (bce / n) / entropy}
        return {"metric_name": "accuracy", "metric_value": correct / n, **nce,
                "bce": bce / n, "base_rate": eval_rate, "samples": n}

    info.update(train_samples=batching.num_rows(train), eval_samples=batching.num_rows(evals),
                table_sizes=table_sizes(p), eval_batch_size=eval_bs, eval_click_rate=eval_rate,
                majority_accuracy=max(eval_rate, 1 - eval_rate))
    return Workload(
        name=NAME, model=model, tt_spec=tt_spec(p),
        train_batches=lambda epoch: batching.train_batches(train, batch_size, seed, epoch, device),
        eval_batches=lambda: batching.eval_batches(evals, eval_bs, device),
        loss=loss, evaluate=evaluate,
        steps_per_epoch=batching.train_steps(batching.num_rows(train), batch_size),
        metric_name="accuracy", seq_len=None, lr=dict(LR), info=info)
