import time

import pytest
import torch
from torch import nn

from harness.core import measure

MB = 1 << 20


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", fake)
    return fake


@pytest.mark.parametrize("values, expected", [
    ([], (float("nan"), float("nan"))),
    ([5.0], (5.0, 0.0)),
    ([1.0, 2.0, 3.0, 4.0, 100.0], (3.0, 2.0)),
])
def test_median_iqr(values, expected):
    med, iqr = measure.median_iqr(values)
    if values:
        assert (med, iqr) == expected
    else:
        assert med != med and iqr != iqr


@pytest.mark.parametrize("warmup", [0, 2])
def test_step_timer_excludes_warmup(clock, warmup):
    timer = measure.StepTimer(torch.device("cpu"), warmup_steps=warmup)
    durations = [0.5, 0.4, 0.010, 0.012, 0.011, 0.013]
    for d in durations:
        with timer.step():
            clock.now += d
    assert timer.all_ms == pytest.approx([d * 1e3 for d in durations])
    summary = timer.summary()
    timed = [d * 1e3 for d in durations[warmup:]]
    assert summary["steps_timed"] == len(timed)
    assert summary["step_time_ms"] == pytest.approx(measure.median_iqr(timed)[0])
    assert summary["step_time_ms_mean"] == pytest.approx(sum(timed) / len(timed))


@pytest.mark.parametrize("warmup, window, covered", [
    (3, 4, slice(4, 12)),     # steps 4-11: two whole windows, each with one slow (SVD) step
    (0, 4, slice(0, 12)),
    (3, 20, None),            # no whole window after warm-up: all timed steps, and the basis says so
])
def test_step_timer_mean_covers_whole_windows(clock, warmup, window, covered):
    timer = measure.StepTimer(torch.device("cpu"), warmup_steps=warmup)
    durations = [0.1 if i % 4 == 0 else 0.01 for i in range(14)]  # a periodic slow step every 4
    for d in durations:
        with timer.step():
            clock.now += d
    summary = timer.summary(window=window)
    expect = [d * 1e3 for d in (durations[covered] if covered else durations[warmup:])]
    assert summary["step_time_ms_mean"] == pytest.approx(sum(expect) / len(expect))
    assert ("whole windows" in summary["step_time_mean_basis"]) == (covered is not None)


def test_step_timer_drops_a_failed_step(clock):
    timer = measure.StepTimer(torch.device("cpu"))
    with pytest.raises(ValueError):
        with timer.step():
            clock.now += 1
            raise ValueError
    assert timer.all_ms == [] and timer.summary()["steps_timed"] == 0


def test_step_timer_rejects_negative_warmup():
    with pytest.raises(ValueError, match="warmup_steps"):
        measure.StepTimer(torch.device("cpu"), warmup_steps=-1)


def test_stopwatch_pauses(clock):
    watch = measure.Stopwatch(torch.device("cpu"))
    watch.start()
    clock.now += 2
    with watch.paused():
        clock.now += 100
    clock.now += 3
    assert watch.elapsed() == pytest.approx(5)


@pytest.mark.parametrize("epochs, expected", [([], (2.5, "extrapolated")), ([9.0], (9.0, "measured")),
                                              ([9.0, 4.0, 5.0, 6.0], (5.0, "measured"))])
def test_epoch_time(epochs, expected):
    value, kind = measure.epoch_time(epochs, mean_step_ms=25.0, steps_per_epoch=100)
    assert (pytest.approx(value), kind) == expected


def _hold_buffer(nbytes):
    buf = torch.ones(nbytes // 4)  # written, so resident
    time.sleep(0.05)
    return float(buf[-1])


@pytest.mark.parametrize("method", ["auto", "sample"])
def test_cpu_peak_rss_delta_sees_200mb_buffer(method):
    monitor = measure.MemoryMonitor(torch.device("cpu"), cpu_method=method)
    with monitor:
        _hold_buffer(200 * MB)
    reading = monitor.reading()
    assert reading.peak_mem_kind == "cpu_rss_delta" and reading.cuda_reserved_bytes is None
    assert 190 * MB <= reading.peak_mem_bytes < 400 * MB


def test_paused_region_is_not_counted():
    monitor = measure.MemoryMonitor(torch.device("cpu"))
    monitor.start()
    with monitor.paused():
        _hold_buffer(200 * MB)
    _hold_buffer(20 * MB)
    reading = monitor.stop()
    assert 15 * MB <= reading.peak_mem_bytes < 150 * MB


@pytest.mark.parametrize("method", ["auto", "sample"])
def test_cpu_monitor_releases_free_heap_before_baseline_and_on_resume(monkeypatch, method):
    events = []
    monkeypatch.setattr(measure.allocator, "release_free_memory", lambda: events.append("release") or True)
    monkeypatch.setattr(measure, "rss", lambda: events.append("baseline") or 0)
    monitor = measure.MemoryMonitor(torch.device("cpu"), cpu_method=method)
    monitor.start()
    assert events[:2] == ["release", "baseline"] and events.count("release") == 1
    with monitor.paused():
        events.clear()
    assert events == ["release"]  # on resuming, before the mark is reset
    monitor.stop()


def test_monitor_rejects_unknown_method():
    with pytest.raises(ValueError, match="cpu_method"):
        measure.MemoryMonitor(torch.device("cpu"), cpu_method="guess")


@pytest.mark.cuda
def test_cuda_peak_allocated_sees_buffer():
    device = torch.device("cuda")
    monitor = measure.MemoryMonitor(device)
    with monitor:
        buf = torch.ones(50 * MB, device=device)
        del buf
    reading = monitor.reading()
    assert reading.peak_mem_kind == "cuda_allocated"
    assert reading.peak_mem_bytes >= 200 * MB and reading.cuda_reserved_bytes >= reading.peak_mem_bytes


def _cuda_stand_in(monkeypatch, in_use, allocated=0, peak=0, reserved=0):
    """torch.cuda's memory calls, as MemoryMonitor makes them, on a machine without CUDA: the GPU's memory in
    use by every process is read from ``in_use`` (of 100 MB in all); returns the list empty_cache appends
    to."""
    readings, emptied = iter(in_use), []
    monkeypatch.setattr(measure, "synchronize", lambda device: None)
    for name, value in (("memory_allocated", allocated), ("max_memory_allocated", peak),
                        ("max_memory_reserved", reserved)):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, value=value: value)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * MB - next(readings), 100 * MB))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    return emptied


