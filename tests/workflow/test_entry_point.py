"""The README's command from the repository root: Snakemake finds the top-level Snakefile, its default
profile (profiles/default) and the embedded default config (config/config.yaml) by itself."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_a_dry_run_from_the_root_reads_the_default_profile_and_config(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "snakemake"), "-n", "figures", "--directory", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Using workflow specific profile profiles/default" in out
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for spec in default["microbench"]["specs"]:  # the default config's micro-benchmark specs are planned
        assert f"/microbench/{spec}.spec.json" in out
    assert "rule claims:" in out or "localrule claims:" in out


def test_the_snakefile_is_at_the_root_and_the_rules_in_workflow():
    assert (ROOT / "Snakefile").is_file() and not (ROOT / "workflow" / "Snakefile").exists()
    text = (ROOT / "Snakefile").read_text()
    for rules in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        assert f'include: "workflow/rules/{rules.name}"' in text
    assert (ROOT / "profiles" / "default" / "config.yaml").is_file()
