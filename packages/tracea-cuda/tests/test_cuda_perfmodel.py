"""The performance model on a fake Hopper (sm_90) profile, on the CPU: the shipped sm_90 data is read,
rankings follow it, explanations name it, and the fp32 Hopper rule holds on big shapes (TF32 allowed
picks wgmma_tf32; fp32-exact picks wgmma_3xtf32)."""

from __future__ import annotations

import json

import pytest

from tracea.ir.ops import Conv2dOp, GemmOp

from tracea_cuda import testing as T

H100, A100 = T.fake_profile("H100"), T.fake_profile("A100")


@pytest.mark.parametrize("size", [4096, 8192])
def test_hopper_fp32_rule_on_big_shapes(monkeypatch, size):
    doc = T.doctor_on(monkeypatch, H100)
    for trans_b in (False, True):
        tf32 = doc.decide(GemmOp(size, size, size, trans_b=trans_b, fp32_precision="high"), "cuda:0", use_cache=False)
        exact = doc.decide(GemmOp(size, size, size, trans_b=trans_b, fp32_precision="highest"), "cuda:0",
                           use_cache=False)
        assert tf32.variant.name == "cuda.gemm.wgmma_tf32", tf32.explain()
        assert exact.variant.name == "cuda.gemm.wgmma_3xtf32", exact.explain()
        assert tf32.chosen.estimate is not None and tf32.chosen.estimate.method == "knn"


def test_hopper_fp32_rule_holds_without_the_model(monkeypatch):
    doc = T.doctor_on(monkeypatch, H100)
    monkeypatch.setenv("TRACEA_PERF_MODEL", "0")
    op = GemmOp(8192, 8192, 8192, fp32_precision="high")
    d = doc.decide(op, "cuda:0", use_cache=False)
    assert d.variant.name == "cuda.gemm.wgmma_tf32"
    assert d.chosen.estimate is None and "TRACEA_PERF_MODEL=0" in d.explain()
    d = doc.decide(GemmOp(8192, 8192, 8192, fp32_precision="highest"), "cuda:0", use_cache=False)
    assert d.variant.name == "cuda.gemm.wgmma_3xtf32"


