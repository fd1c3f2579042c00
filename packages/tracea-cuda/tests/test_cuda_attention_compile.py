"""Without a GPU: the flash-attention variant's Doctor checks, configs and heroes, and its split-KV
combine kernel compiles for sm_80 and sm_90a (the hero kernels are compiled with every other variant's
in ``test_cuda_offline_compile.py``; the nvcc parts skip when nvcc is absent)."""

from __future__ import annotations

import dataclasses

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.device import Device
from tracea.ir.ops import AttentionOp

from tracea_cuda.device import isa_flags
from tracea_cuda.emit import flash_attn, flash_wgmma
from tracea_cuda.offline import compile_report, nvcc_path
from tracea_cuda.variants.attention import FlashAttention, auto_splits

H100 = DeviceProfile(Device("cuda", 0), "H100 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)))
V = FlashAttention()
OPS = [AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"),
       AttentionOp(4, 16, 4096, 4096, 64, dtype="float16"),
       AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16"),
       AttentionOp(2, 8, 77, 300, 64, kv_heads=2, dtype="bfloat16", mask="additive", mask_shape=(2, 1))]


def test_requirements_and_reasons():
    assert V.check(OPS[0], H100) == [] or all("toolkit" in r or "CuPy" in r or "cupy" in r for r in V.check(OPS[0], H100))
    reasons = V.requirements.check(AttentionOp(1, 2, 8, 8, 64, dtype="float32"), H100)
    assert any("float32" in r for r in reasons)
    assert V.extra_checks(AttentionOp(1, 2, 8, 8, 96, dtype="bfloat16"), H100)
    assert any("dropout" in r for r in V.requirements.check(AttentionOp(1, 2, 8, 8, 64, dtype="bfloat16",
                                                                        dropout_p=0.1), H100))


def test_heroes_are_valid_and_decode_splits_the_keys():
    for op in OPS:
        heroes = V.hero_configs(op, H100)
        assert heroes and all(V.validate_config(op, c, H100) for c in heroes), op.describe()
    decode = OPS[2]
    assert V.spec(decode, V.hero_configs(decode, H100)[0], None, H100).splits > 8
    assert auto_splits(OPS[0], 128, 64, 132) == 1  # prefill fills the GPU without splitting


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_split_combine_kernel_compiles():
    """The main kernels of every hero compile without spills in ``test_cuda_offline_compile.py``; the
    split-KV combine kernel is compiled here."""
    decode = OPS[2]
    spec = V.spec(decode, V.hero_configs(decode, H100)[0], None, H100)
    assert spec.splits > 1
    for arch in ("sm_80", "sm_90a"):
        res = compile_report(flash_attn.render_combine(spec), arch)[flash_attn.COMBINE_NAME]
        assert res.spill_stores == 0 and res.spill_loads == 0


def test_mask_ring_follows_the_key_length_and_fits_shared_memory():
    """A mask's tiles go through shared memory (``mask_ring``) where seq_kv is a multiple of 8 (16-byte
    aligned mask rows); the tiles and row offsets count in the shared memory; masked heroes stay valid;
    ``mask_ring=False`` selects the per-key loads."""
    from tracea_cuda.variants.base import hero

    aligned = AttentionOp(2, 8, 300, 2048, 128, kv_heads=2, dtype="bfloat16", mask="bool", mask_shape=(2, 1))
    odd = AttentionOp(2, 8, 300, 2047, 128, kv_heads=2, dtype="bfloat16", mask="bool", mask_shape=(2, 1))
    for op, ring in ((aligned, True), (odd, False), (OPS[3], False), (OPS[0], False)):
        heroes = V.hero_configs(op, H100)
        assert heroes and all(V.validate_config(op, c, H100) for c in heroes), op.describe()
        spec = V.spec(op, heroes[0], None, H100)
        assert spec.ring is ring, op.describe()
        plain = flash_attn.FlashSpec(spec.dtype, spec.head_dim, spec.bm, spec.bn, spec.causal)
        extra = 2 * spec.bm * (spec.bn + flash_attn.MASK_PAD) * 2 + 8 * spec.bm
        assert spec.smem_bytes == plain.smem_bytes + (extra if ring else 0)
        assert f"#define MASK_RING {int(ring)}" in flash_attn.render(spec)
    off = hero(128, 64, 128, 2, 8, mt=1, splits=0, mask_ring=False)
    assert V.spec(aligned, off, None, H100).ring is False
    big = hero(128, 128, 128, 2, 8, mt=1, splits=1)  # two 128-key K / V buffers plus the mask tiles: too much
    assert not V.validate_config(aligned, big, H100) and V.validate_config(odd, big, H100)


# -- cuda.attention.wgmma (Hopper) -------------------------------------------------------------------

def test_wgmma_variant_requirements_and_ranking():
    """sm_90a only; masks over at most SHORT_KV keys declined (flash_mma serves them), longer masked
    prefills served and ranked above flash_mma; prefill ranks above flash_mma, one-token decode and
    short-query long-KV shapes below it (its split-KV fills the GPU)."""
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    w = FlashAttentionWgmma()
    a100 = DeviceProfile(Device("cuda", 0), "A100 (offline)", backend="cuda", arch="sm_80", compute_units=108,
                         compute_capability=(8, 0), warp_size=32, max_threads_per_block=1024,
                         shared_mem_per_block=166912, registers_per_block=65536, isa=isa_flags((8, 0)))
    assert w.requirements.check(OPS[0], a100)
    assert w.requirements.check(OPS[0], H100) == []
    assert w.requirements.check(OPS[3], H100) == []
    assert any("flash_mma" in r for r in w.extra_checks(OPS[3], H100))  # 300 keys: flash_mma's
    long_masked = AttentionOp(4, 32, 2048, 2048, 128, kv_heads=8, dtype="bfloat16", mask="bool", mask_shape=(4, 1))
    assert w.extra_checks(long_masked, H100) == []
    assert w.estimate_seconds(long_masked, H100) < V.estimate_seconds(long_masked, H100)
    spec = w.spec(long_masked, w.hero_configs(long_masked, H100)[0])
    assert spec.mask == 1 and spec.bn == 128 and spec.cw == 2  # a boolean mask is read as bits
    assert "#define MASK 1" in flash_wgmma.render(spec)
    assert flash_wgmma.mask_words(2048) == 64 and flash_wgmma.mask_words(777) == 28
    bad = flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 80, 2, 2, False, mask=1)
    with pytest.raises(UnsupportedConfigError, match="32-bit words"):
        bad.check()
    assert w.extra_checks(AttentionOp(1, 2, 8, 8, 96, dtype="bfloat16"), H100)
    for op in (OPS[0], OPS[1], AttentionOp(4, 32, 4096, 4096, 128, kv_heads=8, dtype="bfloat16")):
        assert w.extra_checks(op, H100) == []
        assert w.estimate_seconds(op, H100) < V.estimate_seconds(op, H100), op.describe()
    for op in (OPS[2], AttentionOp(1, 8, 128, 32768, 128, dtype="bfloat16")):
        assert w.estimate_seconds(op, H100) > V.estimate_seconds(op, H100), op.describe()


