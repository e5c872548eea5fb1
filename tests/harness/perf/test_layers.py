"""harness.perf.layers and harness.perf.roofline: bounds and table memory of targets 1 and 3."""
from __future__ import annotations

import pytest
import torch

from harness.perf import layers
from harness.perf.config import Config
from harness.perf.roofline import Roofline

CUDA = pytest.mark.cuda  # skipped without a CUDA device (tests/conftest.py); `pytest -m cuda` selects them


def test_roofline_bound_takes_the_slower_resource_of_the_fast_op():
    roof = Roofline(flops_per_s=100.0, bytes_per_s=10.0)
    # the fast op is memory bound (2 s at the roofline, not the 0.1 s of its FLOPs): the slow op's 10 s
    # allow at most 5x
    assert roof.speedup_bound(10.0, (10.0, 20.0)) == pytest.approx(5.0)


def test_roofline_bound_allows_a_slow_op_far_below_its_roofline():
    """A slow op of many small products measured at 40x the fast one's roofline time: 40x is possible
    however few FLOPs the slow op counts (its roofline time no bound on its measured time)."""
    roof = Roofline(flops_per_s=100.0, bytes_per_s=10.0)
    assert roof.speedup_bound(80.0, (10.0, 20.0)) == pytest.approx(40.0)


def test_table_memory_counts_params_grads_and_working_memory_beyond_the_output():
    from harness.core import measure
    from harness.perf import microbench as mb

    emb = torch.nn.Embedding(1000, 8)
    idx = torch.randint(0, 1000, (300,))
    run, reset, _ = mb.module_call(emb, idx, "fwd_bwd", wrt_input=False)
    peak, _ = measure.call_peak(run, torch.device("cpu"), reset)
    memory = layers.TableMemory.of(emb, peak, 300 * 8 * 4)
    assert memory.params == memory.grads == 1000 * 8 * 4
    assert 0 <= memory.working < memory.params  # the dense backward needs little beyond its gradient
    assert memory.total == memory.params + memory.grads + memory.working == 32000 + peak - 300 * 8 * 4


def test_fixed_cost_note_bounds_the_ratio_by_the_one_token_time():
    note = layers.fixed_cost_note(dense_ms=2.0, tt_ms=1.0, one_token_ms=0.5, floor_ms=0.125, direct_ms=0.25)
    assert "0.500 ms (50% of its time here" in note and "at most 4.00x" in note
    assert "no arithmetic) takes 0.125 ms and the contraction's forward and backward called directly " \
           "(no autograd) 0.250 ms" in note


def test_contraction_only_runs_the_layer_forward_and_backward_without_a_graph(monkeypatch):
    """The direct call goes through the layer's own contraction (forward, then backward on its saved
    tensors) and leaves no gradient behind."""
    from comera import tt

    layer = tt.TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=3)
    seen = []
    forward, backward = tt.TTLinearFunction.forward, tt.TTLinearFunction.backward
    monkeypatch.setattr(tt.TTLinearFunction, "forward",
                        staticmethod(lambda ctx, *a: seen.append("forward") or forward(ctx, *a)))
    monkeypatch.setattr(tt.TTLinearFunction, "backward",
                        staticmethod(lambda ctx, dy: seen.append(len(backward(ctx, dy)))))
    layers.contraction_only(layer, torch.randn(2, 24))()
    assert seen == ["forward", 3 + 6 + 5] and all(p.grad is None for p in layer.parameters())


def test_autograd_only_passes_every_tensor_of_the_layer_and_computes_nothing():
    """The floor call has the layer's output shape and leaves one gradient on the input and on every
    parameter (bias, cores, gates), as a real call does, without reading their values."""
    from comera.tt import TTLinear

    layer = TTLinear(24, 20, in_shape=[2, 3, 4], out_shape=[5, 2, 2], rank=3)
    x = torch.randn(3, 24, requires_grad=True)
    y = layers.AutogradOnly(layer)(x)
    assert y.shape == (3, 20)
    y.backward(torch.ones_like(y))
    params = list(layer.parameters())
    assert len(params) == 6 + 5 + 1 and x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in params)


def test_rounds_alternate_the_runs_and_the_ratio_is_the_analysis_layers_round_ratio(monkeypatch):
    """Every run once per round, in order; the ratio is the median of the per-round ratios (a slow spell
    in one round moves both sides of that round: harness.results.analysis.rounds_ratio, the statistic of
    cells timed together), printed round by round; the rows' stability is the spread of each side's
    per-round times."""
    from harness.core import measure
    from harness.perf.report import per_round_text
    from harness.results import analysis

    calls, fake = [], {"a": iter([10.0, 30.0, 12.0]), "b": iter([5.0, 10.0, 4.0])}
    run_of = {"a": lambda: None, "b": lambda: None}

    def call_ms(run, **kwargs):
        name = next(k for k, v in run_of.items() if v is run)
        calls.append(name)
        return next(fake[name])

    monkeypatch.setattr(measure, "call_ms", call_ms)
    per_round = measure.time_rounds(run_of, rounds=3, num_threads=1, min_run_time_s=0.0)
    assert calls == ["a", "b"] * 3 and per_round == {"a": [10.0, 30.0, 12.0], "b": [5.0, 10.0, 4.0]}
    r = analysis.rounds_ratio(per_round["a"], per_round["b"])
    # the ratio of medians: 12/5
    assert r.value == 3.0 and per_round_text(r) == "; per round 2.00, 3.00, 3.00"
    assert (r.low, r.high, r.n, r.interleaved) == (2.5, 3.0, 3, True)
    assert analysis.rounds_ratio([1.0], [0.0]) is None and per_round_text(None) == ""
    one = analysis.rounds_ratio([3.0], [2.0])
    assert one.value == 1.5 and per_round_text(one) == ""  # one round: no list
    assert analysis.rounds_verdict(per_round) == (
        "noisy: a per-round times spread 83% of their median (> 25%); "
        "b per-round times spread 60% of their median (> 25%)")
    assert analysis.rounds_verdict({"a": [10.0, 11.0, 10.5], "b": [5.0, 5.2, 4.9]}) == "stable"


