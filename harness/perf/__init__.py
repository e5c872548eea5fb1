"""The performance targets of ``comera-bench bench`` (harness.perf.bench), measured and judged in one table
against the goals of harness/perf/goals.yaml (:mod:`.goals`).

Modules: :mod:`.config` (one invocation's settings), :mod:`.roofline` (machine peaks, paired timing),
:mod:`.layers` (targets 1 and 3), :mod:`.steps` with :mod:`.worker` (targets 2 and 4), :mod:`.plans`
(target 5), :mod:`.targets` (running them), :mod:`.report` (rows, verdicts, table, files).

Targets (ratios are always measured in the same run, alternating the compared variants round by round
so that a load change on a shared machine hits both):

1. TTLinear forward+backward vs nn.Linear at the paper's layer shapes; each row's profile note times the
   same layer on one token (the cost that does not shrink with tokens) and the ratio that caps.
2. One full training step of the six-encoder transformer (paper shapes, seq 128), each configuration
   in its own process: CoMERA vs uncompressed at batch 32 (time, peak memory) and CoMERA vs GaLore
   at batch 1 (time, peak memory); and the small preset (size "small"), CoMERA vs uncompressed at batch
   32 and batch 1 (time). The processes take turns in ``--step-rounds`` interleaved rounds
   (default 3; harness.core.interleave, the mechanism of the pipeline's timing groups); every ratio is the
   analysis layer's (harness.results.analysis.ratio on the cells' runs rows: the median over rounds of the
   ratio of the rounds' mean step times, as the claims give it) and every time row carries the cells'
   stability verdicts. The speed rows carry a profile:
   the time of CoMERA's tensorized layers (each re-run alone on its step input) and of the rest of its
   step, which bounds the ratio even if the tensorized layers took no time (the row's bound).
3. TTMEmbedding optimized vs naive lookup (time, peak memory) and the TTM table's memory vs an
   nn.Embedding with dense gradients, at 10000..40000 Zipf-like indices.
4. The paper-shape step at batch 32 after the rank gates halve every rank and comera.prune.prune shrinks
   the cores: the tensorized layers' speedup, and the step's speedup as a fraction of its Amdahl estimate.
5. Contraction-plan FLOPs vs the sum of opt_einsum's optimal costs of the forward and backward
   contractions, over a sweep of TT orders and token counts.

One timing model: targets 1 and 3 time their calls in alternating rounds (harness.core.measure.time_rounds,
as ``comera-bench microbench`` does), target 4 its steps with a cell's step timer in rounds
(harness.core.timing.round_means); per-round times become a ratio through
harness.results.analysis.rounds_ratio and a verdict through analysis.rounds_verdict
(harness.core.timing.judge_rounds, a cell's thresholds); a row whose timings are not stable is ``noisy``
(shown, not judged against its goal).

Each row carries the physical context of its ratio: the FLOP ratio and the compulsory-traffic ratio of
the two ops, and the roofline bound (the row's bound for targets 1 and 3)
``max(F_a/P, B_a/W) / max(F_b/P, B_b/W)`` with the peak matmul rate ``P`` and copy bandwidth ``W``
measured in the same run (harness.perf.microbench.TrafficCounter defines B).
Memory kinds: the one vocabulary of ``harness.core.measure.MEMORY_KINDS`` -- ``cpu_allocated`` /
``cuda_allocated`` for single ops (``measure.call_peak``), and for a training step the cell's
(``cpu_rss_delta`` / ``cuda_allocated``, ``measure.MemoryMonitor``): each configuration of targets 2 and 4
runs as an ordinary cell (``harness.running.run.run_cell``, spec ``harness.perf.worker.cell_spec``) with
the pipeline's warm-up, step, timer and memory monitor, and its result carries the runs columns
(``step_time_ms``, ``peak_mem_bytes``, ``peak_mem_kind``, ``round_step_ms``, ...).

Allocator: every measuring process (this one and each step worker) applies the ``--allocator`` policy
of :mod:`harness.core.allocator` (default "reuse": freed memory is kept for reuse instead of being unmapped
and page-faulted again); what was applied is printed in the header and recorded in every row.

Target 3's table-memory row counts what the table costs in training: parameters + parameter gradients
+ the lookup's working memory beyond the (N x d) output (the peak of one forward+backward minus the
output and the gradients; the output gradient is an input and not counted either), i.e. what differs
between the two layers, which produce the same output and receive the same output gradient.
Target 4 carries its Amdahl estimate: the share ``f`` of the step spent in the tensorized layers'
forward+backward (each re-run alone) and their speedup ``s`` after halving give ``1/((1-f)+f/s)``; the
measured step can gain more, since it also sheds work the lone layers do not show.
"""
