#!/usr/bin/env bash
# The prepared GPU check: one call on a machine with a CUDA GPU runs the tests there (the CUDA-only ones
# are skipped elsewhere) and `comera-bench bench` on the GPU (targets 1-5, one round of step processes).
#   here, once:      bash scripts/device_wheels.sh   (what the device image lacks, into .whl/)
#   on the device:   bash scripts/gpu_check.sh       (device tool: carry [".whl"]; about 5 minutes)
# Writes env.txt, pytest.txt, bench.txt and bench.{parquet,md} to $OUT (else results/gpu_check).
# DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python runs the same flow here: a dry run of the script itself.
# Exit status: 0 when every part ran and the tests passed, 1 otherwise (the files say which part failed).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu_check}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/comera-site .whl/*.whl || { echo "gpu_check: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/comera-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u
  git rev-parse HEAD 2>/dev/null || true
  command -v nvidia-smi > /dev/null && nvidia-smi
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
status=0
# The tests of the library, baselines and harness (tests/workflow needs snakemake, which is not carried).
timeout 300 "$py" -m pytest -q -m "not slow" -p no:cacheprovider -rs tests/comera tests/baselines tests/harness \
  > "$out/pytest.txt" 2>&1 || status=1
tail -25 "$out/pytest.txt"
timeout 420 "$py" -m harness.perf.bench --device "$device" ${QUICK:+--quick} --step-rounds 1 --out "$out/bench.parquet" \
  > "$out/bench.txt" 2>&1 || status=1
tail -40 "$out/bench.txt"
exit $status
