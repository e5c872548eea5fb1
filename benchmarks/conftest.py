"""Settings of the pytest-benchmark micro-benchmarks (``pytest benchmarks/``; docs/performance.md)."""
from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--torch-threads", type=int, default=2,
                     help="torch.set_num_threads for the benchmarks (default 2, as comera-bench bench)")


@pytest.fixture(autouse=True)
def torch_threads(request):
    """Every benchmark runs with ``--torch-threads`` intra-op threads and a fixed seed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(request.config.getoption("--torch-threads"))
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def pytest_benchmark_update_machine_info(config, machine_info):
    """Saved runs (``--benchmark-save``) say which torch and how many threads measured them."""
    machine_info["torch_version"] = torch.__version__
    machine_info["torch_threads"] = config.getoption("--torch-threads")
