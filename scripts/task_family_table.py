"""Print the task-family table (docs/recipe.md, "The task family"): every case of
tests/comera/test_task_family.py (README's recipe) beside its TT twin and the dense model.

    python scripts/task_family_table.py

One row per case (task, network, seed, batch, target): held-out accuracy of the dense model, the TT twin
and CoMERA, CoMERA's size at the end over its size at the stage switch (1.00: no late stage), the CoMERA -
twin gap and CoMERA's shortfall, then the worst gap per task. One torch thread; a case takes about 10 s of
CPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.comera import task_family  # noqa: E402


def main() -> int:
    print("| task | network | seed | batch | target | dense | TT twin | CoMERA | size | gap | shortfall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst: dict[str, float] = {}
    for task, kind, seed, batch, target in task_family.CASES:
        dense, twin = (task_family.train(task, kind, seed, method, batch=batch) for method in ("dense", "tt"))
        ours = task_family.train(task, kind, seed, "comera", target=target, batch=batch)
        gap = ours.accuracy - twin.accuracy
        worst[task] = min(worst.get(task, 1.0), gap)
        print(f"| {task} | {kind} | {seed} | {batch} | {target} | {dense.accuracy:.3f} | {twin.accuracy:.3f} "
              f"| {ours.accuracy:.3f} | {ours.size_ratio:.2f} | {gap:+.3f} | {ours.shortfall or ''} |",
              flush=True)
    print("\n| task | worst CoMERA - twin gap |\n|---|---|")
    for task, gap in worst.items():
        print(f"| {task} | {gap:+.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
