#!/usr/bin/env bash
# The prepared GPU check: one run on a machine with one CUDA GPU and no network, at most BUDGET_S
# (default 450 s) of wall time, that always leaves its results in $OUT (default results/gpu_check):
#   here, once:      bash scripts/device_wheels.sh   (what the device image lacks, into .whl/)
#   on the device:   bash scripts/gpu_check.sh       (device tool: carry [".whl"]; timeout_s 540)
# First, when the native TT ops load, their device-parametrized tests on this device (at most 120 s): where
# they fail, the phases run the Python kernels (COMERA_NATIVE=0; env.txt says so).
# Phases, each under `timeout` within what is left of the budget:
#   tests   `pytest -m cuda`: the tests that need CUDA (at most TESTS_S, 90 s)
#   bench   `comera-bench bench --device cuda --targets 1` (at most BENCH_S, 150 s: it compiles four modules)
#   grid    `snakemake figures --configfile config/gpu.yaml` (the rest, less FIGURES_S and PACK_S); at its
#           limit Snakemake and its jobs get SIGINT, SIGKILL KILL_S later: a stopped timing group leaves no row
#   figures `snakemake figures --config only_finished=True`: merged tables, figures and claims of the cells
#           that finished, when the grid did not end by itself (at most FIGURES_S, 60 s)
# Files in $OUT, at most 8, rewritten after every phase (so SIGKILL loses at most the running phase):
# gpu_check.log (phases, limits, exit codes), env.txt (GPU, torch build, CUDA, float32 matmul precision),
# pytest.txt, bench.txt, pipeline.txt (Snakemake's output), results.tar.gz (per-cell files, merged
# tables, grid.json, logs, bench.{parquet,md,png}) and figures.tar.gz (figures, tables, claims.md).
# SIGTERM, SIGINT or SIGHUP stop the running phase, then the figures of what finished are drawn (at most
# STOP_FIGURES_S, 30 s) and everything is packed. DEVICE=cpu QUICK=1 runs the same flow on the CPU with
# config/gpu-tiny.yaml and the quick bench (the dry run of tests/scripts/test_gpu_check.py); PYTHON picks
# the interpreter (default python3), WORK the pipeline's folder (default a new one in $TMPDIR), WHEEL_SITE
# where the wheels go (default WORK/site: no two checks share it), GRID_CONFIG the grid (a file in config/),
# BUDGET_S TESTS_S BENCH_S FIGURES_S STOP_FIGURES_S PACK_S KILL_S the limits above.
# Exit status: 0 when every phase ended by itself with status 0.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$repo/results/gpu_check}
py=$(command -v "${PYTHON:-python3}") || { echo "gpu_check: no ${PYTHON:-python3}" >&2; exit 2; }
[[ $py == /* ]] || py=$PWD/$py  # the pipeline runs elsewhere; keep the path as given (a venv's symlink)
device=${DEVICE:-cuda}
quick=${QUICK:-}
config=$repo/config/${GRID_CONFIG:-$([[ -n $quick ]] && echo gpu-tiny.yaml || echo gpu.yaml)}
budget=${BUDGET_S:-450} tests_s=${TESTS_S:-90} bench_s=${BENCH_S:-150} figures_s=${FIGURES_S:-60}
pack_s=${PACK_S:-15} kill_s=${KILL_S:-15} stop_figures_s=${STOP_FIGURES_S:-30}
start=$SECONDS
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/comera-gpu-check.XXXXXX")}  # the pipeline's folder
mkdir -p "$out" "$work/bin" "$work/results/bench" "$work/figures"
status=0 stopped= phase_pid=
for file in gpu_check.log env.txt pytest.txt bench.txt pipeline.txt; do : > "$out/$file"; done

log() { printf '[gpu_check %3d s] %s\n' $((SECONDS - start)) "$*" | tee -a "$out/gpu_check.log" >&2; }
left() { echo $((budget - (SECONDS - start))); }

pack() {  # the tars are replaced only once complete
  mkdir -p "$work/figures"  # Snakemake removes it with the outputs of a failed job
  tar -czf "$work/results.tar.gz" -C "$work" --exclude=results/cache --exclude=results/.gpu-locks results \
    && mv -f "$work/results.tar.gz" "$out/results.tar.gz"
  tar -czf "$work/figures.tar.gz" -C "$work" figures && mv -f "$work/figures.tar.gz" "$out/figures.tar.gz"
}

# run_phase NAME SECONDS OUTPUT_FILE COMMAND...: COMMAND in its own process group under `timeout`
# (SIGINT at the limit, SIGKILL kill_s later); a stop signal to this script is passed on to the group.
run_phase() {
  local name=$1 secs=$2 file=$3 rc
  shift 3
  if ((secs < 5)); then
    log "$name: skipped (${secs} s left of its budget)"
    status=1
    return 1
  fi
  log "$name: started, limit ${secs} s"
  timeout -s INT -k "$kill_s" "$secs" "$@" >> "$file" 2>&1 &
  phase_pid=$!
  wait "$phase_pid"
  rc=$?
  while kill -0 "$phase_pid" 2> /dev/null; do  # wait was cut short by a trapped signal
    wait "$phase_pid"
    rc=$?
  done
  phase_pid=
  log "$name: exit status $rc$([[ $rc == 124 || $rc == 137 ]] && echo ' (stopped at its limit)')"
  ((rc == 0)) || status=1
  pack
  return $rc
}

on_signal() {
  stopped=$1
  log "SIG$1 received: stopping the running phase, then the figures of what finished and the packing"
  [[ -n $phase_pid ]] && kill -INT -- "-$phase_pid" 2> /dev/null
}
finish() {
  pack
  log "done: exit status $status; files: $(cd "$out" && ls | tr '\n' ' ')"
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP
trap finish EXIT

# What the device image lacks travels as wheels (scripts/device_wheels.sh): installed where missing.
site=${WHEEL_SITE:-$work/site}  # this run's own folder: two checks never share one
if compgen -G "$repo/.whl/*.whl" > /dev/null; then
  mapfile -t wheels < <("$py" - "$repo"/.whl/*.whl << 'EOF'
import sys
from importlib import metadata
for path in sys.argv[1:]:  # a wheel's distribution name is its file name up to the first "-"
    try:
        metadata.version(path.rsplit("/", 1)[-1].split("-")[0])
    except metadata.PackageNotFoundError:
        print(path)
EOF
  )
  if ((${#wheels[@]})) && ! timeout 120 "$py" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$site" "${wheels[@]}" >> "$out/gpu_check.log" 2>&1; then
    log "pip could not install the wheels: unpacking them instead"  # a wheel is a zip of its site-packages
    for wheel in "${wheels[@]}"; do "$py" -m zipfile -e "$wheel" "$site"; done
  fi
  log "wheels: ${#wheels[@]} of $(compgen -G "$repo/.whl/*.whl" | wc -l) installed into $site (the others are here)"
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  [[ -d $site/bin ]] && export PATH=$site/bin:$PATH  # ninja, which the native TT ops are built with
fi
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The pipeline's shell commands call python, comera-bench and snakemake: this interpreter, this checkout.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$py" > "$work/bin/python"
printf '#!/bin/sh\nexec "%s" -m harness.entry "$@"\n' "$py" > "$work/bin/comera-bench"
printf '#!/bin/sh\nexec "%s" -m snakemake "$@"\n' "$py" > "$work/bin/snakemake"
chmod +x "$work/bin/"*
export PATH=$work/bin:$PATH

{
  date -u
  echo "commit $(git -C "$repo" rev-parse HEAD 2> /dev/null)"
  echo "budget ${budget} s; work folder $work; config $config"
  command -v nvidia-smi > /dev/null && timeout 30 nvidia-smi
  timeout 60 "$py" - "$device" << 'EOF'
import platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("float32 matmul precision", torch.get_float32_matmul_precision(),
      "cuda.matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32,
      "cudnn.allow_tf32", torch.backends.cudnn.allow_tf32)
if sys.argv[1] == "cuda":
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
          "memory GiB", round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
EOF
  timeout 60 "$py" -m pip list 2> /dev/null \
    | grep -iE "^(snakemake|galore|bitsandbytes|transformers|jsonschema|pandas|pyarrow|numpy) "
} > "$out/env.txt" 2>&1
log "env: $(grep -E '^(device|torch|python)' "$out/env.txt" | tr '\n' ' ')"

# The native TT ops (comera/native.py): the library prebuilt by device_wheels.sh when it matches this torch,
# else compiled here once, before any phase is timed; without either the layers run their Python kernels
# and every row's settings.tt_kernels says why.
export COMERA_NATIVE_BUILD_DIR=${COMERA_NATIVE_BUILD_DIR:-$work/native-build}
[[ -f $repo/.whl/native/comera_native.so ]] \
  && export COMERA_NATIVE_LIBRARY=${COMERA_NATIVE_LIBRARY:-$repo/.whl/native/comera_native.so}
native=$(cd "$repo" && timeout 180 "$py" -c "import comera.native as n; s = n.status()
print(('in use, ' if s.in_use else 'not in use: ') + s.reason)" 2>&1 | tail -n 1)
echo "comera.native: $native" >> "$out/env.txt"
log "comera.native: $native"
# The native ops' first run on this device: the device-parametrized tests compare them with the Python
# kernels (layer and fused block, forward and backward). Where they fail, every later phase runs the Python
# kernels (COMERA_NATIVE=0), so that a broken op cannot cost the CoMERA rows; env.txt says so.
if [[ $native == "in use"* ]]; then
  (cd "$repo" && timeout 120 "$py" -m pytest -q -p no:cacheprovider -k "on_the_device and $device" \
    tests/comera/test_native.py tests/comera/test_feedforward.py) > "$work/native_check.txt" 2>&1
  check_rc=$?
  check="exit status $check_rc: $(grep -E '(passed|failed|error|skipped)' "$work/native_check.txt" | tail -n 1)"
  if ((check_rc == 1)); then
    export COMERA_NATIVE=0
    check="$check; FAILED: the Python kernels run from here (COMERA_NATIVE=0)"
    grep -E '^(FAILED|E )' "$work/native_check.txt" | head -n 20 >> "$out/env.txt"
  fi
  echo "comera.native check on $device: $check" >> "$out/env.txt"
  log "comera.native check on $device: $check"
fi

cd "$repo" || exit 2
cuda_tests=$(grep -rl --include='test_*.py' "mark.cuda" tests | sort)
[[ -z $stopped ]] && run_phase tests $((tests_s < $(left) ? tests_s : $(left))) "$out/pytest.txt" \
  "$py" -m pytest -q -m cuda -p no:cacheprovider -rs $cuda_tests
[[ -z $stopped ]] && run_phase bench $((bench_s < $(left) ? bench_s : $(left))) "$out/bench.txt" \
  "$py" -m harness.entry bench --device "$device" --targets 1 ${quick:+--quick} \
  --out "$work/results/bench/bench.parquet"

smk=("$py" -m snakemake -s "$repo/Snakefile" -d "$work" --cores 1)
paths=(results_dir="$work/results" figures_dir="$work/figures")
grid_rc=1
if [[ -z $stopped ]]; then
  run_phase grid $(($(left) - figures_s - pack_s - kill_s)) "$out/pipeline.txt" \
    "${smk[@]}" figures --configfile "$config" --config "${paths[@]}"
  grid_rc=$?
fi
if ((grid_rc != 0)) || [[ ! -f $work/figures/claims.md ]]; then
  limit=$([[ -n $stopped ]] && echo "$stop_figures_s" || echo "$figures_s")
  # the stopped run's lock is stale (its processes are gone): --nolock
  run_phase figures $((limit < $(left) ? limit : $(left))) "$out/pipeline.txt" \
    "${smk[@]}" --nolock figures --configfile "$config" --config "${paths[@]}" only_finished=True
fi
[[ -n $stopped ]] && status=1
exit $status