def test_cuda_rows_are_skipped_on_another_device_saying_why():
    said = []
    assert layers.target_linear_cuda(Config.make("cpu", 1, quick=True), said.append) == []
    assert said == ["target 1 CUDA rows skipped: they need a CUDA device, this run's is cpu"]


def test_linear_shapes_are_the_distinct_layers_of_the_cases():
    cases = [{"in_shape": [2, 2], "out_shape": [2, 2], "rank": 2, "tokens": t} for t in (8, 16)]
    cases.append({"in_shape": [2, 2], "out_shape": [4, 2], "rank": 2, "tokens": 8})
    assert layers.linear_shapes(cases) == [([2, 2], [2, 2], 2), ([2, 2], [4, 2], 2)]


@CUDA
def test_graph_replay_gives_the_eager_gradients_of_new_inputs():
    """Captured once, replayed after new values are copied into the static input and output gradient:
    the gradients on the input and every parameter are those of an eager call on the new values."""
    from comera.tt import TTLinear

    torch.manual_seed(0)
    layer = TTLinear(48, 40, in_shape=[3, 4, 4], out_shape=[2, 4, 5], rank=3, device="cuda")
    x = torch.randn(16, 48, device="cuda", requires_grad=True)
    grad_out = torch.randn(16, 40, device="cuda")
    replay = layers.graphed_fwd_bwd(layer, x, grad_out)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        grad_out.copy_(torch.randn_like(grad_out))
    replay()
    torch.cuda.synchronize()
    wrt = [x, *layer.parameters()]
    got = [t.grad.clone() for t in wrt]
    want = torch.autograd.grad(layer(x), wrt, grad_out)
    for a, b in zip(got, want):
        assert ((a - b).norm() / b.norm()).item() <= 1e-4


@CUDA
def test_cuda_rows_time_eager_graph_and_compile(monkeypatch):
    cfg = Config.make("cuda", 1, quick=True)
    cfg.goals["cuda_linear"] = [{"in_shape": [2, 2, 4], "out_shape": [2, 4, 4], "rank": 4, "tokens": 64,
                                 "quick_tokens": 8, "graph": 1.0, "vs_official": 0.5}]
    rows = layers.target_linear_cuda(cfg, print)
    assert [r.what.split(",")[1].strip() for r in rows] == ["CUDA graph replay", "eager",
                                                            "torch.compile", "eager"]
    assert [r.goal for r in rows] == [1.0, None, None, 0.5]
    compiled = rows[2]  # inductor (torch 2.11, H200) raised on TTLinear: then an error row naming it
    assert all(r.measured > 0 for r in rows if r is not compiled)
    assert compiled.measured > 0 or compiled.note.startswith("torch.compile failed")
    assert all(f"float32 matmul precision {torch.get_float32_matmul_precision()}" in r.settings for r in rows)


@CUDA
def test_a_compiler_failure_costs_its_own_row_only(monkeypatch):
    """On the H200 inductor raised on the paper-shape TTLinear: the eager and CUDA-graph rows stay."""
    def broken(module, x):
        raise AssertionError("inductor said no")

    monkeypatch.setattr(layers, "compiled_fwd_bwd", broken)
    cfg = Config.make("cuda", 1, quick=True)
    cfg.goals["cuda_linear"] = [{"in_shape": [2, 2, 4], "out_shape": [2, 4, 4], "rank": 4, "tokens": 64,
                                 "quick_tokens": 8, "graph": 1.0, "vs_official": 0.5}]
    rows = {r.what.split(",")[1].strip() + (" official" if "official" in r.what else ""): r
            for r in layers.target_linear_cuda(cfg, print)}
    assert rows["torch.compile"].verdict == "error"
    assert "torch.compile failed: AssertionError: inductor said no" in rows["torch.compile"].note
    assert rows["CUDA graph replay"].measured > 0 and rows["eager"].measured > 0
    assert rows["eager official"].measured > 0


def test_matmul_precision_is_named_on_cuda_only():
    assert layers.matmul_precision(torch.device("cpu")) == ""
    assert layers.matmul_precision(torch.device("cuda")) == (
        f"; float32 matmul precision {torch.get_float32_matmul_precision()}")
