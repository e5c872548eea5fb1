"""harness.perf.microbench: spec checking, cost counters, memory measurement and schema-complete rows."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from harness.configs.microbench_spec import LINEAR_VARIANTS
from harness.core import measure
from harness.perf import microbench as mb
from harness.results import MICROBENCH_COLUMNS, file_metadata, read_parquet, to_frame

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_rows():
    return mb.run(mb.PRESETS["tiny"])


def test_tiny_spec_rows_are_schema_complete(tiny_rows):
    frame = to_frame(tiny_rows, "microbench")
    assert list(frame.columns) == MICROBENCH_COLUMNS
    assert (frame["time_ms"] > 0).all() and (frame["time_ms_iqr"] >= 0).all()
    assert (frame["peak_mem_bytes"] > 0).all()
    assert set(frame["direction"]) == {"fwd", "fwd_bwd"}
    assert set(frame.loc[frame.op == "embedding", "variant"]) == set(mb.EMBEDDING_VARIANTS)
    assert set(frame.loc[frame.op == "linear", "variant"]) == set(LINEAR_VARIANTS)
    assert frame.loc[frame.variant == "dense", "rank"].isna().all()
    assert (frame.loc[frame.variant == "tt", "rank"] == 4).all()
    assert (frame["device"] == "cpu").all() and (frame["num_threads"] == 1).all()
    assert all(len(json.loads(r)) == 5 for r in frame["round_time_ms"])  # the spec's rounds (default 5)
    assert frame["timing_quality"].str.match(r"stable$|noisy: ").all() and (frame["param_bytes"] > 0).all()


def test_dense_linear_flops_are_counted_exactly(tiny_rows):
    dense = {r["direction"]: r["flops"] for r in tiny_rows if r["variant"] == "dense"}
    tokens, n_in, n_out = 16, 16, 32
    assert dense["fwd"] == 2 * tokens * n_in * n_out
    assert dense["fwd_bwd"] == 6 * tokens * n_in * n_out  # forward, input gradient, weight gradient


def test_tt_fwd_bwd_flops_match_the_plan():
    from comera.tt import TTLinear
    from harness.perf.plans import plan_contraction_flops

    layer = TTLinear(16, 32, in_shape=(4, 4), out_shape=(4, 8), rank=4, bias=False)
    run, *_ = mb.module_call(layer, torch.randn(16, 16), "fwd_bwd", wrt_input=True)
    flops, _ = mb.count_cost(run)
    assert flops == plan_contraction_flops(layer.plan(16))  # the kernels execute what the plan counts


@pytest.mark.parametrize("numel", [2**10, 2**18])
def test_cpu_peak_memory_sees_a_transient_allocation(numel):
    def run():
        a = torch.ones(numel)
        b = a * 2  # a and b alive together: peak is two buffers
        del a
        return b.sum()

    peak, kind = measure.call_peak(run, CPU)
    assert kind == "cpu_allocated"
    assert 2 * numel * 4 <= peak <= 2 * numel * 4 + 4096


def test_fwd_bwd_peak_includes_output_and_gradients():
    layer = nn.Linear(64, 128, bias=False)
    run, reset, _ = mb.module_call(layer, torch.randn(32, 64), "fwd_bwd", wrt_input=True)
    run()  # leaves gradients behind; reset must drop them before measuring
    peak, _ = measure.call_peak(run, CPU, reset)
    minimum = 4 * (32 * 128 + 32 * 64 + 64 * 128)  # output + input grad + weight grad
    assert minimum <= peak <= 2 * minimum


def test_traffic_counter_counts_operands_and_gathers():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    flops, traffic = mb.count_cost(lambda: a @ b)
    assert flops == 2 * 8 * 16 * 4
    assert traffic == 4 * (8 * 16 + 16 * 4 + 8 * 4)
    table, idx = torch.randn(1000, 16), torch.tensor([1, 5, 7])
    _, gather = mb.count_cost(lambda: table.index_select(0, idx))
    assert gather == 2 * 3 * 16 * 4 + 3 * 8  # rows read + written, indices read; not the whole table
    _, view = mb.count_cost(lambda: table.view(16, 1000))
    assert view == 0


def test_op_counter_counts_every_dispatched_op_of_the_second_call():
    """Views count like any op; the first call (set-up, e.g. lazy state) is left out."""
    calls, a = [], torch.randn(3, 4)

    def run():
        calls.append(1)
        if len(calls) == 1:
            a.sum()  # set-up work of the first call only
        a.view(2, 6).t().mul(2.0)

    assert mb.count_ops(run) == 3 and len(calls) == 2
    layer, x = nn.Linear(4, 5), torch.randn(2, 4, requires_grad=True)
    fwd_bwd = mb.module_call(layer, x, "fwd_bwd", wrt_input=True)[0]
    assert mb.count_ops(fwd_bwd) == 13  # addmm, 2 mm, sum, t x5, view, and 3 gradient accumulations


def test_zipf_indices_are_deterministic_in_range_and_skewed():
    idx = mb.zipf_indices(20000, 5000, 1.05, seed=3)
    assert torch.equal(idx, mb.zipf_indices(20000, 5000, 1.05, seed=3))
    assert idx.dtype == torch.int64 and int(idx.min()) >= 0 and int(idx.max()) < 5000
    counts = torch.bincount(idx, minlength=5000)
    assert int(counts.max()) > 50 * 20000 / 5000  # the hottest row is far above uniform
    assert int(torch.unique(idx).numel()) < 5000


@pytest.mark.parametrize("spec, message", [
    ({"repeats": 3}, "unknown key 'repeats'"),
    ({"device": "tpu"}, "device='tpu'"),
    ({"num_threads": 0}, "num_threads=0"),
    ({"min_run_time_s": 0}, "min_run_time_s=0"),
    ({"linear": {"layers": [], "rank": [4]}}, "linear: unknown key 'rank'"),
    ({"linear": {"layers": [{"in_shape": [4], "outshape": [4]}]}}, "unknown key 'outshape'"),
    ({"linear": {"tokens": [0]}}, "linear.tokens: 0"),
    ({"embedding": {"variants": ["fast"]}}, "unknown value 'fast'"),
    ({"embedding": {"tables": [{"rows": 3}]}}, "embedding.tables: unknown key 'rows'"),
    ({"embedding": {"zipf_exponent": -1}}, "zipf_exponent=-1"),
    ({"allocator": "jemalloc"}, "allocator='jemalloc'"),
])
def test_bad_specs_name_the_key(spec, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        mb.check_spec(spec)


def test_spec_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: cpu\nthreads: 2\n")
    with pytest.raises(ValueError, match=f"{bad}.*unknown key 'threads'"):
        mb.load_spec(bad)


def test_cli_writes_a_microbench_file(tmp_path):
    spec = {"device": "cpu", "num_threads": 1, "min_run_time_s": 0.005,
            "linear": {"layers": [{"in_shape": [2, 4], "out_shape": [4, 2]}], "ranks": [2], "tokens": [4],
                       "directions": ["fwd"]}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "m.parquet"
    assert mb.cli(["--spec", str(path), "--out", str(out), "--quiet", "--allocator", "system"]) == 0
    frame = read_parquet(out, "microbench")
    assert sorted(frame["variant"]) == ["dense", "tt"]
    assert frame.loc[frame.variant == "tt", "shape"].item() == "8x8 [2,4|4,2]"
    meta = file_metadata(out)
    assert meta["kind"] == "microbench" and meta["provenance"]["peak_mem_kind"] == "cpu_allocated"
    assert meta["provenance"]["spec"]["linear"]["ranks"] == [2]
    assert meta["provenance"]["spec"]["allocator"] == "system"
    assert meta["provenance"]["allocator"].startswith("system")


def test_cli_reports_a_bad_spec(tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"devices": "cpu"}))
    assert mb.cli(["--spec", str(path), "--out", str(tmp_path / "m.parquet")]) == 2
    assert "unknown key 'devices'" in capsys.readouterr().err


@pytest.mark.cuda  # the cuda_allocated peak
def test_cuda_peak_memory():
    def run():
        return torch.ones(2**20, device="cuda").sum()

    peak, kind = measure.call_peak(run, torch.device("cuda"))
    assert kind == "cuda_allocated" and peak >= 4 * 2**20


def test_an_output_that_cannot_be_written_is_named(tmp_path, monkeypatch, capsys):
    import errno

    from harness import results
    from harness.perf import microbench

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro" / "x.parquet"))

    monkeypatch.setattr(results, "write_parquet_atomic", refuse)
    assert microbench.cli(["--preset", "tiny", "--out", str(tmp_path / "ro" / "x.parquet")]) == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and "Permission denied" in err and "Traceback" not in err


def test_micro_benchmarks_share_the_cells_quartiles_and_memory_kinds(monkeypatch):
    """A case is timed in rounds (harness.core.measure.time_rounds); its median and IQR are the cells'
    quartiles (measure.median_iqr) of the rounds, and the memory kinds come from the one vocabulary
    (measure.MEMORY_KINDS)."""
    seen = []
    real = mb.median_iqr
    monkeypatch.setattr(mb, "median_iqr", lambda values: seen.append(list(values)) or real(values))
    case = next(mb.linear_cases({"layers": [{"in_shape": [4, 4], "out_shape": [4, 8]}], "variants": ["dense"],
                                 "tokens": [8], "directions": ["fwd"]}, CPU, 0))
    row = mb.to_row(mb.measure(case, CPU, num_threads=1, min_run_time_s=0.001, rounds=3), {})
    assert seen[-1] == json.loads(row["round_time_ms"]) and len(seen[-1]) == 3
    assert (row["time_ms"], row["time_ms_iqr"]) == real(seen[-1])
    _, kind = measure.call_peak(lambda: torch.ones(64).sum(), CPU)
    assert kind == measure.CPU_ALLOCATED and {kind, measure.CUDA_ALLOCATED} <= set(measure.MEMORY_KINDS)
    assert measure.MemoryMonitor(CPU).stop().peak_mem_kind in measure.MEMORY_KINDS


def test_a_case_timed_in_one_round_is_not_stable(monkeypatch):
    """One round (one blocked_autorange that may be a single block: an IQR of exactly 0, as a 16 ms
    dense forward next to its 0.33 ms forward+backward once showed under load) has no spread to judge:
    the row says so, as it says a spread or a busy machine; the row records the bytes it measured."""
    case = next(mb.linear_cases({"layers": [{"in_shape": [4, 4], "out_shape": [4, 8]}], "variants": ["dense"],
                                 "tokens": [8], "directions": ["fwd_bwd"]}, CPU, 0))
    one = mb.to_row(mb.measure(case, CPU, num_threads=1, min_run_time_s=0.001, rounds=1), {})
    assert one["time_ms_iqr"] == 0.0 and one["timing_quality"].startswith("noisy: rounds: 1 round(s) (< 2)")
    monkeypatch.setattr(mb, "time_rounds", lambda runs, **kw: {"case": [1.0, 1.1, 3.0, 1.0, 1.05]})
    monkeypatch.setattr(mb.timing.MachineState, "columns",
                        lambda self: {"load_avg_1m": 7.0, "cpu_pressure": 0.6, "run_queue_frac": 0.5})
    noisy = mb.to_row(mb.measure(case, CPU, num_threads=1, min_run_time_s=0.001, rounds=5), {})
    assert "waited for a CPU 50%" in noisy["timing_quality"] and "CPU pressure 60%" in noisy["timing_quality"]
    assert (one["param_bytes"], one["output_bytes"]) == ((16 * 32 + 32) * 4, 8 * 32 * 4)
