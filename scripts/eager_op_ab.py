#!/usr/bin/env python3
"""A/B of the eager dispatch of flash_attn_func (branch eager-direct): the autograd Functions call
the op implementations directly (default) or through the registered custom ops
(FLASH_ATTN_EAGER_OP=1), interleaved rounds, forward+backward ms (do_bench median), bf16 d128,
16k tokens: short sequences and the window (512, 0) feature case, where launch overhead shows.

    python scripts/eager_op_ab.py [--rounds 3]
"""

import argparse
import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cases = [(512, {}), (1024, {}), (8192, {"window_size": (512, 0)}), (8192, {"causal": True})]
    for seqlen, kw in cases:
        b, h, d = 16384 // seqlen, 16, 128
        q, k, v = [torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3)]
        dout = torch.randn_like(q)

        def fb():
            torch.autograd.grad(flash_attn_func(q, k, v, **kw), (q, k, v), dout)

        times = {"direct": [], "op": []}
        for _ in range(args.rounds):
            for mode, env in (("direct", "0"), ("op", "1")):
                os.environ["FLASH_ATTN_EAGER_OP"] = env
                times[mode].append(do_bench(fb, warmup=25, rep=200))
        med = {m: sorted(t)[len(t) // 2] for m, t in times.items()}
        print(f"seqlen {seqlen:5d} {kw!s:28s} f+b ms: direct {med['direct']:.3f}  op {med['op']:.3f}  "
              f"op / direct {med['op'] / med['direct']:.3f}")


if __name__ == "__main__":
    main()