def test_wgmma_configs_are_valid_or_declined_with_reasons():
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    for op in (OPS[0], OPS[1], AttentionOp(2, 32, 1000, 1777, 128, kv_heads=8, dtype="float16")):
        heroes = w.hero_configs(op, H100)
        assert heroes and all(w.validate_config(op, c, H100) for c in heroes), op.describe()
        space = w.search_space(op, H100)
        assert space is not None
    d128 = OPS[0]
    # the softmax / P V overlap: on by default with two consumer warpgroups, off with three (param overlap)
    assert w.spec(d128, hero(128, 128, 128, 2, 12), None, H100).overlap is True
    assert w.spec(d128, hero(192, 64, 128, 2, 16), None, H100).overlap is False
    assert w.spec(d128, hero(128, 128, 128, 2, 12, overlap=False), None, H100).overlap is False
    assert "softmax_fence(p, Skv, sq)" in flash_wgmma.render(w.spec(d128, hero(128, 128, 128, 2, 12), None, H100))
    assert "#define OVERLAP 0" in flash_wgmma.render(w.spec(d128, hero(192, 64, 128, 2, 16), None, H100))
    assert "registers" in w.validate_config(d128, hero(192, 128, 128, 2, 16), H100).reason  # O+S+P over 160
    assert "shared memory" in w.validate_config(d128, hero(128, 256, 128, 3, 12), H100).reason
    assert "warps" in w.validate_config(d128, hero(128, 128, 128, 2, 8), H100).reason
    assert "multiple of 16" in w.validate_config(d128, hero(128, 120, 128, 2, 12), H100).reason


