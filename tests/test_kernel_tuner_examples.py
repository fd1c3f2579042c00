"""The Kernel Tuner-style example scripts (examples/kernel_tuner/) run through tracea.tune_kernel: the same
scripts run with Kernel Tuner by swapping the module. C here and in CI; CUDA where a GPU and CuPy are."""

from __future__ import annotations

import importlib
import itertools
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tracea
from tracea.tuning.cache import TuningCache, set_cache

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "kernel_tuner"
sys.path.insert(0, str(EXAMPLES))

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler")


def _gpu() -> str | None:
    try:
        from tracea_cuda import toolkit
    except ImportError:
        return "tracea-cuda is not installed"
    ok, why = toolkit.status()
    return None if ok else why


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    set_cache(TuningCache(tmp_path / "cache.json"))
    monkeypatch.chdir(tmp_path)
    yield
    set_cache(None)


def expected_space(mod, max_threads=None):
    """The valid configs, computed independently: the product of the lists, minus the restrictions."""
    tune_params, restrictions = mod.space()
    names = list(tune_params)
    out = set()
    for combo in itertools.product(*tune_params.values()):
        p = dict(zip(names, combo))
        if all(eval(r, {}, dict(p)) for r in restrictions):
            if max_threads is None or p.get("block_size_x", 256) * p.get("block_size_y", 1) <= max_threads:
                out.add(combo)
    return names, out


@needs_cxx
def test_vector_add_c_example_brute_force():
    mod = importlib.import_module("vector_add_c")
    results, env = mod.tune(tracea, size=1 << 14, strategy="brute_force", iterations=2, quiet=True)
    names, space = expected_space(mod)
    assert {tuple(r[n] for n in names) for r in results} == space and len(results) == len(space)
    assert all(isinstance(r["time"], float) for r in results)  # every config verified against a + b


@needs_cxx
def test_matmul_c_example_default_strategy():
    mod = importlib.import_module("matmul_c")
    results, env = mod.tune(tracea, n=48, strategy_options={"max_fevals": 6}, iterations=2, quiet=True)
    names, space = expected_space(mod)
    assert len(results) == 6 and all(tuple(r[n] for n in names) in space for r in results)
    assert all(isinstance(r["time"], float) for r in results) and env["strategy"] == "tracea"


@needs_cxx
def test_decorator_on_a_c_kernel(rng):
    mod = importlib.import_module("matmul_c")

    @tracea.kernel(target="c", autotune=True, tune_params=mod.space()[0], restrictions=mod.space()[1],
                   heroes=[{"block_i": 16, "block_j": 64, "block_k": 64, "unroll": 8}],
                   reference=lambda c, a, b, n: [a.astype(np.float64) @ b.astype(np.float64), None, None, None],
                   atol=1e-3, strategy_options={"max_fevals": 4}, iterations=2, compiler_options=["-O2"])
    def matmul(c, a, b, n):
        return tracea.KernelLaunch(mod.KERNEL, problem_size=(int(n), int(n)))

    for n in (33, 64):
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        c = np.full((n, n), np.nan, np.float32)
        matmul(c, a, b, np.int32(n))  # tunes on first use, then runs the best config on c
        np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)
    assert len(matmul.best) == 2
    # a fresh decorator (another process, say) finds the tuned config in Tracea's cache without tuning
    again = tracea.kernel(target="c", tune_params=mod.space()[0], restrictions=mod.space()[1],
                          compiler_options=["-O2"], iterations=2)(matmul.describe)
    assert again.config_for(c, a, b, np.int32(64)) == list(matmul.best.values())[-1]
    c2 = np.zeros_like(c)
    again.run(c2, a, b, np.int32(64))
    np.testing.assert_allclose(c2, c, rtol=1e-6)


@needs_cxx
def test_decorator_fixed_and_autotune_configs(rng):
    src = r"""
    extern "C" float fill(float *out, int n) {
        for (int i = 0; i < n; i++) out[i] = tile_size_x * 10 + tile_size_y + (float)(i % k);
        return 0.0f;
    }
    """
    @tracea.kernel(target="c", tile_shape=(3, 4), autotune_configs=[{"k": 2}, {"k": 5}], autotune=False)
    def fill(out, n):
        return tracea.KernelLaunch(src, problem_size=int(n))

    out = np.zeros(10, np.float32)
    fill(out, np.int32(10))  # no autotune, nothing cached: the first of autotune_configs, tile from tile_shape
    np.testing.assert_array_equal(out, 34 + (np.arange(10) % 2))
    assert fill.tune_params == {"k": (2, 5), "tile_size_x": (3,), "tile_size_y": (4,)}


