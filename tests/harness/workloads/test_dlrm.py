import pytest
import torch
from torch import nn

from harness.data.criteo import KAGGLE_TABLE_SIZES
from harness.workloads import build_workload, check_params, dlrm
from harness.workloads.tt_spec import tt_parameter_count



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    return build_workload("dlrm", {"size": "tiny", "cache_dir": cache}, batch_size=256, seed=0, device="cpu")


def test_paper_model_is_the_dlrm_kaggle_configuration():
    params = check_params("dlrm", {"size": "paper"})
    with torch.device("meta"):
        model = dlrm.build_model(params)
    bottom = (13 * 512 + 512) + (512 * 256 + 256) + (256 * 64 + 64) + (64 * 16 + 16)
    top = (367 * 512 + 512) + (512 * 256 + 256) + (256 + 1)  # 367 = 16 + 27 * 26 / 2 interactions
    assert sum(p.numel() for p in model.parameters()) == 16 * sum(KAGGLE_TABLE_SIZES) + bottom + top
    spec = dlrm.tt_spec(params)
    assert {int(name.split(".")[1]) for name in spec} == {i for i, n in enumerate(KAGGLE_TABLE_SIZES)
                                                          if n >= 10000}
    for name, entry in spec.items():
        rows = KAGGLE_TABLE_SIZES[int(name.split(".")[1])]
        assert entry["kind"] == "embedding" and entry["col_shape"] == [4, 2, 2]
        assert rows <= torch.tensor(entry["row_shape"]).prod() and tt_parameter_count(entry) < rows * 16


def test_interaction_is_all_pairwise_dot_products():
    model = dlrm.DLRM([5, 7, 3], embedding_dim=4, bottom_mlp=[8, 4], top_mlp=[6]).double()
    dense, sparse = torch.randn(2, 13, dtype=torch.double), torch.tensor([[1, 6, 2], [4, 0, 0]])
    x = model.bottom(dense)
    vectors = [x] + [emb(sparse[:, i]) for i, emb in enumerate(model.embeddings)]
    pairs = [(vectors[i] * vectors[j]).sum(1) for i in range(4) for j in range(i)]
    expected = model.top(torch.cat([x, torch.stack(pairs, 1)], 1)).squeeze(-1)
    assert torch.allclose(model(dense, sparse), expected)


def test_tiny_builds_trains_one_batch_and_evaluates(tiny):
    batch = next(iter(tiny.train_batches(0)))
    assert batch["dense"].shape == (256, 13) and batch["sparse"].shape == (256, 26)
    loss = tiny.loss(tiny.model, batch)
    loss.backward()
    assert torch.isfinite(loss) and tiny.model.embeddings[0].weight.grad is not None
    result = tiny.evaluate(tiny.model)
    assert result["metric_name"] == "accuracy" == tiny.metric_name
    assert 0 <= result["metric_value"] <= 1 and result["nce"] > 0
    assert result["samples"] == tiny.info["eval_samples"] == round(8192 * 0.1)
    assert tiny.info["oracle_nce"] < 0.8  # the synthetic data carries a signal a model can find
    modules = dict(tiny.model.named_modules())
    assert tiny.tt_spec and all(isinstance(modules[n], nn.Embedding) for n in tiny.tt_spec)


def test_nce_is_one_for_the_base_rate_predictor(tiny):
    class BaseRate(nn.Module):
        def forward(self, dense, sparse):
            rate = tiny.info["eval_click_rate"]
            return torch.full((dense.shape[0],), torch.logit(torch.tensor(rate)).item())
    result = tiny.evaluate(BaseRate())
    assert result["nce"] == pytest.approx(1.0, abs=1e-4)
    assert result["metric_value"] == pytest.approx(tiny.info["majority_accuracy"])


def test_criteo_file_through_the_workload(tmp_path):
    line = "\t".join(["1"] + ["3"] * 13 + ["a1"] * 26)
    path = tmp_path / "train.txt"
    path.write_text((line + "\n") * 30 + line.replace("1", "0", 1) + "\n")
    work = build_workload("dlrm", {"size": "tiny", "data": "criteo", "data_path": str(path),
                                   "cache_dir": str(tmp_path)}, batch_size=4, seed=0, device="cpu")
    assert work.info["train_samples"] == 28 and work.info["eval_samples"] == 3
    assert work.steps_per_epoch == 7
    work.loss(work.model, next(iter(work.train_batches(0)))).backward()


def test_nce_is_left_out_when_every_eval_label_is_the_same(tmp_path):
    """NCE divides by the entropy of the eval click rate, 0 here: it is undefined, not NaN (the runner
    reads a non-finite evaluation value as divergence)."""
    line = "\t".join(["1"] + ["3"] * 13 + ["a1"] * 26)
    (tmp_path / "train.txt").write_text((line + "\n") * 20)
    work = build_workload("dlrm", {"size": "tiny", "data": "criteo", "data_path": str(tmp_path / "train.txt"),
                                   "cache_dir": str(tmp_path)}, batch_size=4, seed=0, device="cpu")
    result = work.evaluate(work.model)
    assert work.info["eval_click_rate"] == 1.0 and "nce" not in result and result["bce"] >= 0
