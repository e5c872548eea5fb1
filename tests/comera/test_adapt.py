"""comera.RankAdaptation / comera.param_groups: the defaults are the pipeline's working recipe, the two
calls switch stage and prune (optimizer state included), and bad settings are named."""
import pytest
import torch
from torch import nn

import comera
from baselines.comera import PARAMS_DEFAULTS


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    comera.tensorize(model, {"0": {"rank": 4}})
    return model


def test_param_groups_split_cores_gates_and_the_rest():
    model = _model()
    groups = {g["name"]: g for g in comera.param_groups(model, lr=2e-3)}
    assert {k: g["lr"] for k, g in groups.items()} == {"cores": 2e-3, "gates": 1e-2, "other": 2e-3}
    assert [p is q for p, q in zip(groups["cores"]["params"], model[0].cores)] == [True] * 6
    assert len(groups["gates"]["params"]) == 5
    assert {id(p) for p in groups["other"]["params"]} == {id(model[0].bias), id(model[2].weight),
                                                          id(model[2].bias)}
    overridden = {g["name"]: g["lr"] for g in comera.param_groups(model, cores=1e-4, gates=1e-3, other=5e-5)}
    assert overridden == {"cores": 1e-4, "gates": 1e-3, "other": 5e-5}
    with pytest.raises(ValueError, match="'gates'"):
        comera.param_groups(model, gates=0)


def test_param_groups_put_ttm_cores_in_their_own_group():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32))
    comera.tensorize(model, {"0": {"rank": 4, "row_shape": [4, 4, 4], "col_shape": [4, 2, 2]},
                             "1": {"rank": 4}})
    groups = {g["name"]: g for g in comera.param_groups(model, lr=1e-3, embedding_cores=1e-2)}
    assert {k: g["lr"] for k, g in groups.items()} == {"cores": 1e-3, "embedding_cores": 1e-2, "gates": 5e-3,
                                                        "other": 1e-3}
    assert [id(p) for p in groups["embedding_cores"]["params"]] == [id(p) for p in model[0].cores]
    assert [id(p) for p in groups["cores"]["params"]] == [id(p) for p in model[1].cores]
    assert {g["name"]: g["lr"] for g in comera.param_groups(model, cores=2e-4)}["embedding_cores"] == 2e-4
    with pytest.raises(ValueError, match="'embedding_cores'"):
        comera.param_groups(model, embedding_cores=-1.0)


def test_defaults_are_the_pipelines_recipe():
    adapt = comera.RankAdaptation(_model(), target=0.3, total_steps=1000)
    s = adapt.settings
    shared = ("l1_weight", "l2_weight", "threshold", "prune_every", "min_rank", "switch_when",
              "converged_gain",
              "loss_tolerance", "size_weight", "stop_at_target", "target_ramp", "mask_gates")
    assert {key: getattr(s, key) for key in shared} == {key: PARAMS_DEFAULTS[key] for key in shared}
    assert (s.l1_weight, s.l2_weight, s.min_rank, s.switch_when) == (0.0, 0.0, 1, "converged")
    assert (s.late_start_step, s.target_ratio, s.total_steps, s.converged_window) == (450, 0.3, 1000, 100)
    early_only = comera.RankAdaptation(_model()).settings
    assert (early_only.late_start_step, early_only.target_ratio) == (None, None)
    assert comera.RankAdaptation(_model(), size_weight=3.0).settings.size_weight == 3.0


@pytest.mark.parametrize("kwargs,error,message", [
    ({"target": 0.5}, ValueError, "total_steps"),
    ({"target": 0.5, "total_steps": 10, "early_fraction": 1.5}, ValueError, "early_fraction"),
    ({"l2_wieght": 1e-3}, TypeError, "l2_wieght"),
    ({"late_start_step": 5}, TypeError, "late_start_step"),
    ({"target": 1.5, "total_steps": 10}, ValueError, "target_ratio"),
])
def test_bad_settings_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        comera.RankAdaptation(_model(), **kwargs)


def test_param_groups_in_place_of_the_optimizer_are_refused():
    model = _model()
    with pytest.raises(TypeError, match="torch optimizer.*got dict"):
        comera.RankAdaptation(model, comera.param_groups(model))


def test_a_model_without_tt_layers_is_refused():
    with pytest.raises(ValueError, match="tensorize"):
        comera.RankAdaptation(nn.Linear(4, 4))


