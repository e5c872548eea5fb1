"""Target 5: the FLOPs of comera's contraction plans against opt_einsum's optimal paths, over a sweep of TT
orders, ranks and token counts."""
from __future__ import annotations

import math
import re

from harness.perf.config import Config
from harness.perf.report import BenchRow, make_row

_GATE_OR_BIAS = re.compile(r"^(gate|dgate|dcore)\d+$|^d?bias$")


def plan_contraction_flops(plan) -> int:
    """Plan FLOPs of the contractions only (gate scaling and bias steps left out)."""
    return sum(s.flops for s in plan.steps if not _GATE_OR_BIAS.match(s.name))


def optimal_sum_flops(in_shape: tuple[int, ...], out_shape: tuple[int, ...], ranks: tuple[int, ...],
                      tokens: int) -> int:
    """Sum of opt_einsum's optimal (dynamic programming, outer products allowed) costs of the d+2
    contractions of a TT linear layer: y, dx and every core gradient dG_k, each optimized alone."""
    import opt_einsum as oe

    d, m = len(in_shape) + len(out_shape), len(in_shape)
    modes = tuple(in_shape) + tuple(out_shape)
    n_idx = [oe.get_symbol(1 + k) for k in range(d)]
    b_idx = [oe.get_symbol(1 + d + k) for k in range(d - 1)]
    sizes = {"t": tokens, **dict(zip(n_idx, modes)), **dict(zip(b_idx, ranks[1:-1]))}
    cores = [(b_idx[k - 1] if k else "") + n_idx[k] + (b_idx[k] if k < d - 1 else "") for k in range(d)]
    x, y = "t" + "".join(n_idx[:m]), "t" + "".join(n_idx[m:])
    problems = [([x, *cores], y), ([y, *cores], x)]
    problems += [([x, y, *cores[:k], *cores[k + 1:]], cores[k]) for k in range(d)]
    total = 0
    for inputs, output in problems:
        shapes = [tuple(sizes[c] for c in term) for term in inputs]
        _, info = oe.contract_path(",".join(inputs) + "->" + output, *shapes, shapes=True,
                                   optimize=oe.DynamicProgramming(search_outer=True))
        total += int(info.opt_cost)
    return total


def plan_sweep(quick: bool) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]]:
    """Distinct (in_shape, out_shape, ranks, tokens) over orders 2..8 (quick: 2..4), ranks (clipped to
    the largest rank of each bond) and token counts."""
    modes = (4, 6, 8, 5, 3, 7, 2, 8)
    orders = range(2, 5) if quick else range(2, 9)
    rank_choices = (4,) if quick else (2, 8, 30)
    token_choices = (1, 64) if quick else (1, 16, 256, 4096)
    cases = []
    for d in orders:
        m = (d + 1) // 2
        in_shape, out_shape = modes[:m], modes[m:d]
        full = in_shape + out_shape
        for r in rank_choices:
            ranks = (1, *(min(r, math.prod(full[:k]), math.prod(full[k:])) for k in range(1, d)), 1)
            cases += [(in_shape, out_shape, ranks, t) for t in token_choices]
    return list(dict.fromkeys(cases))  # clipped ranks repeat cases


def kernel_cost_row(cfg: Config) -> BenchRow:
    """Info row: the per-kernel fixed cost of a TT call measured here against the library's default
    (:data:`comera.contraction.KERNEL_COST`), the number plans charge per kernel."""
    from comera import contraction
    from comera.tt import measure_kernel_cost

    measured = measure_kernel_cost(cfg.device, min_run_time_s=0.05 if cfg.quick else 0.3)
    default = contraction.KERNEL_COST
    return make_row(5, "per-kernel cost of a TT call, measured here / library default (KERNEL_COST)", None,
                    measured / default,
                    medians=f"measured {measured:,d}, default {default:,d} FLOP-equivalents",
                    settings="one-token 768->768 rank-30 TTLinear forward+backward / its plan's kernels, "
                             "x the rate of a 512^3 float32 matmul",
                    note="far from 1: layer.plan_settings = dataclasses.replace(layer.plan_settings, "
                         "kernel_cost=comera.tt.measure_kernel_cost()) adapts a layer's plans to this "
                         "machine")


def target_plans(cfg: Config) -> list[BenchRow]:
    """Max over the sweep of plan FLOPs / opt_einsum optimal sum (must be <= 1), and the kernel-cost row."""
    from comera.contraction import make_plan

    worst, worst_case, count, over = 0.0, None, 0, 0
    for in_shape, out_shape, ranks, tokens in plan_sweep(cfg.quick):
        plan = make_plan(in_shape, out_shape, ranks, tokens, False)
        ratio = plan_contraction_flops(plan) / optimal_sum_flops(in_shape, out_shape, ranks, tokens)
        count += 1
        over += ratio > 1.0
        if ratio > worst:
            worst, worst_case = ratio, (in_shape, out_shape, ranks, tokens)
    return [make_row(5, f"plan FLOPs / sum of opt_einsum optimal costs (max over {count} cases, "
                        f"{over} above 1)", cfg.goals["plans"]["flops_vs_optimal"], worst, better="<=",
                     goal_key="plans.flops_vs_optimal", flop_ratio=worst,
                     medians=f"worst case in={list(worst_case[0])} out={list(worst_case[1])} "
                             f"ranks={list(worst_case[2])} tokens={worst_case[3]}" if worst_case else "",
                     settings="orders 2-4, rank 4, tokens 1,64" if cfg.quick else
                     "orders 2-8, ranks 2/8/30, tokens 1/16/256/4096; gate scaling and bias excluded"),
            kernel_cost_row(cfg)]
