"""Every value a pipeline shell command gets from the config, the grid or Snakemake (paths, labels,
JSON) is shell-quoted (`{output:q}`), so no config value is ever run as shell code."""
from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
PRE_QUOTED = {"params.wrapper"}  # common.smk gpu_wrapper(): a command prefix, quoted where it is built


def shell_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command template) of every `shell:` directive in a Snakemake file."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if re.fullmatch(r"\s*shell:\s*", line):
            indent = len(line) - len(line.lstrip())
            body = []
            for follow in lines[i + 1:]:
                if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                    break
                body.append(follow)
            out.append((i + 1, ast.literal_eval("(" + "\n".join(body).strip().rstrip(",") + ")")))
    return out


COMMANDS = [(f"{p.name}:{line}", cmd) for p in RULE_FILES for line, cmd in shell_commands(p)]


def test_rules_were_found():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_field_is_quoted(where, command):
    fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(command) if name is not None]
    unquoted = [name for name, spec in fields if not spec.endswith("q") and name not in PRE_QUOTED]
    assert not unquoted, f"{where}: unquoted field(s) {unquoted} in {command!r}"


@pytest.mark.slow
def test_snakemake_lint_leaves_only_the_software_deployment_recommendation():
    """`snakemake --lint`: logs on every rule, no hard-coded output prefixes, no variable from outside a
    rule in a shell command; what remains is the conda/container advice, which a pip-installed project
    does not follow (docs/architecture.md says why)."""
    import re
    import subprocess
    import sys

    proc = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--lint"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lints = set(re.findall(r"^    \* (.+?):?$", proc.stdout + proc.stderr, re.M))
    assert lints == {"Specify a conda environment or container for each rule."}, lints
