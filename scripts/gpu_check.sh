#!/usr/bin/env bash
# A GPU check on a machine with one CUDA GPU, in the current Python environment (PYTHON, default python3,
# with this checkout's requirements: pip install -e '.[bench]'); it installs nothing unless WHEELS is set:
#   bash scripts/gpu_check.sh      # results in $OUT (default results/gpu_check), at most BUDGET_S (450 s)
# A GPU machine without network: where pip reaches the registry, `bash scripts/device_wheels.sh DIR` packs
# as wheels what the GPU machine's environment lacks; copy DIR with the checkout, then
# `WHEELS=DIR bash scripts/gpu_check.sh` installs them into the work folder (never into the environment).
# Phases, each under `timeout` within what is left of the budget:
#   tests   `pytest -m cuda`: the tests that need CUDA (at most TESTS_S, 90 s)
#   bench   `comera-bench bench --device cuda --targets 1` (at most BENCH_S, 150 s: it compiles four modules)
#   grid    `snakemake figures --configfile config/gpu.yaml` (the rest, less FIGURES_S and PACK_S); at its
#           limit Snakemake and its jobs get SIGINT, SIGKILL KILL_S later: a stopped timing group leaves no row
#   figures `snakemake figures --config only_finished=True`: merged tables, figures and claims of the cells
#           that finished, when the grid did not end by itself (at most FIGURES_S, 60 s)
# Files in $OUT, rewritten after every phase (so SIGKILL loses at most the running phase):
# gpu_check.log (phases, limits, exit codes), env.txt (GPU, torch build, CUDA, float32 matmul precision),
# pytest.txt, bench.txt, pipeline.txt (Snakemake's output), results.tar.gz (per-cell files, merged
# tables, grid.json, logs, bench.{parquet,md,png}) and figures.tar.gz (figures, tables, claims.md).
# SIGTERM, SIGINT or SIGHUP stop the running phase, then the figures of what finished are drawn (at most
# STOP_FIGURES_S, 30 s) and everything is packed. DEVICE=cpu QUICK=1 runs the same flow on the CPU with
# config/gpu-tiny.yaml and the quick bench (the dry run of tests/scripts/test_gpu_check.py); WORK is the
# pipeline's folder (default a new one in $TMPDIR), WHEEL_SITE where the wheels go (default WORK/site),
# GRID_CONFIG the grid (a file in config/), BUDGET_S TESTS_S BENCH_S FIGURES_S STOP_FIGURES_S PACK_S KILL_S
# the limits above.
# Exit status: 0 when every phase ended by itself with status 0; 2 for a bad setting (named on stderr).
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

# WHEELS: a folder of wheels (scripts/device_wheels.sh), installed into this run's own folder where this
# environment lacks them.
if [[ -n ${WHEELS:-} ]]; then
  site=${WHEEL_SITE:-$work/site}
  compgen -G "$WHEELS/*.whl" > /dev/null || { log "WHEELS=$WHEELS: no *.whl file there"; status=2; exit 2; }
  mapfile -t wheels < <("$py" - "$WHEELS"/*.whl << 'EOF'
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
  log "wheels: ${#wheels[@]} of $(compgen -G "$WHEELS/*.whl" | wc -l) installed into $site (others: here)"
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  [[ -d $site/bin ]] && export PATH=$site/bin:$PATH
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
