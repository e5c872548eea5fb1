"""Each workload's tt_spec is accepted by comera.convert.tensorize and the tensorized model trains."""
import pytest
import torch

from comera import convert
from harness.workloads import WORKLOADS, build_workload


@pytest.mark.parametrize("name", WORKLOADS)
def test_tensorized_tiny_workload_runs(name, tmp_path):
    params = {"size": "tiny", "cache_dir": str(tmp_path)}
    if name == "mlm":
        params["max_documents"] = 3
    work = build_workload(name, params, batch_size=8, seed=0, device="cpu")
    report = convert.tensorize(work.model, work.tt_spec)
    assert set(report.layers) == set(work.tt_spec) and report.compression_layers > 1
    loss = work.loss(work.model, next(iter(work.train_batches(0))))
    loss.backward()
    assert torch.isfinite(loss)
    assert work.metric_name == work.evaluate(work.model)["metric_name"]
