import os
from pathlib import Path

import pytest
import torch

# The native TT ops (comera/native.py) compile into the checkout, not into the user's torch extension
# folder; pipeline subprocesses inherit the variable. Built once per fresh clone.
os.environ.setdefault("COMERA_NATIVE_BUILD_DIR", str(Path(__file__).resolve().parents[1] / ".native-build"))
# One intra-op thread for the whole session (module fixtures too, which run outside one_thread below) and
# for the tests' subprocesses (cells, pipelines, scripts); a cell or a command that names its threads still
# sets them (see one_thread).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    """Test tensors are tiny: extra intra-op threads only add contention on a 2-core machine (10-30x
    slower steps were measured under load). Tests that time or compare thread counts set their own."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


XDIST_MOST = 4
"""The most pytest-xdist workers ``-n auto`` starts (README's test command): one per CPU up to this."""


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may use (xdist's own count is the physical cores), at
    most :data:`XDIST_MOST`."""
    from harness.running.threads import cpus_here

    return max(1, min(cpus_here(), XDIST_MOST))


def pytest_collection_modifyitems(config, items):
    """Slow tests first, so that under xdist (README's ``-n auto --dist loadfile``: each test file in one
    worker, so that a module fixture -- the tiny pipeline run, the SLURM cluster -- is made once) the files
    with long tests start early and the short ones fill the workers' ends.
    Tests marked ``slurm`` last: once their cluster's daemons are stopped, the Slurm client they installed
    makes every later Snakemake start wait ~9 s for a controller (snakemake-executor-plugin-slurm runs
    ``scontrol show config`` when Snakemake loads its plug-ins). Tests marked ``cuda`` need a CUDA device:
    skipped without one (``pytest -m cuda`` selects them, as scripts/gpu_check.sh does). The sort is
    stable: the order is the same in every xdist worker."""
    items.sort(key=lambda item: (item.get_closest_marker("slurm") is not None,
                                 item.get_closest_marker("slow") is None))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
