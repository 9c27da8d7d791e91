#!/usr/bin/env python3
"""A/B of the forward's per-call zero fill (session 24): FLASH_ATTN_FWD_ZERO_FILL=1 (rng_state and
the persistent kernel's tile counter zeroed by a fill kernel each call, the behaviour until
session 23) against the default (the kernel writes rng_state; one self-resetting counter per
stream). bf16, 16k tokens, hidden 2048; the arms interleaved over 3 rounds, medians.

    python scripts/fwd_fill_ab.py
"""
import os
import statistics
import sys

import torch

from flash_attn import flash_attn_func
from flash_attn.flash_attn_interface import flash_attn_varlen_func

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import grid_fwd_cells, interleaved_env_medians  # noqa: E402

print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ratios = []
for d, causal, s, _, q, k, v in grid_fwd_cells():
    old, new = (t * 1e3 for t in interleaved_env_medians(
        "FLASH_ATTN_FWD_ZERO_FILL", ("1", "0"), lambda: flash_attn_func(q, k, v, causal=causal)))
    ratios.append(old / new)
    print(f"d{d:<3} {'causal' if causal else 'full  '} s{s:<5} fill {old:8.1f} us  no fill {new:8.1f} us  "
          f"({old / new:.3f}x, {old - new:+.1f} us)", flush=True)
# Varlen (always the dynamic order): 8 sequences of 293..3774 tokens, d128, causal.
lens = [293, 1024, 3774, 2048, 512, 4096, 1800, 2835]
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
q, k, v = (torch.randn(sum(lens), 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
old, new = (t * 1e3 for t in interleaved_env_medians(
    "FLASH_ATTN_FWD_ZERO_FILL", ("1", "0"),
    lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)))
print(f"varlen d128 causal fill {old:8.1f} us  no fill {new:8.1f} us  ({old / new:.3f}x)", flush=True)
print(f"geo-mean fill / no fill over the dense cells: "
      f"{statistics.geometric_mean(ratios):.4f}x (> 1: no fill faster)", flush=True)
