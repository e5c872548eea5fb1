"""What a GPU machine without network lacks of the pipeline's needs, as pins and trimmed wheels
(scripts/device_wheels.sh runs it).

``python scripts/device_wheels.py pins [PYTHON_VERSION [HAVE...]]``: ``name==version`` of :data:`ROOTS` and
everything they require, walked through the Requires-Dist of the packages installed in this interpreter (so
the versions are this checkout's, as ``pip freeze`` lists them), with the markers of CPython
``PYTHON_VERSION`` (default this interpreter's) on x86-64 Linux and no extras, leaving out the packages
``HAVE`` (default ``torch``: what the GPU machine's environment has) and what they require.

``python scripts/device_wheels.py trim FOLDER [CUDA_MAJOR]``: drop from the downloaded wheels the binaries an
x86-64 Linux machine cannot use (:func:`drop_pattern`; with ``CUDA_MAJOR``, bitsandbytes keeps its CPU
library and those of that CUDA major version only), rewriting each such wheel with its RECORD to match.
"""
from __future__ import annotations

import platform
import re
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("snakemake", "galore-torch", "bitsandbytes", "jsonschema", "pyyaml", "psutil", "opt-einsum", "tqdm",
         "tokenizers", "tabulate", "markdown-it-py")
"""The pipeline's needs beyond torch (pyproject's `bench` extra)."""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_env(python_version: str) -> dict[str, str]:
    """The environment markers of CPython ``python_version`` ("3.12") on x86-64 Linux."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "os_name": "posix", "platform_system": "Linux",
            "platform_machine": "x86_64", "extra": ""}


def requires(name: str, env: dict[str, str]) -> list[str]:
    """The packages ``name`` requires under the markers ``env`` (no extras)."""
    out = []
    for line in metadata.requires(name) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req.name)
    return out


def closure(roots: tuple[str, ...], env: dict[str, str], skip: frozenset[str] = frozenset()
            ) -> dict[str, tuple[str, str]]:
    """key -> (name, version) of ``roots`` and everything they require, as installed here, not entering
    the packages whose key is in ``skip``. A package not installed here raises, naming it."""
    seen: dict[str, tuple[str, str]] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if _key(name) in seen or _key(name) in skip:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"device_wheels: {name} is not installed in {sys.executable}: pins come from "
                             "this environment's versions") from None
        seen[_key(name)] = (dist.metadata["Name"], dist.version)
        todo.extend(requires(name, env))
    return seen


def pins(python_version: str | None = None, have: tuple[str, ...] = ("torch",)) -> list[str]:
    """``name==version`` of :data:`ROOTS` and what they require, less ``have`` and what they require."""
    env = target_env(python_version or platform.python_version().rsplit(".", 1)[0])
    skip = frozenset(closure(have, env))
    return sorted(f"{name}=={version}" for name, version in closure(ROOTS, env, skip).values())


def drop_pattern(package: str, cuda_major: str | None = None) -> re.Pattern | None:
    """The files of ``package``'s wheel that are dropped (None: the wheel is kept whole)."""
    if _key(package) == "pulp":  # CBC for x86-64 Linux only
        return re.compile(r"pulp/solverdir/cbc/(?!linux/i64/).*")
    if _key(package) == "bitsandbytes" and cuda_major:
        return re.compile(rf"bitsandbytes/libbitsandbytes_(?!cpu\.|cuda{cuda_major}\d\.)[^/]*\.so$")
    return None


def trim(folder: Path, cuda_major: str | None = None) -> None:
    """Rewrite the wheels in ``folder`` without the files of :func:`drop_pattern`."""
    for wheel in sorted(folder.glob("*.whl")):
        pattern = drop_pattern(wheel.name.split("-")[0], cuda_major)
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
    if sys.argv[1:2] == ["pins"]:
        version = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
        print("\n".join(pins(version, tuple(sys.argv[3:]) or ("torch",))))
    elif sys.argv[1:2] == ["trim"] and len(sys.argv) in (3, 4):
        trim(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 and sys.argv[3] else None)
    else:
        sys.exit("usage: python scripts/device_wheels.py pins [PYTHON_VERSION [HAVE...]] "
                 "| trim FOLDER [CUDA_MAJOR]")
