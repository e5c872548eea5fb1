"""Draw docs/img/library_curve.png: README's CoMERA recipe on a user's MLP as it is and as it was (lr 1e-3,
L0 fixed at the switch, rho 0.1, core l2 1e-4), beside the dense and TT twins.

    python scripts/library_curve.py [--out docs/img/library_curve.png]

The MLP, data and loop are tests/comera/test_readme_recipe.py's (labels of a random low-rank TT teacher,
seed 0); accuracy on the 4096 training points every 20 steps, one torch thread.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import comera  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "comera"))
from test_readme_recipe import LR, STEPS, TARGET, teacher_labels, accuracy, train_mlp  # noqa: E402

EARLIER = {"loss_reference": "switch", "rho": 0.1, "l2_weight": 1e-4}
EARLIER_LR = 1e-3


def curve(x, y, *, tt: bool, adapt: dict | None, lr: float = LR,
          every: int = 20) -> tuple[list[int], list[float], list[float]]:
    """Steps, accuracy and TT size / size at the start, for one training run."""
    steps, accuracies, sizes = [], [], []
    start: list[int] = []

    def record(step: int, model: torch.nn.Module) -> None:
        size = comera.tt_parameter_count(model) if tt else 1
        start[:] = start or [size]
        if step % every == 0:
            steps.append(step)
            accuracies.append(accuracy(model, x, y))
            sizes.append(size / start[0] if tt else float("nan"))

    train_mlp(x, y, 0, tt=tt, adapt=adapt, lr=lr, on_step=record)
    return steps, accuracies, sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/library_curve.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x, y = teacher_labels(0)
    runs = {"dense twin": curve(x, y, tt=False, adapt=None), "TT, no rank adaptation": curve(x, y, tt=True, adapt=None),
            "CoMERA, defaults": curve(x, y, tt=True, adapt={}),
            "CoMERA, the recipe before (lr 1e-3)": curve(x, y, tt=True, adapt=EARLIER, lr=EARLIER_LR)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (name, (steps, accuracy, size)), color in zip(runs.items(), ("C0", "C1", "C2", "C3")):
        left.plot(steps, accuracy, label=name, color=color)
        if "CoMERA" in name:
            right.plot(steps, size, label=name, color=color)
    switch = round(0.45 * STEPS)
    for ax in (left, right):
        ax.axvline(switch, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("training step")
    left.set_ylabel("accuracy (4096 training points)")
    left.legend(fontsize=8)
    right.axhline(TARGET, color="grey", lw=0.8, ls="--", label=f"target {TARGET}")
    right.set_ylabel("TT size / size at the start")
    right.legend(fontsize=8)
    fig.suptitle(f"README's recipe on an MLP 100-256-10 (tensorize all-linear, rank 16, lr {LR}, {STEPS} steps, "
                 f"target {TARGET}; stage switch dotted)", fontsize=9)
    fig.text(0.01, 0.01, "labels of a random rank-4 TT teacher, seed 0, batch 128, one CPU thread; "
             "the recipe before: lr 1e-3, L0 fixed at the switch, rho 0.1, core l2 1e-4", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
