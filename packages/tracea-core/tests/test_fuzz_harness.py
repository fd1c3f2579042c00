"""The ops fuzzer's own machinery: replayable generation, exact memory geometry, the oracle, and the
runner's handling of wrong results, crashes, hangs, foreign exceptions and sanitizer replays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracea.fuzzing import arrays, cases, oracle, runner, sanitize
from tracea.fuzzing.arrays import ArraySpec

ROOT = Path(__file__).resolve().parents[3]

# Workers without the compiled CPU backend: the reference backend and the torch fallback serve every
# case, so nothing compiles and a short per-case timeout is safe.
NO_COMPILE = {"TRACEA_PLUGINS": "torch=tracea_torch.plugin", "TRACEA_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}


def test_generation_is_a_pure_function_of_seed_and_index():
    a = [cases.generate(5, i).to_dict() for i in range(200)]
    b = [cases.generate(5, i).to_dict() for i in range(200)]
    assert a == b
    assert cases.generate(6, 3).to_dict() != cases.generate(5, 3).to_dict()
    ops = {c["op"] for c in a}
    assert ops == set(cases.OPS)
    expects = {c["expect"] for c in a}
    assert expects == {"valid", "either", "invalid"}
    json.dumps(a)  # reports hold cases as JSON


def test_built_arrays_replay_bit_identically():
    c = cases.generate(9, 17)
    b1, _ = arrays.build_arrays(c.arrays, np.random.default_rng([9, 17]), "cpu")
    b2, _ = arrays.build_arrays(c.arrays, np.random.default_rng([9, 17]), "cpu")
    for name in b1:
        np.testing.assert_array_equal(b1[name].values, b2[name].values)


@pytest.mark.parametrize("view,param", [
    ("contig", {}), ("transposed", {}), ("fortran", {}), ("sliced", {"steps": [2, 3], "offset": 1}),
    ("reversed", {"axis": 1}), ("overlap", {"axis": 0, "stride": 2}), ("expanded", {"axis": 0}),
    ("unaligned", {"byte_shift": 1}), ("record", {}),
])
def test_geometry_describes_the_numpy_view_exactly(view, param):
    spec = ArraySpec((4, 5), "float32", "numpy", view, param)
    built, bufs = arrays.build_arrays({"a": spec}, np.random.default_rng(0), "cpu")
    a = built["a"]
    assert a.obj.shape == (4, 5)
    np.testing.assert_array_equal(np.asarray(a.obj, dtype=np.float64), a.values)
    mask = arrays.covered_bytes(a.geo, (4, 5), 4, bufs.host["a"].size)
    assert (bufs.host["a"][~mask] == arrays.FILL).all()  # bytes outside the view keep the fill pattern
    if view == "unaligned":
        assert not a.obj.flags.aligned
    if view == "record":
        assert a.obj.strides[1] == 5


def test_torch_views_share_the_buffer_model():
    torch = pytest.importorskip("torch")
    spec = ArraySpec((2, 3, 4, 5), "bfloat16", "torch", "channels_last")
    built, _ = arrays.build_arrays({"x": spec}, np.random.default_rng(1), "cpu")
    x = built["x"].obj
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(x.to(torch.float64).numpy(), built["x"].values)


def test_bound_grows_with_k_and_dtype():
    mag = np.ones(3)
    f32 = oracle.bound("matmul", {"k": 100, "steps": []}, "float32", "float32", mag)
    f32_big = oracle.bound("matmul", {"k": 10000, "steps": []}, "float32", "float32", mag)
    bf16 = oracle.bound("matmul", {"k": 100, "steps": []}, "bfloat16", "bfloat16", mag)
    tf32 = oracle.bound("matmul", {"k": 100, "steps": [], "precision": "high"}, "float32", "float32", mag)
    assert (f32 < f32_big).all() and (f32 < tf32).all() and (tf32 < bf16).all()
    assert f32[0] < 1e-4 and bf16[0] > 1e-2


def test_matches_requires_the_same_nan_and_inf_pattern():
    want = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    tol = np.full(5, 1e-6)
    got = np.array([1.0, np.nan, np.inf, np.inf, 2.1])
    assert oracle.matches(got, want, tol, "float32").tolist() == [True, True, True, False, False]
    # a finite reference beyond the dtype's range rounds to Inf
    assert oracle.matches(np.array([np.inf]), np.array([1e6]), np.array([1.0]), "float16").all()


def test_case_reproducer_prints_the_call():
    proc = subprocess.run([sys.executable, "-m", "tracea.fuzzing", "--show", "3:14"], capture_output=True,
                          text=True, env={**os.environ, **_env()}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tracea.ops.") and "# expect:" in proc.stdout


def _run(tmp_path: Path, cases_: int, start: int = 0, **kw) -> dict:
    env = _env(**kw.pop("env", {}))
    cfg = runner.RunConfig(seed=kw.pop("seed", 11), cases=cases_, start=start, env=env, quiet=True,
                           report=str(tmp_path / "report.json"), **kw)
    report = runner.run(cfg)
    assert json.loads((tmp_path / "report.json").read_text())["cases"] == report["cases"]
    return report


FAKE_PLUGIN = textwrap.dedent('''
    """A deliberately wrong float32 GEMM that outranks every real one."""
    from tracea.doctor.variant import KernelVariant, Requirements
    from tracea.dtypes import DType
    from tracea.ir.ops import LayerType
    from tracea.plugins.manager import hookimpl
    from tracea.semantic.config import PipelineConfig


    class WrongGemm(KernelVariant):
        name = "fake.gemm.wrong"
        backend = "fake"
        priority = 10_000
        requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}))

        def hero_configs(self, op, profile):
            return [PipelineConfig(tile_m=1, tile_n=1, tile_k=1, stages=1, warps=1)]

        def estimate_seconds(self, op, profile, config=None):
            return 1e-12

        def run(self, op, config, args, profile):
            args.host("out")[...] = 1.0  # not the product


    @hookimpl
    def tracea_register_variants():
        return [WrongGemm()]
''')


def test_a_wrong_kernel_is_caught(tmp_path):
    (tmp_path / "fake_wrong_plugin.py").write_text(FAKE_PLUGIN)
    env = {**NO_COMPILE, "TRACEA_PLUGINS": NO_COMPILE["TRACEA_PLUGINS"] + ",fake=fake_wrong_plugin",
           "PYTHONPATH": str(tmp_path) + os.pathsep + os.pathsep.join(p for p in sys.path if p)}
    report = _run(tmp_path, 40, env=env, jobs=2)
    fake = report["summary"].get("fake")
    assert fake and fake["wrong"] >= 1, report["summary"]
    f = next(f for f in report["findings"] if f["backend"] == "fake")
    assert f["category"] == "wrong" and "float64 reference" in f["message"]
    assert f["reproducer"] == f"python -m tracea.fuzzing --replay {f['seed']}:{f['index']}"
    assert "tracea.ops." in f["call"]


def test_crash_hang_and_foreign_exception_are_findings(tmp_path):
    env = {**NO_COMPILE, "TRACEA_FUZZ_INJECT": "crash@1,hang@3,raise@4"}
    report = _run(tmp_path, 6, env=env, timeout=6.0)
    by_index = {f["index"]: f for f in report["findings"]}
    assert by_index[1]["category"] == "crash" and "reproduced alone" in by_index[1]["message"]
    assert by_index[3]["category"] == "hang" and "reproduced alone" in by_index[3]["message"]
    assert by_index[4]["category"] == "nontracea" and "injected" in by_index[4]["message"]
    total = runner.summary_table(report).splitlines()[-1].split()
    assert total[:4] == ["total", "6", "1", "1"]  # every case counted, the run went on after each


def test_sanitizer_replays_count_errors(tmp_path):
    # A fake sanitizer that reports an error for every replay: exit status 99.
    out = sanitize.run(11, [0, 1], "cpu", "sh -c 'exit 99' sanitizer")
    assert out["cases"] == 2 and out["sanitizer_errors"] == 2 and out["failures"][0]["kind"] == "sanitizer"
    # A no-op wrapper runs the real replay command line.
    log = tmp_path / "argv.txt"
    out = sanitize.run(11, [5], "cpu", f"sh -c 'echo \"$@\" > {log}' sanitizer")
    assert out["sanitizer_errors"] == 0
    assert log.read_text().split()[1:] == ["-m", "tracea.fuzzing", "--replay", "11:5", "--device", "cpu"]
    invalid = next(i for i in range(100) if cases.generate(11, i).expect == "invalid")
    out = sanitize.run(11, [invalid], "cpu", "env", env={**os.environ, **_env(**NO_COMPILE)})
    assert out == {**out, "cases": 1, "sanitizer_errors": 0, "other_failures": 0}, out
    assert sanitize.sample(1, [(i, "cpu" if i % 2 else "none") for i in range(20)], 5, "cpu") == \
        sorted(sanitize.sample(1, [(i, "cpu" if i % 2 else "none") for i in range(20)], 5, "cpu"))
    assert all(i % 2 for i in sanitize.sample(1, [(i, "cpu" if i % 2 else "none") for i in range(20)], 5, "cpu"))


def test_sanitizer_replays_in_parallel_keep_index_order():
    # Odd cases "fail" the fake sanitizer; with 3 replays at once the failures still come in index order.
    out = sanitize.run(11, list(range(7)), "cpu", "sh -c 'case \"$5\" in *[13579]) exit 99;; esac' sanitizer",
                       jobs=3, quiet=True)
    assert out["cases"] == 7 and out["sanitizer_errors"] == 3
    assert [f["index"] for f in out["failures"]] == [1, 3, 5]


def test_cli_sanitize_option_uses_the_override(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tracea.fuzzing", "--cases", "3", "--seed", "2", "--quiet",
                           "--report", str(tmp_path / "r.json"), "--sanitize", "2",
                           "--sanitizer-cmd", "sh -c 'exit 99' s"], capture_output=True, text=True,
                          env={**os.environ, **_env(**NO_COMPILE)}, timeout=300)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sanitizer"]["sanitizer_errors"] == 2
    assert proc.returncode == 1
    assert "sanitizer errors" in proc.stderr and "refused-valid" in proc.stdout


def test_dev_py_has_a_fuzz_command():
    text = (ROOT / "dev.py").read_text()
    assert '"fuzz"' in text and "tracea.fuzzing" in text


def test_importing_the_fuzzer_imports_no_framework():
    code = "import sys, tracea.fuzzing, tracea.fuzzing.runner, tracea.fuzzing.worker; " \
           "print([m for m in ('torch', 'cupy') if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **_env(TRACEA_PLUGINS="", TRACEA_DISABLE_PLUGIN_AUTOLOAD="1")},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_known_issues_are_tolerated_only_when_switched_on(monkeypatch):
    from tracea.fuzzing import known_issues
    from tracea.fuzzing.oracle import Verdict, compare
    from tracea.fuzzing.reference import Reference

    monkeypatch.delenv(known_issues.ENV, raising=False)
    assert not known_issues.enabled()
    ref = Reference(np.array([np.nan, 2.0]), [], np.array([np.nan, 2.0]))
    got = np.array([0.0, 2.0])  # ReLU swallowed the NaN
    ctx = {"op": "matmul", "model": {"k": 4, "steps": ["relu"]}, "out_dtype": "float32", "in_dtype": "float32",
           "backend": "cpu", "variants": ["cpu.gemm.avx512"], "steps": ["relu"], "nonfinite_inputs": True}
    off, on = Verdict(), Verdict()
    compare(ctx, got, ref, off, tolerate=False)
    compare(ctx, got, ref, on, tolerate=True)
    assert [f.category for f in off.findings] == ["wrong"] and not off.known
    assert not on.findings and on.known == ["relu-nonfinite-cpu"]
    # the same mismatch on another backend is not explained
    other = Verdict()
    compare({**ctx, "backend": "reference"}, got, ref, other, tolerate=True)
    assert [f.category for f in other.findings] == ["wrong"]
    monkeypatch.setenv(known_issues.ENV, "1")
    assert known_issues.enabled()


def test_cuda_cases_materialise_as_device_kinds(monkeypatch):
    """``--device cuda`` cannot run here; check what it would build: NumPy-kind arrays become CuPy arrays
    (or CUDA tensors without CuPy), layouts only NumPy has become contiguous, torch views stay."""
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "cupy", None)  # no CuPy: NumPy-kind arrays become CUDA tensors
    assert arrays.resolve_kind("numpy", "cuda") == "torch"
    assert arrays.resolve_kind("list", "cuda") == "list" and arrays.resolve_kind("numpy", "cpu") == "numpy"
    assert arrays.effective_view(ArraySpec((3, 4), view="reversed"), "cupy") == "reversed"
    assert arrays.effective_view(ArraySpec((3, 4), view="unaligned"), "torch") == "contig"
    seen = []
    real = arrays._device_buffer

    def on_host(data, kind, device):  # stand-in for the copy to the GPU
        seen.append((kind, device))
        return real(data, kind, "cpu")

    monkeypatch.setattr(arrays, "_device_buffer", on_host)
    for i in range(60):
        c = cases.generate(21, i)
        built, bufs = arrays.build_arrays(c.arrays, np.random.default_rng([21, i]), "cuda")
        for name, b in built.items():
            if b.kind in ("list", "scalar"):
                continue
            assert b.kind == "torch" and tuple(b.obj.shape) == tuple(c.arrays[name].shape)
            if b.obj.is_floating_point():
                np.testing.assert_array_equal(b.obj.detach().double().numpy(), b.values)
        bufs.snapshot()
    assert seen and all(k == "torch" and d == "cuda" for k, d in seen)


def test_conv_reference_accepts_both_readings_of_zero_padding():
    pytest.importorskip("torch")
    from tracea.fuzzing.reference import compute

    x = np.ones((1, 1, 3, 3))
    w = np.ones((1, 1, 3, 3))
    w[0, 0, 0, 0] = np.inf  # the top-left tap: in the padding for the first output row and column
    model = {"steps": [], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "layout": "NCHW"}
    ref = compute("conv2d", {"x": x, "w": w}, model)
    assert np.isnan(ref.ref[0, 0, 0, 0])  # 0 * inf: PyTorch's float64 conv multiplies the padding
    skipped = ref.alts[-2]
    assert skipped[0, 0, 0, 0] == 4.0 and np.isinf(skipped[0, 0, 1, 1])  # taps in the padding skipped


def test_attention_reference_accepts_float32_weight_underflow():
    """Fuzz case 5151:1018: a key whose softmax weight is tiny in float64 but 0 in float32 (kernels flush
    below the normal range) times an Inf in v: float64 gives Inf, a float32 kernel NaN (0 * Inf)."""
    pytest.importorskip("torch")
    from tracea.fuzzing.reference import compute

    q = np.zeros((1, 1, 1, 2))
    q[..., 0] = 200.0
    k = np.array([[[[1.0, 0.0], [0.0, 0.0]]]])  # logits 200*scale and 0: weight of key 1 ~ e^-141
    v = np.array([[[[1.0], [np.inf]]]])
    ref = compute("attention", {"q": q, "k": k, "v": v}, {"scale": 1.0 / np.sqrt(2), "causal": False})
    assert np.isinf(ref.ref[0, 0, 0, 0])
    assert any(np.isnan(alt[0, 0, 0, 0]) for alt in ref.alts)


def test_attention_reference_accepts_masked_keys_skipped():
    """Fuzz case 4343:2410: a NaN value at a key the causal mask hides from some queries: the float64
    reference gives those queries NaN (0 * NaN), kernels that skip masked keys a finite result; both are
    accepted. Queries that see the key get NaN in every reading."""
    pytest.importorskip("torch")
    from tracea.fuzzing.reference import compute

    rng = np.random.default_rng(2410)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    v[1, 2, 2, 3] = np.nan  # key 2: queries 0 and 1 do not see it
    ref = compute("attention", {"q": q, "k": k, "v": v}, {"scale": None, "causal": True})
    assert np.isnan(ref.ref[1, 2, 0, 3]) and np.isnan(ref.ref[1, 2, 1, 3])
    skipped = ref.alts[-1]
    masked = v.copy()
    masked[1, 2, 2, 3] = 0.0
    for i in (0, 1):  # the key is hidden from these queries: its value does not matter
        want = compute("attention", {"q": q, "k": k, "v": masked}, {"scale": None, "causal": True}).ref[1, 2, i]
        np.testing.assert_allclose(skipped[1, 2, i], want, rtol=1e-12)
    assert np.isnan(skipped[1, 2, 2:, 3]).all() and np.isfinite(np.delete(skipped[1, 2, 2:], 3, axis=-1)).all()
    assert np.isfinite(np.delete(skipped, 1, axis=0)).all()


def test_torch_cuda_conv_is_judged_at_cudnn_tf32_precision():
    """torch float32 convs follow ``torch.backends.cudnn.allow_tf32`` on CUDA (TF32 by default), as ``F.conv2d``
    does: the oracle judges them at that precision unless the call names ``fp32_precision``; other torch calls
    at ``torch.get_float32_matmul_precision()``, NumPy fp32-accurate (the GPU fuzz run of seed 4343 flagged 245
    TF32-level conv results against an fp32 bound)."""
    torch = pytest.importorskip("torch")
    from tracea.fuzzing import worker

    class _CudaLooking(torch.Tensor):  # a torch tensor the adapter takes for a CUDA one (no GPU needed)
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    def built(kind: str) -> arrays.Built:
        b = arrays.Built.__new__(arrays.Built)
        b.kind = kind
        b.obj = torch.zeros(1).as_subclass(_CudaLooking) if kind == "torch" else np.zeros(1, np.float32)
        return b

    conv = cases.Case.__new__(cases.Case)
    conv.op, conv.kwargs, conv.model = "conv2d", {}, {"precision": "highest"}
    named = cases.Case.__new__(cases.Case)
    named.op, named.kwargs, named.model = "conv2d", {"fp32_precision": "highest"}, {"precision": "highest"}
    cudnn = torch.backends.cudnn  # (set through flags(): other tests may have frozen the global setters)
    with cudnn.flags(enabled=cudnn.enabled, allow_tf32=True):
        assert worker._framework_precision(conv, [built("torch")]) == "high"
        assert worker._framework_precision(conv, [built("numpy")]) == "highest"
        assert worker._framework_precision(named, [built("torch")]) == "highest"
    with cudnn.flags(enabled=cudnn.enabled, allow_tf32=False):
        assert worker._framework_precision(conv, [built("torch")]) == "highest"
    mm = cases.Case.__new__(cases.Case)
    mm.op, mm.kwargs, mm.model = "matmul", {}, {"precision": "highest"}
    assert worker._framework_precision(mm, [built("torch")]) == torch.get_float32_matmul_precision()
