"""harness.perf.layers and harness.perf.roofline: bounds and table memory of targets 1 and 3."""
from __future__ import annotations

import pytest
import torch

from harness.perf import layers
from harness.perf.roofline import Roofline


def test_roofline_bound_takes_the_slower_resource():
    roof = Roofline(flops_per_s=100.0, bytes_per_s=10.0)
    # slow op is compute bound (10 s), fast op is memory bound (2 s): bound 5x, not the FLOP ratio 100x
    assert roof.speedup_bound((1000.0, 10.0), (10.0, 20.0)) == pytest.approx(5.0)


def test_table_memory_counts_params_grads_and_working_memory_beyond_the_output():
    from harness.perf import microbench as mb

    emb = torch.nn.Embedding(1000, 8)
    idx = torch.randint(0, 1000, (300,))
    run, reset = mb._call(emb, idx, "fwd_bwd", wrt_input=False)
    peak, _ = mb.peak_memory(run, torch.device("cpu"), reset)
    memory = layers.TableMemory.of(emb, peak, 300 * 8 * 4)
    assert memory.params == memory.grads == 1000 * 8 * 4
    assert 0 <= memory.working < memory.params  # the dense backward needs little beyond its gradient
    assert memory.total == memory.params + memory.grads + memory.working == 32000 + peak - 300 * 8 * 4


def test_fixed_cost_note_bounds_the_ratio_by_the_one_token_time():
    note = layers.fixed_cost_note(dense_ms=2.0, tt_ms=1.0, one_token_ms=0.5)
    assert "0.500 ms (50% of its time here" in note and "at most 4.00x" in note
