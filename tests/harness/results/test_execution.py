"""How a runs row ran, read from its execution columns (harness/results/execution.py)."""
from __future__ import annotations

import pandas as pd

from harness.results.execution import execution_label, graphed, paper_execution

ROWS = pd.DataFrame({"cuda_graph": pd.array([None, True, False, False, True], dtype="boolean"),
                     "compile": pd.array([False, False, True, None, True], dtype="boolean"),
                     "matmul_precision": ["highest", "highest", "highest", "high", "medium"]})


def test_graphed_and_paper_execution_read_null_as_the_eager_fp32_default():
    assert graphed(ROWS).tolist() == [False, True, False, False, True]
    assert paper_execution(ROWS).tolist() == [True, False, False, False, False]
    assert paper_execution(ROWS, graphs=True).tolist() == [True, True, False, False, False]


def test_execution_label_names_each_setting_a_row_ran_with():
    assert [execution_label(r) for r in ROWS.itertuples()] == [
        "", " + CUDA graph", " (compiled)", " TF32 (high)", " + CUDA graph (compiled) bfloat16 (medium)"]
    assert execution_label(pd.Series({"method": "dense"})) == ""  # no execution columns: eager FP32
