"""Every `comera-bench show | merge | compare | noisy` command that README.md and docs/*.md print, pasted into
bash as written, on a results folder shaped like a pipeline's (tests/harness/reports/synthetic.py on
config/tiny.yaml): it exits 0 and writes no file but the ones it names with --out (a `>` left unquoted
in `--where step_time_ms>=10` redirected the output into a file named `=10`)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.reports import synthetic

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = ("show", "merge", "compare", "noisy")
PLACEHOLDERS = {"<device>": "cpu"}


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) of each such command in a ```bash block or an inline `code` span naming a results
    folder, its trailing comment dropped, a chain (`a && b`) cut to its comera-bench parts, placeholders
    filled."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        spans = re.findall(r"`(comera-bench [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        lines += [span for span in spans if "results" in span]  # a command, not a name (`comera-bench show`)
        for line in lines:
            line = re.sub(r"\s+#\s.*$", "", line.strip())
            for part in line.split(" && "):
                words = part.split()
                if len(words) > 1 and words[0] == "comera-bench" and words[1] in SUBCOMMANDS:
                    for placeholder, value in PLACEHOLDERS.items():
                        part = part.replace(placeholder, value)
                    found.append((doc.name, part.strip()))
    return sorted(set(found))


COMMANDS = documented_commands()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """results/{cpu,nvidia-h200} (merged) and results/runs/{cpu,laptop} (per-cell files) of the tiny grid; a
    command naming another device's merged folder gets a copy of nvidia-h200's under that name."""
    root = tmp_path_factory.mktemp("docs")
    tiny = ROOT / "config" / "tiny.yaml"
    synthetic.results_folder(tiny, root / "results" / "cpu", cells_dir=root / "results" / "runs" / "cpu")
    synthetic.results_folder(tiny, root / "results" / "nvidia-h200",
                             cells_dir=root / "results" / "runs" / "laptop")
    return root


def test_the_documented_commands_were_found():
    where = {w for w, _ in COMMANDS}
    assert {"README.md", "usage.md", "pipeline.md", "measurement.md"} <= where, COMMANDS
    assert any("--where 'step_time_ms>=10'" in c for _, c in COMMANDS)


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}: {c}" for w, c in COMMANDS])
def test_a_documented_command_runs_as_pasted(tree, tmp_path, where, command):
    work = tmp_path / "w"
    shutil.copytree(tree, work)
    for label in re.findall(r"\bresults/([A-Za-z0-9._-]+)(?=\s|$)", command):  # another device's folder
        if not (work / "results" / label).exists():
            shutil.copytree(work / "results" / "nvidia-h200", work / "results" / label)
    before = {p for p in work.rglob("*") if p.is_file()}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, (where, proc.stdout[-2000:], proc.stderr[-2000:])
    outs = [work / m for m in re.findall(r"--out\s+(\S+)", command)]
    new = {p for p in work.rglob("*") if p.is_file()} - before
    stray = sorted(str(p.relative_to(work)) for p in new if not any(p == o or o in p.parents for o in outs))
    assert stray == [], (where, command, stray)