def test_cuda_reading_has_the_gpus_memory_in_use_by_every_process(monkeypatch):
    """The GPU-wide reading (a timing group's other cells included) is the largest where the region paused or
    ended; on CUDA through a stand-in for torch.cuda's calls, since this machine has none."""
    _cuda_stand_in(monkeypatch, [3 * MB, 7 * MB, 5 * MB], allocated=1 * MB, peak=2 * MB, reserved=4 * MB)
    monitor = measure.MemoryMonitor(torch.device("cuda"))
    monitor.start()
    with monitor.paused():  # an evaluation
        pass
    with monitor.paused():
        pass
    reading = monitor.stop()
    assert reading.details == {"allocated_at_start": 1 * MB, "device_in_use_bytes": 7 * MB,
                               "device_total_bytes": 100 * MB}
    assert (reading.peak_mem_bytes, reading.cuda_reserved_bytes) == (2 * MB, 4 * MB)


def test_yielding_the_device_reads_the_gpu_and_empties_the_cache_on_cuda_only(monkeypatch):
    emptied = _cuda_stand_in(monkeypatch, [9 * MB, 4 * MB])
    measure.MemoryMonitor(torch.device("cpu")).yield_device()
    assert emptied == []  # nothing on the CPU
    monitor = measure.MemoryMonitor(torch.device("cuda"))
    monitor.start()
    monitor.yield_device()  # its cache still full, the others' handed back: the larger reading
    reading = monitor.stop()
    assert emptied == [1] and reading.details["device_in_use_bytes"] == 9 * MB


@pytest.mark.cuda
def test_yielding_the_device_hands_the_cache_back_on_a_gpu():
    device = torch.device("cuda")
    monitor = measure.MemoryMonitor(device)
    monitor.start()
    buf = torch.ones(64 * MB, device=device)  # 256 MiB, cached once freed
    del buf
    assert torch.cuda.memory_reserved(device) >= 256 * MB
    monitor.yield_device()
    assert torch.cuda.memory_reserved(device) < 256 * MB
    reading = monitor.stop()
    assert reading.peak_mem_bytes >= 256 * MB  # the peak is the allocator's statistic: unchanged
    assert reading.details["device_in_use_bytes"] >= 256 * MB and reading.details["device_total_bytes"] > 0


class Planned(nn.Module):
    """Stands for a TT layer: counts itself through flops(tokens); its inner Linear is not counted."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(6, 6)

    def flops(self, tokens):
        return 1000 * tokens

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("batch_shape", [(5,), (2, 7)])
def test_flops_per_step_counts_plans_and_linears(batch_shape):
    model = nn.Sequential(nn.Linear(4, 6), Planned(), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(*batch_shape, 4)
    flops, tokens, basis = measure.measure_flops(model, lambda: model(x))
    n = x.numel() // 4
    assert tokens == {"0": n, "1": n, "3": n}
    assert flops == 6 * n * 4 * 6 + 1000 * n + 6 * n * 6 * 3
    assert basis["flops_modules_plan"] == 1 and basis["flops_modules_linear"] == 2
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_flops_counts_indices_of_embedding_like_modules():
    class Table(nn.Module):
        def flops(self, tokens):
            return 10 * tokens

        def forward(self, idx):
            return torch.zeros(*idx.shape, 2)

    model = Table()
    idx = torch.randint(0, 5, (3, 4))
    flops, tokens, _ = measure.measure_flops(model, lambda: model(idx))
    assert tokens == {"": 12} and flops == 120


def test_step_after_a_round_pause_is_timed_but_not_counted():
    timer = measure.StepTimer(torch.device("cpu"), warmup_steps=1)
    for i in range(6):
        if i in (1, 4):  # a round starts: the coordinator paused this process before the step
            timer.round += i > 1
            timer.rewarm_next = True
        with timer.step():
            pass
    assert len(timer.all_ms) == 6 and timer.rewarm == {1, 4}
    assert len(timer.timed_ms) == 3 and timer.timed_rounds == [0, 0, 1]
    assert timer.summary()["steps_timed"] == 3


def test_every_memory_kind_is_documented():
    """The one vocabulary of peak_mem_kind (measure.MEMORY_KINDS) is the one docs/measurement.md lists."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "measurement.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \| ", doc.split("## Memory", 1)[1], flags=re.M))
    assert listed == set(measure.MEMORY_KINDS)
