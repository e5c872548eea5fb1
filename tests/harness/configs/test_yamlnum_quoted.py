"""A quoted YAML string stays a string, a plain exponent number becomes a number (harness.configs.yamlnum)."""
from __future__ import annotations

import yaml

from harness.configs import yamlnum


def test_quoted_strings_stay_text_where_the_files_say_so():
    text = 'device_name: "1e5"\nmethods:\n  galore: {method: galore, params: {lr: 2e-3}}\nseeds: [0]\n'
    snakemake_view = yaml.safe_load(text)  # YAML 1.1: both come back as strings
    assert (snakemake_view["device_name"] == "1e5"
            and snakemake_view["methods"]["galore"]["params"]["lr"] == "2e-3")
    reference = yamlnum.merged([yamlnum.load(text)])
    out = yamlnum.numbers_as_in(snakemake_view, reference)
    assert out["device_name"] == "1e5" and out["methods"]["galore"]["params"]["lr"] == 0.002


def test_overrides_absent_from_the_files_fall_back_to_the_exponent_rule():
    out = yamlnum.numbers_as_in({"a": {"lr": "1e-3"}, "b": "1e5"}, {"b": "1e5"})
    assert out == {"a": {"lr": 0.001}, "b": "1e5"}


def test_merged_is_a_deep_merge_later_files_win():
    assert yamlnum.merged([{"x": {"a": 1, "b": 2}, "y": 1}, {"x": {"b": 3}}]) == {"x": {"a": 1, "b": 3},
                                                                                  "y": 1}
