#!/usr/bin/env bash
# Creates .venv (if missing) and installs comera-bench with its pipeline (bench), test and cluster extras.
# A CPU build of torch is installed first when the venv has no torch: a bare `torch` requirement would
# pull a multi-GB CUDA build. Bring your own CUDA torch by installing it into .venv before this script.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[bench,test,slurm]"
