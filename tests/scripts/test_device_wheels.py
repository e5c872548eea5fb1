"""scripts/device_wheels.py: the pins are this environment's versions of what the target lacks, and a
trimmed wheel keeps only the binaries the target can use, with its RECORD to match."""
from __future__ import annotations

import importlib.util
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_wheels", ROOT / "scripts" / "device_wheels.py")
device_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_wheels)


IMAGE = ("torch", "numpy", "pandas", "pyarrow", "matplotlib", "pytest")


def test_pins_are_the_installed_versions_of_what_the_target_lacks():
    pins = dict(pin.split("==") for pin in device_wheels.pins("3.12", IMAGE))
    names = {name.lower().replace("_", "-") for name in pins}
    assert {"snakemake", "galore-torch", "bitsandbytes", "jsonschema", "pulp", "connection-pool"} <= names
    assert not names & {"torch", "numpy", "pandas", "pyarrow", "matplotlib", "pytest", "python-dateutil",
                        "pluggy", "ninja"}  # what the target has, or what that requires
    assert all(metadata.version(name) == version for name, version in pins.items())


def test_pins_default_to_a_target_with_torch_only():
    names = {pin.split("==")[0].lower() for pin in device_wheels.pins()}
    assert "snakemake" in names and not names & {"torch", "sympy", "filelock"}  # torch and what it requires


def test_pins_name_a_package_this_environment_lacks():
    with pytest.raises(SystemExit, match="no-such-package-here is not installed"):
        device_wheels.pins("3.12", ("no-such-package-here",))


def test_trim_drops_the_binaries_the_device_cannot_use(tmp_path):
    wheel = tmp_path / "bitsandbytes-1.0-py3-none-any.whl"
    files = ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so",
             "bitsandbytes/libbitsandbytes_cuda126.so", "bitsandbytes/libbitsandbytes_cuda130.so",
             "bitsandbytes/libbitsandbytes_rocm64.so"]
    record = "".join(f"{name},sha256=x,1\n" for name in files) + "bitsandbytes-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in files:
            zf.writestr(name, b"x")
        zf.writestr("bitsandbytes-1.0.dist-info/RECORD", record)
    other = tmp_path / "snakemake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("snakemake/libx_cuda126.so", b"x")
    device_wheels.trim(tmp_path, "13")
    kept = ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so",
            "bitsandbytes/libbitsandbytes_cuda130.so"]
    with zipfile.ZipFile(wheel) as zf:
        assert zf.namelist() == kept + ["bitsandbytes-1.0.dist-info/RECORD"]
        listed = [line.split(",")[0]
                  for line in zf.read("bitsandbytes-1.0.dist-info/RECORD").decode().splitlines()]
    assert listed == kept + ["bitsandbytes-1.0.dist-info/RECORD"]
    assert zipfile.ZipFile(other).namelist() == ["snakemake/libx_cuda126.so"]  # not a trimmed package


def test_trim_keeps_every_cuda_library_without_a_cuda_version(tmp_path):
    wheel = tmp_path / "bitsandbytes-1.0-py3-none-any.whl"
    names = ["bitsandbytes/libbitsandbytes_cuda126.so", "bitsandbytes/libbitsandbytes_cuda130.so"]
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in names:
            zf.writestr(name, b"x")
    device_wheels.trim(tmp_path)
    assert zipfile.ZipFile(wheel).namelist() == names
