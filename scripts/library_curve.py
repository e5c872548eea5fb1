"""Draw docs/img/library_curve.png: README's recipe on two tasks of the task family
(tests/comera/task_family.py), held-out accuracy and TT size over training, beside the TT twin and the
dense model.

    python scripts/library_curve.py [--out docs/img/library_curve.png]

Left: the `relu_teacher` labels on the plain MLP (seed 1, target 0.2), where the stage switch comes once
the loss has converged; right: the `linear` labels (seed 0, target 0.2), still being learned when the
steps run out, so no late stage starts. One torch thread; about 30 s of CPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import comera  # noqa: E402
from tests.comera import task_family  # noqa: E402

PANELS = (("relu_teacher", 1), ("linear", 0))
TARGET, EVERY = 0.2, 20


def curve(task: str, seed: int, method: str) -> tuple[list[int], list[float], list[float], int | None]:
    """Steps, held-out accuracy, TT size over the size at the start, and the switch step of one run."""
    _, _, x_test, y_test = task_family.split(task, seed)
    steps, accuracies, sizes, start = [], [], [], []

    def record(step: int, model: torch.nn.Module, adapt) -> None:
        size = comera.tt_parameter_count(model) if method != "dense" else 1
        start[:] = start or [size]
        if step % EVERY == 0:
            with torch.no_grad():
                accuracies.append(float((model(x_test).argmax(1) == y_test).float().mean()))
            steps.append(step)
            sizes.append(size / start[0])

    outcome = task_family.train(task, "plain", seed, method, target=TARGET, on_step=record)
    return steps, accuracies, sizes, outcome.switch_step if method == "comera" else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/library_curve.png")
    args = parser.parse_args(argv)
    fig, axes = plt.subplots(2, len(PANELS), figsize=(10, 6), sharex=True)
    for column, (task, seed) in enumerate(PANELS):
        top, bottom = axes[0][column], axes[1][column]
        for method, color, label in (("dense", "C0", "dense"), ("tt", "C1", "TT, no rank adaptation"),
                                     ("comera", "C2", f"CoMERA, target {TARGET}")):
            steps, accuracy, size, switch = curve(task, seed, method)
            top.plot(steps, accuracy, color=color, label=label)
            if method != "dense":
                bottom.plot(steps, size, color=color, label=label)
            if switch:
                for ax in (top, bottom):
                    ax.axvline(switch, color="grey", lw=0.8, ls=":")
        top.set_title(f"{task} labels, seed {seed}", fontsize=9)
        bottom.axhline(TARGET, color="grey", lw=0.8, ls="--")
        bottom.set_xlabel("training step")
    axes[0][0].set_ylabel("held-out accuracy")
    axes[1][0].set_ylabel("TT size / size at the start")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"README's recipe on a plain MLP in-256-256-10 (rank 16, lr {task_family.LR}, "
                 f"{task_family.STEPS} steps, batch 128, one CPU thread; stage switch dotted)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
