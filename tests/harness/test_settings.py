"""harness.settings: every COMERA_* environment variable the project reads, declared once, read and checked
there (a bad value names the variable and the value), and documented from the declarations."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import settings
from harness.running import eta, threads

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("harness", "baselines", "comera", "workflow", "scripts", "tests", "Snakefile")


def names_in_sources() -> set[str]:
    """Every COMERA_* name in the project's code (Python, Snakemake rules, shell scripts)."""
    found: set[str] = set()
    for top in SOURCES:
        paths = [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")
        for path in paths:
            if path.is_file() and (path.suffix in (".py", ".smk", ".sh") or path.name == "Snakefile"):
                found |= set(re.findall(r"\bCOMERA_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    return found


def test_every_variable_the_project_reads_is_declared():
    assert names_in_sources() == set(settings.SETTINGS)


def test_the_docs_table_is_current():
    """docs/settings.md is what ``python -m harness.settings`` writes from the declarations."""
    assert (ROOT / "docs" / "settings.md").read_text() == settings.markdown()
    out = subprocess.run([sys.executable, "-m", "harness.settings"], capture_output=True, text=True, cwd=ROOT,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout == settings.markdown()


@pytest.mark.parametrize("value", ["abc", "0", "-3", "4294967296", "1025", "²", "2.5"])
def test_a_bad_threads_variable_is_named(monkeypatch, tmp_path, value):
    monkeypatch.setenv(threads.THREADS_ENV, value)
    with pytest.raises(settings.SettingError, match=re.escape(
            f"environment variable COMERA_BENCH_THREADS={value!r}: the threads of every cell must be a whole "
            "number from 1 to 1024; the pipeline sets it: unset it")):
        threads.resolve("auto", tmp_path, 0.0, cpus=2)


def test_the_threads_bound_is_the_specs_and_the_configs():
    from harness import spec

    assert settings.SETTINGS[threads.THREADS_ENV].high == settings.MAX_THREADS == spec.MAX_THREADS


def test_settings_imports_nothing_of_the_project():
    code = "import sys, harness.settings; print(sorted(m for m in sys.modules if m.startswith('harness.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout.strip() == "['harness.settings']"


def test_the_threads_variable_up_to_the_configs_cap_is_taken(monkeypatch, tmp_path):
    monkeypatch.setenv(threads.THREADS_ENV, " 1024 ")
    assert threads.resolve("auto", tmp_path, 0.0, cpus=2)[0] == 1024


@pytest.mark.parametrize("value", ["abc", "²", "-1", "1.5", "1" + "0" * 10])
def test_a_bad_pipeline_cells_variable_is_named(monkeypatch, value):
    monkeypatch.setenv(eta.STARTED_ENV, "1000")
    monkeypatch.setenv(eta.CELLS_ENV, value)
    with pytest.raises(settings.SettingError, match=re.escape(
            f"environment variable COMERA_BENCH_PIPELINE_CELLS={value!r}: the grid's cell count must be a "
            "whole number from 0 to 1000000000")):
        eta.pipeline_env()


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "soon"])
def test_a_bad_pipeline_start_is_named(monkeypatch, value):
    monkeypatch.setenv(eta.STARTED_ENV, value)
    monkeypatch.setenv(eta.CELLS_ENV, "3")
    with pytest.raises(settings.SettingError, match=re.escape(
            f"environment variable COMERA_BENCH_PIPELINE_STARTED={value!r}: the pipeline's start must be a "
            "time in seconds since the epoch")):
        eta.pipeline_env()


def test_finished_cells_with_threads_past_the_cap_are_not_copied(tmp_path, monkeypatch):
    """A finished cell's spec with num_threads 4294967296 (or 0, or true) is not a choice to keep."""
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    for name, count in (("a", 4294967296), ("b", 4294967296), ("c", 0), ("d", True), ("e", 2)):
        (tmp_path / f"{name}.spec.json").write_text(json.dumps({"execution": {"num_threads": count}}))
        (tmp_path / f"{name}.runs.parquet").write_bytes(b"")
    assert threads.finished_threads(tmp_path) == (2, 1)


@pytest.mark.parametrize("name, value", [("COMERA_BENCH_DEVICE", "../x"),
                                         ("COMERA_BENCH_STALL_LIMIT_S", "-1"),
                                         ("COMERA_BENCH_CHECKPOINT_S", "nan"),
                                         ("COMERA_BENCH_PARENT_PID", "x"),
                                         ("COMERA_BENCH_CELL_STARTED", "inf")])
def test_every_checked_kind_names_variable_and_value(name, value):
    with pytest.raises(settings.SettingError, match=re.escape(f"environment variable {name}={value!r}: ")):
        settings.read(name, {name: value})


def test_unset_or_empty_is_the_default():
    assert settings.read("COMERA_BENCH_STALL_LIMIT_S", {}) == 3600.0
    assert settings.read("COMERA_BENCH_STALL_LIMIT_S", {"COMERA_BENCH_STALL_LIMIT_S": " "}) == 3600.0
    assert settings.read("COMERA_BENCH_CHECKPOINT_S", {"COMERA_BENCH_CHECKPOINT_S": "0"}) is None
    assert settings.read("COMERA_BENCH_PLUGINS", {"COMERA_BENCH_PLUGINS": "a:b"}) == (Path("a"), Path("b"))
    assert settings.read("COMERA_BENCH_SLURM_TESTS", {}) is False
    assert settings.read("COMERA_BENCH_SLURM_TESTS", {"COMERA_BENCH_SLURM_TESTS": "1"}) is True


def test_text_is_read_as_given():
    """Spaces are part of a path or label (a label with one is refused, as a folder name it cannot be)."""
    assert settings.read("COMERA_BENCH_CACHE_DIR", {"COMERA_BENCH_CACHE_DIR": " my cache"}) == " my cache"
    with pytest.raises(settings.SettingError, match="COMERA_BENCH_DEVICE=' cpu'"):
        settings.read("COMERA_BENCH_DEVICE", {"COMERA_BENCH_DEVICE": " cpu"})
