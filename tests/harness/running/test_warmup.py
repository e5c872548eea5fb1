import gc
import random
import weakref

import numpy as np
import pytest
import torch

from harness.running import warmup
from tests.harness.running.run_toys import TOY_REGISTRY, ToyMethod

CPU = torch.device("cpu")


class Recorder:
    """The toy registry, keeping weak references to every model it builds; ``draw`` makes the workload
    consume python's and numpy's global random streams when built."""

    def __init__(self, draw: bool = False):
        self.models: list[weakref.ref] = []
        self.params: list[dict] = []
        self.draw = draw

    def build_workload(self, name, params, **kw):
        if self.draw:
            random.random()
            np.random.rand()
        workload = TOY_REGISTRY.build_workload(name, params, **kw)
        self.models.append(weakref.ref(workload.model))
        self.params.append(dict(params))
        return workload

    def warm_up(self, method_params=None, **kw):
        return warmup.warm_up("toy", "toy", batch_size=kw.pop("batch_size", 16), device=CPU,
                              method_params=method_params, build_workload=self.build_workload,
                              get_method=lambda name: ToyMethod(), **kw)


def _states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def test_random_states_are_untouched():
    """The toy workload reseeds torch and its dropout draws from it; the recorder draws from python and
    numpy."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    before = _states()
    recorder = Recorder(draw=True)
    assert recorder.warm_up() == "ok"
    after = _states()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_the_model_is_dropped():
    recorder = Recorder()
    assert recorder.warm_up() == "ok"
    gc.collect()  # what reference cycles hold is left to the caller's collection
    assert len(recorder.models) == 1 and recorder.models[0]() is None


def test_a_failing_step_raises_and_drops_the_model():
    """The model is gone while the exception still lives (warm_up frees CUDA's cache before it returns)."""
    recorder = Recorder()
    with pytest.raises(ValueError, match="toy method broke") as raised:
        recorder.warm_up({"fail": "error", "fail_at": 0})
    gc.collect()
    assert raised.value.__traceback__ is not None and recorder.models[0]() is None


def test_a_skipped_method_runs_nothing():
    assert Recorder().warm_up({"fail": "skip"}) == "method skipped: toy needs a device it does not have"


def test_a_workload_without_a_batch_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="tiny 'toy' .* no training batch of size 300"):
        Recorder().warm_up(batch_size=300)


def test_tiny_params_keep_the_code_path_choices_of_the_cell():
    recorder = Recorder()
    recorder.warm_up(workload_params={"size": "small", "samples": 4096, "cache_dir": "/c", "dropout": 0.1})
    assert recorder.params == [{"size": "tiny", "cache_dir": "/c", "dropout": 0.1}]


@pytest.mark.parametrize("workload, method, method_params, batch_size", [
    ("transformer", "lte", {"preset": "tuned"}, 4),  # 4 heads split the batch
    ("dlrm", "comera", {}, 4),
    ("mlm", "dense", {}, 4),
])
def test_every_real_workload_has_a_tiny_instance(tmp_path, workload, method, method_params, batch_size):
    import baselines
    import harness.workloads as workloads

    assert set(warmup.ONE_BATCH) == set(workloads.WORKLOADS)
    cell = workloads.check_params(workload, {"cache_dir": str(tmp_path)})
    outcome = warmup.warm_up(workload, method, batch_size=batch_size, device=CPU, workload_params=cell,
                             method_params=baselines.check_params(method, method_params))
    assert outcome == "ok"


def test_a_size_matched_cell_warms_up_without_the_cell_it_matches():
    """The tiny instance has no cell to match (and a size-matched dense method would first train its
    candidates for a quarter of the warm-up's 10**6 steps): the step gets the other params only."""
    seen = []

    class Method(ToyMethod):
        def prepare(self, model, workload, params, **kw):
            seen.append(dict(params))
            return super().prepare(model, workload, {k: v for k, v in params.items() if k != "match_run"},
                                   **kw)

    assert warmup.warm_up("toy", "toy", batch_size=16, device=CPU,
                          method_params={"match_run": "cell_t0.2_s0", "lr": 0.1},
                          build_workload=Recorder().build_workload, get_method=lambda name: Method()) == "ok"
    assert seen == [{"lr": 0.1}]
