#!/usr/bin/env python3
"""A/B of FLASH_ATTN_BWD_WS_DET_HEAD_GROUP (how many heads' key blocks the deterministic causal
WS backward interleaves in its launch order): backward ms of the --features configuration (bf16,
seqlen 8192, batch 2, nheads 2048 / d, causal) for each group size and for the default
(non-deterministic) backward, in interleaved rounds, plus a bitwise check across group sizes.

    python scripts/det_head_group_ab.py [--headdims 64,128,256] [--groups 1,2,4] [--rounds 5]
"""
import argparse
import os
import statistics

import torch
import triton.testing as tt

from flash_attn import flash_attn_func


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--groups", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    groups = args.groups.split(",")
    print("bf16 seqlen 8192 batch 2 nheads 2048/d causal; backward ms (do_bench median, median of %d "
          "interleaved rounds); det / default" % args.rounds)
    for d in [int(x) for x in args.headdims.split(",")]:
        h = 2048 // d
        q, k, v = (torch.randn(2, 8192, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        outs = {det: flash_attn_func(q, k, v, causal=True, deterministic=det) for det in (False, True)}

        def bwd(det):
            return torch.autograd.grad(outs[det], (q, k, v), dout, retain_graph=True)
        ref = None
        for g in groups:
            os.environ["FLASH_ATTN_BWD_WS_DET_HEAD_GROUP"] = g
            grads = bwd(True)
            if ref is None:
                ref = grads
            same = all(torch.equal(a, b) for a, b in zip(grads, ref))
            if not same:
                print("  d%d group %s: gradients differ from group %s" % (d, g, groups[0]))
        times = {name: [] for name in ["default"] + ["det g%s" % g for g in groups]}
        for _ in range(args.rounds):
            times["default"].append(tt.do_bench(lambda: bwd(False), warmup=25, rep=100, return_mode="median"))
            for g in groups:
                os.environ["FLASH_ATTN_BWD_WS_DET_HEAD_GROUP"] = g
                times["det g%s" % g].append(tt.do_bench(lambda: bwd(True), warmup=25, rep=100, return_mode="median"))
        base = statistics.median(times["default"])
        cells = ["%s %.3f" % (n, statistics.median(t)) + ("" if n == "default" else " (%.3fx)" % (statistics.median(t) / base))
                 for n, t in times.items()]
        print("d%-4d %s" % (d, " | ".join(cells)), flush=True)
        os.environ.pop("FLASH_ATTN_BWD_WS_DET_HEAD_GROUP", None)


if __name__ == "__main__":
    main()