def test_loss_and_step_switch_stage_and_prune_with_the_optimizer_state():
    model = _model()
    optimizer = torch.optim.AdamW(comera.param_groups(model))
    adapt = comera.RankAdaptation(model, optimizer, target=0.5, total_steps=20, early_fraction=0.5,
                                  switch_when="step", l1_weight=0.01, recover_fraction=0.0)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    stages = []
    for step in range(20):
        task = nn.functional.cross_entropy(model(x), y)
        objective = adapt.loss(task)
        assert objective.item() != task.item()  # penalties are added
        objective.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 12:
            with torch.no_grad():
                model[0].gates[2][:2] = 0.0  # two ranks to prune at the next pruning step (every 10)
        stages.append(adapt.step()["stage"])
        assert adapt.steps == step + 1
    assert stages == [0.0] * 9 + [1.0] * 11 and adapt.stage == "late"
    assert adapt.ranks()["0"][3] == 2
    for gate in model[0].gates:
        assert optimizer.state[gate]["exp_avg"].shape == gate.shape
    assert adapt.size_target == pytest.approx(0.5 * adapt.driver.switch["size"])
    assert adapt.size >= adapt.size_target
    assert "late stage" in adapt.summary() and f"{adapt.size:,} TT parameters" in adapt.summary()


def test_a_non_finite_task_loss_leaves_the_running_loss_alone():
    """A step whose task loss overflows (a GradScaler then skips it) must not freeze the late stage's loss
    reference at inf (comera.running_loss.RunningLoss itself: tests/comera/test_rank.py)."""
    model = _model()
    adapt = comera.RankAdaptation(model, torch.optim.AdamW(comera.param_groups(model)), target=0.5,
                                  total_steps=20)
    for loss in [1.0, float("inf"), float("nan"), 0.5]:
        adapt.loss(torch.tensor(loss))
    running = adapt.state_dict()["driver"]["running"]
    assert running["slow"] == pytest.approx(0.98 * 1.0 + 0.02 * 0.5) == running["best"]


def _float64_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).double()
    comera.tensorize(model, {"0": {"rank": 4}})
    return model


def _train(model, optimizer, adapt, start, stop, net=None, part=(0, 1)):
    """Steps ``start`` .. ``stop - 1`` on batches fixed by the step, through ``net`` (default: the model;
    its ``after_step(adapt)`` runs after each step), each batch's ``part = (k, n)``: its k-th of n equal
    chunks; two gate entries are zeroed after steps 3 and 12, so that pruning removes ranks before and
    after the switch."""
    for step in range(start, stop):
        gen = torch.Generator().manual_seed(step)
        x, y = (torch.randn(32, 16, generator=gen, dtype=torch.float64),
                torch.randint(0, 4, (32,), generator=gen))
        x, y = x.chunk(part[1])[part[0]], y.chunk(part[1])[part[0]]
        adapt.loss(nn.functional.cross_entropy((net or model)(x), y)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step in (3, 12):
            with torch.no_grad():
                model[0].gates[step % 4][:1] = 0.0
        adapt.step()
        if net is not None:
            net.after_step(adapt)


def _run(settings):
    model = _float64_model()
    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=1e-2))
    return model, optimizer, comera.RankAdaptation(model, optimizer, **settings)


PROJECT_RULES = dict(converged_window=4, converged_gain=1.0)


@pytest.mark.parametrize("resume_at", [4, 10, 16])  # early stage, right after the switch, late stage
@pytest.mark.parametrize("rules", [dict(target_ramp=0.0, switch_when="step", **PROJECT_RULES),
                                   dict(target_ramp=0.8, switch_when="step", **PROJECT_RULES),
                                   dict(target_ramp=0.8, switch_when="converged", **PROJECT_RULES),
                                   dict(rules="paper", loss_target=1.0)],
                         ids=["step", "ramp", "converged", "paper"])