def test_explanation_names_model_neighbours_and_roofline(monkeypatch):
    doc = T.doctor_on(monkeypatch, H100)
    d = doc.decide(GemmOp(512, 15360, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"), "cuda:0",
                   use_cache=False)
    text = d.explain()
    assert "performance model for sm_90" in text and "sm_90.json" in text
    assert "knn:" in text and "roofline" in text and "measured shape" in text
    assert d.to_dict()["chosen"]["estimate"]["method"] == "knn"


def test_decode_shape_prefers_gemv(monkeypatch):
    doc = T.doctor_on(monkeypatch, H100)
    d = doc.decide(GemmOp(1, 13824, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"), "cuda:0",
                   use_cache=False)
    assert d.variant.name == "cuda.gemm.gemv", d.explain()


def test_model_never_picks_a_declining_variant(monkeypatch):
    """K % 4 != 0: the Hopper TF32 variants decline (TMA rows); data near the shape must not revive them."""
    doc = T.doctor_on(monkeypatch, H100)
    op = GemmOp(4096, 4096, 4093, fp32_precision="highest")
    d = doc.decide(op, "cuda:0", use_cache=False)
    assert d.variant.name != "cuda.gemm.wgmma_3xtf32"
    assert any(r.variant == "cuda.gemm.wgmma_3xtf32" for r in d.rejected)
    conv = Conv2dOp(32, 20, 56, 56, 64, 3, 3, padding=1, layout="nhwc", dtype="float16")  # C not in 16-byte runs
    d = doc.decide(conv, "cuda:0", use_cache=False)
    assert d.variant.name == "cuda.conv2d.implicit_mma"


def test_other_architecture_falls_back_to_roofline(monkeypatch):
    doc = T.doctor_on(monkeypatch, A100)
    d = doc.decide(GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16"), "cuda:0", use_cache=False)
    assert d.chosen.estimate is None
    assert "no measured data for sm_80" in d.explain() and "data exists for sm_90" in d.explain()


@pytest.mark.parametrize("content", [b"{not json", b"[]", json.dumps({"format": "tracea-perf-data", "version": 99}).encode(),
                                     json.dumps({"format": "tracea-perf-data", "version": 1, "arch_key": "sm_90",
                                                 "columns": ["variant", "op", "seconds"], "rows": "x"}).encode()])
def test_corrupt_shipped_file_falls_back_with_reason(monkeypatch, tmp_path, content):
    bad = tmp_path / "sm_90.json"
    bad.write_bytes(content)
    doc = T.doctor_on(monkeypatch, H100, [str(bad)])
    d = doc.decide(GemmOp(8192, 8192, 8192, fp32_precision="high"), "cuda:0", use_cache=False)
    assert d.chosen.estimate is None  # roofline
    assert "sm_90.json not used" in d.explain()
    assert d.variant.name == "cuda.gemm.wgmma_tf32"


def test_bad_rows_are_skipped_not_fatal(monkeypatch, tmp_path):
    from tracea_cuda.plugin import tracea_perf_data

    good = json.load(open(tracea_perf_data(H100)[0]))
    good["rows"] = good["rows"][:50] + [["cuda.gemm.wgmma", {"kind": "gemm", "m": -1}, 1e-3],
                                        ["cuda.gemm.wgmma", {"kind": "gemm", "m": 1, "n": 1, "k": 1}, float("nan")],
                                        ["x"], ["cuda.gemm.wgmma", {"kind": "nope"}, 1e-3, "", "fit", [0, 0]]]
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(good))
    doc = T.doctor_on(monkeypatch, H100, [str(path)])
    d = doc.decide(GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16"), "cuda:0", use_cache=False)
    assert "4 malformed row(s) skipped" in d.explain()


def test_doctor_cli_text_explains_the_ranking(monkeypatch):
    from tracea.cli.doctor_cmd import render_text
    from tracea.doctor.report import build_report

    doc = T.doctor_on(monkeypatch, H100)
    op = GemmOp(8192, 8192, 8192, fp32_precision="high")
    text = render_text(build_report(doc, [op], "cuda:0"))
    assert "estimated by (roofline)" in text and "knn (" in text
    assert "ranking of untuned candidates: performance model for sm_90" in text
    assert "data near: gemm 8192x8192x8192" in text


def test_few_tile_gemms_take_the_split_k_hero_and_decode_keeps_its_variants(monkeypatch):
    """x @ W.T with few 128x128 tiles: the Doctor picks the Hopper GEMM with the split-K hero (measured
    1.9-2.6x faster than the mma.sync default it replaced on an H100); whole 128-row tiles over at most one
    128x64 tile per SM take 128x64 tiles (H200 and H100 alike), or narrower ones that fill the SMs where those
    are not split (``hopper_tiles``: 128x32 at N4096 K4096, 128x96 at N11008); M <= 16 keeps GEMV / skinny.
    (17-127 rows: ``cuda.gemm.wgmma_fewrows``, see test_cuda_gemm_fewrows.py.)"""
    from dataclasses import replace as dc_replace

    expected = {(512, 1024, 8192): (128, 4), (128, 4096, 4096): (32, None), (128, 1024, 8192): (64, 8),
                (128, 2048, 8192): (64, 4), (256, 4096, 4096): (64, None), (128, 8192, 8192): (64, None),
                (128, 11008, 4096): (96, None), (128, 4096, 11008): (64, 2),
                (192, 4096, 4096): (128, None), (256, 4096, 14336): (64, None)}
    for profile in (H100, dc_replace(H100, bandwidth_gbs=4800.0)):
        doc = T.doctor_on(monkeypatch, profile)

        def decide(m, n, k, dt="bfloat16", doc=doc):
            kw = {"fp32_precision": "high"} if dt == "float32" else {"dtype_a": dt, "dtype_b": dt}
            return doc.decide(GemmOp(m, n, k, trans_b=True, **kw), "cuda:0", use_cache=False)

        for (rows, cols, depth), (tile_n, splits) in expected.items():
            d = decide(rows, cols, depth)
            assert d.variant.name == "cuda.gemm.wgmma" and d.chosen.config.get("split_k") == splits, d.explain()
            assert d.chosen.config.tile_n == tile_n, d.explain()
        d = decide(512, 1024, 8192, "float32")
        assert d.variant.name == "cuda.gemm.wgmma_tf32" and d.chosen.config.get("split_k") == 4, d.explain()
        assert decide(192, 8192, 8192).chosen.config.get("split_k") is None  # half a wave of tiles, K < 12288
        for rows in (1, 4, 16):
            assert decide(rows, 4096, 4096).variant.name in ("cuda.gemm.gemv", "cuda.gemm.skinny_mma")


def test_first_use_times_the_chosen_variants_heroes_not_variants_estimated_far_slower(monkeypatch):
    """First-use tuning's candidates on Hopper: the chosen variant's first three heroes (where the H100
    first-use winners were), then only the variants estimated within ``ESTIMATE_SPAN``: on a prefill GEMM the
    mma.sync GEMM (estimated 2.6x slower, never a winner) costs no compilation; on decode it stays."""
    from tracea.doctor import doctor as doctor_mod
    from tracea.runtime import first_use

    doc = T.doctor_on(monkeypatch, H100)
    monkeypatch.setattr(doctor_mod, "get_doctor", lambda: doc)

    def trials(m, n, k):
        d = doc.decide(GemmOp(m, n, k, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"), "cuda:0",
                       use_cache=False)
        got = first_use._trials(d)
        assert got[0] == (d.chosen.variant, d.chosen.config)
        return [v.name for v, _ in got]

    assert trials(2048, 11008, 4096) == ["cuda.gemm.wgmma"] * 3
    decode = trials(16, 5120, 5120)
    assert decode[:3] == ["cuda.gemm.skinny_mma"] * 3 and len(decode) == first_use.MAX_CANDIDATES
    assert "cuda.gemm.mma_f16" in decode


def test_attention_decode_shapes_go_to_the_decode_kernel(monkeypatch):
    """One-token decode and short queries over a KV cache: cuda.attention.decode on Hopper and on sm_80;
    prefill: cuda.attention.wgmma on Hopper, flash_mma on sm_80 (the decode kernel declines > 32 rows)."""
    from tracea.ir.ops import AttentionOp

    decode = [AttentionOp(b, 32, sq, kv, d, kv_heads=8, dtype=dt) for b in (1, 4) for sq in (1, 4)
              for kv in (4096, 32768) for d in (64, 128) for dt in ("bfloat16", "float16")]
    decode += [AttentionOp(2, 8, 1, 3000, 128, kv_heads=2, dtype="float16", mask="additive", mask_shape=(2, 1)),
               AttentionOp(1, 16, 8, 8192, 128, kv_heads=4, dtype="bfloat16", causal=True)]
    prefill = AttentionOp(4, 32, 4096, 4096, 128, kv_heads=8, dtype="bfloat16")
    for profile, pre in ((H100, "cuda.attention.wgmma"), (A100, "cuda.attention.flash_mma")):
        doc = T.doctor_on(monkeypatch, profile)
        for op in decode:
            d = doc.decide(op, "cuda:0", use_cache=False)
            assert d.variant.name == "cuda.attention.decode", (profile.name, d.explain())
        assert doc.decide(prefill, "cuda:0", use_cache=False).variant.name == pre


def test_skinny_heroes_follow_the_memory_bandwidth():
    """The skinny GEMM's first hero. Below 4 TB/s (H100 probe): the prefetching one-row-block kernels,
    (nb=1, kw=16, unroll=2, wide_regs) at M <= 8 and on narrow weights, (nb=1, kw=8, unroll=2) at M 9-16 unless
    its grid ends in a short last wave (then nb=2). On an H200 (4.8 TB/s) the prefetching loop, (nb=2, kw=16,
    unroll=2) at M <= 8 and (nb=2, kw=8, unroll=2) at M 9-16, one-block rows over 16 warps where two-block rows
    leave SMs idle (N < 16 x SMs)."""
    from dataclasses import replace as dc_replace

    from tracea_cuda.variants.skinny import SkinnyMmaGemm

    def first(m, n, bw, profile=H100):
        c = SkinnyMmaGemm().hero_configs(GemmOp(m, n, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),
                                         dc_replace(profile, bandwidth_gbs=bw))[0]
        return tuple(c.get(p) for p in ("nb", "kw", "unroll", "coalesced", "prefetch", "wide_regs"))

    for rows in (1, 4, 8):
        assert first(rows, 8192, 3350.0) == first(rows, 1024, 3350.0) == (1, 16, 2, False, True, True)
    # M 9-16 on 132 SMs, 4 one-row blocks per SM: 5120 rows are 1.21 waves, 6000 1.42, 8192 1.94, 13824 3.27
    assert first(16, 5120, 3350.0) == first(9, 5120, 3350.0) == (2, 8, 2, False, True, False)
    for n in (6000, 8192, 11008, 13824, 28672, 3000):
        assert first(16, n, 3350.0) == (1, 8, 2, False, True, False), n
    assert first(16, 1024, 3350.0) == (1, 16, 2, False, True, True)
    # the waves follow the SM count: 108 SMs (A100) put 4096 rows at 1.19 waves
    assert first(16, 4096, 2039.0, A100) == (2, 8, 2, False, True, False)
    assert first(16, 4096, 3350.0) == (1, 8, 2, False, True, False)
    assert first(4, 8192, 4800.0) == (2, 16, 2, False, True, False)
    assert first(16, 8192, 4800.0) == (2, 8, 2, False, True, False)
    assert first(4, 1024, 4800.0) == (1, 16, 4, True, True, True)
    assert first(16, 1024, 4800.0) == (1, 16, 2, False, True, True)
    for bw in (3350.0, 4800.0):
        heroes = SkinnyMmaGemm().hero_configs(GemmOp(16, 8192, 8192, trans_b=True, dtype_a="bfloat16",
                                                     dtype_b="bfloat16"), dc_replace(H100, bandwidth_gbs=bw))
        assert len({c.key for c in heroes}) == len(heroes) == (7 if bw < 4000 else 8)
        assert all(c.get("wide_regs") == (c.get("kw") == 16 and c.get("prefetch") and c.get("nb") == 1)
                   for c in heroes)


def test_short_last_wave():
    from tracea_cuda.variants.skinny import short_last_wave

    assert short_last_wave(640, 4, 132)  # 1.21 waves
    assert not short_last_wave(1024, 4, 132)  # 1.94
    assert not short_last_wave(500, 4, 132)  # one wave, not full
    assert not short_last_wave(1728, 4, 132)  # 3.27: later waves dilute the tail
    assert short_last_wave(1100, 4, 132)  # 2.08
    assert not short_last_wave(10, 4, 0)  # no SM count: no claim


def test_skinny_row_groups_validated_on_the_cpu():
    """wn row groups: at most 16 warps a block (kw x wn), wn in 1 / 2 / 4 / 8; the grid covers N in blocks
    of 8 x nb x wn rows."""
    from tracea.semantic.config import PipelineConfig

    from tracea_cuda.variants.skinny import SkinnyMmaGemm

    v, op = SkinnyMmaGemm(), GemmOp(16, 1000, 512, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")

    def cfg(kw, wn, nb=1):
        return PipelineConfig(warps=kw * wn, params=(("nb", nb), ("kw", kw), ("unroll", 2), ("wn", wn)))

    assert v.validate_config(op, cfg(8, 2), H100) and v.validate_config(op, cfg(2, 8), H100)
    for bad in (cfg(8, 4), cfg(16, 2), cfg(4, 3)):
        validity = v.validate_config(op, bad, H100)
        assert not validity and "wn=" in validity.reason, bad.key
    spec = v.spec(op, cfg(4, 2, nb=2), None)
    assert spec.threads == 256 and spec.rows == 32 and v.grid(op, spec) == (32, 1, 1)
    assert spec.smem_bytes == 4 * 8 * 2 * 128


def test_one_row_decode_goes_to_the_gemv_on_tall_weights(monkeypatch):
    """M = 1 against a weight of >= 48 rows per SM: the skinny GEMM declines (the GEMV streamed those
    faster on an H200), on fewer rows it stays a candidate; M = 4 keeps the skinny GEMM."""
    from dataclasses import replace as dc_replace

    from tracea_cuda.variants.skinny import SkinnyMmaGemm

    h200 = dc_replace(H100, bandwidth_gbs=4800.0)
    op = lambda m, n, k: GemmOp(m, n, k, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")  # noqa: E731
    doc = T.doctor_on(monkeypatch, h200)  # CuPy reported usable
    reasons = SkinnyMmaGemm().check(op(1, 11008, 4096), h200)
    assert any("cuda.gemm.gemv" in r for r in reasons), reasons
    assert not SkinnyMmaGemm().check(op(1, 4096, 11008), h200)
    for n, k in ((11008, 4096), (8192, 8192), (28672, 8192)):
        assert doc.decide(op(1, n, k), "cuda:0", use_cache=False).variant.name == "cuda.gemm.gemv"
        assert doc.decide(op(4, n, k), "cuda:0", use_cache=False).variant.name == "cuda.gemm.skinny_mma"
    assert doc.decide(op(1, 1024, 8192), "cuda:0", use_cache=False).variant.name == "cuda.gemm.skinny_mma"


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_cuda_attention_declines_non_positive_scales(monkeypatch, scale):
    """The online softmax of every CUDA attention kernel assumes a positive scale: zero and negative ones
    are declined with that reason (PyTorch accepts them; the reference computes them)."""
    from tracea.errors import NoVariantError
    from tracea.ir.ops import AttentionOp

    doc = T.doctor_on(monkeypatch, H100)
    for sq in (1, 4096):  # the decode kernel and the prefill kernels
        op = AttentionOp(1, 32, sq, 4096, 128, kv_heads=8, dtype="bfloat16", scale=scale)
        try:
            decision = doc.decide(op, "cuda:0", use_cache=False)
        except NoVariantError as exc:
            rejected = exc.rejections
        else:
            assert not decision.chosen.variant.name.startswith("cuda.attention"), decision.chosen.variant.name
            rejected = {r.variant: r.reasons for r in decision.rejected}
        for name in ("cuda.attention.flash_mma", "cuda.attention.wgmma", "cuda.attention.decode"):
            assert any("positive scale" in r for r in rejected.get(name, [])), (name, rejected.get(name))


def test_more_bandwidth_keeps_the_measured_ranking(monkeypatch):
    """An H200 (an H100's SMs, 4.8 TB/s) reads the H100's sm_90 data as efficiencies: one-row fp32 x @ W.T
    stays on the GEMV (H200, 2026-11-28, user path: the skinny kernel the seconds-as-is estimate chose ran at
    45-48% of the copy bandwidth, 0.59-0.69x cuBLAS), and the GEMV's estimate shrinks with the bandwidth."""
    from dataclasses import replace

    h200 = replace(H100, name="H200 (fake)", bandwidth_gbs=4800.0)
    for n, k in ((4096, 4096), (11008, 4096), (1024, 8192)):
        op = GemmOp(1, n, k, trans_b=True)
        on = {p.name: T.doctor_on(monkeypatch, p).decide(op, "cuda:0", use_cache=False) for p in (H100, h200)}
        assert {d.variant.name for d in on.values()} == {"cuda.gemm.gemv"}, on["H200 (fake)"].explain()
        assert on["H200 (fake)"].chosen.estimate_s < 0.8 * on["H100 (fake)"].chosen.estimate_s
