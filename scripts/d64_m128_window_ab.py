#!/usr/bin/env python3
"""A/B of the d64 forward's tile rows (FLASH_ATTN_FWD_WS_D64_M=192 / 128) on sliding-window and
mid-length causal calls (bf16, 16k tokens, 32 heads): where else the 128-row tiles win.

    python scripts/d64_m128_window_ab.py
"""
import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func

cases = [(s, True, (-1, -1)) for s in (1024, 1536, 2048)]
cases += [(s, False, w) for s in (2048, 8192) for w in ((256, 0), (512, 0), (1024, 0), (256, 256))]
for s, causal, window in cases:
    b, h, d = 16384 // s, 32, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cells = []
    for rows in ("192", "128"):
        os.environ["FLASH_ATTN_FWD_WS_D64_M"] = rows
        ms = do_bench(lambda: flash_attn_func(q, k, v, causal=causal, window_size=window), warmup=25, rep=100)
        cells.append(ms)
    os.environ.pop("FLASH_ATTN_FWD_WS_D64_M")
    print(f"d64 s{s:<5} {'causal' if causal else 'window'} {str(window):<12} M=192 {cells[0] * 1e3:7.1f} us  "
          f"M=128 {cells[1] * 1e3:7.1f} us  ({cells[0] / cells[1]:.3f}x)", flush=True)
