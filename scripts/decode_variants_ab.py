#!/usr/bin/env python3
"""A/B (one process, interleaved rounds) of the wide split-KV kernel's switches on the contiguous
d128 decode shapes of issue 4, next to SDPA cuDNN: bf16, 32 query / 8 KV heads, 1 query token;
batch 16 at 4k and 32k keys, batch 4 at 128k. Variants of FLASH_ATTN_DECODE_SKIP_RESCALE /
FLASH_ATTN_DECODE_L2_PREFETCH / FLASH_ATTN_DECODE_PIPELINE / FLASH_ATTN_DECODE_CTA: plain, skip (the
default), skip + pf, skip + pipeline, cta1 .. cta17 (cuDNN's schedule: FLASH_ATTN_DECODE_CTA's variants).
Checks first that the wide-kernel variants give bitwise the same out / LSE (the cta ones: max
difference from skip). GB/s = bytes of K and V / median time (triton do_bench, median of --rounds rounds).

A mode name may carry the suffixes ":sN" (num_splits=N) and ":nopdl" (FLASH_ATTN_DECODE_PDL=0: the
combine kernel, where num_splits > 1, launched without programmatic dependent launch). Mode "paged" runs a 16-token paged copy of
the cache (the sm_90a bulk-copy kernel), "pagedcta" the same through the CTA-schedule kernel
(FLASH_ATTN_DECODE_PAGED_CTA=1, the default since session 17). --clean adds a second timer whose L2 flush reads a
256 MB buffer (clean lines) instead of do_bench's zero fill (dirty lines, written back during the
timed kernel).

    python scripts/decode_variants_ab.py [--rounds 5] [--modes skip,cta11,cta11:s2,paged,...] [--clean]
"""
import argparse
import os
import sys
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flash_attn import flash_attn_with_kvcache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import event_median_ms  # noqa: E402

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
            "cta15": ("1", "0", "0", "15"), "cta16": ("1", "0", "0", "16"),
            "cta17": ("1", "0", "0", "17")}
MODES = tuple(MODE_ENV)
# FLASH_ATTN_AB_KERNELS=1 builds (the default build has the wide kernel and the CTA default only)
AB_ONLY = ("skip+pipe",) + tuple("cta%d" % i for i in range(1, 18) if i != 11)


PAGE = 16


def parse_mode(mode):
    """(base mode, num_splits) of a mode name such as "cta11:s2" or "cta11:s4:nopdl"."""
    name, *suffixes = mode.split(":")
    splits = [int(x[1:]) for x in suffixes if x.startswith("s")]
    return name, splits[0] if splits else 0


def set_mode(mode):
    base = parse_mode(mode)[0]
    for var, value in zip(VARS, MODE_ENV[{"paged": "skip", "pagedcta": "cta11"}.get(base, base)]):
        os.environ[var] = value
    os.environ["FLASH_ATTN_DECODE_PAGED_CTA"] = "1" if base == "pagedcta" else "0"
    os.environ["FLASH_ATTN_DECODE_PDL"] = "0" if "nopdl" in mode.split(":")[1:] else "1"


def paged_copy(k, v):
    """k, v as shuffled 16-token pages and the block table."""
    b, s = k.shape[:2]
    nblk = (s + PAGE - 1) // PAGE
    perm = torch.randperm(b * nblk, device=k.device)
    out = []
    for t in (k, v):
        t = F.pad(t, (0, 0, 0, 0, 0, nblk * PAGE - s)).reshape(b * nblk, PAGE, *t.shape[2:])
        t2 = torch.empty_like(t)
        t2[perm] = t
        out.append(t2)
    return out[0], out[1], perm.view(b, nblk).to(torch.int32)


def bench_clean(fn, flush, reps=40):
    """Median ms of fn after an L2 flush that reads (not writes) a 256 MB buffer."""
    return event_median_ms(fn, reps=reps, warmup=3, before=flush.sum)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="", help="comma-separated mode names (default: all that are built)")
    ap.add_argument("--clean", action="store_true", help="also time with a read-only L2 flush")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    import flash_attn._C as ext

    built = [m for m in MODES if ext.ab_kernels_built() or m not in AB_ONLY] + ["paged", "pagedcta"]
    modes = [m for m in args.modes.split(",") if parse_mode(m)[0] in built] if args.modes else built
    for b, s in ((16, 4096), (16, 32768), (4, 131072)):
        torch.manual_seed(b + s)
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, HK, D, device="cuda", dtype=torch.bfloat16)
        kp, vp, table = paged_copy(k, v) if any(parse_mode(m)[0].startswith("paged") for m in modes) else (None, None, None)
        seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")

        def call(mode, **kw):
            base, splits = parse_mode(mode)
            if base.startswith("paged"):
                return flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table,
                                               num_splits=splits, **kw)
            return flash_attn_with_kvcache(q, k, v, num_splits=splits, **kw)

        outs = {}
        for mode in modes:
            set_mode(mode)
            outs[mode] = call(mode, return_softmax_lse=True)
        ref = outs[modes[0]]
        # The wide kernel's switches keep results bitwise; other kernels / split counts: max difference.
        bitwise = [m for m in modes if parse_mode(m)[0] in ("plain", "skip", "skip+pf", "skip+pipe") and parse_mode(m)[1] == 0]
        same = all(torch.equal(outs[m][0], ref[0]) and torch.equal(outs[m][1], ref[1]) for m in bitwise)
        diff = max([(o[0].float() - ref[0].float()).abs().max().item() for m, o in outs.items() if m not in bitwise],
                   default=0.0)
        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        def ours(mode):
            def f():
                set_mode(mode)
                call(mode)
            return f

        fns = {m: ours(m) for m in modes}
        fns["cudnn"] = cudnn
        times = {n: [] for n in fns}
        clean = {n: [] for n in fns}
        flush = torch.randn(64 * 1024 * 1024, device="cuda") if args.clean else None  # 256 MB
        for _ in range(args.rounds):
            for n, f in fns.items():
                try:
                    times[n].append(do_bench(f, warmup=25, rep=200))
                    if args.clean:
                        clean[n].append(bench_clean(f, flush))
                except Exception as e:  # noqa: BLE001
                    print("  %s failed: %s" % (n, str(e).splitlines()[0]))
        gb = 2 * k.numel() * k.element_size() / 1e9
        cells = ["%s %5.0f" % (n, gb / (statistics.median(t) * 1e-3)) for n, t in times.items() if t]
        print("b=%-3d s=%-7d bitwise equal: %s, others' max diff %.2e   GB/s: %s" % (b, s, same, diff, "  ".join(cells)),
              flush=True)
        if args.clean:
            cells = ["%s %5.0f" % (n, gb / (statistics.median(t) * 1e-3)) for n, t in clean.items() if t]
            print("      read-only L2 flush           GB/s: %s" % "  ".join(cells), flush=True)
        del kp, vp, flush
    for var in VARS + ("FLASH_ATTN_DECODE_PAGED_CTA", "FLASH_ATTN_DECODE_PDL"):
        os.environ.pop(var, None)


if __name__ == "__main__":
    main()
