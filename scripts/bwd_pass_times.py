#!/usr/bin/env python3
"""Kernel times of one backward, ours (torch.profiler, CUDA activity): the preprocess kernel
(softmax_d = rowsum(dO * O), and dq_accum zeroed since session 20), the main kernel, the dQ
conversion and any fill kernel, per head dim, bf16, 16k tokens, hidden 2048, non-causal.

    python scripts/bwd_pass_times.py [--seqlens 512,8192] [--headdims 64,128,256]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from flash_attn import flash_attn_func


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="512,8192")
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    for d in (int(x) for x in args.headdims.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            b, h = max(16384 // s, 1), 2048 // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            out = flash_attn_func(q, k, v)
            for _ in range(3):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.reps):
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                torch.cuda.synchronize()
            times = defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    name = e.name
                    key = ("preprocess" if "preprocess" in name else "convert_dq" if "convert_dq" in name else
                           "main" if "flash_bwd" in name else "fill" if "Fill" in name else "other")
                    times[key] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            cells = "  ".join(f"{k} {times[k] / args.reps:8.1f} us" for k in
                              ("preprocess", "main", "convert_dq", "fill", "other"))
            print(f"d{d:<3} s={s:<5} b={b:<3} h={h:<3} {cells}", flush=True)


if __name__ == "__main__":
    main()
