#!/usr/bin/env python3
"""Run-time A/B of one forward switch read by the binding at each call (one build, no rebuild):
the variable at value A against value B, bf16, 16k tokens, hidden 2048, the built head dims among
--head-dims, non-causal and causal, at --seqlens; arms interleaved over 3 rounds, medians.

    python scripts/fwd_env_ab.py FLASH_ATTN_FWD_TMA_O 0 1            # session 26: thread stores vs TMA
    python scripts/fwd_env_ab.py FLASH_ATTN_FWD_WS_PERSISTENT 0 1 --head-dims 128 --seqlens 8192,16384
"""
import argparse
import os
import statistics
import sys

import torch

from flash_attn import flash_attn_func

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import grid_fwd_cells, interleaved_env_medians  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("var")
parser.add_argument("a", help="value of arm A (the baseline)")
parser.add_argument("b", help="value of arm B")
parser.add_argument("--head-dims", default="64,128,256")
parser.add_argument("--seqlens", default="512,1024,2048,8192")
args = parser.parse_args()

print(torch.cuda.get_device_name(), torch.__version__, f"{args.var}: A={args.a} B={args.b}", flush=True)
ratios = []
cells = grid_fwd_cells(tuple(int(x) for x in args.head_dims.split(",")), tuple(int(x) for x in args.seqlens.split(",")))
for d, causal, s, flops, q, k, v in cells:
    ta, tb = interleaved_env_medians(args.var, (args.a, args.b), lambda: flash_attn_func(q, k, v, causal=causal))
    ratios.append(ta / tb)
    print(f"d{d:<3} {'causal' if causal else 'full  '} s{s:<5} A {flops / ta * 1e-9:6.1f}  "
          f"B {flops / tb * 1e-9:6.1f} TFLOP/s  ({ta / tb:.3f}x, {(ta - tb) * 1e3:+.1f} us)", flush=True)
print(f"geo-mean A / B time: {statistics.geometric_mean(ratios):.4f}x (> 1: B faster)", flush=True)
