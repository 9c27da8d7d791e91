#!/usr/bin/env python3
"""Which shapes make the warp-specialised sm_90a backward (FLASH_ATTN_BWD_WS=1) fail? Each shape
runs in its own process (an illegal instruction kills the CUDA context), one forward + backward,
dq / dk / dv compared with the lock-step backward (FLASH_ATTN_BWD_WS=0) in the same process.

    python scripts/probe_bwd_ws.py [--dtype bf16] [--sanitize]   # --sanitize: first failure under compute-sanitizer
"""
import argparse
import subprocess
import sys

CHILD = r'''
import os, sys, torch
from flash_attn import flash_attn_func
d, sq, sk, b, h, hk = (int(x) for x in sys.argv[1:7])
causal, dt = sys.argv[7] == "1", sys.argv[8]
dtype = torch.bfloat16 if dt == "bf16" else torch.float16
torch.manual_seed(0)
q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
do = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
out = flash_attn_func(q, k, v, causal=causal)
os.environ["FLASH_ATTN_BWD_WS"] = "0"
g0 = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
os.environ["FLASH_ATTN_BWD_WS"] = "1"
g1 = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
print("maxdiff dq %.2e dk %.2e dv %.2e" % tuple((a.float() - c.float()).abs().max().item() for a, c in zip(g0, g1)))
'''

SHAPES = []
for d in (64, 128):
    for sq, sk in ((1, 1), (1, 300), (17, 17), (63, 63), (64, 64), (65, 65), (127, 127), (128, 128), (129, 129),
                   (191, 191), (192, 192), (193, 193), (300, 1), (300, 300), (17, 4096), (4096, 17)):
        SHAPES.append((d, sq, sk, 2, 4, 2, 0))
SHAPES += [(64, 1, 1, 1, 1, 1, 0), (64, 64, 64, 1, 1, 1, 0), (64, 1, 1, 2, 4, 2, 1), (64, 300, 300, 2, 4, 2, 1),
           (128, 1, 1, 1, 1, 1, 0), (64, 128, 1, 1, 1, 1, 0), (64, 1, 128, 1, 1, 1, 0)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    first_fail = None
    for shape in SHAPES:
        argv = [str(x) for x in shape] + [args.dtype]
        r = subprocess.run([sys.executable, "-c", CHILD] + argv, capture_output=True, text=True, timeout=60)
        lines = (r.stdout + r.stderr).strip().splitlines()
        msg = lines[-1] if r.returncode == 0 else next((l for l in lines if "Error" in l), lines[-1] if lines else "")
        print("%s d%-3d sq%-5d sk%-5d b%d h%d/%d causal%d  %s" % ("ok  " if r.returncode == 0 else "FAIL", *shape, msg[:150]),
              flush=True)
        if r.returncode != 0 and first_fail is None:
            first_fail = argv
    if args.sanitize and first_fail is not None:
        print("\ncompute-sanitizer on", first_fail, flush=True)
        r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--show-backtrace", "device", sys.executable, "-c",
                            CHILD] + first_fail, capture_output=True, text=True, timeout=180)
        out = (r.stdout + r.stderr).splitlines()
        print("\n".join([l for l in out if "=========" in l][:60]))


if __name__ == "__main__":
    main()
