"""The native TT ops (comera/native.py, comera/csrc/tt_linear.cpp) against the Python kernels.

Every case runs one forward+backward twice, natively and inside ``native.disabled()``, in float64; outputs
and every gradient must agree to 1e-12 (they are made by the same ATen calls, so they are usually equal).
"""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comera import native
from comera.contraction import PlanSettings, make_plan
from comera.tt import TTLinear, parameter_entries, tt_linear
from harness.perf.microbench import OpCounter
from tests.comera.flops import native_and_python_flops

TOOLS = shutil.which("ninja") is not None and shutil.which("c++") is not None
needs_native = pytest.mark.skipif(not native.status().in_use, reason=f"native ops: {native.status().reason}")


def test_native_ops_are_in_use_where_a_compiler_and_ninja_are():
    if not TOOLS:
        pytest.skip("no C++ compiler or no ninja on PATH: the Python kernels are used")
    state = native.status()
    assert state.in_use, state.reason
    assert all(hasattr(torch.ops.comera_native, name)
               for name in ("tt_forward", "tt_backward", "tt_left_forward", "tt_right_forward"))


def _layer(in_shape, out_shape, rank, bias=True, dtype=torch.float64):
    torch.manual_seed(0)
    layer = TTLinear(math.prod(in_shape), math.prod(out_shape), in_shape=in_shape, out_shape=out_shape,
                     rank=rank, bias=bias, dtype=dtype)
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.3, 1.7)
    return layer


def _fwd_bwd(layer, x, plan, need_dx=True):
    """Output and the gradients of (x,) bias, cores and gates for a fixed output gradient."""
    x = x.detach().clone().requires_grad_(need_dx)
    y = tt_linear(x, parameter_entries(layer.cores), parameter_entries(layer.gates), layer.bias, plan)
    grad = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1)).to(y.device)
    wrt = ([x] if need_dx else []) + list(layer.parameters())
    return [y, *torch.autograd.grad(y, wrt, grad)]


def _compare(layer, tokens, strategies=None, settings=PlanSettings(), need_dx=True, tol=1e-12):
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, layer.bias is not None,
                     strategies, settings)
    x = torch.randn(tokens, layer.in_features, dtype=layer.cores[0].dtype, device=layer.cores[0].device)
    got = _fwd_bwd(layer, x, plan, need_dx)
    with native.disabled():
        want = _fwd_bwd(layer, x, plan, need_dx)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == x.device
        torch.testing.assert_close(g, w, rtol=0, atol=tol)
    return plan


STRATEGIES = [("merge", "merge"), ("sequential", "sequential"), ((2, 1), (1, 2)), ((1, 2), "merge"),
              ("merge", (2, 1)), "dense"]


@needs_native
@pytest.mark.parametrize("strategies", STRATEGIES, ids=str)
@pytest.mark.parametrize("tokens", [1, 2, 9])
@pytest.mark.parametrize("bias", [True, False])
def test_native_equals_python(strategies, tokens, bias):
    _compare(_layer((4, 3, 5), (2, 6, 3), 3, bias), tokens, strategies)


@needs_native
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("strategies", [("merge", "merge"), ("sequential", "merge")], ids=str)
def test_native_folds_the_bias_like_python(tokens, strategies):
    plan = _compare(_layer((4, 3, 5), (2, 6, 3), 3), tokens, strategies, PlanSettings(fold_bias_min_tokens=0))
    assert plan.fold_bias


@needs_native
def test_native_folded_bias_at_many_tokens():
    layer = _layer((4, 4), (4, 8), 4)
    assert _compare(layer, 2048, ("merge", "merge")).fold_bias


@needs_native
@pytest.mark.parametrize("strategies", [("merge", "merge"), ("sequential", (1, 2)), "dense"], ids=str)
@pytest.mark.parametrize("tokens", [1, 6])
def test_native_without_input_gradient(strategies, tokens):
    _compare(_layer((4, 3, 5), (2, 6, 3), 3), tokens, strategies, need_dx=False)


@needs_native
@pytest.mark.parametrize("shapes", [((12, 8, 8), (8, 8, 12)), ((12, 8, 8), (12, 16, 16))], ids=str)
@pytest.mark.parametrize("tokens", [1, 128, 4096])
def test_native_float32_paper_shapes_match(shapes, tokens):
    """Default plans of the paper shapes in float32, through oneDNN where the Python path goes there."""
    layer = _layer(*shapes, 30, dtype=torch.float32)
    _compare(layer, tokens, tol=1e-5)


@needs_native
def test_two_dispatched_ops_per_forward_and_backward():
    layer = _layer((4, 3, 5), (2, 6, 3), 3)
    x = torch.randn(7, layer.in_features, dtype=torch.float64, requires_grad=True)
    with OpCounter() as seen:
        layer(x).sum().backward()
    native_ops = [n for n in seen.names if n.startswith("comera_native.")]
    assert native_ops == ["comera_native.tt_forward.default", "comera_native.tt_backward.default"]
    assert not any(n.startswith("aten.mm") for n in seen.names)


