"""scripts/setup.sh asks PyTorch's CPU index for the CPU build of torch on a machine without an NVIDIA
GPU, falls back to the plain install when that index cannot be reached, and takes the default build
where nvidia-smi exists (a fake venv records the pip calls; nothing is installed)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_PIP = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../pip-calls"
for a in "$@"; do [ "$a" = "--index-url" ] && [ -n "$CPU_INDEX_DOWN" ] && exit 1; done
exit 0
"""


def _setup(tmp_path: Path, *, gpu: bool, index_down: bool) -> list[str]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/usr/bin/env bash\nexit 1\n")  # no torch yet
    (venv / "pip").write_text(FAKE_PIP)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\nexit 0\n")
    for f in (venv / "python", venv / "pip", *bin_dir.iterdir()):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "CPU_INDEX_DOWN": "1" if index_down else ""}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / ".venv" / "pip-calls").read_text().splitlines()


@pytest.mark.parametrize("gpu, index_down, torch_calls", [
    (False, False, ["--index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]),
    (False, True, ["--index-url https://download.pytorch.org/whl/cpu torch==2.13.0",
                   "install -q torch==2.13.0"]),
    (True, False, ["install -q torch==2.13.0"]),
])
def test_torch_comes_from_the_cpu_index_without_a_gpu(tmp_path, gpu, index_down, torch_calls):
    calls = _setup(tmp_path, gpu=gpu, index_down=index_down)
    assert len(calls) == len(torch_calls) + 1
    for call, expected in zip(calls, torch_calls):
        assert call.endswith(expected), (call, expected)
    assert calls[-1] == 'install -q -e .[bench,test,slurm]'