def test_wgmma_mid_length_small_grid_heroes():
    """Past SHORT_KV keys, a prefill whose long-hero row blocks (192 rows at D64, 128 at D128) fill fewer
    than MID_WAVES waves leads with the mid heroes: D64 64x128 with two CTAs per SM (causal up to 1024 keys
    64x64 with three), D128 128x128 with O staged (non-causal persistent, no tail split), 64x64 x2 staged
    first where 128-row blocks leave half the SMs idle; such ops rank above flash_mma. Long prefills (B4
    H16 S4096), decode and short-query ops keep their heroes."""
    from tracea_cuda.variants.attention_wgmma import MID_MIN_Q, FlashAttentionWgmma

    w = FlashAttentionWgmma()

    def lead(b: int, h: int, s: int, d: int, causal: bool = False, kvh: int | None = None, sq: int | None = None):
        op = AttentionOp(b, h, s if sq is None else sq, s, d, kv_heads=kvh, causal=causal, dtype="bfloat16")
        first = w.hero_configs(op, H100)[0]
        return op, (first.tile_m, first.tile_n, first.get("ctas", 1), bool(first.get("persistent")),
                    bool(first.get("tail")), bool(first.get("ostage")))

    cases = {  # (B, H, S, D, causal): (tile_m, tile_n, ctas, persistent, tail, ostage)
        (2, 16, 1024, 64, False): (64, 128, 2, True, False, False),
        (4, 16, 1024, 64, False): (64, 128, 2, True, False, False),  # 384 blocks of 192 rows: 2.9 waves
        (1, 8, 1536, 64, False): (64, 128, 2, True, False, False),
        (2, 16, 1024, 64, True): (64, 64, 3, False, False, False),
        (1, 16, 2048, 64, True): (64, 128, 2, False, False, False),
        (2, 16, 1024, 128, False): (128, 128, 1, True, False, True),
        (1, 8, 1024, 128, False): (64, 64, 2, True, False, True),  # 64 blocks of 128 rows
        (1, 16, 1024, 128, True): (128, 128, 1, True, False, True),  # persistent, balanced pairs (lpt)
        (1, 8, 1024, 128, True): (64, 64, 2, True, False, True),
    }
    for (b, h, s, d, causal), want in cases.items():
        op, got = lead(b, h, s, d, causal)
        assert w.few_waves(op, H100) and got == want, (op.describe(), got)
        heroes = w.hero_configs(op, H100)
        assert all(w.validate_config(op, c, H100) for c in heroes), op.describe()
        assert len({c.key for c in heroes}) == len(heroes)
        assert any(c.tile_m >= 128 and c.get("ctas", 1) == 1 and not c.get("ostage") for c in heroes)  # long ones
        assert w.estimate_seconds(op, H100) < V.estimate_seconds(op, H100), op.describe()
    # unchanged: long prefills (B4 H16 S4096, GQA H32/8), past MID_WAVES (8x16x2048 D64: 1408 blocks), decode
    # and short queries over long keys
    for op in (AttentionOp(4, 16, 4096, 4096, 64, dtype="bfloat16"),
               AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"),
               AttentionOp(4, 32, 4096, 4096, 128, kv_heads=8, dtype="bfloat16"),
               AttentionOp(8, 16, 2048, 2048, 64, dtype="bfloat16"),
               AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16"),
               AttentionOp(1, 16, MID_MIN_Q - 1, 4096, 128, dtype="bfloat16")):
        assert not w.few_waves(op, H100) and w.short_heroes(op, H100) == [], op.describe()
        assert w.hero_configs(op, H100) == w.long_heroes(op, H100)
    assert w.hero_configs(AttentionOp(4, 16, 4096, 4096, 128, dtype="bfloat16"), H100)[0].get("tail")
    # a prefill chunk over a long KV cache, fewer 128-row blocks than SMs: the tail split cutting every block
    # leads (not below SPLIT_MIN_KV keys, nor where the runs would hold nearly whole blocks)
    chunk = AttentionOp(1, 32, 256, 8192, 128, kv_heads=8, dtype="bfloat16")
    first = w.hero_configs(chunk, H100)[0]
    assert w.few_waves(chunk, H100) and first.get("tail") and first.get("persistent") and first.tile_m == 128
    assert not w.hero_configs(AttentionOp(1, 8, 1024, 1024, 128, dtype="bfloat16"), H100)[0].get("tail")
    assert not w.hero_configs(AttentionOp(1, 32, 511, 16384, 128, kv_heads=8, dtype="bfloat16"), H100)[0].get("tail")
    # causal (top-left) chunks see at most seq_q keys: short-sequence heroes, whatever the cache length
    top_left = AttentionOp(4, 32, 256, 4096, 128, kv_heads=8, causal=True, dtype="bfloat16")
    assert w.short_heroes(top_left, H100) and not w.few_waves(top_left, H100)


