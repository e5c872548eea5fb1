"""Measuring a training run: step time, epoch time, peak memory and FLOPs per step (docs/measurement.md).

:class:`StepTimer`, :class:`Stopwatch`, :class:`MemoryMonitor` (a training region), :func:`time_rounds`
and :func:`call_peak` (single calls), :data:`MEMORY_KINDS` (the one ``peak_mem_kind`` vocabulary),
:func:`flops_per_step`. The CPU peak's reset: docs/design-notes.md.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import torch
from torch import nn

from harness.core import allocator
from harness.core.timing import quartiles

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_iqr(values: list[float]) -> tuple[float, float]:
    """Median and inter-quartile range (NaN, NaN for no values; IQR 0 for a single value)."""
    if not values:
        return float("nan"), float("nan")
    q1, q2, q3 = quartiles(values)
    return float(q2), float(q3 - q1)


class StepTimer:
    """Wall-clock time of each training step, the device synchronized around it; the first
    ``warmup_steps`` steps are timed but excluded from the summary."""

    def __init__(self, device: torch.device, warmup_steps: int = 0):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.device = torch.device(device)
        self.warmup_steps = warmup_steps
        self.all_ms: list[float] = []
        self.all_cpu_ms: list[float] = []
        self.all_rounds: list[int] = []
        self.round = 0
        """The timing round the next steps belong to (harness.core.interleave)."""
        self.rewarm: set[int] = set()
        """Indices of steps right after a pause between timing rounds: timed, not counted (the pause
        left the caches to other processes; measured ~20% slower than the steps after it)."""
        self.rewarm_next = False

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Times the enclosed block as one step (recorded only when it finishes without exception),
        with the process's CPU time (all threads) during it."""
        synchronize(self.device)
        start, cpu = time.perf_counter(), time.process_time()
        yield
        synchronize(self.device)
        self.all_ms.append((time.perf_counter() - start) * 1e3)
        self.all_cpu_ms.append((time.process_time() - cpu) * 1e3)
        self.all_rounds.append(self.round)
        if self.rewarm_next:
            self.rewarm.add(len(self.all_ms) - 1)
            self.rewarm_next = False

    def _counted(self, values: list) -> list:
        return [v for i, v in enumerate(values) if i >= self.warmup_steps and i not in self.rewarm]

    @property
    def timed_ms(self) -> list[float]:
        return self._counted(self.all_ms)

    @property
    def timed_index(self) -> list[int]:
        """The index of each counted step among all the cell's steps (its place in a period)."""
        return self._counted(list(range(len(self.all_ms))))

    @property
    def timed_rounds(self) -> list[int]:
        return self._counted(self.all_rounds)

    @property
    def timed_cpu_ms(self) -> list[float]:
        return self._counted(self.all_cpu_ms)

    def summary(self, window: int | None = None) -> dict[str, float | int | str]:
        """step_time_ms (median), step_time_ms_iqr, steps_timed, and step_time_ms_mean with its basis.

        With ``window`` (a method's periodic work, e.g. GaLore's SVD on every step that is a multiple of
        update_proj_gap), the mean covers only whole windows after warm-up, so the periodic cost is counted
        once per window; without a whole window it falls back to all timed steps and says so."""
        timed = self.timed_ms
        med, iqr = median_iqr(timed)
        mean_over, basis = timed, "timed steps"
        if window:
            first = -(-self.warmup_steps // window) * window
            last = len(self.all_ms) // window * window
            if last > first:
                mean_over = [ms for i, ms in enumerate(self.all_ms[first:last], first)
                             if i not in self.rewarm]
                basis = f"whole windows of {window} steps ({first}-{last})"
            else:
                basis = f"timed steps (no whole window of {window} steps after warm-up)"
        return {"step_time_ms": med, "step_time_ms_iqr": iqr, "steps_timed": len(timed),
                "step_time_ms_mean": statistics.fmean(mean_over) if mean_over else float("nan"),
                "step_time_mean_basis": basis}


class Stopwatch:
    """Accumulates wall time while running; :meth:`paused` excludes a block (e.g. evaluation)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._elapsed = 0.0
        self._since: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._elapsed, self._since = 0.0, time.perf_counter()

    def elapsed(self) -> float:
        """Seconds counted so far (the device synchronized when running)."""
        if self._since is None:
            return self._elapsed
        synchronize(self.device)
        return self._elapsed + time.perf_counter() - self._since

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._elapsed, self._since = self.elapsed(), None
        try:
            yield
        finally:
            self._since = time.perf_counter()


def epoch_time(full_epochs_s: list[float], *, mean_step_ms: float, steps_per_epoch: int
               ) -> tuple[float, str]:
    """(seconds, kind): measured over whole epochs when at least one ran in full (the median over the
    epochs after the first when there are several, the first one including warm-up otherwise); else
    extrapolated as mean timed step time x steps_per_epoch (the mean, not the median, so periodic work
    such as pruning or GaLore's projection updates is included)."""
    if full_epochs_s:
        measured = full_epochs_s[1:] if len(full_epochs_s) > 1 else full_epochs_s
        return float(statistics.median(measured)), "measured"
    return mean_step_ms * steps_per_epoch / 1e3, "extrapolated"


# ----------------------------------------------------------------------------------- one call, in rounds

def call_ms(run: Callable[[], Any], *, num_threads: int, min_run_time_s: float) -> float:
    """ms per call of ``run`` in one round: the median over ``torch.utils.benchmark``'s blocked_autorange
    blocks (its block-size estimation is the warm-up; it synchronizes an accelerator), at least
    ``min_run_time_s`` of blocks in all. A round may be one block (a block longer than ``min_run_time_s``):
    its spread is the rounds' (:func:`time_rounds`)."""
    from torch.utils.benchmark import Timer

    m = Timer(stmt="run()", globals={"run": run}, num_threads=num_threads).blocked_autorange(
        min_run_time=min_run_time_s)
    return statistics.median(m.times) * 1e3


def time_rounds(runs: dict[str, Callable[[], Any]], *, rounds: int, num_threads: int,
                min_run_time_s: float) -> dict[str, list[float]]:
    """Each run's ms per call (:func:`call_ms`) in each of ``rounds`` rounds, the runs alternating (every
    run once a round, in order): the per-round values of one call, as a cell's are its round means
    (harness.core.timing.round_means). Their median, spread and verdict: harness.core.timing.judge_rounds."""
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            per_round[name].append(call_ms(run, num_threads=num_threads, min_run_time_s=min_run_time_s))
    return per_round


# ------------------------------------------------------------------------------------------- memory

CUDA_ALLOCATED = "cuda_allocated"
CPU_RSS_DELTA = "cpu_rss_delta"
CPU_ALLOCATED = "cpu_allocated"
MEMORY_KINDS: dict[str, str] = {
    CUDA_ALLOCATED: "peak of torch.cuda.max_memory_allocated, reset at the start of the region (a training "
                    "region: an absolute number that includes the model; one call: minus what was allocated "
                    "before it)",
    CPU_RSS_DELTA: "growth of the process's resident-set high-water mark during the training region over the "
                   "RSS at its start (VmHWM where the kernel lets it be reset, else sampled every 1 ms)",
    CPU_ALLOCATED: "peak of the running sum of the CPU allocator's allocations and frees during one call "
                   "(torch.profiler, profile_memory=True)",
}
"""Every ``peak_mem_kind`` (docs/measurement.md, "Memory"): :class:`MemoryMonitor` gives the first two for
a training region, :func:`call_peak` the first and the last for one call."""


@dataclass
class MemoryReading:
    peak_mem_bytes: int | None
    peak_mem_kind: str
    cuda_reserved_bytes: int | None
    details: dict[str, Any] = field(default_factory=dict)


def resolve_device(name: str, what: str = "execution.device") -> torch.device:
    """"auto" -> cuda when available (the device CUDA_VISIBLE_DEVICES gave the job), else cpu; a CUDA
    device without CUDA is an error naming ``what`` (the config key or option that asked for it)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{what} is {name!r} but CUDA is not available here")
    return device


def rss() -> int:
    """This process's resident set size in bytes."""
    return psutil.Process().memory_info().rss


def vm_hwm() -> int | None:
    """The kernel's peak-RSS mark of this process in bytes (VmHWM; None where /proc is missing)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    hwm = vm_hwm()
    return hwm is not None and hwm <= rss() + (1 << 20)


class _Sampler(threading.Thread):
    def __init__(self, interval_s: float):
        super().__init__(daemon=True, name="rss-sampler")
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop_event = threading.Event()
        self._proc = psutil.Process()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self.samples += 1
            self._stop_event.wait(self.interval_s)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, self._proc.memory_info().rss)


class MemoryMonitor:
    """Peak memory of a region (what is measured on each device: docs/measurement.md, "Memory").

    ``cpu_method``: "auto" (kernel high-water mark where allowed, else sampling), "hwm", "sample" or
    "both" (the larger of the two)."""

    def __init__(self, device: torch.device, *, cpu_method: str = "auto", interval_s: float = 1e-3):
        if cpu_method not in ("auto", "hwm", "sample", "both"):
            raise ValueError(f"cpu_method must be auto|hwm|sample|both, got {cpu_method!r}")
        self.device = torch.device(device)
        self.cpu_method = cpu_method
        self.interval_s = interval_s
        self._running = False
        self._peak = 0
        self._reserved = 0
        self._device_in_use = self._device_total = 0
        self._baseline = 0
        self._use_hwm = self._use_sampler = False
        self._sampler: _Sampler | None = None
        self._samples = 0

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
        else:
            allocator.release_free_memory()  # freed heap (e.g. a converted dense model) leaves the RSS
            self._baseline = rss()
            hwm_ok = self.cpu_method in ("auto", "hwm", "both") and reset_hwm()
            if self.cpu_method == "hwm" and not hwm_ok:
                raise RuntimeError("cannot reset the peak-RSS mark through /proc/self/clear_refs here")
            self._use_hwm = hwm_ok
            self._use_sampler = self.cpu_method in ("sample", "both") or not hwm_ok
        self._peak = self._reserved = self._device_in_use = 0
        self._resume(release=False)

    def _resume(self, release: bool = True) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            if release:  # memory freed while paused (an evaluation) must not hold the mark up
                allocator.release_free_memory()
            if self._use_hwm:
                reset_hwm()
            if self._use_sampler:
                self._sampler = _Sampler(self.interval_s)
                self._sampler.start()
        self._running = True

    def _suspend(self) -> None:
        if not self._running:
            return
        if self.device.type == "cuda":
            synchronize(self.device)
            self._peak = max(self._peak, torch.cuda.max_memory_allocated(self.device))
            self._reserved = max(self._reserved, torch.cuda.max_memory_reserved(self.device))
            self._read_device()
        else:
            peak = rss()
            if self._use_hwm:
                peak = max(peak, vm_hwm() or 0)
            if self._sampler is not None:
                peak = max(peak, self._sampler.stop())
                self._samples += self._sampler.samples
                self._sampler = None
            self._peak = max(self._peak, peak - self._baseline)
        self._running = False

    def yield_device(self) -> None:
        """Before this cell waits while another cell of its timing group runs: on CUDA, read the GPU's memory
        in use by every process (this cell's cached blocks still held, the waiting cells' handed back) and
        hand this cell's cached blocks back to the driver, so that a group needs about its cells' resident
        memory plus one cell's working memory, not the sum of their caches. The peaks are unchanged (they
        are allocator statistics); the step after the wait re-allocates and is not counted
        (:class:`StepTimer` ``rewarm``). Nothing on the CPU."""
        if self.device.type != "cuda":
            return
        synchronize(self.device)
        self._read_device()
        torch.cuda.empty_cache()

    def _read_device(self) -> None:
        """The GPU's memory in use by every process now, into the region's largest reading."""
        free, self._device_total = torch.cuda.mem_get_info(self.device)
        self._device_in_use = max(self._device_in_use, self._device_total - free)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Excludes the enclosed block from the peak."""
        was_running = self._running
        self._suspend()
        try:
            yield
        finally:
            if was_running:
                self._resume()

    def stop(self) -> MemoryReading:
        self._suspend()
        return self.reading()

    def reading(self) -> MemoryReading:
        """The peak so far (suspends and resumes a running region to read it)."""
        if self._running:
            with self.paused():
                pass
        if self.device.type == "cuda":
            return MemoryReading(int(self._peak), CUDA_ALLOCATED, int(self._reserved),
                                 {"allocated_at_start": int(self._baseline),
                                  "device_in_use_bytes": int(self._device_in_use),
                                  "device_total_bytes": int(self._device_total)})
        method = "+".join(m for m, on in (("vmhwm", self._use_hwm), ("sampled", self._use_sampler)) if on)
        return MemoryReading(int(max(self._peak, 0)), CPU_RSS_DELTA, None,
                             {"rss_at_start": int(self._baseline), "cpu_method": method,
                              "samples": self._samples})

    def __enter__(self) -> "MemoryMonitor":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._suspend()


def call_peak(run: Callable[[], Any], device: torch.device,
              reset: Callable[[], None] | None = None) -> tuple[int, str]:
    """Peak bytes allocated by one call of ``run`` above what was allocated before it (after ``reset``,
    which drops what an earlier call left, e.g. gradients), and its kind: ``cuda_allocated`` on CUDA,
    ``cpu_allocated`` on CPU (:data:`MEMORY_KINDS`)."""
    from torch.profiler import ProfilerActivity, profile

    if reset is not None:
        reset()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, CUDA_ALLOCATED
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak, CPU_ALLOCATED


# -------------------------------------------------------------------------------------------- FLOPs

def _counted_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that count their own FLOPs (a ``flops`` method, or nn.Linear); their children are not
    visited."""
    found: dict[str, nn.Module] = {}

    def visit(prefix: str, module: nn.Module) -> None:
        if callable(getattr(module, "flops", None)) or isinstance(module, nn.Linear):
            found[prefix] = module
            return
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return found


def _tokens_of(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    x = inputs[0] if inputs else None
    if not isinstance(x, torch.Tensor):
        return 0
    if x.is_floating_point() or x.is_complex():
        return x.numel() // max(x.shape[-1], 1) if x.dim() else 1
    return x.numel()  # indices (embedding lookups)


@contextlib.contextmanager
def count_tokens(model: nn.Module) -> Iterator[dict[str, int]]:
    """Within the block, records per counted module the tokens it sees (rows of its input; indices for
    an embedding), summed over calls."""
    tokens: dict[str, int] = {}
    handles = []
    for name, module in _counted_modules(model).items():
        def hook(mod: nn.Module, inputs: tuple[Any, ...], _name: str = name) -> None:
            tokens[_name] = tokens.get(_name, 0) + _tokens_of(mod, inputs)
        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield tokens
    finally:
        for h in handles:
            h.remove()


def flops_per_step(model: nn.Module, tokens: dict[str, int]) -> tuple[int, dict[str, Any]]:
    """Analytic forward+backward FLOPs of one step given the tokens each counted module saw (from
    :func:`count_tokens`), with the basis: how many modules were counted by plan and by shape."""
    total, by_plan, by_shape = 0, 0, 0
    modules = _counted_modules(model)
    for name, n in tokens.items():
        module = modules.get(name)
        if module is None or n == 0:
            continue
        if callable(getattr(module, "flops", None)):
            total += int(module.flops(n))
            by_plan += 1
        else:
            total += 6 * n * module.in_features * module.out_features
            by_shape += 1
    return total, {"flops_modules_plan": by_plan, "flops_modules_linear": by_shape,
                   "flops_basis": "TT/TTM plans (fwd+bwd) + nn.Linear 6*tokens*in*out; "
                                  "attention products, element-wise ops and optimizer not counted"}


def measure_flops(model: nn.Module, run_forward: Callable[[], Any]) -> tuple[int, dict[str, int],
                                                                              dict[str, Any]]:
    """Runs ``run_forward`` once under no_grad with token counting; returns (flops, tokens, basis)."""
    with torch.no_grad(), count_tokens(model) as tokens:
        run_forward()
    flops, basis = flops_per_step(model, tokens)
    return flops, dict(tokens), basis