def test_a_resumed_run_ends_as_the_uninterrupted_one(tmp_path, resume_at, rules):
    """Checkpoint (model, optimizer, rank adaptation) after ``resume_at`` of 24 steps, rebuild everything
    from the files and go on: the same ranks, parameters (float64, exactly), switch point and summary as a
    run that never stopped."""
    settings = dict(target=0.5, total_steps=24, early_fraction=0.4, prune_every=4, **rules)
    model, optimizer, adapt = _run(settings)
    _train(model, optimizer, adapt, 0, 24)

    first, first_opt, first_adapt = _run(settings)
    _train(first, first_opt, first_adapt, 0, resume_at)
    torch.save({"model": first.state_dict(), "optimizer": first_opt.state_dict(),
                "adapt": first_adapt.state_dict()}, tmp_path / "checkpoint.pt")
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    resumed = _float64_model()
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = torch.optim.AdamW(comera.param_groups(resumed, lr=1e-2))
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    resumed_adapt = comera.RankAdaptation(resumed, resumed_opt, **settings)
    resumed_adapt.load_state_dict(checkpoint["adapt"])
    _train(resumed, resumed_opt, resumed_adapt, resume_at, 24)

    assert adapt.stage == resumed_adapt.stage == "late"
    assert comera.ranks(resumed) == comera.ranks(model) != comera.ranks(_float64_model())  # pruned
    for (name, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name
    assert resumed_adapt.driver.switch == adapt.driver.switch
    assert resumed_adapt.summary() == adapt.summary()


def test_a_state_from_a_run_with_other_settings_is_named():
    model, optimizer, adapt = _run(dict(target=0.5, total_steps=24))
    other = _run(dict(target=0.3, total_steps=30))[2]
    with pytest.raises(ValueError, match=r"target_ratio=0\.5 \(here 0\.3\).*total_steps=24 \(here 30\)"):
        other.load_state_dict(adapt.state_dict())


def test_resized_says_when_to_rebuild_distributed_data_parallel(tmp_path):
    """Pruning changes the shapes of cores and gates, which a DistributedDataParallel wrapper cannot follow:
    rebuilt after every step whose ``adapt.resized`` is set, a one-process DDP run (gloo) ends as the plain
    run, exactly (float64)."""
    import torch.distributed as dist

    settings = dict(target=0.5, total_steps=24, early_fraction=0.4, prune_every=4, switch_when="step")
    model, optimizer, adapt = _run(settings)
    _train(model, optimizer, adapt, 0, 24)

    wrapped, wrapped_opt, wrapped_adapt = _run(settings)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        net = _Rewrapped(wrapped)
        _train(wrapped, wrapped_opt, wrapped_adapt, 0, 24, net)
    finally:
        dist.destroy_process_group()
    assert net.rebuilt >= 2 and comera.ranks(wrapped) == comera.ranks(model) != comera.ranks(_float64_model())
    for (name, a), (_, b) in zip(model.named_parameters(), wrapped.named_parameters()):
        assert torch.equal(a, b), name



class _Rewrapped:
    """The model in DistributedDataParallel, built again after every step that pruned (docs/library.md,
    "Several GPUs")."""

    def __init__(self, model):
        self.model, self.ddp, self.rebuilt = model, nn.parallel.DistributedDataParallel(model), 0

    def __call__(self, x):
        return self.ddp(x)

    def after_step(self, adapt):
        import gc

        if adapt.resized:
            self.ddp = None
            gc.collect()  # the old wrapper holds the parameters' gradient accumulators, old shapes included
            self.ddp, self.rebuilt = nn.parallel.DistributedDataParallel(self.model), self.rebuilt + 1


def _ddp_process(rank, folder):
    """One of two processes of a gloo DDP run through prunings in both stages, each on its half of every
    batch; its parameters, ranks and rebuild count go to ``folder/rank<r>.pt``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        model, optimizer, adapt = _run(dict(target=0.5, total_steps=24, early_fraction=0.4, prune_every=4,
                                            switch_when="step"))
        net = _Rewrapped(model)
        _train(model, optimizer, adapt, 0, 24, net, part=(rank, 2))
    finally:
        dist.destroy_process_group()
    torch.save({"params": {k: p.detach() for k, p in model.named_parameters()}, "ranks": comera.ranks(model),
                "rebuilt": net.rebuilt}, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_two_ddp_processes_prune_alike_and_stay_equal(tmp_path):
    """The recipe with two processes (gloo), each on its own half of every batch: they prune the same
    ranks, rebuild their wrappers at the same steps and end with the same parameters (bit for bit), which
    differ from a process trained on one half alone (the gradients were averaged)."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_process, args=(str(tmp_path),), nprocs=2, join=True)
    first, second = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert first["ranks"] == second["ranks"] != comera.ranks(_float64_model())
    assert first["rebuilt"] == second["rebuilt"] >= 2
    for name, param in first["params"].items():
        assert torch.equal(param, second["params"][name]), name
    alone, alone_opt, alone_adapt = _run(dict(target=0.5, total_steps=24, early_fraction=0.4, prune_every=4,
                                              switch_when="step"))
    _train(alone, alone_opt, alone_adapt, 0, 24, part=(0, 2))
    assert not torch.equal(dict(alone.named_parameters())["2.weight"], first["params"]["2.weight"])


def test_the_summary_of_a_model_whose_tt_layers_were_all_removed_says_so():
    """Every rank pruned (``min_rank=0``) before the object was made: its size at the start is 0, and the
    summary says so instead of dividing by it."""
    model = _model()
    comera.prune(model, 1.0, min_rank=0)
    adapt = comera.RankAdaptation(model, min_rank=0)
    assert adapt.initial_size == 0
    text = adapt.summary()
    assert "step 0, early stage: 0 TT parameters (every TT layer was removed before rank adaptation" in text
    assert "removed layers (weight zero): 0" in text


def test_summary_states_the_layers_and_the_whole_models_compression_as_tensorize_counts_them():
    """One count on both sides (biases with the TT layers as with the dense ones): summary()'s layer
    compression is tensorize's report's, and the whole model's stands beside it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10), nn.LayerNorm(10))
    report = comera.tensorize(model, {"0": {"rank": 8}, "2": {"rank": 8}})
    adapt = comera.RankAdaptation(model, torch.optim.AdamW(comera.param_groups(model)))
    text = adapt.summary()
    assert f"tensorized layers {report.compression_layers:.1f}x" in text
    assert (f"({report.params_dense_layers:,} dense -> {report.params_layers:,})" in text
            and f"whole model {report.compression_total:.2f}x" in text)
    assert f"({report.params_dense_total:,} dense -> {report.params_total:,})" in text
    assert report.compression_total < report.compression_layers  # the LayerNorm stays dense


def test_an_optimizer_built_before_tensorize_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    early = torch.optim.AdamW(model.parameters())
    comera.tensorize(model, {"0": {"rank": 4}})
    with pytest.raises(ValueError, match=r"does not hold 11 of the model's 11 TT parameters .* build the "
                                         r"optimizer after comera.tensorize"):
        comera.RankAdaptation(model, early, target=0.5, total_steps=10)
    partial = torch.optim.AdamW(model[0].cores)  # the gates left out
    with pytest.raises(ValueError, match="does not hold 5 of the model's 11"):
        comera.RankAdaptation(model, [partial])
    comera.RankAdaptation(model, torch.optim.AdamW(comera.param_groups(model)))  # after tensorize: taken


def _steps(adapt, model, optimizer, steps, on_loss=None, after=None):
    torch.manual_seed(1)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    for step in range(steps):
        task = nn.functional.cross_entropy(model(x), y)
        objective = adapt.loss(task)
        if on_loss:
            on_loss(step, task, objective)
        objective.backward()
        optimizer.step()
        optimizer.zero_grad()
        if after:
            after(step)
        adapt.step()


@pytest.mark.parametrize("late_fraction, switch", [(1 / 3, 20), (0.5, 15), (0.0, None)])
def test_the_late_stage_keeps_its_share_converged_or_not(late_fraction, switch):
    """A loss that never counts as converged (a window longer than the run): the switch comes at
    (1 - late_fraction) x total_steps all the same; with late_fraction 0 it never comes."""
    model = _model()
    optimizer = torch.optim.AdamW(comera.param_groups(model))
    adapt = comera.RankAdaptation(model, optimizer, target=0.5, total_steps=30, early_fraction=0.2,
                                  converged_window=10_000, late_fraction=late_fraction)
    _steps(adapt, model, optimizer, 30)
    assert adapt.driver.switch.get("step") == switch
    assert adapt.stage == ("early" if switch is None else "late")


def test_recovery_trains_the_task_loss_alone_and_prunes_nothing():
    """The late stage's last recover_fraction: the objective is the task loss (no size term) and a gate at
    zero is not pruned; before it the same gate is."""
    model = _model()
    optimizer = torch.optim.AdamW(comera.param_groups(model))
    adapt = comera.RankAdaptation(model, optimizer, target=0.2, total_steps=40, early_fraction=0.5,
                                  switch_when="step", recover_fraction=0.25, target_ramp=0.0)
    seen = {}

    def on_loss(step, task, objective):
        seen[step] = (adapt.driver.recovering(step), objective.item() == task.item(),
                      sum(adapt.ranks()["0"]))

    def after(step):
        if step in (24, 34):
            with torch.no_grad():
                model[0].gates[1][:1] = 0.0  # a rank the next pruning (every 10 steps) would take

    _steps(adapt, model, optimizer, 40, on_loss, after)
    assert adapt.driver.switch["step"] == 20 and adapt.driver.switch["recover_step"] == 35
    assert [s for s in seen if seen[s][0]] == list(range(35, 40))
    assert all(seen[s][1] for s in range(35, 40)) and not any(seen[s][1] for s in range(20, 35))
    assert seen[30][2] < seen[24][2]           # pruned after step 29, before the recovery
    assert sum(adapt.ranks()["0"]) == seen[35][2]  # nothing pruned during it (step 39's pruning skipped)
