#!/usr/bin/env bash
# What the GPU machine's image lacks (it has Python 3.12 with torch, numpy, pandas, pyarrow, matplotlib and
# pytest), as wheels for CPython 3.12 on x86-64 Linux in .whl/ (git-ignored), which scripts/gpu_check.sh
# installs there where missing (the device tool carries the folder: carry [".whl"]). Run here, where pip
# reaches the package registry:   bash scripts/device_wheels.sh
# The packages: snakemake, galore-torch, bitsandbytes, jsonschema and the pipeline's other needs, with
# everything they require (transformers, which galore-torch imports, is in the image), at the versions
# installed in PYTHON (default .venv/bin/python: this checkout's, as `pip freeze` lists them), one wheel
# each (scripts/device_wheels.py);
# bitsandbytes keeps its CUDA 13 and CPU libraries only, PuLP its x86-64 Linux CBC solver only. Also the
# native TT ops prebuilt for the device's torch (scripts/native_prebuilt.py: its wheel is downloaded once
# into ~/.cache/comera/wheels, about 530 MB for 2.11.0), in .whl/native/.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
pins=$("$py" scripts/device_wheels.py pins)  # before .whl/ is emptied: a missing PYTHON changes nothing
mapfile -t pins <<< "$pins"
rm -rf .whl
mkdir -p .whl
wanted=("${pins[@]}") built=()
# A package published without a wheel for the device (an sdist only) is built here instead, once pip
# has named it, and must give a pure-Python wheel.
until "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 -d .whl \
  "${wanted[@]}" 2> .whl/pip.err; do
  missing=$(sed -n 's/^ERROR: No matching distribution found for //p' .whl/pip.err)
  [[ -n $missing ]] || { cat .whl/pip.err >&2; exit 1; }
  built+=("$missing")
  mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | grep -vxF "$missing")
done
for pin in ${built[@]+"${built[@]}"}; do
  "$py" -m pip wheel -q --no-deps -w .whl/built "$pin"
done
rm -f .whl/pip.err
if [[ -d .whl/built ]]; then
  if ls .whl/built | grep -v -- '-none-any\.whl$'; then
    echo "device_wheels: built here, but not pure Python: the device cannot use these" >&2
    exit 1
  fi
  mv .whl/built/*.whl .whl/ && rmdir .whl/built
fi
"$py" scripts/device_wheels.py trim .whl
# The native TT ops built for the device's torch (DEVICE_TORCH, default 2.11.0, its image's), in case it
# cannot compile them itself; gpu_check.sh loads them when they match (comera/native.py).
"$py" scripts/native_prebuilt.py --torch "${DEVICE_TORCH:-2.11.0}" --python 3.12 \
  --out .whl/native/comera_native.so \
  || echo "device_wheels: no prebuilt native ops; the device builds them if it has a C++ compiler" >&2
echo "$(ls .whl/*.whl | wc -l) wheels for ${#pins[@]} packages, $(du -sh .whl | cut -f1) in .whl/"
