"""scripts/device_wheels.py: the pins are this environment's versions of what the device lacks, and a
trimmed wheel keeps only the binaries the device can use, with its RECORD to match."""
from __future__ import annotations

import importlib.util
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_wheels", ROOT / "scripts" / "device_wheels.py")
device_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_wheels)


def test_pins_are_the_installed_versions_of_what_the_device_lacks():
    pins = dict(pin.split("==") for pin in device_wheels.pins())
    names = {name.lower().replace("_", "-") for name in pins}
    assert {"snakemake", "galore-torch", "bitsandbytes", "jsonschema", "pulp", "connection-pool"} <= names
    assert not names & {"torch", "numpy", "pandas", "pyarrow", "matplotlib", "pytest", "transformers",
                        "python-dateutil", "pluggy"}  # in the image, or required by what is
    assert all(metadata.version(name) == version for name, version in pins.items())


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
    device_wheels.trim(tmp_path)
    kept = ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so",
            "bitsandbytes/libbitsandbytes_cuda130.so"]
    with zipfile.ZipFile(wheel) as zf:
        assert zf.namelist() == kept + ["bitsandbytes-1.0.dist-info/RECORD"]
        listed = [line.split(",")[0]
                  for line in zf.read("bitsandbytes-1.0.dist-info/RECORD").decode().splitlines()]
    assert listed == kept + ["bitsandbytes-1.0.dist-info/RECORD"]
    assert zipfile.ZipFile(other).namelist() == ["snakemake/libx_cuda126.so"]  # not a trimmed package
