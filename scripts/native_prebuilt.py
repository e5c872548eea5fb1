"""Build the native TT ops (comera/csrc/tt_linear.cpp) for another machine's torch, without that torch
installed: from its wheel's headers and libraries, with this machine's C++ compiler.

For a machine that has torch but no compiler (the GPU image of scripts/gpu_check.sh). Writes the library
and, beside it, a ``.json`` naming the torch version, the source's SHA-256 and the library's size and
SHA-256; ``comera.native`` loads it when ``$COMERA_NATIVE_LIBRARY`` names it and all match (else it builds
as usual, saying why).

    python scripts/native_prebuilt.py --torch 2.11.0 --out .whl/native/comera_native.so
    python scripts/native_prebuilt.py --torch-root .venv/lib/python3.11/site-packages/torch --out x.so

``--torch VERSION`` downloads that torch's wheel for CPython ``--python`` (default 3.12) on x86-64 Linux
with pip into ``--cache`` (default ~/.cache/comera/wheels) once; ``--wheel PATH`` takes a wheel already
here; ``--torch-root`` an installed torch package folder.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from comera import native  # noqa: E402  (this checkout's, which the library is built from)

SOURCE = native.SOURCE
LIBRARIES = ("libc10.so", "libtorch_cpu.so", "libtorch.so")
"""What the ops link against (torch's own build of an extension adds libtorch_python, which they do not
use)."""


def download(version: str, python: str, cache: Path) -> Path:
    """torch ``version``'s wheel for CPython ``python`` on x86-64 Linux, from the cache or pip."""
    tag = "cp" + python.replace(".", "")
    found = sorted(cache.glob(f"torch-{version}-{tag}-{tag}-*x86_64.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "--implementation", "cp", "--platform",
                        "manylinux_2_28_x86_64", "-d", str(cache), f"torch=={version}"], check=True)
        found = sorted(cache.glob(f"torch-{version}-{tag}-{tag}-*x86_64.whl"))
    if not found:
        raise SystemExit(f"native_prebuilt: pip left no torch {version} wheel for {tag} in {cache}")
    return found[-1]


def unpack(wheel: Path, into: Path) -> Path:
    """The wheel's headers, the libraries the ops link against and its version file, under ``into/torch``."""
    wanted = re.compile(r"torch/(include/.*|version\.py|lib/(" + "|".join(map(re.escape, LIBRARIES)) + "))$")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(into, [n for n in archive.namelist() if wanted.match(n)])
    return into / "torch"


def torch_version(root: Path) -> str:
    match = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", (root / "version.py").read_text(), re.M)
    if not match:
        raise SystemExit(f"native_prebuilt: no __version__ in {root / 'version.py'}")
    return match.group(1)


def cxx11_abi(root: Path) -> int:
    """1 when torch's libraries were built with the C++11 string ABI (their symbols name ``__cxx11``)."""
    return int(b"__cxx11" in (root / "lib" / "libc10.so").read_bytes())


def compile_library(root: Path, out: Path, compiler: str) -> list[str]:
    """Compile and link :data:`SOURCE` against the torch under ``root`` into ``out``; returns the command."""
    include = root / "include"
    command = [compiler, "-shared", "-fPIC", "-O2", "-std=c++17",
               f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi(root)}",
               "-DTORCH_EXTENSION_NAME=comera_native", "-DTORCH_API_INCLUDE_EXTENSION_H",
               "-isystem", str(include), "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
               str(SOURCE), f"-L{root / 'lib'}", *(f"-l{lib[3:-3]}" for lib in LIBRARIES), "-o", str(out)]
    subprocess.run(command, check=True)
    return command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--torch", help="a torch version, downloaded with pip (e.g. 2.11.0)")
    where.add_argument("--wheel", type=Path, help="a torch wheel already here")
    where.add_argument("--torch-root", type=Path, help="an installed torch package folder")
    parser.add_argument("--python", default="3.12", help="the other machine's Python (with --torch)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "comera" / "wheels")
    parser.add_argument("--compiler", default="c++")
    parser.add_argument("--out", type=Path, required=True, help="the library to write (a .so)")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.torch_root:
            root = args.torch_root.resolve()
        else:
            wheel = args.wheel or download(args.torch, args.python, args.cache)
            root = unpack(wheel, Path(tmp))
        command = compile_library(root, args.out, args.compiler)
        version = torch_version(root)
    made_for = {"torch": version, "source_sha256": native.source_sha256(), **native.file_record(args.out)}
    args.out.with_suffix(".json").write_text(json.dumps(made_for, indent=1) + "\n")
    print(f"native_prebuilt: {args.out} for torch {version} ({shlex.join(command[:1])}; "
          f"{args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
