"""A toy workload and a toy method (with failure injection) for the runner and CLI tests."""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from baselines.base import Periodic, Prepared
from harness.running.registry import Registry
from harness.workloads.base import Workload


HANG_S = 3600.0
"""How long an injected hang blocks (far beyond any test's time limit)."""


def pause(seconds: float) -> None:
    """The toy method's work of a step (``sleep_s``, ``period_sleep_s``): a sleep, unless a test gives the
    step timer a clock of its own (tests/harness/running/test_periodic_rounds.py)."""
    time.sleep(seconds)


def toy_workload(name: str, params: dict[str, Any], *, batch_size: int, seed: int,
                 device: torch.device) -> Workload:
    """A 3-class problem on 8 features, learnable by a small MLP in a few dozen steps; the evaluation
    numbered ``params["hang_eval"]`` (0 = the first) hangs."""
    n = params.get("samples", 256)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    y = (x @ torch.randn(8, 3, generator=gen)).argmax(1)
    x_eval, y_eval = x[: n // 4], y[: n // 4]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3)).to(device)

    def train_batches(epoch: int):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for i in range(0, n - batch_size + 1, batch_size):
            idx = order[i:i + batch_size]
            yield {"x": x[idx].to(device), "y": y[idx].to(device)}

    def loss(m: nn.Module, batch):
        return nn.functional.cross_entropy(m(batch["x"]), batch["y"])

    evaluations = []

    def evaluate(m: nn.Module):
        if len(evaluations) == params.get("hang_eval"):
            time.sleep(HANG_S)
        evaluations.append(1)
        m.eval()
        with torch.no_grad():
            logits = m(x_eval.to(device))
        acc = (logits.argmax(1).cpu() == y_eval).float().mean().item()
        return {"metric_name": "accuracy", "metric_value": acc,
                "loss": nn.functional.cross_entropy(logits.cpu(), y_eval).item()}

    return Workload(name=name, model=model, tt_spec={}, train_batches=train_batches,
                    eval_batches=lambda: iter(()), loss=loss, evaluate=evaluate,
                    steps_per_epoch=n // batch_size, metric_name="accuracy", seq_len=None,
                    lr={"dense": 1e-2}, info={"source": "toy"})


class ToyMethod:
    """AdamW on the whole model; ``params["fail"]`` injects oom | nan | error | skip at step
    ``fail_at``, or nan_params (every parameter NaN after that step's update); ``sleep_s`` slows every
    step; step ``hang_at`` hangs; every ``period``-th step sleeps ``period_sleep_s`` more (periodic work,
    declared as ``time_window_steps``; with ``declare`` also as ``Prepared.periodic`` "toy work", forceable
    with ``forceable``: a forced step sleeps the same; ``forced`` counts the forcings)."""

    forced = 0

    name = "toy"
    variant = "default"

    def prepare(self, model, workload, params, *, target_ratio, total_steps):
        fail, fail_at = params.get("fail"), params.get("fail_at", 2)
        if fail == "skip":
            return Prepared(model=model, optimizers=[], skipped="toy needs a device it does not have")
        opt = torch.optim.AdamW(model.parameters(), lr=params.get("lr", 1e-2))

        def total_loss(task_loss, step):
            if fail == "oom" and step >= fail_at:
                raise MemoryError("toy allocation failed")
            if fail == "nan" and step >= fail_at:
                return task_loss * float("nan")
            return task_loss + 0.0 * sum(p.sum() for p in model.parameters())

        def after_step(step):
            if fail == "error" and step >= fail_at:
                raise ValueError("toy method broke")
            if fail == "nan_params" and step >= fail_at:  # via the optimizer: a traceback through
                # after_step must not keep the model alive (test_warmup)
                with torch.no_grad():
                    for group in opt.param_groups:
                        for p in group["params"]:
                            p.fill_(float("nan"))
            if step == params.get("hang_at"):
                time.sleep(HANG_S)
            pause(params.get("sleep_s", 0.0))
            if params.get("period") and ((step + 1) % params["period"] == 0 or due):  # periodic work
                pause(params.get("period_sleep_s", 0.0))
            due.clear()
            return {"stage": float(step >= 3)}

        due: list[bool] = []

        def force(name):
            assert name == "toy work"
            ToyMethod.forced += 1
            due.append(True)

        periodic = ({"toy work": Periodic(params["period"], params["period"] - 1,
                                          params.get("forceable", False))} if params.get("declare") else {})

        return Prepared(model=model, optimizers=[opt], total_loss=total_loss, after_step=after_step,
                        settings={"lr": params.get("lr", 1e-2), "rank": 4,
                                  "time_window_steps": params.get("period")},
                        ranks=lambda: {"fc": [1, 4, 1]}, periodic=periodic,
                        force=force if params.get("forceable") else None)


TOY_REGISTRY = Registry(build_workload=toy_workload, get_method=lambda name: ToyMethod())


def toy_spec(**overrides: Any) -> dict[str, Any]:
    spec = {"workload": "toy", "method": "toy", "batch_size": 16, "seed": 0,
            "budget": {"epochs": 2, "max_steps_per_epoch": None, "warmup_steps": 1,
                       "eval_every_steps": 8, "time_limit_s": None},
            "execution": {"device": "cpu", "num_threads": 1, "cuda_graph": False, "compile": False}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec
