"""`pip install` of the project pulls torch and nothing of the pipeline (fresh venv); the `comera-bench`
command names the missing extra there."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "comera", "baselines", "harness")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"core": project["dependencies"], **project["optional-dependencies"]}


def test_core_dependencies_are_torch_only_and_the_pipeline_is_an_extra():
    extras = _extras()
    assert [_name(r) for r in extras["core"]] == ["torch"]
    assert ({"pandas", "pyarrow", "matplotlib", "snakemake", "galore-torch"}
            <= {_name(r) for r in extras["bench"]})
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '".[bench,test,slurm]"' in setup


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w",
                    str(tmp_path / "dist"), f"{src}/"], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("comera_bench-*.whl")
    return wheel


PROBE = """
import importlib.metadata as md, json, torch, comera
layer = comera.TTLinear(12, 8, rank=2)
y = layer(torch.randn(3, 12))
print(json.dumps({"installed": sorted(d.metadata["Name"].lower().replace("_", "-")
                                      for d in md.distributions()),
                  "requires": md.requires("comera-bench"), "shape": list(y.shape), "file": comera.__file__}))
"""


@pytest.mark.slow
def test_fresh_venv_installs_torch_and_nothing_of_the_pipeline(tmp_path):
    wheel = _build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # the venv alone
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, capture_output=True, text=True)
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, text=True)
    probe = json.loads(subprocess.run([str(bin_dir / "python"), "-c", PROBE], check=True, capture_output=True,
                                      text=True, cwd=tmp_path, env=clean).stdout)
    assert probe["shape"] == [3, 8] and str(env_dir) in probe["file"]
    pipeline = {_name(r) for r in _extras()["bench"]} - {"numpy"}  # numpy may come with torch
    assert not pipeline & set(probe["installed"]), \
        f"pipeline packages installed: {pipeline & set(probe['installed'])}"
    assert [r for r in probe["requires"] if "extra ==" not in r] == ["torch>=2.4"]
    cli = subprocess.run([str(bin_dir / "comera-bench"), "show"], capture_output=True, text=True,
                         cwd=tmp_path, env=clean)
    assert cli.returncode == 2
    assert "'bench'" in cli.stderr and "pip install 'comera-bench[bench]'" in cli.stderr, cli.stderr