def test_wgmma_short_sequence_heroes_and_their_checks():
    """Short keys (seq_kv <= SHORT_KV) lead with one consumer warpgroup (tile_m 64, no ping-pong) and two or
    three CTAs per SM -- at D128 where 128-row blocks leave SMs idle; otherwise D128 leads with 128x128 and
    the O tile staged in shared memory -- the long-sequence heroes after them; the registers and shared
    memory split over the resident CTAs; longer keys keep the long heroes. The fill estimate counts the
    first hero's blocks' rows only (no SM fill at short keys), so batch-1 ViT-S and a batch-1 512-token
    prefill rank above flash_mma."""
    from tracea.dtypes import DType
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import SHORT_KV, FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    shapes = [AttentionOp(8, 12, 256, 256, 64, dtype="bfloat16"), AttentionOp(32, 6, 197, 197, 64, dtype="float16"),
              AttentionOp(16, 8, 65, 65, 64, causal=True, dtype="float16"),
              AttentionOp(1, 16, 512, 512, 128, dtype="bfloat16"),
              AttentionOp(1, 6, 197, 197, 64, dtype="float16")]
    for op in shapes:
        heroes = w.hero_configs(op, H100)
        assert heroes[0].tile_m == 64 and heroes[0].get("ctas", 1) in (2, 3), op.describe()
        assert all(w.validate_config(op, c, H100) for c in heroes), op.describe()
        assert any(c.tile_m >= 128 for c in heroes)  # the long heroes stay for the tuner
        assert w.estimate_seconds(op, H100) < V.estimate_seconds(op, H100), op.describe()
    # BERT-base b8: 384 blocks of 64 rows fit one wave of three CTAs per SM; ViT-S b32 (768) runs persistent
    assert w.hero_configs(shapes[0], H100)[0].get("ctas") == 3
    assert w.hero_configs(shapes[1], H100)[0].get("persistent") is True
    assert w.hero_configs(shapes[3], H100)[0].get("ostage") is True  # D128 b1: 64 x 64, O staged
    # D128 not causal: the tile padding (rows x keys) least (ViT-B's 197 tokens: 128 x 112; 257: 64 x 64 x2;
    # 256 / 500: 128 x 128 first of equals; under 128 rows 64-row tiles: 77 tokens 64 x 128 x2, one stage)
    for op, bm, bn in ((AttentionOp(4, 32, 300, 300, 128, kv_heads=8, causal=True, dtype="bfloat16"), 64, 64),
                       (AttentionOp(8, 16, 384, 384, 128, causal=True, dtype="bfloat16"), 128, 128),
                       (AttentionOp(4, 32, 512, 512, 128, causal=True, dtype="bfloat16"), 128, 128),
                       (AttentionOp(16, 16, 257, 257, 128, causal=True, dtype="bfloat16"), 64, 64),
                       (AttentionOp(8, 16, 256, 256, 128, dtype="bfloat16"), 128, 128),
                       (AttentionOp(16, 12, 197, 197, 128, dtype="float16"), 128, 112),
                       (AttentionOp(16, 12, 257, 257, 128, dtype="float16"), 64, 64),
                       (AttentionOp(64, 12, 77, 77, 128, dtype="bfloat16"), 64, 128),
                       (AttentionOp(8, 16, 500, 500, 128, dtype="bfloat16"), 128, 128)):
        first = w.hero_configs(op, H100)[0]
        assert (first.tile_m, first.tile_n, first.get("ostage"), first.get("persistent")) == (bm, bn, True, True)
        assert w.estimate_seconds(op, H100) < V.estimate_seconds(op, H100), op.describe()
        assert all(w.validate_config(op, c, H100) for c in w.hero_configs(op, H100)), op.describe()
    one_tile = w.hero_configs(AttentionOp(32, 16, 128, 128, 128, dtype="bfloat16"), H100)[0]
    assert (one_tile.tile_m, one_tile.tile_n, one_tile.stages, one_tile.get("ostage")) == (64, 128, 1, True)
    long = AttentionOp(4, 16, 4096, 4096, 64, dtype="bfloat16")
    assert w.hero_configs(long, H100)[0].tile_m > 64 and w.short_heroes(long, H100) == []
    assert w.short_heroes(AttentionOp(4, 16, SHORT_KV + 1, SHORT_KV + 1, 64, dtype="bfloat16"), H100)  # 1.5 waves
    # registers: the CTA's share of the register file split between producer and consumer
    spec = flash_wgmma.FlashWgmmaSpec(DType.BF16, 64, 64, 1, 2, False, pingpong=False, ctas=3)
    assert spec.threads == 256 and spec.regs == (24, 136)
    assert flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 64, 1, 2, False, pingpong=False, ctas=2).regs == (24, 232)
    src = flash_wgmma.render(spec)
    assert "#define CTAS 3" in src and "__launch_bounds__(NT, CTAS)" in src and "prefetch.tensormap" in src
    d64, d128 = shapes[0], shapes[3]
    assert "ping-pong" in w.validate_config(d64, hero(64, 64, 64, 2, 8, ctas=2, pingpong=True), H100).reason
    assert w.spec(d64, hero(64, 64, 64, 2, 8, ctas=2), None, H100).pingpong is False  # off by default at tile_m 64
    assert "shared memory" in w.validate_config(d128, hero(64, 128, 128, 2, 8, pingpong=False, ctas=2), H100).reason
    assert "registers" in w.validate_config(d128, hero(64, 64, 128, 1, 8, pingpong=False, ctas=3), H100).reason
    assert "ctas" in w.validate_config(d64, hero(64, 64, 64, 2, 8, pingpong=False, ctas=4), H100).reason
    assert w.validate_config(d128, hero(64, 128, 128, 1, 8, pingpong=False, ctas=2), H100)  # one stage: 80 KB


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_wgmma_short_sequence_kernels_compile_without_spills():
    """The tile_m 64 kernels with two and three CTAs per SM (and the O tile staged in shared memory): ptxas
    gives every thread the launch bound's cap (128 / 80 registers: the pool setmaxnreg redistributes) and
    spills nothing."""
    from tracea.dtypes import DType
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.offline import bundle

    F = flash_wgmma.FlashWgmmaSpec
    specs = [F(DType.BF16, 64, 64, 1, 2, False, pingpong=False, ctas=3), F(DType.F16, 64, 96, 1, 2, True, pingpong=False, ctas=3, lse=True),
             F(DType.F16, 64, 128, 1, 2, False, pingpong=False, ctas=2, strided=True),
             F(DType.BF16, 128, 64, 1, 2, True, pingpong=False, ctas=2, lse=True, strided=True),
             F(DType.BF16, 128, 128, 1, 1, False, pingpong=False, ctas=2),
             F(DType.BF16, 128, 64, 1, 2, False, pingpong=False, ctas=2, ostage=True, strided=True),
             F(DType.F16, 64, 80, 1, 2, False, pingpong=False, ctas=3, ostage=True, lse=True)]
    sources = {f"k{i}": flash_wgmma.render(s, name=f"k{i}") for i, s in enumerate(specs)}
    report = compile_report(bundle(sources), "sm_90a")
    assert set(report) == set(sources)
    for (name, res), spec in zip(sorted(report.items()), specs):
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack == 0 and not res.advisories, (name, res)
        assert res.registers == {2: 128, 3: 80}[spec.ctas], (name, res)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_wgmma_mid_length_heroes_compile_without_spills():
    """Every kernel the mid heroes (:meth:`FlashAttentionWgmma.mid_heroes`) compile to, D64 / D128, causal
    and not: no spills, no stack, no ptxas advisory."""
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.offline import bundle
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    w = FlashAttentionWgmma()
    specs = {}
    for b, h, s, d in ((2, 16, 1024, 64), (1, 16, 2048, 64), (2, 16, 1024, 128), (1, 8, 1024, 128)):
        for causal in (False, True):
            op = AttentionOp(b, h, s, s, d, causal=causal, dtype="bfloat16")
            mid = w.mid_heroes(op, H100)
            assert mid, op.describe()
            for cfg in mid:
                spec = w.spec(op, cfg)
                specs[spec] = spec
    sources = {f"k{i}": flash_wgmma.render(sp, name=f"k{i}") for i, sp in enumerate(specs)}
    report = compile_report(bundle(sources), "sm_90a")
    assert set(report) == set(sources)
    for name, res in report.items():
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack == 0 and not res.advisories, (name, res)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_wgmma_kernels_compile_without_spills():
    """Kernels beside the heroes (compiled in test_cuda_offline_compile.py): three consumer warpgroups at
    D128, no ping-pong, float16, deep rings -- no spills, no stack, no ptxas advisory (C7514: wgmma
    serialised)."""
    from tracea.dtypes import DType
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.offline import bundle

    specs = [flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 80, 3, 2, True, pingpong=False),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 64, 192, 2, 4, False),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 128, 192, 2, 2, True),
             flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 160, 2, 2, False, tail=True, lse=True),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 64, 128, 3, 2, False, tail=True),
             flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 128, 2, 2, True, ostage=True, strided=True, lse=True),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 128, 128, 2, 2, False, tail=True, ostage=True)]
    sources = {f"k{i}": flash_wgmma.render(s, name=f"k{i}") for i, s in enumerate(specs)}
    report = compile_report(bundle(sources), "sm_90a")
    assert set(report) == set(sources)
    for name, res in report.items():
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack == 0 and not res.advisories, (name, res)


