"""The comera-bench command without the pipeline extra names it instead of a bare traceback; the pipeline
finds it without an activated venv."""
import os
import sys

import pytest

from harness import entry


def test_a_missing_pipeline_package_names_the_extra(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "harness.cli", raising=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas fails as if not installed
    assert entry.main(["show"]) == 2
    err = capsys.readouterr().err
    assert "'pandas' is missing" in err and "pip install 'comera-bench[bench]'" in err


def test_a_missing_project_module_is_not_hidden(monkeypatch):
    monkeypatch.setitem(sys.modules, "harness.cli", None)
    with pytest.raises(ModuleNotFoundError):
        entry.main(["show"])


def test_command_on_path_adds_the_interpreters_folder_only_where_the_command_is_missing(tmp_path):
    folder = os.path.dirname(sys.executable)
    if not os.path.isfile(os.path.join(folder, "comera-bench")):
        pytest.skip("comera-bench is not installed beside this interpreter")
    missing = {"PATH": str(tmp_path)}
    entry.command_on_path(missing)
    assert missing["PATH"] == folder + os.pathsep + str(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "comera-bench").write_text("#!/bin/sh\n")
    (other / "comera-bench").chmod(0o755)
    found = {"PATH": str(other)}  # an activated environment's command: left as it is
    entry.command_on_path(found)
    assert found == {"PATH": str(other)}
