#!/usr/bin/env bash
# Creates .venv (if missing) and installs comera-bench with its pipeline (bench), test and cluster extras.
# torch first, when the venv has none: on a machine without an NVIDIA GPU the CPU build from PyTorch's
# CPU wheel index (a plain `torch` requirement would pull a multi-GB CUDA build), falling back to a plain
# `pip install torch==2.13.0` when that index cannot be reached (an offline mirror or a local wheel);
# with a GPU (nvidia-smi present) the default build. Bring your own torch by installing it into .venv
# before this script.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
TORCH=torch==2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        .venv/bin/pip install -q "$TORCH"
    else
        .venv/bin/pip install -q --timeout 10 --retries 0 --index-url "$CPU_INDEX" "$TORCH" 2>/dev/null \
            || { echo "setup.sh: PyTorch's CPU index not reachable; installing $TORCH from the default index" >&2
                 .venv/bin/pip install -q "$TORCH"; }
    fi
fi
.venv/bin/pip install -q -e ".[bench,test,slurm]"
