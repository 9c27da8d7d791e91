#!/usr/bin/env python3
"""Heats the GPU and its HBM the way a long benchmark grid does, for a fixed time: a loop of
bf16 8192^3 matmuls (the die at its power limit) and 2 GB device copies (the HBM busy).
Session 28 (issue 4): our decode reads ~1% below cuDNN's on a fresh machine but ~1.5% below after
the benchmark grid (sessions 25 and 27: 4418 vs 4482-4484 GB/s); this makes that state on purpose,
so that decode variants can be timed cold and hot in one run.

    python scripts/gpu_heat.py [--seconds 90]
"""
import argparse
import subprocess
import time

import torch


def smi():
    q = "temperature.gpu,temperature.memory,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active"
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=" + q, "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return "nvidia-smi failed: %s" % e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90.0)
    args = ap.parse_args()
    print("before (gpu C, mem C, SM MHz, mem MHz, W, reasons):", smi(), flush=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(1024 * 1024 * 1024 // 2, device="cuda", dtype=torch.bfloat16)  # 1 GB
    dst = torch.empty_like(src)
    t0, n = time.time(), 0
    while time.time() - t0 < args.seconds:
        for _ in range(8):
            c = a @ b
        dst.copy_(src)
        src.copy_(dst)
        torch.cuda.synchronize()
        n += 1
        if n % 50 == 0:
            print("%5.0f s: %s" % (time.time() - t0, smi()), flush=True)
    del c
    print("after %.0f s (%d loops): %s" % (time.time() - t0, n, smi()), flush=True)


if __name__ == "__main__":
    main()
