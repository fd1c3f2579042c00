"""Run the CUDA attention variants' hero configs (and forced split counts) once each on small odd shapes
through ``tracea.ops.attention``, without and with the log-sum-exp output (``return_lse``), and check every
output (and lse) against the float64 reference. Meant to run under
compute-sanitizer (GPU machine), e.g.

    compute-sanitizer --tool memcheck --error-exitcode 9 python scripts/sanitize_attention.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python scripts/sanitize_attention.py --variant cuda.attention.decode

Prints one line per run and a summary; exit code 1 when an output is wrong or a run raises."""

from __future__ import annotations

import argparse
import sys

VARIANTS = ("cuda.attention.decode", "cuda.attention.flash_mma", "cuda.attention.wgmma")
# (B, H, KVH, Sq, Skv, D, causal, mask): odd KV lengths, GQA / MQA, a few query rows, masks
SHAPES = [(1, 8, 2, 1, 1000, 128, False, None), (2, 4, 1, 3, 333, 64, True, None),
          (2, 8, 2, 1, 515, 128, False, "additive"), (1, 4, 4, 2, 77, 64, False, "bool"),
          (1, 32, 8, 1, 2049, 128, False, None),
          # decode's mask tile by cp.async (seq_kv % 8 == 0): one shared row (seq_q 1), then 16 rows (seq_q 2)
          (2, 8, 2, 1, 1024, 64, False, "additive"), (2, 8, 2, 2, 1024, 128, True, "bool"),
          # more query blocks than SMs: persistent grids walk several blocks per CTA
          (4, 16, 16, 600, 333, 128, False, None),
          # ... with a partial last wave (tail pieces of one and of several key tiles) on 132 SMs
          (4, 8, 8, 600, 333, 128, False, None), (1, 43, 43, 600, 1000, 64, False, None),
          # flash_mma's mask tiles over several blocks and key tiles: plain loads (seq_kv % 8 != 0), cp.async
          (2, 4, 2, 130, 300, 128, False, "bool"), (1, 4, 1, 200, 264, 64, True, "additive"),
          # head dim 32 (flash_mma only): Swin windows with a mask, a causal 197-token ViT, split-KV decode
          (3, 3, 3, 49, 49, 32, False, "additive"), (1, 2, 2, 197, 197, 32, True, None),
          (2, 4, 2, 1, 250, 32, False, None)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", help="only these variant names")
    ap.add_argument("--match", help="only configs whose key contains this text (e.g. tail=True)")
    args = ap.parse_args()
    import torch

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.errors import UnsupportedConfigError
    from tracea.ir.ops import AttentionOp
    from tracea_cuda import testing as T
    from tracea_cuda.testing_attention import attention_ref, lse_close
    from tracea_cuda.variants import all_variants
    from tracea_cuda.variants.base import hero

    profile = T.gpu_profile()
    doctor = get_doctor()
    runs = bad = 0
    for variant in all_variants():
        if variant.name not in VARIANTS or (args.variant and variant.name not in args.variant):
            continue
        for i, (b, h, kvh, sq, skv, d, causal, mkind) in enumerate(SHAPES):
            op = AttentionOp(b, h, sq, skv, d, kv_heads=kvh, causal=causal, dtype="bfloat16", mask=mkind,
                             mask_shape=(b, 1) if mkind else None)
            if doctor.check(variant, op, profile):
                continue
            g = torch.Generator(device="cuda").manual_seed(i)
            q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            mask = None
            if mkind == "bool":
                mask = torch.rand(b, 1, sq, skv, device="cuda", generator=g) < 0.7
            elif mkind == "additive":
                mask = (torch.rand(b, 1, sq, skv, device="cuda", generator=g) * 3 - 2).bfloat16()
            ref, ref_lse = attention_ref(q, k, v, mask, causal, return_lse=True)
            configs = variant.hero_configs(op, profile)
            if variant.name == "cuda.attention.wgmma":  # the softmax / P V overlap switched the other way
                c0 = configs[0]
                configs.append(hero(c0.tile_m, c0.tile_n, d, c0.stages, c0.warps, pingpong=True,
                                    overlap=c0.tile_m != 128))
                if not causal:  # the persistent grid without and with the tail split
                    configs += [hero(c0.tile_m, c0.tile_n, d, c0.stages, c0.warps, persistent=True, tail=t)
                                for t in (False, True)]
            if variant.name == "cuda.attention.decode":
                c0 = configs[0]
                configs += [hero(16, c0.tile_n, d, c0.stages, c0.warps, splits=n) for n in (1, 3, 64)]
            configs = [c for c in configs if args.match is None or args.match in c.key]
            for cfg, lse in [(c, flag) for c in configs for flag in (False, True)]:
                runs += 1
                try:
                    out = tracea.ops.attention(q, k, v, mask, is_causal=causal, enable_gqa=True, variant=variant.name,
                                               config=cfg, return_lse=lse)
                    torch.cuda.synchronize()
                    lse_msg = None
                    if lse:
                        out, got_lse = out
                        lse_msg = lse_close(got_lse, ref_lse)
                    err = float((out.double().cpu() - ref).norm() / ref.norm())
                    ok = err < 2e-2 and lse_msg is None
                    msg = f"err={err:.2e}" + (f" lse: {lse_msg or 'ok'}" if lse else "")
                except UnsupportedConfigError as exc:
                    ok, msg = True, f"declined: {exc}"
                except Exception as exc:  # noqa: BLE001 - reported per run
                    ok, msg = False, f"{type(exc).__name__}: {exc}"[:300]
                bad += not ok
                print(("ok  " if ok else "BAD ") + f"{variant.name:26s} {op.describe()[:60]:60s} {cfg.key} {msg}",
                      flush=True)
    print(f"{runs} runs, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
