"""scripts/native_prebuilt.py builds the native TT ops against a torch it does not import, and
comera.native loads that library when $COMERA_NATIVE_LIBRARY names it and its .json matches, else builds
as usual and says why it skipped it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comera import native

ROOT = Path(__file__).resolve().parents[2]
STATUS = ("import torch, comera.native as n\n"
          "from comera.tt import TTLinear\n"
          "layer = TTLinear(12, 8, rank=2); layer(torch.randn(3, 12)).sum().backward()\n"
          "print(n.status().in_use, n.status().reason)\n")

pytestmark = pytest.mark.skipif(not (shutil.which("c++") and shutil.which("ninja")
                                     and native.status().in_use),
                                reason="needs a C++ compiler and ninja; native ops: "
                                       f"{native.status().reason}")


def _status(library: Path) -> str:
    env = {**os.environ, native.LIBRARY_ENV: str(library)}
    return subprocess.run([sys.executable, "-c", STATUS], check=True, env=env, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.slow
def test_a_prebuilt_library_is_loaded_only_for_its_torch_and_source(tmp_path):
    library = tmp_path / "native" / "comera_native.so"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "native_prebuilt.py"), "--torch-root",
                    str(Path(torch.__file__).parent), "--out", str(library)], check=True, cwd=tmp_path)
    made_for = json.loads(library.with_suffix(".json").read_text())
    assert made_for == {**native.library_metadata(), **native.file_record(library)}
    assert _status(library) == f"True prebuilt {library}"

    built = library.read_bytes()
    library.write_bytes(built[:-4096])  # cut short: loading it would end the process
    damaged = _status(library)
    assert damaged.startswith("True built in ") and "(truncated, corrupt or replaced)" in damaged
    library.write_bytes(built)  # whole again: what follows is the metadata's check alone

    library.with_suffix(".json").write_text(json.dumps({**made_for, "torch": "0.0.0+elsewhere"}))
    skipped = _status(library)  # built (here: loaded from the tests' build folder) instead, saying why
    assert skipped.startswith("True built in ") and "skipped: built for torch 0.0.0+elsewhere" in skipped
    assert _status(tmp_path / "missing.so").endswith("missing.so: no such file)")
