#!/usr/bin/env python3
"""Cells for the mask A/B (branch s25-mask-bounds, prepared in session 24): forward and backward
TFLOP/s of masked calls (causal, sliding window) and unmasked controls, bf16, 16k tokens, hidden
2048; one `FWD <tag> d<D> <mode> s<S> <TFLOP/s>` line per cell (fwd_so_ab_table's format; backward
cells have modes starting with `bwd_`). Run once per build with the build's tag:

    python scripts/mask_ab_cells.py new
"""
import sys

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func

tag = sys.argv[1]
for d in (64, 128, 256):
    for mode, seqlens, kw in (("full", (512, 2048), {}), ("causal", (512, 1024, 2048, 8192), {"causal": True}),
                              ("win256", (8192,), {"window_size": (256, 0)})):
        for s in seqlens:
            h, b = 2048 // d, 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if kw.get("causal") else 1)
            if mode == "win256":
                flops = 4 * b * h * s * 257 * d  # visible keys per row ~ 257
            with torch.no_grad():
                ms = do_bench(lambda: flash_attn_func(q, k, v, **kw), warmup=25, rep=100)
            print(f"FWD {tag} d{d} {mode} s{s} {flops / ms * 1e-9:.1f}", flush=True)
            out = flash_attn_func(q, k, v, **kw)
            dout = torch.randn_like(out)
            ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=100)
            print(f"FWD {tag} d{d} bwd_{mode} s{s} {2.5 * flops / ms * 1e-9:.1f}", flush=True)
