#!/usr/bin/env bash
# Wheels that the GPU machine's image lacks (its python3 has torch, pandas, pyarrow, matplotlib, pyyaml,
# psutil, tokenizers, opt_einsum, tqdm, tabulate, pytest), for Python 3.12 x86-64, into .whl/ (ignored):
# GaLore (galore-torch imports bitsandbytes) and jsonschema for the config checks. About 44 MB; the device
# tool carries it with carry=[".whl"]. Run here, where pip reaches the package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  galore-torch bitsandbytes jsonschema jsonschema-specifications referencing rpds-py
du -sh .whl
