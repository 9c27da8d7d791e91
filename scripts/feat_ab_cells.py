#!/usr/bin/env python3
"""Feature-kernel forward cells for two-build A/Bs (session 26: conditional rescaling in the
softcap / ALiBi / dropout forwards, PART=S26F): TFLOP/s of flash_attn_func, bf16, 16k tokens,
hidden 2048, head dims 128 / 256 where built, seqlen 2k / 8k; plain, dropout 0.1, ALiBi (also
causal) and softcap 30. One `FWD <tag> d<D> <mode> s<S> <TFLOP/s>` line per cell
(gpu_check_common.fwd_so_ab_table's format). Run once per build:

    python scripts/feat_ab_cells.py lazy8
"""
import sys

import torch
from triton.testing import do_bench

import flash_attn._C as ext
from flash_attn import flash_attn_func

tag = sys.argv[1]
built = {tuple(c) for c in ext.built_configs()}
for d in (128, 256):
    if ("bf16", d) not in built:
        continue
    h = 2048 // d
    slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.3
    cells = {"plain": {}, "dropout": {"dropout_p": 0.1}, "alibi": {"alibi_slopes": slopes},
             "alibi_causal": {"alibi_slopes": slopes, "causal": True}, "softcap": {"softcap": 30.0}}
    for mode, kwargs in cells.items():
        for s in (2048, 8192):
            b = 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if kwargs.get("causal") else 1)
            with torch.no_grad():
                ms = do_bench(lambda: flash_attn_func(q, k, v, **kwargs), warmup=25, rep=100)
            print(f"FWD {tag} d{d} {mode} s{s} {flops / ms * 1e-9:.1f}", flush=True)
