import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# One intra-op thread for the whole session (module fixtures too, which run outside one_thread below) and
# for the tests' subprocesses (cells, pipelines, scripts); a cell or a command that names its threads still
# sets them (see one_thread).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

NO_SCONTROL_DIR = Path(tempfile.mkdtemp(prefix="comera-bench-tests-bin-"))
"""First on the tests' PATH: an ``scontrol`` that fails at once. snakemake-executor-plugin-slurm runs
``scontrol show config`` whenever Snakemake loads its plug-ins, and where a SLURM client has no controller
(this machine once tests/workflow/test_slurm.py stopped its daemons) that waits ~9 s in every Snakemake
process; the plug-in takes a failure as "no MinJobAge" either way. test_slurm.py takes it off its PATH."""
(NO_SCONTROL_DIR / "scontrol").write_text("#!/bin/sh\nexit 1\n")
(NO_SCONTROL_DIR / "scontrol").chmod(0o755)
os.environ["PATH"] = f"{NO_SCONTROL_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
atexit.register(shutil.rmtree, NO_SCONTROL_DIR, ignore_errors=True)


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


def pytest_configure(config):
    """xdist keeps the order :func:`pytest_collection_modifyitems` makes (its own hands out the files with
    most tests first, which starts the long end-to-end files, with few tests each, last)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The order in which xdist hands out whole files (README's ``--dist loadfile``: each file on one
    worker, so that a module fixture -- the tiny pipeline run, the SLURM cluster -- is made once): files
    with a test marked ``slow`` first, so that the long end-to-end files start early and the many quick
    files fill the workers' ends; among them, most tests first; slow tests first inside a file. Files with
    tests marked ``slurm`` last: their cluster holds the CPUs while it runs jobs. Tests marked ``cuda`` need
    a CUDA device: skipped without one (``pytest -m cuda`` selects them, as scripts/gpu_check.sh does). The
    order is the same in every xdist worker."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def marked(name: str, marker: str) -> bool:
        return any(test.get_closest_marker(marker) for test in files[name])

    order = sorted(files, key=lambda name: (marked(name, "slurm"), not marked(name, "slow"),
                                            -len(files[name])))
    items[:] = [item for name in order
                for item in sorted(files[name], key=lambda item: item.get_closest_marker("slow") is None)]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