@needs_native
def test_rank_zero_and_double_backward_take_the_python_kernels():
    layer = _layer((4, 3), (2, 6), [1, 0, 2, 2, 1])
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()  # the zero plan: Python, no native op
    layer = _layer((4, 3), (2, 6), 2)
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    results = []
    for off in (False, True):
        with native.disabled() if off else torch.enable_grad():
            (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
            results.append(torch.autograd.grad(gx.pow(2).sum(), [x, *layer.parameters()]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@needs_native
@pytest.mark.parametrize("strategies", [None, ("sequential", (1, 2)), "dense"], ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 2048])
@pytest.mark.parametrize("need_dx", [True, False])
def test_flop_formulas_count_what_the_python_kernels_run(strategies, tokens, need_dx):
    layer = _layer((4, 4), (2, 4, 4), 4, dtype=torch.float32)
    plan = make_plan(layer.in_shape, layer.out_shape, tuple(layer.ranks), tokens, True, strategies)
    x = torch.randn(tokens, layer.in_features)
    natively, python = native_and_python_flops(lambda: _fwd_bwd(layer, x, plan, need_dx))
    assert natively == python > 0


@needs_native
def test_traffic_and_flop_counting_sees_the_python_kernels():
    """count_cost (FLOPs and traffic of pipeline cells and bench rows) gives the numbers of the Python
    path."""
    from harness.perf import microbench as mb

    layer = _layer((12, 8, 8), (8, 8, 12), 30, dtype=torch.float32)
    x = torch.randn(64, 768)
    run = mb.module_call(layer, x, "fwd_bwd", wrt_input=True)[0]
    native_cost = mb.count_cost(run)
    with native.disabled():
        python_cost = mb.count_cost(run)
    assert native_cost == python_cost and native_cost[0] > 0 and native_cost[1] > 0


@needs_native
def test_a_built_library_is_loaded_without_cpp_extension(tmp_path, monkeypatch):
    """A later process loads the default build folder's library directly (its .json names this source and
    torch): torch.utils.cpp_extension, with setuptools and ninja's checks, stays unimported."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "COMERA_NATIVE_BUILD_DIR"}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", env["TORCH_EXTENSIONS_DIR"])
    folder = native.build_folder()
    folder.mkdir(parents=True)
    built = Path(os.environ["COMERA_NATIVE_BUILD_DIR"])  # tests/conftest.py's, where this session built it
    for name in (f"{native.NAME}.so", f"{native.NAME}.json"):
        shutil.copy(built / name, folder / name)
    code = ("import sys, comera.native as n; s = n.status()\n"
            f"assert s.in_use and s.reason == 'built in {folder}', s\n"
            "assert 'torch.utils.cpp_extension' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env)


@needs_native
@pytest.mark.parametrize("damage", ["truncated", "not a library"])
def test_a_damaged_library_is_built_again_never_loaded(tmp_path, damage):
    """A build folder whose library was cut short (loading it would kill the process with SIGBUS) or
    overwritten, its .json intact: the library's size and SHA-256 are checked first, it is removed and
    built again (here a relink of the folder's object file), and the native ops are in use."""
    import json
    import os

    built, folder = Path(os.environ["COMERA_NATIVE_BUILD_DIR"]), tmp_path / "b"
    shutil.copytree(built, folder, ignore=shutil.ignore_patterns("lock", native.FAILED_MEMO))
    library = folder / f"{native.NAME}.so"
    whole = library.read_bytes()
    library.write_bytes(whole[:len(whole) // 2] if damage == "truncated" else b"not a library\n" * 100)
    code = "import comera.native as n; s = n.status(); print(s.in_use, s.reason)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "COMERA_NATIVE_BUILD_DIR": str(folder)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"True built in {folder}", out
    assert "(truncated, corrupt or replaced); building it again" in out.stderr
    assert json.loads(library.with_suffix(".json").read_text()) == {**native.library_metadata(),
                                                                    **native.file_record(library)}


def test_disabled_by_environment(tmp_path):
    code = ("import warnings; warnings.simplefilter('error'); import comera.native as n; s = n.status(); "
            "assert not s.in_use and 'COMERA_NATIVE=0' in s.reason, s")
    env = {**__import__("os").environ, "COMERA_NATIVE": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_a_failed_build_warns_once_and_uses_python(tmp_path):
    """No ninja on PATH: one warning naming the reason, status says why, layers still run."""
    code = ("import warnings, torch\n"
            "import comera.native as n\n"
            "from comera.tt import TTLinear\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    layer = TTLinear(16, 8, rank=2)\n"
            "    layer(torch.randn(3, 16)).sum().backward(); layer(torch.randn(3, 16))\n"
            "msgs = [str(w.message) for w in caught if 'comera.native' in str(w.message)]\n"
            "assert len(msgs) == 1 and 'ninja' in msgs[0].lower(), msgs\n"
            "assert not n.status().in_use and 'not built' in n.status().reason\n")
    env = {**__import__("os").environ, "PATH": str(tmp_path), "COMERA_NATIVE_BUILD_DIR": str(tmp_path / "b")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not TOOLS, reason="no C++ compiler or no ninja on PATH")
def test_a_compile_error_is_named_in_the_warning(tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++;\n")
    code = ("import warnings, pathlib\n"
            "import comera.native as n\n"
            f"n.SOURCE = pathlib.Path({str(broken)!r})\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    n.status(); n.status()\n"
            "msgs = [str(w.message) for w in caught if 'comera.native' in str(w.message)]\n"
            "assert len(msgs) == 1 and 'error:' in msgs[0], msgs\n"
            "assert not n.status().in_use and 'error:' in n.status().reason\n"
            "print(n.status().reason)\n")
    env = {**__import__("os").environ, "COMERA_NATIVE_BUILD_DIR": str(tmp_path / "b")}
    first, again = (subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path,
                                   capture_output=True, text=True).stdout for _ in range(2))
    # The second process is told of the first one's failure instead of compiling again.
    assert ("an earlier build" not in first
            and f"an earlier build; delete {tmp_path / 'b' / native.FAILED_MEMO}" in again)
    assert first.strip() in again


def test_the_cpp_inner_product_thresholds_are_the_kernels():
    """csrc/tt_linear.cpp sends the same float32 CPU products to oneDNN as comera.kernels."""
    import re

    from comera import kernels

    text = native.SOURCE.read_text()
    found = [int(re.search(rf"{name} = int64_t\(1\) << (\d+);", text).group(1))
             for name in ("kNarrowMinMacs", "kWideMinMacs")]
    assert tuple(1 << n for n in found) == kernels.INNER_PRODUCT_MIN_MACS
    assert "cols > 64" in text


@needs_native
def test_native_ops_run_on_the_meta_device():
    """The ops create every tensor on their inputs' device (what running on CUDA needs): on meta tensors
    they run, dispatched as the two native ops, and return meta tensors of the CPU run's shapes."""
    shapes = {}
    for device in ("cpu", "meta"):
        torch.manual_seed(0)
        layer = TTLinear(768, 3072, in_shape=(12, 8, 8), out_shape=(12, 16, 16), rank=30, device=device)
        x = torch.randn(64, 768, device=device, requires_grad=True)
        with OpCounter() as seen:
            layer(x).sum().backward()
        grads = [x.grad, *(p.grad for p in layer.parameters())]
        assert all(g.device.type == device for g in grads)
        assert [n for n in seen.names if n.startswith("comera_native.")] == [
            "comera_native.tt_forward.default", "comera_native.tt_backward.default"]
        shapes[device] = [g.shape for g in grads]
    assert shapes["meta"] == shapes["cpu"]


@needs_native
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tokens", [1, 200])
def test_native_equals_python_on_the_device(device, dtype, tokens):
    """On each device (the CUDA case runs in scripts/gpu_check.sh's test phase), every plan kind of a
    paper-shape layer: native vs Python kernels (float64: 1e-12; float32: 1e-5, the same ATen calls)."""
    layer = _layer((12, 8, 8), (12, 16, 16), 8, dtype=dtype).to(device)
    for strategies in STRATEGIES:
        _compare(layer, tokens, strategies, tol=1e-12 if dtype == torch.float64 else 1e-5)


@needs_native
@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 200])
def test_native_ops_replay_in_a_cuda_graph(tokens):
    """Forward and backward of the paper-shape layer captured in one CUDA graph (as the pipeline's
    CUDA-graph cells capture a step): a replay on new input gives eager's output and gradients."""
    device = torch.device("cuda")
    layer = _layer((12, 8, 8), (12, 16, 16), 8, dtype=torch.float32).to(device)
    params = list(layer.parameters())
    x = torch.randn(tokens, layer.in_features, device=device)
    dy = torch.randn(tokens, layer.out_features, device=device)

    def step():
        for p in params:
            p.grad = None
        y = layer(x)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for p in params:
        p.grad = None
    with torch.cuda.graph(graph):
        static_y = layer(x)
        static_y.backward(dy)
    fresh = torch.randn_like(x)
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    got = [static_y.clone(), *(p.grad.clone() for p in params)]
    for p in params:
        p.grad = None
    want_y = layer(fresh)
    want_y.backward(dy)
    for g, w in zip(got, [want_y, *(p.grad for p in params)]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
