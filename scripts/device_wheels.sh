#!/usr/bin/env bash
# Wheels for a GPU machine without network (x86-64 Linux): what its Python environment lacks of the
# pipeline's needs, at this environment's versions, one wheel each, into DIR (default .whl, git-ignored);
# there, `WHEELS=DIR bash scripts/gpu_check.sh` installs them into its work folder. Run where pip reaches
# the package registry:
#   bash scripts/device_wheels.sh [DIR]
# PYTHON: this checkout's interpreter (default python3: the versions pinned are its); TARGET_PYTHON: the GPU
# machine's Python version (default PYTHON's, e.g. 3.12); HAVE: the packages its environment has, whose
# requirements it has too (default "torch"); CUDA_MAJOR: keep only the CPU and that CUDA version's libraries
# of bitsandbytes (default all). Packages and trimming: scripts/device_wheels.py.
set -euo pipefail
dir=$(realpath -m "${1:-$(dirname "$0")/../.whl}")  # DIR as given, from the caller's folder
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
target=${TARGET_PYTHON:-$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
pins=$("$py" scripts/device_wheels.py pins "$target" ${HAVE:-torch})  # before DIR's wheels go
mapfile -t pins <<< "$pins"
mkdir -p "$dir"
rm -rf "$dir"/*.whl "$dir/built"  # the folder's earlier wheels only: nothing else in it is touched
wanted=("${pins[@]}") built=()
# A package published without a wheel for the target (an sdist only) is built here instead, once pip
# has named it, and must give a pure-Python wheel.
until "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$target" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 -d "$dir" \
  "${wanted[@]}" 2> "$dir/pip.err"; do
  missing=$(sed -n 's/^ERROR: No matching distribution found for //p' "$dir/pip.err")
  [[ -n $missing ]] || { cat "$dir/pip.err" >&2; exit 1; }
  built+=("$missing")
  mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | grep -vxF "$missing")
done
for pin in ${built[@]+"${built[@]}"}; do
  "$py" -m pip wheel -q --no-deps -w "$dir/built" "$pin"
done
rm -f "$dir/pip.err"
if [[ -d $dir/built ]]; then
  if ls "$dir/built" | grep -v -- '-none-any\.whl$'; then
    echo "device_wheels: built here, but not pure Python: the target cannot use these" >&2
    exit 1
  fi
  mv "$dir"/built/*.whl "$dir"/ && rmdir "$dir/built"
fi
"$py" scripts/device_wheels.py trim "$dir" "${CUDA_MAJOR:-}"
echo "$(ls "$dir"/*.whl | wc -l) wheels for ${#pins[@]} packages, $(du -sh "$dir" | cut -f1) in $dir/"
