import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from harness.running import cudagraph


def batch(n=4, shift=0.0):
    return {"x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + shift,
            "y": torch.arange(n) % 2}


def test_static_batch_copies_in_place():
    static = cudagraph.StaticBatch(batch())
    ptrs = {k: v.data_ptr() for k, v in static.tensors.items()}
    new = batch(shift=10.0)
    assert static.load(new)
    assert all(static.tensors[k].data_ptr() == ptrs[k] for k in ptrs)
    assert torch.equal(static.tensors["x"], new["x"]) and torch.equal(static.tensors["y"], new["y"])
    new["x"] += 1  # the buffers are copies, not views of the batch
    assert not torch.equal(static.tensors["x"], new["x"])


@pytest.mark.parametrize("other", [batch(n=5), {"x": batch()["x"]},
                                   {"x": batch()["x"].double(), "y": batch()["y"]}])
def test_static_batch_refuses_other_shapes(other):
    static = cudagraph.StaticBatch(batch())
    before = static.tensors["x"].clone()
    assert not static.load(other)
    assert torch.equal(static.tensors["x"], before)


def test_make_capturable_switches_adamw():
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    cudagraph.make_capturable(model, [opt])
    assert opt.defaults["capturable"] and all(g["capturable"] for g in opt.param_groups)


class NoCapture(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})


def test_make_capturable_refuses():
    model = nn.Linear(3, 2)
    with pytest.raises(cudagraph.CudaGraphUnsupported, match="NoCapture does not"):
        cudagraph.make_capturable(model, [NoCapture(model.parameters())])
    with pytest.raises(cudagraph.CudaGraphUnsupported, match="layer-wise"):
        cudagraph.make_capturable(model, [])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    with pytest.raises(cudagraph.CudaGraphUnsupported, match="already has state"):
        cudagraph.make_capturable(model, [opt])


def test_state_signature_sees_reallocation_not_updates():
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    sig = cudagraph.state_signature(model, [opt])
    with torch.no_grad():
        model.weight.add_(1.0)
    opt.step()
    assert cudagraph.state_signature(model, [opt]) == sig
    model.weight.data = model.weight.data[:2].clone()  # what pruning does
    assert cudagraph.state_signature(model, [opt]) != sig


def test_graphed_step_needs_cuda():
    model = nn.Linear(3, 2)
    with pytest.raises(cudagraph.CudaGraphUnsupported, match="cuda_graph needs CUDA"):
        cudagraph.GraphedStep(lambda b, s: None, model, [torch.optim.AdamW(model.parameters())],
                              torch.device("cpu"))


@pytest.mark.cuda
def test_graphed_steps_match_eager_steps():
    device = torch.device("cuda")

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
        return model, opt

    def step_fn_for(model, opt):
        def step_fn(b, step):
            loss = nn.functional.cross_entropy(model(b["x"]), b["y"])
            loss.backward()
            opt.step()
            return loss.detach(), loss.detach()
        return step_fn

    batches = [{k: v.to(device) for k, v in batch(shift=i).items()} for i in range(8)]
    model_e, opt_e = make()
    eager = []
    for i, b in enumerate(batches):
        eager.append(float(step_fn_for(model_e, opt_e)(b, i)[0]))
        opt_e.zero_grad(set_to_none=True)
    model_g, opt_g = make()
    graphed = cudagraph.GraphedStep(step_fn_for(model_g, opt_g), model_g, [opt_g], device, warmup=2)
    got = [float(graphed(b, i)[0]) for i, b in enumerate(batches)]
    assert graphed.stats() == {"captures": 1, "replays": 6, "eager_steps": 2}
    assert got == pytest.approx(eager, rel=1e-5, abs=1e-6)


# What a CUDA graph cannot capture, found on the CPU: an op that waits for the device to tell the host a
# value or a size (a capture then fails with cudaErrorStreamCaptureInvalidated, as the TTM lookup's
# torch.unique once did on an H200), or a tensor made from host data.
HOST_SYNCS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique", "_unique2",
              "unique_dim", "unique_consecutive", "lift_fresh"}


class HostSyncs(TorchDispatchMode):
    """Records the ops of :data:`HOST_SYNCS` that run while it is active."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in HOST_SYNCS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


CAPTURED_CASES = [(workload, size, method, target)
                  for workload, size in (("transformer", "tiny"), ("transformer", "paper"), ("dlrm", "tiny"),
                                         ("mlm", "tiny"))
                  for method, target in (("dense", None), ("comera", None), ("comera", 0.5))
                  # the paper's TT/TTM shapes; dense: as the tiny one
                  if (size, method) != ("paper", "dense")]


@pytest.mark.parametrize("workload,size,method,target", CAPTURED_CASES)
def test_the_captured_part_of_a_step_never_waits_for_the_device(workload, size, method, target, monkeypatch):
    """``Prepared.update``'s forward, objective and backward (what GraphedStep captures, with the optimizers'
    capturable steps) run no host sync, in CoMERA's early and late stage, with the code paths a CUDA capture
    takes: the TTM lookup's capture branch, and no CPU-only index check (on CUDA the gather checks)."""
    import baselines
    import harness.workloads as workloads
    from comera import ttm

    monkeypatch.setattr(ttm, "_capturing", lambda t: True)
    monkeypatch.setattr(ttm, "_index_bounds", lambda idx, plain_ops: None)
    params = {"size": size, **({"train_samples": 64, "eval_samples": 8} if size == "paper" else {})}
    built = workloads.build_workload(workload, params, batch_size=2, seed=0, device=torch.device("cpu"))
    # at early_fraction, converged or not
    method_params = {"switch_when": "step"} if method == "comera" else {}
    prepared = baselines.get_method(method).prepare(built.model, built, method_params, target_ratio=target,
                                                    total_steps=8)
    batches = iter(built.train_batches(0))
    for step in range(8):  # the stage switches after step 3 (early_fraction 0.45)
        batch = next(batches)
        if step in (1, 7):
            if method == "comera":
                stage = prepared.stateful["rank_adaptation"].stage
                assert stage == ("late" if step == 7 and target is not None else "early")
            with HostSyncs() as syncs:
                prepared.total_loss(built.loss(prepared.model, batch), step).backward()
            assert syncs.seen == [], f"step {step}: {syncs.seen}"
            for opt in prepared.optimizers:
                opt.zero_grad(set_to_none=True)
        prepared.train_step(built, batch, step)
