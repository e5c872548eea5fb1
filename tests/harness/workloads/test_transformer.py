from pathlib import Path

import pytest
import torch
from torch import nn

from harness.workloads import build_workload, check_params, transformer
from harness.workloads.tt_spec import tt_parameter_count

FIXTURE = Path(__file__).parents[3] / "harness" / "data" / "fixtures" / "mnli"



@pytest.fixture(scope="module")
def paper_model():
    params = check_params("transformer", {"size": "paper"})
    with torch.device("meta"):
        return params, transformer.build_model(params)


def test_paper_model_has_the_paper_parameter_count(paper_model):
    _, model = paper_model
    assert sum(p.numel() for p in model.parameters()) == 66_957_315


def test_paper_tt_spec_is_the_papers(paper_model):
    params, model = paper_model
    spec = transformer.tt_spec(params)
    modules = dict(model.named_modules())
    assert len(spec) == 6 * 6 + 2
    for name, entry in spec.items():
        kind = nn.Linear if entry["kind"] == "linear" else nn.Embedding
        assert isinstance(modules[name], kind), name
    r = 30
    assert spec["encoder.blocks.4.attn.q"] == {"kind": "linear", "in_shape": [12, 8, 8],
                                               "out_shape": [8, 8, 12], "rank": [1, 12, r, r, r, 12, 1]}
    assert spec["fc1"] == spec["encoder.blocks.0.attn.o"]
    assert spec["encoder.blocks.4.ffn_in"] == {"kind": "linear", "in_shape": [12, 8, 8],
                                               "out_shape": [12, 16, 16], "rank": [1, 12, r, r, r, 16, 1]}
    assert spec["encoder.blocks.4.ffn_out"]["in_shape"] == [16, 16, 12]
    assert spec["encoder.blocks.4.ffn_out"]["out_shape"] == [8, 8, 12]
    emb = spec["encoder.embeddings.word"]
    assert (emb["row_shape"], emb["col_shape"], emb["rank"]) == ([16, 20, 10, 10], [4, 4, 8, 6],
                                                                 [1, 32, 32, 32, 1])
    # docs/workloads.md: "tensorized one 1,485,795 at initialization" (cores; rank gates not counted)
    replaced = sum(modules[name].weight.numel() for name in spec)
    tensorized = (sum(p.numel() for p in model.parameters()) - replaced
                  + sum(map(tt_parameter_count, spec.values())))
    assert tensorized == 1_485_795


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    return build_workload("transformer", {"size": "tiny", "cache_dir": cache}, batch_size=32, seed=0,
                          device=torch.device("cpu"))


def test_tiny_builds_trains_one_batch_and_evaluates(tiny):
    batch = next(iter(tiny.train_batches(0)))
    assert batch["input_ids"].shape == (32, tiny.seq_len) and batch["labels"].shape == (32,)
    loss = tiny.loss(tiny.model, batch)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in tiny.model.fc2.parameters())
    result = tiny.evaluate(tiny.model)
    assert result["metric_name"] == "accuracy" == tiny.metric_name and 0.0 <= result["metric_value"] <= 1.0
    assert tiny.model.training  # evaluate restores the mode
    assert tiny.steps_per_epoch == 2048 // 32 and set(tiny.lr) == {"dense", "cores", "other", "gates",
                                                                   "embedding_cores"}
    assert all(name in dict(tiny.model.named_modules()) for name in tiny.tt_spec)


def test_same_seed_same_model_and_batches(tiny):
    again = build_workload("transformer", {"size": "tiny"}, batch_size=32, seed=0, device="cpu")
    for a, b in zip(tiny.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)
    first = next(iter(again.train_batches(3)))
    assert torch.equal(first["input_ids"], next(iter(tiny.train_batches(3)))["input_ids"])
    other = build_workload("transformer", {"size": "tiny"}, batch_size=32, seed=1, device="cpu")
    assert not torch.equal(other.model.fc1.weight, tiny.model.fc1.weight)