@pytest.mark.cuda
@pytest.mark.parametrize("name,kwargs,budget", [("matmul_cuda", {"n": 512}, 12), ("convolution_cuda", {"h": 300, "w": 520}, 10),
                                                ("stencil_cuda", {"width": 1000, "height": 300}, 8)])
def test_cuda_examples(name, kwargs, budget):
    why = _gpu()
    if why:
        pytest.skip(why)
    mod = importlib.import_module(name)
    opts = {"strategy_options": {"max_fevals": budget}} if budget else {"strategy": "brute_force"}
    results, env = mod.tune(tracea, **kwargs, iterations=3, quiet=True, **opts)
    names, space = expected_space(mod, max_threads=1024)
    seen = {tuple(r[n] for n in names) for r in results}
    assert seen <= space and (budget is not None or seen == space)
    ok = [r for r in results if isinstance(r["time"], float)]
    assert ok, results[:3]  # every config that ran was verified against the NumPy reference
    assert env["best_config"]["time"] == min(r["time"] for r in ok)


@pytest.mark.cuda
def test_cuda_decorator_on_cupy_and_torch_arrays(rng):
    why = _gpu()
    if why:
        pytest.skip(why)
    import cupy as cp

    mod = importlib.import_module("stencil_cuda")

    @tracea.kernel(target="cuda", autotune=True, tune_params=mod.space()[0], strategy_options={"max_fevals": 5},
                   iterations=2)
    def stencil(new, old, width, height):
        src = mod.KERNEL.replace("#define WIDTH 4096\n#define HEIGHT 2048", f"#define WIDTH {width}\n#define HEIGHT {height}")
        return tracea.KernelLaunch(src, problem_size=(width, height), grid_div_x=["block_size_x"],
                                   grid_div_y=["block_size_y"], arguments=[new, old], name="stencil_kernel")

    w, h = 333, 129
    old = rng.standard_normal(w * h).astype(np.float32)
    g = old.reshape(h, w).astype(np.float64)
    want = g.copy()
    want[1:-1, 1:-1] = (g[1:-1, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1]) * 0.2
    for kind in ("numpy", "cupy", "torch"):
        if kind == "numpy":
            new, o = old.copy(), old
        elif kind == "cupy":
            new, o = cp.asarray(old), cp.asarray(old)
        else:
            torch = pytest.importorskip("torch")
            new, o = torch.as_tensor(old, device="cuda"), torch.as_tensor(old, device="cuda")
        stencil(new, o, w, h)
        got = new if kind == "numpy" else (cp.asnumpy(new) if kind == "cupy" else new.cpu().numpy())
        np.testing.assert_allclose(got.reshape(h, w), want, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_triton_kernel_tuned_by_tracea(rng):
    why = _gpu()
    if why:
        pytest.skip(why)
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.zeros(n, device="cuda")
    tp = {"BLOCK": [256, 1024], "num_warps": [2, 4]}
    results, env = tracea.tune_kernel("add_kernel", add_kernel, n, [x, y, out, n], tp, grid_div_x="BLOCK",
                                      answer=[None, None, (x + y).cpu().numpy(), None], atol=1e-6,
                                      strategy="brute_force", iterations=3, quiet=True)
    assert len(results) == 4 and all(isinstance(r["time"], float) for r in results)
    assert env["lang"] == "TRITON" and not out.any()

    @tracea.kernel(target="triton", autotune=True, tune_params=tp, strategy_options={"max_fevals": 2}, iterations=2)
    def add(x, y, out):
        return tracea.KernelLaunch(add_kernel, problem_size=x.numel(), grid_div_x="BLOCK",
                                   arguments=[x, y, out, x.numel()])

    add(x, y, out)
    torch.testing.assert_close(out, x + y)


# -- Kernel Tuner's own scripts, import changed (examples/kernel_tuner/run_kt_script.py) ------------------

def test_kt_script_rewrite_touches_only_the_import_lines():
    import run_kt_script

    text = "import numpy\nimport kernel_tuner\nfrom kernel_tuner import tune_kernel, run_kernel\n" \
           "def tune():\n    import kernel_tuner\n    x = 'kernel_tuner'\n"
    new, diff = run_kt_script.rewrite(text)
    assert new == ("import numpy\nimport tracea as kernel_tuner\nfrom tracea import tune_kernel, run_kernel\n"
                   "def tune():\n    import tracea as kernel_tuner\n    x = 'kernel_tuner'\n")
    assert sum(1 for d in diff if d.startswith("-") and not d.startswith("---")) == 3
    with pytest.raises(SystemExit, match="file_utils"):
        run_kt_script.rewrite("from kernel_tuner import tune_kernel\nfrom kernel_tuner.file_utils import store_output_file\n")
    with pytest.raises(SystemExit, match="does not import"):
        run_kt_script.rewrite("import numpy\n")


# A script written the way Kernel Tuner's examples are (our own kernel and script: Kernel Tuner's code is not
# copied here; the real scripts run with run_kt_script.py from a Kernel Tuner checkout, see docs/kernel_tuner.md).
KT_STYLE_SCRIPT = '''
import numpy
from kernel_tuner import tune_kernel

kernel_string = """
extern "C" float scale_add(float *y, float *x, int n) {
    for (int i = 0; i < n; i += step) {
        #pragma GCC unroll 8
        for (int j = i; j < i + step && j < n; j++) y[j] = 2.0f * x[j] + y[j];
    }
    return 0.5f + (float)step;
}
"""
size = 1000
x = numpy.random.randn(size).astype(numpy.float32)
y = numpy.random.randn(size).astype(numpy.float32)
tune_params = {"step": [1, 3, 8, 64], "pad": [0, 1]}
answer = [2 * x + y, None, None]
results, env = tune_kernel("scale_add", kernel_string, size, [y, x, numpy.int32(size)], tune_params,
                           restrictions=["pad == 0 or step > 1"], answer=answer, atol=1e-5, compiler_options=["-O2"])
'''


@needs_cxx
def test_kt_style_script_runs_through_tracea_with_only_the_import_changed(tmp_path, monkeypatch):
    import json

    import run_kt_script

    script = tmp_path / "scale_add.py"
    script.write_text(KT_STYLE_SCRIPT)
    out = tmp_path / "summary.json"
    monkeypatch.setattr(sys, "argv", ["run_kt_script.py", str(script), "--json", str(out)])
    assert run_kt_script.main() == 0
    summary = json.loads(out.read_text())
    (call,) = summary["calls"]
    assert call["space"] == 7 and call["evaluated"] == 7 and call["ran"] == 7  # 4 x 2 minus (pad=1, step=1)
    assert call["space_matches"] and call["verified_against_answer"] and call["best"]["step"] == 1
    assert not (tmp_path / ".tracea_scale_add.py").exists()


@needs_cxx
@pytest.mark.skipif(not os.environ.get("KT_EXAMPLES"), reason="set KT_EXAMPLES to Kernel Tuner's examples/ folder")
def test_kernel_tuners_own_c_example(tmp_path, monkeypatch):
    """Kernel Tuner's examples/c/vector_add.py, verbatim but for the import (72M floats: minutes, ~3 GB)."""
    import json

    import run_kt_script

    out = tmp_path / "summary.json"
    monkeypatch.setattr(sys, "argv", ["run_kt_script.py", os.path.join(os.environ["KT_EXAMPLES"], "c", "vector_add.py"),
                                      "--json", str(out)])
    assert run_kt_script.main() == 0
    (call,) = json.loads(out.read_text())["calls"]
    assert call["space"] == call["evaluated"] == call["ran"] == 45 and call["verified_against_answer"]


@needs_cxx
@pytest.mark.parametrize("name,size", [("conv2d_c", (37, 21)), ("stencil_c", (67, 45)), ("stencil_c", (130, 3))])
def test_held_out_c_examples_verify_against_their_references(name, size):
    """The two C kernels recorded as held-out tables for the sample-efficiency benchmark: a sample of configs
    (odd sizes, so every remainder loop runs) is checked against the float64 reference by tune_kernel."""
    mod = importlib.import_module(name)
    results, env = mod.tune(tracea, *size, strategy="random_sample", strategy_options={"max_fevals": 6, "seed": 1},
                            iterations=1, quiet=True, tracea_cache=False)
    names, space = expected_space(mod)
    assert len(results) == 6 and all(tuple(r[n] for n in names) in space for r in results)
    assert all(isinstance(r["time"], float) for r in results), [r.get("__error__") for r in results]
