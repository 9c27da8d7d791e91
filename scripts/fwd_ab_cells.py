#!/usr/bin/env python3
"""Forward cells for two-build A/Bs (session 25: branch s26-fwd-next's conditional rescaling,
PART=S26C): TFLOP/s of flash_attn_func, bf16, 16k tokens, hidden 2048, every built head dim of
64 / 128 / 256, non-causal and causal, seqlen 512 .. 8k; one `FWD <tag> d<D> <mode> s<S> <TFLOP/s>`
line per cell (gpu_check_common.fwd_so_ab_table's format). Run once per build:

    python scripts/fwd_ab_cells.py lazy8
"""
import sys

import torch
from triton.testing import do_bench

import flash_attn._C as ext
from flash_attn import flash_attn_func

tag = sys.argv[1]
built = {tuple(c) for c in ext.built_configs()}
for d in (64, 128, 256):
    if ("bf16", d) not in built:
        continue
    for mode in ("full", "causal"):
        causal = mode == "causal"
        for s in (512, 1024, 2048, 8192):
            h, b = 2048 // d, 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            with torch.no_grad():
                ms = do_bench(lambda: flash_attn_func(q, k, v, causal=causal), warmup=25, rep=100)
            print(f"FWD {tag} d{d} {mode} s{s} {flops / ms * 1e-9:.1f}", flush=True)