def test_attention_ignores_padding():
    params = check_params("transformer", {"size": "tiny", "dropout": 0.0})
    model = transformer.build_model(params).eval()
    ids = torch.randint(6, 200, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[:, 8:] = False
    seg = torch.zeros_like(ids)
    changed = ids.clone()
    changed[:, 8:] = 7
    with torch.no_grad():
        assert torch.allclose(model(ids, seg, mask), model(changed, seg, mask), atol=1e-6)
        assert not torch.allclose(model(ids, seg, None), model(changed, seg, None), atol=1e-6)


def test_synthetic_task_is_learnable_quickly():
    """Two epochs (128 steps) of a tiny model at the preset's learning rate go well above chance (1/3)."""
    work = build_workload("transformer", {"size": "tiny"}, batch_size=32, seed=0, device="cpu")
    opt = torch.optim.AdamW(work.model.parameters(), lr=work.lr["dense"], weight_decay=0.0)
    before = work.evaluate(work.model)["metric_value"]
    for epoch in range(2):
        for batch in work.train_batches(epoch):
            opt.zero_grad()
            work.loss(work.model, batch).backward()
            opt.step()
    after = work.evaluate(work.model)["metric_value"]
    assert before < 0.45 and after > 0.55


@pytest.mark.parametrize("word_topics, data_seed", [("random", 0), ("random", 3), ("modular", 0)])
def test_synthetic_splits_share_the_word_topics_of_the_setting(word_topics, data_seed):
    """Both splits follow one topic map: the one data_seed draws ("random", the default) or the modular
    one."""
    from harness.data.nli_synthetic import FIRST_WORD_ID, NOT_ID, word_topics as topics_of
    from harness.data.text_tokenizer import SEP_ID

    params = check_params("transformer", {"size": "tiny", "train_samples": 300, "eval_samples": 200,
                                          "num_words": 48, "data_seed": data_seed,
                                          **({} if word_topics == "random"
                                             else {"word_topics": word_topics})})
    topic_of = topics_of(48, 4, data_seed if word_topics == "random" else None)
    for split in transformer.load_data(params)[:2]:
        for ids, label in zip(split["input_ids"].tolist(), split["labels"].tolist()):
            first_sep = ids.index(SEP_ID)
            premise = {topic_of[t - FIRST_WORD_ID] for t in ids[1:first_sep]}
            hypothesis = {topic_of[t - FIRST_WORD_ID]
                          for t in ids[first_sep + 1:ids.index(SEP_ID, first_sep + 1)] if t != NOT_ID}
            assert len(premise) == len(hypothesis) == 1 and (premise != hypothesis) == (label == 1)


def test_mnli_fixture_through_the_workload(tmp_path):
    params = {"size": "tiny", "data": "mnli", "data_dir": str(FIXTURE), "cache_dir": str(tmp_path),
              "vocab_size": 300}
    work = build_workload("transformer", params, batch_size=8, seed=0, device="cpu")
    assert work.info["train_samples"] == 36 and work.info["eval_samples"] == 12
    assert work.info["tokenizer_vocab"] <= 300 and work.steps_per_epoch == 4
    work.loss(work.model, next(iter(work.train_batches(0)))).backward()
    assert work.evaluate(work.model)["samples"] == 12
    cached = sorted(p.name.split("-")[0] for p in (tmp_path / "mnli").iterdir()
                    if not p.name.endswith(".lock"))  # the tokenizer's training lock stays beside it
    assert cached == ["eval", "train", "wordpiece"]
    with pytest.raises(ValueError, match="more than param vocab_size=6"):
        build_workload("transformer", {**params, "vocab_size": 6, "tokenizer":
                                       str(next((tmp_path / "mnli").glob("wordpiece-*.json")))},
                       batch_size=8, seed=0, device="cpu")


def test_mnli_rows_dropped_are_in_the_workload_info(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text((FIXTURE / "train.tsv").read_text())
    lines = (FIXTURE / "dev_matched.tsv").read_text().splitlines()
    lines[1] = lines[1].rsplit("\t", 1)[0] + "\t-"
    (data / "dev_matched.tsv").write_text("\n".join(lines) + "\n")
    params = {"size": "tiny", "data": "mnli", "data_dir": str(data), "cache_dir": str(tmp_path / "cache")}
    with pytest.warns(UserWarning, match="1 dropped"):
        work = build_workload("transformer", params, batch_size=8, seed=0, device="cpu")
    assert work.info["rows_read"] == {"train": 36, "validation_matched": 12}
    assert work.info["rows_dropped"] == {"train": {}, "validation_matched": {"'-'": 1}}
    assert work.info["eval_samples"] == 11


def test_sized_params_give_the_width_with_the_nearest_parameter_count():
    """The size-matched dense baseline's rule: d_model in steps of num_heads up to the preset's, d_ff in
    proportion, nothing else changed; the nearest count wins, the narrower width on a tie."""
    p = check_params("transformer", {"size": "small"})
    count = {d: transformer.parameter_count({**p, "d_model": d, "d_ff": 4 * d}) for d in range(4, 129, 4)}
    assert count[128] == transformer.parameter_count(p) == 553_219
    middle = (count[16] + count[20]) // 2
    for n, width in ((0, 4), (count[16], 16), (middle, 16), (middle + 1, 20), (10 ** 9, 128)):
        q = transformer.sized_params(p, n)
        assert (q["d_model"], q["d_ff"]) == (width, 4 * width), n
        assert {k: v for k, v in q.items() if k not in ("d_model", "d_ff")} == {
            k: v for k, v in p.items() if k not in ("d_model", "d_ff")}


def test_sized_models_are_width_depth_and_the_task_vocabulary_each_seeded_as_the_workloads():
    """The small preset (two layers) with the grid's 96 words: three shapes near the count asked for; the
    task-vocabulary model embeds only the 102 ids the generator emits, every other id as [UNK]."""
    from harness.data import nli_synthetic
    from harness.data.text_tokenizer import UNK_ID

    work = build_workload("transformer", {"size": "small", "num_words": 96, "num_topics": 8, "premise_len": 8,
                                          "train_samples": 64, "eval_samples": 16},
                          batch_size=8, seed=0, device="cpu")
    shapes = {c.shape: c for c in work.sized_models(70_000)}
    assert list(shapes) == ["width", "depth", "task-vocabulary"]
    assert shapes["depth"].dims["num_layers"] == 1 and shapes["width"].dims["num_layers"] == 2
    assert shapes["depth"].dims["d_model"] > shapes["width"].dims["d_model"]
    assert shapes["task-vocabulary"].dims["task_vocabulary"] == 102
    for c in shapes.values():
        model, again = c.build(), c.build()
        assert sum(q.numel() for q in model.parameters()) == c.params
        assert abs(c.params - 70_000) < 10_000
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     again.state_dict().values()))
    word = shapes["task-vocabulary"].build().encoder.embeddings.word
    ids = nli_synthetic.token_ids(1024, 96)
    assert word.embedding.weight.shape[0] == len(ids) == 102
    assert torch.equal(word(torch.tensor(ids)), word.embedding.weight)
    assert torch.equal(word(torch.tensor([1023])), word(torch.tensor([UNK_ID])))


