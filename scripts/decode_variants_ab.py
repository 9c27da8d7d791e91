#!/usr/bin/env python3
"""A/B (one process, interleaved rounds) of the wide split-KV kernel's switches on the contiguous
d128 decode shapes of issue 4, next to SDPA cuDNN: bf16, 32 query / 8 KV heads, 1 query token;
batch 16 at 4k and 32k keys, batch 4 at 128k. Variants of FLASH_ATTN_DECODE_SKIP_RESCALE /
FLASH_ATTN_DECODE_L2_PREFETCH / FLASH_ATTN_DECODE_PIPELINE / FLASH_ATTN_DECODE_CTA: plain, skip (the
default), skip + pf, skip + pipeline, cta1 .. cta15 (cuDNN's schedule: FLASH_ATTN_DECODE_CTA's variants).
Checks first that the wide-kernel variants give bitwise the same out / LSE (the cta ones: max
difference from skip). GB/s = bytes of K and V / median time (triton do_bench, median of --rounds rounds).

    python scripts/decode_variants_ab.py [--rounds 5] [--modes skip,cta1,...]
"""
import argparse
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache

H, HK, D = 32, 8, 128
VARS = ("FLASH_ATTN_DECODE_SKIP_RESCALE", "FLASH_ATTN_DECODE_L2_PREFETCH", "FLASH_ATTN_DECODE_PIPELINE",
        "FLASH_ATTN_DECODE_CTA")
# mode name -> values of VARS
MODE_ENV = {"plain": ("0", "0", "0", "0"), "skip": ("1", "0", "0", "0"), "skip+pf": ("1", "1", "0", "0"),
            "skip+pipe": ("1", "0", "1", "0"), "cta1": ("1", "0", "0", "1"), "cta2": ("1", "0", "0", "2"),
            "cta3": ("1", "0", "0", "3"), "cta4": ("1", "0", "0", "4"), "cta5": ("1", "0", "0", "5"),
            "cta6": ("1", "0", "0", "6"), "cta7": ("1", "0", "0", "7"), "cta8": ("1", "0", "0", "8"),
            "cta9": ("1", "0", "0", "9"), "cta10": ("1", "0", "0", "10"), "cta11": ("1", "0", "0", "11"),
            "cta12": ("1", "0", "0", "12"), "cta13": ("1", "0", "0", "13"), "cta14": ("1", "0", "0", "14"),
            "cta15": ("1", "0", "0", "15")}
MODES = tuple(MODE_ENV)
# FLASH_ATTN_AB_KERNELS=1 builds (the default build has the wide kernel and the CTA default only)
AB_ONLY = ("skip+pipe",) + tuple("cta%d" % i for i in range(1, 16) if i != 11)


def set_mode(mode):
    for var, value in zip(VARS, MODE_ENV[mode]):
        os.environ[var] = value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="", help="comma-separated mode names (default: all that are built)")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    import flash_attn._C as ext

    modes = [m for m in MODES if ext.ab_kernels_built() or m not in AB_ONLY]
    if args.modes:
        modes = [m for m in modes if m in args.modes.split(",")]
    for b, s in ((16, 4096), (16, 32768), (4, 131072)):
        torch.manual_seed(b + s)
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, HK, D, device="cuda", dtype=torch.bfloat16)
        outs = {}
        for mode in modes:
            set_mode(mode)
            outs[mode] = flash_attn_with_kvcache(q, k, v, return_softmax_lse=True)
        ref = outs[modes[0]]
        same = all(torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]) for m, o in outs.items()
                   if not m.startswith("cta"))
        diff = max([(o[0].float() - ref[0].float()).abs().max().item() for m, o in outs.items() if m.startswith("cta")],
                   default=0.0)
        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        def ours(mode):
            def f():
                set_mode(mode)
                flash_attn_with_kvcache(q, k, v)
            return f

        fns = {m: ours(m) for m in modes}
        fns["cudnn"] = cudnn
        times = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, f in fns.items():
                try:
                    times[n].append(do_bench(f, warmup=25, rep=200))
                except Exception as e:  # noqa: BLE001
                    print("  %s failed: %s" % (n, str(e).splitlines()[0]))
        gb = 2 * k.numel() * k.element_size() / 1e9
        cells = ["%s %5.0f" % (n, gb / (statistics.median(t) * 1e-3)) for n, t in times.items() if t]
        print("b=%-3d s=%-7d bitwise equal: %s, cta max diff %.2e   GB/s: %s" % (b, s, same, diff, "  ".join(cells)),
              flush=True)
    for var in VARS:
        os.environ.pop(var, None)


if __name__ == "__main__":
    main()
