#!/usr/bin/env python3
"""A/B of the forward epilogue's TMA store of O (branch s26-tma-store): FLASH_ATTN_FWD_TMA_O=0
(16-byte stores by every consumer thread from the staged tile, main's epilogue) against the
default (one TMA store per warpgroup tile). bf16, 16k tokens, hidden 2048, d64 / d128 / d256 as
built, non-causal and causal, seqlen 512 .. 8k; the arms interleaved over 3 rounds, medians.

    python scripts/fwd_tma_o_ab.py
"""
import os
import statistics
import sys

import torch

from flash_attn import flash_attn_func

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import grid_fwd_cells, interleaved_env_medians  # noqa: E402

print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ratios = []
for d, causal, s, flops, q, k, v in grid_fwd_cells():
    old, new = interleaved_env_medians("FLASH_ATTN_FWD_TMA_O", ("0", "1"), lambda: flash_attn_func(q, k, v, causal=causal))
    ratios.append(old / new)
    print(f"d{d:<3} {'causal' if causal else 'full  '} s{s:<5} threads {flops / old * 1e-9:6.1f}  "
          f"TMA {flops / new * 1e-9:6.1f} TFLOP/s  ({old / new:.3f}x, {(old - new) * 1e3:+.1f} us)", flush=True)
print(f"geo-mean threads / TMA time: {statistics.geometric_mean(ratios):.4f}x (> 1: TMA faster)", flush=True)