def test_holdout_is_the_last_slice_of_the_training_data_and_never_the_eval_split():
    work = build_workload("transformer", {"size": "tiny", "train_samples": 100, "eval_samples": 7},
                          batch_size=10, seed=0, device="cpu")
    held = work.holdout(0.2)
    assert held.steps_per_epoch == 8
    fitted = torch.cat([b["input_ids"] for b in held.train_batches(0)])
    assert fitted.shape[0] == 80
    assert held.evaluate(work.model)["samples"] == 20 and work.evaluate(work.model)["samples"] == 7


def test_label_noise_ceilings_are_in_the_workload_info():
    """With label noise the info says which share of the evaluation labels follow the task's rule (what a
    model that learned the rule can reach) and what the hypothesis alone gives."""
    params = {"size": "tiny", "train_samples": 64, "eval_samples": 600, "label_noise": 0.3}
    noisy = build_workload("transformer", params, batch_size=8, seed=0, device="cpu")
    clean = build_workload("transformer", {**params, "label_noise": 0.0}, batch_size=8, seed=0, device="cpu")
    evals = {name: torch.cat([b["labels"] for b in w.eval_batches()]) for name, w in (("noisy", noisy),
                                                                                     ("clean", clean))}
    assert noisy.info["label_ceiling"] == float((evals["noisy"] == evals["clean"]).double().mean()) < 1
    assert noisy.info["hypothesis_only_ceiling"] == pytest.approx(2 / 3 - 0.1)
    assert "label_ceiling" not in clean.info and clean.info["hypothesis_only_ceiling"] == 2 / 3


@pytest.mark.parametrize("label_noise", [0.0, 0.1])
def test_synthetic_pairs_come_from_the_runs_cache_unchanged(tmp_path, monkeypatch, label_noise):
    """The synthetic pairs are generated once per cache folder (the pipeline's) and read back equal; with
    no cache folder asked for, nothing is written (not even under the current directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMERA_BENCH_CACHE_DIR", raising=False)
    params = check_params("transformer", {"size": "tiny", "label_noise": label_noise})
    fresh = transformer.load_data(params)
    assert not any(tmp_path.iterdir())
    cache = tmp_path / "cache"
    monkeypatch.setenv("COMERA_BENCH_CACHE_DIR", str(cache))
    first = transformer.load_data(params)
    (entry,) = (cache / "nli").glob("synthetic-*.pt")
    generate, calls = transformer.nli_synthetic.generate, []
    monkeypatch.setattr(transformer.nli_synthetic, "generate", lambda *a, **k: calls.append(a))
    again = transformer.load_data(params)
    assert not calls and entry.exists()
    monkeypatch.setattr(transformer.nli_synthetic, "generate", generate)
    for loaded in (first, again):
        assert loaded[2] == fresh[2]
        for split in (0, 1):
            assert loaded[split].keys() == fresh[split].keys()
            for key, tensor in fresh[split].items():
                assert torch.equal(loaded[split][key], tensor), key
    other = transformer.load_data({**params, "data_seed": params["data_seed"] + 1})
    assert len(list((cache / "nli").glob("synthetic-*.pt"))) == 2
    assert not torch.equal(other[0]["input_ids"], fresh[0]["input_ids"])
