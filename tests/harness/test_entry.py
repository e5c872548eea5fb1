"""The comera-bench command without the pipeline extra names it instead of a bare traceback."""
import sys

import pytest

from harness import entry


def test_a_missing_pipeline_package_names_the_extra(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "harness.cli")
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas fails as if not installed
    assert entry.main(["show"]) == 2
    err = capsys.readouterr().err
    assert "'pandas' is missing" in err and "pip install 'comera-bench[bench]'" in err


def test_a_missing_project_module_is_not_hidden(monkeypatch):
    monkeypatch.setitem(sys.modules, "harness.cli", None)
    with pytest.raises(ModuleNotFoundError):
        entry.main(["show"])