def test_wgmma_tail_split():
    """``tail``: whole waves run whole, the rest (fewer items than CTAs) cut into runs of key tiles no
    longer than an item and no item in more than about TAIL_MAX_PIECES pieces (plus one where a run's
    start falls inside it); it needs a persistent grid and non-causal attention."""
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import TAIL_MAX_PIECES, FlashAttentionWgmma, persistent_grid, tail_split
    from tracea_cuda.variants.base import hero

    assert tail_split(2048, 132, 26) == (1980, 14)  # B4 H16 S4096, 128x160: 68 tail items in runs of 14
    assert tail_split(4096, 132, 26) == (4092, 7)  # GQA 32/8: 4 tail items, 4 pieces each, not 26
    assert tail_split(1056, 132, 26) == (1056, 1)  # whole waves: nothing to cut
    assert tail_split(100, 100, 26) == (100, 1)  # one CTA per item
    assert tail_split(64, 132, 26) == (0, 13)  # more CTAs than items (persistent_grid): every item cut
    assert tail_split(100, 132, 26) == (100, 1)  # runs of 20 of 26 tiles: not worth the cut
    assert tail_split(256, 132, 8) == (256, 1)  # 124 tail items in runs of whole items: not cut
    assert tail_split(4096, 132, 1) == (4096, 1)  # one key tile an item
    assert persistent_grid(64, 132, True) == 132 and persistent_grid(20, 132, True) == 20 * TAIL_MAX_PIECES
    assert persistent_grid(64, 132, False) == 64 and persistent_grid(2048, 132, True) == 132
    for items, ctas, nt in ((160, 132, 3), (2049, 132, 26), (1408, 132, 32), (4010, 114, 64), (302, 7, 9)):
        full, trun = tail_split(items, ctas, nt)
        assert full % ctas == 0 and 0 < items - full < ctas and 1 <= trun <= nt
        tiles = (items - full) * nt
        assert -(-tiles // trun) <= ctas  # every run has a CTA
        assert -(-nt // trun) <= TAIL_MAX_PIECES
    w = FlashAttentionWgmma()
    d128 = AttentionOp(4, 16, 4096, 4096, 128, dtype="bfloat16")
    spec = w.spec(d128, hero(128, 160, 128, 2, 12, persistent=True, tail=True), None, H100)
    assert spec.tail and spec.smem_bytes == flash_wgmma.FlashWgmmaSpec(spec.dtype, 128, 160, 2, 2, False).smem_bytes + 16
    src = flash_wgmma.render(spec)
    assert "#define TAIL 1" in src and "SOFTMAX(t0 + t)" in src
    assert "SOFTMAX(t0" not in flash_wgmma.render(w.spec(d128, hero(128, 160, 128, 2, 12, persistent=True), None, H100))
    assert "persistent" in w.validate_config(d128, hero(128, 160, 128, 2, 12, tail=True), H100).reason
    causal = AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16")
    assert "causal" in w.validate_config(causal, hero(128, 128, 128, 2, 12, persistent=True, tail=True), H100).reason


def test_wgmma_causal_longest_first_order():
    """``lpt``: on by default for persistent causal grids (off for plain grids and non-causal ops, where it is
    declined), compiled in as ``LPT``; a search dimension only for causal ops."""
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    causal = AttentionOp(8, 16, 384, 384, 128, causal=True, dtype="bfloat16")
    plain = AttentionOp(8, 16, 384, 384, 128, dtype="bfloat16")
    assert w.spec(causal, hero(128, 128, 128, 2, 12, persistent=True), None, H100).lpt
    assert not w.spec(causal, hero(128, 128, 128, 2, 12), None, H100).lpt
    assert not w.spec(causal, hero(128, 128, 128, 2, 12, persistent=True, lpt=False), None, H100).lpt
    assert w.spec(causal, hero(128, 128, 128, 2, 12, lpt=True), None, H100).lpt
    assert not w.spec(plain, hero(128, 128, 128, 2, 12, persistent=True, tail=True), None, H100).lpt
    assert "lpt" in w.validate_config(plain, hero(128, 128, 128, 2, 12, lpt=True), H100).reason
    src = flash_wgmma.render(w.spec(causal, hero(128, 128, 128, 2, 12, persistent=True), None, H100))
    assert "#define LPT 1" in src and "walk.next(items, nmb, heads_kv)" in src
    # the D128 causal heroes lead with persistent grids dealing balanced pairs (long, mid-length, short);
    # 64x64 with at most two blocks a (batch, head) keeps the plain deal
    for op in (AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"), causal,
               AttentionOp(2, 32, 1024, 1024, 128, kv_heads=8, causal=True, dtype="bfloat16")):
        lead = w.hero_configs(op, H100)[0]
        assert lead.get("persistent") and lead.get("ostage") and w.spec(op, lead, None, H100).lpt, op.describe()
    vit77 = AttentionOp(64, 12, 77, 77, 128, causal=True, dtype="bfloat16")
    lead = w.hero_configs(vit77, H100)[0]
    assert (lead.tile_m, lead.tile_n, lead.get("lpt")) == (64, 64, False)
    assert w.estimate_seconds(vit77, H100) < V.estimate_seconds(vit77, H100)  # flash_mma ran it before
    # causal, 67..131 blocks of 128 rows on 132 SMs: 128x128 still leads (64x64 x2 at most half the SMs)
    gqa512 = AttentionOp(1, 32, 512, 512, 128, kv_heads=8, causal=True, dtype="bfloat16")
    assert w.hero_configs(gqa512, H100)[0].tile_m == 128
    assert w.hero_configs(AttentionOp(1, 16, 512, 512, 128, causal=True, dtype="bfloat16"), H100)[0].tile_m == 64
    # the producer keeps 32 registers for the walk
    assert w.spec(causal, hero(128, 128, 128, 2, 12, persistent=True), None, H100).regs == (32, 232)
    assert dict(w.search_space(causal, H100).dims)["lpt"] == (False, True)
    assert dict(w.search_space(plain, H100).dims)["lpt"] == (False,)


def test_wgmma_staged_output():
    """``ostage`` adds the O tile to the shared memory and compiles the staged epilogue in."""
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    vit = AttentionOp(1, 6, 197, 197, 64, dtype="float16")
    base = w.spec(vit, hero(64, 80, 64, 2, 8, pingpong=False, ctas=3), None, H100)
    staged = w.spec(vit, hero(64, 80, 64, 2, 8, pingpong=False, ctas=3, ostage=True), None, H100)
    assert staged.ostage and staged.smem_bytes == base.smem_bytes + 64 * 64 * 2
    assert "#define OSTAGE 1" in flash_wgmma.render(staged) and "#define OSTAGE 0" in flash_wgmma.render(base)
    d128 = AttentionOp(4, 16, 4096, 4096, 128, dtype="bfloat16")
    for bn in (128, 160):  # the long D128 heroes keep fitting with the O tile (Q 32 KB + O 32 KB + two K / V stages)
        assert w.validate_config(d128, hero(128, bn, 128, 2, 12, persistent=True, tail=True, ostage=True), H100)


# -- cuda.attention.decode (split-KV decode, sm_80+) ----------------------------------------------------

def test_decode_variant_requirements_and_reasons():
    from tracea_cuda.variants.attention_decode import MAX_ROWS, FlashDecode

    dv = FlashDecode()
    assert dv.extra_checks(OPS[2], H100) == []
    assert dv.extra_checks(AttentionOp(1, 32, 8, 4096, 64, kv_heads=8, dtype="float16"), H100) == []  # 32 rows
    rows = dv.extra_checks(AttentionOp(1, 32, 17, 4096, 128, kv_heads=8, dtype="bfloat16"), H100)
    assert any(str(MAX_ROWS) in r for r in rows)
    assert any("head_dim" in r for r in dv.extra_checks(AttentionOp(1, 8, 1, 100, 96, dtype="bfloat16"), H100))
    assert any("float32" in r for r in dv.requirements.check(AttentionOp(1, 8, 1, 100, 64, dtype="float32"), H100))
    assert dv.requirements.check(OPS[3], H100) == []  # masks served


def test_decode_splits_fill_one_wave_and_heroes_are_valid():
    from tracea_cuda.emit.flash_decode import DecodeSpec
    from tracea_cuda.variants.attention_decode import FlashDecode, decode_splits
    from tracea_cuda.variants.base import hero

    dv = FlashDecode()
    for b, sq, kv, d in ((1, 1, 4096, 128), (1, 1, 32768, 128), (4, 1, 8192, 64), (2, 8, 4096, 128), (64, 1, 4096, 128)):
        op = AttentionOp(b, 32, sq, kv, d, kv_heads=8, dtype="bfloat16")
        heroes = dv.hero_configs(op, H100)
        assert heroes and all(dv.validate_config(op, c, H100) for c in heroes), op.describe()
        for cfg in heroes:
            spec = dv.spec(op, cfg, None, H100)
            ctas = -(-4 * sq // 16) * 8 * b * spec.splits
            assert ctas <= max(132, -(-4 * sq // 16) * 8 * b), (op.describe(), cfg.key, spec.splits)  # one wave
            if b == 1 and sq == 1:
                assert ctas > 100, (op.describe(), cfg.key, spec.splits)  # fills most SMs
    # a tiny KV cache is not cut below two tiles per warp
    tiny = AttentionOp(1, 32, 1, 300, 128, kv_heads=8, dtype="bfloat16")
    assert decode_splits(tiny, DecodeSpec(tiny.dtype.storage, 128, 16, 4, 3, False), 132) == 2
    bad = hero(32, 16, 128, 3, 4)
    assert "tile_m" in dv.validate_config(OPS[2], bad, H100).reason
    assert "shared memory" in dv.validate_config(OPS[2], hero(16, 32, 128, 8, 8), H100).reason
    masked = AttentionOp(2, 8, 1, 3000, 128, kv_heads=2, dtype="float16", mask="bool", mask_shape=(2, 1))
    assert "registers" in dv.validate_config(masked, hero(16, 32, 128, 3, 4), H100).reason  # mask + bn32 + d128


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_decode_kernels_beside_the_heroes_compile_without_spills():
    from tracea.dtypes import DType
    from tracea_cuda.emit import flash_decode
    from tracea_cuda.offline import bundle

    specs = [flash_decode.DecodeSpec(DType.F16, 128, 32, 2, 6, True, 0, 3),
             flash_decode.DecodeSpec(DType.BF16, 64, 16, 8, 8, False, 1, 1),
             flash_decode.DecodeSpec(DType.BF16, 128, 16, 1, 2, True, 2, 64)]
    sources = {f"k{i}": flash_decode.render(s, name=f"k{i}") for i, s in enumerate(specs)}
    for arch in ("sm_80", "sm_90a"):
        report = compile_report(bundle(sources), arch)
        assert set(report) == set(sources)
        for name, res in report.items():
            assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack == 0, (arch, name, res)


def test_decode_splits_follow_an_mps_share(monkeypatch):
    """Under CUDA MPS with a share of the SMs, the default split count fills that share, not the device."""
    from tracea_cuda.device import MPS_PERCENTAGE_ENV
    from tracea_cuda.variants.attention_decode import FlashDecode

    dv = FlashDecode()
    op = AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16")
    cfg = dv.hero_configs(op, H100)[0]
    full = dv.spec(op, cfg, None, H100).splits
    monkeypatch.setenv(MPS_PERCENTAGE_ENV, "50")
    half = dv.spec(op, cfg, None, H100).splits
    assert full == 16 and half == 8


# -- strided operands (AttentionOp.strides) -----------------------------------------------------------

def _strided_op(d: int = 64, seq: int = 197, heads: int = 6, **kw) -> AttentionOp:
    """ViT-style packed qkv: (batch, head, seq) strides (seq * 3 * heads * d, d, 3 * heads * d); out BSHD."""
    qkv = (seq * 3 * heads * d, d, 3 * heads * d)
    return AttentionOp(4, heads, seq, seq, d, dtype="float16", strides=qkv * 3 + (seq * heads * d, d, heads * d), **kw)


def test_which_variants_take_strided_operands():
    """flash_mma and wgmma read 16-byte-multiple strides in place (their specs compile the strided mode);
    other strides (and packed ops) are not taken, so dispatch packs for them; decode never takes them."""
    from tracea_cuda.variants.attention_decode import FlashDecode
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    op = _strided_op()
    assert V.takes_strides(op) and w.takes_strides(op) and not FlashDecode().takes_strides(op)
    assert not V.takes_strides(OPS[1]) and not w.takes_strides(OPS[1])
    odd = AttentionOp(1, 2, 5, 5, 64, dtype="float16", strides=(1000, 500, 100) + (640, 320, 64) * 3)  # 100 x 2 B
    assert not V.takes_strides(odd) and not w.takes_strides(odd)
    assert V.spec(op, V.hero_configs(op, H100)[0], None, H100).strided
    assert w.spec(op, hero(128, 128, 64, 2, 12)).strided and not w.spec(OPS[1], hero(128, 128, 64, 2, 12)).strided


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_strided_kernels_compile_without_spills():
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    w = FlashAttentionWgmma()
    for causal in (False, True):
        op = _strided_op(d=128, causal=causal)
        spec = w.spec(op, w.hero_configs(op, H100)[0])
        res = compile_report(flash_wgmma.render(spec), "sm_90a")[flash_wgmma.KERNEL_NAME]
        assert spec.strided and res.spill_stores == 0 and res.spill_loads == 0
    # flash_mma's first heroes (d32 and d64 two m-tiles; d128), masked (per-key loads at seq 197) or not,
    # with the log-sum-exp, and a split-KV decode kernel
    specs = [flash_attn.FlashSpec(DType.BF16, 128, 16, 64, False, 0, 8, strided=True)]
    for d in (32, 64, 128):
        for mask in (None, "additive", "bool"):
            op = dataclasses.replace(_strided_op(d=d), mask=mask, mask_shape=(4, 1) if mask else None, lse=True)
            specs.append(V.spec(op, V.hero_configs(op, H100)[0], None, H100))
    for spec in specs:
        assert spec.strided
        res = compile_report(flash_attn.render(spec), "sm_90a")[flash_attn.KERNEL_NAME]
        assert res.spill_stores == 0 and res.spill_loads == 0, spec
    combine = compile_report(flash_attn.render_combine(spec), "sm_90a")[flash_attn.COMBINE_NAME]
    assert combine.spill_stores == 0


def test_flash_mma_head_dim_32_and_many_windows():
    """Head dim 32 is served over at most 256 keys (Swin / PVT / TinyViT); a batch of thousands of windows (Swin: B x 64 windows of
    7x7) fits grid z with split-KV chunks capped to batch x chunks <= 65535; past 65535 sequences, declined."""
    from tracea_cuda.variants.base import hero

    op = AttentionOp(2048, 3, 49, 49, 32, dtype="float16")
    assert V.extra_checks(op, H100) == []
    spec = V.spec(op, hero(64, 64, 32, 2, 4, mt=1, splits=64), None, H100)
    assert spec.head_dim == 32 and spec.splits == 65535 // 2048 and op.batch * spec.splits <= 65535
    assert V.spec(op, V.hero_configs(op, H100)[0], None, H100).splits == 1  # a full grid: no split
    assert any("grid" in r for r in V.extra_checks(AttentionOp(70000, 1, 49, 49, 32, dtype="float16"), H100))
    assert any("head_dim" in r for r in V.extra_checks(AttentionOp(2, 3, 49, 49, 48, dtype="float16"), H100))
    assert V.extra_checks(AttentionOp(2, 3, 3136, 256, 32, dtype="float16"), H100) == []
    assert any("PyTorch" in r for r in V.extra_checks(AttentionOp(2, 3, 257, 257, 32, dtype="float16"), H100))


def test_strides_fit_refuses_broadcast_dimensions():
    """Strided operands are read in place unless a dimension of more than one element is broadcast (stride 0:
    an expanded view) -- those get packed copies (GPU fuzz finding, seed 4343 case 4174: an expanded q read in
    place came out wrong on cuda.attention.wgmma). Size-1 dimensions carry stride 0 by convention and pass."""
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention import strides_fit

    bshd = (100 * 8 * 64, 64, 8 * 64)
    kv = (150 * 2 * 64, 64, 2 * 64)
    assert strides_fit(AttentionOp(2, 8, 100, 150, 64, kv_heads=2, dtype="bfloat16", strides=bshd + kv + kv + bshd))
    expanded_q = (100 * 64, 0, 64)  # heads broadcast
    assert not strides_fit(AttentionOp(2, 8, 100, 150, 64, kv_heads=2, dtype="bfloat16",
                                       strides=expanded_q + kv + kv + bshd))
    shared_k = (0, 64, 2 * 64)  # the batch broadcast
    assert not strides_fit(AttentionOp(2, 8, 100, 150, 64, kv_heads=2, dtype="bfloat16",
                                       strides=bshd + shared_k + kv + bshd))
    one = (0, 64, 8 * 64)  # batch of one: its stride is never used
    assert strides_fit(AttentionOp(1, 8, 100, 150, 64, kv_heads=2, dtype="bfloat16",
                                   strides=one + (0, 64, 2 * 64) * 2 + one))
