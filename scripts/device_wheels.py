"""What the GPU machine's image lacks, as pins and trimmed wheels (scripts/device_wheels.sh runs it).

``python scripts/device_wheels.py pins``: ``name==version`` of the device's missing packages and everything
they require, walked through the Requires-Dist of the packages installed in this interpreter (so the
versions are this checkout's, as ``pip freeze`` lists them), with the markers of CPython 3.12 on x86-64
Linux and no extras; what the image has (:data:`ON_DEVICE` and what they require, :data:`ALSO_ON_DEVICE`)
is left out.

``python scripts/device_wheels.py trim FOLDER``: drop from the downloaded wheels the binaries the device
cannot use (:data:`DROP`), rewriting each such wheel with its RECORD to match.
"""
from __future__ import annotations

import re
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("snakemake", "galore-torch", "bitsandbytes", "jsonschema", "pyyaml", "psutil", "opt-einsum", "tqdm",
         "tokenizers", "tabulate", "markdown-it-py", "ninja")
"""The pipeline's needs beyond torch (pyproject's `bench` extra; ninja builds the native TT ops)."""
ON_DEVICE = ("torch", "numpy", "pandas", "pyarrow", "matplotlib", "pytest")
"""In the device image, with what they require."""
ALSO_ON_DEVICE = ("transformers",)
"""Also there, but what they require is not counted as there: transformers (galore-torch imports it; with
its needs about 25 MiB of wheels) ran 8-bit GaLore on the H200 without being in .whl/."""
DEVICE_ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
              "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
DROP = {
    # CUDA 13, CPU
    "bitsandbytes": re.compile(r"bitsandbytes/libbitsandbytes_(?!cpu\.|cuda13\d\.)[^/]*\.so$"),
    "pulp": re.compile(r"pulp/solverdir/cbc/(?!linux/i64/).*"),  # CBC for x86-64 Linux only
}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires(name: str) -> list[str]:
    """The packages ``name`` requires on the device (markers evaluated, no extras)."""
    out = []
    for line in metadata.requires(name) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(DEVICE_ENV):
            out.append(req.name)
    return out


def closure(roots: tuple[str, ...], skip: frozenset[str] = frozenset()) -> dict[str, tuple[str, str]]:
    """key -> (name, version) of ``roots`` and everything they require, as installed here, not entering
    the packages whose key is in ``skip``."""
    seen: dict[str, tuple[str, str]] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if _key(name) in seen or _key(name) in skip:
            continue
        dist = metadata.distribution(name)
        seen[_key(name)] = (dist.metadata["Name"], dist.version)
        todo.extend(requires(name))
    return seen


def pins() -> list[str]:
    have = frozenset(closure(ON_DEVICE)) | {_key(name) for name in ALSO_ON_DEVICE}
    return sorted(f"{name}=={version}" for name, version in closure(ROOTS, have).values())


def trim(folder: Path) -> None:
    for wheel in sorted(folder.glob("*.whl")):
        pattern = DROP.get(_key(wheel.name.split("-")[0]))
        if pattern is None:
            continue
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                if pattern.match(item.filename):
                    continue
                data = src.read(item)
                if item.filename.endswith(".dist-info/RECORD"):
                    data = b"".join(line for line in data.splitlines(keepends=True)
                                    if not pattern.match(line.split(b",")[0].decode()))
                dst.writestr(item, data)
        before = wheel.stat().st_size
        tmp.replace(wheel)
        print(f"{wheel.name}: {before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    if sys.argv[1:] == ["pins"]:
        print("\n".join(pins()))
    elif len(sys.argv) == 3 and sys.argv[1] == "trim":
        trim(Path(sys.argv[2]))
    else:
        sys.exit("usage: python scripts/device_wheels.py pins | trim FOLDER")
