#!/usr/bin/env python3
"""SM clock and board power while one forward runs back to back (session 26's question: do the
long d >= 128 forwards run power-capped, so that instructions saved per tile also raise the
clock?). For each cell (bf16, 16k tokens, hidden 2048, seqlen 8k / 512, causal off / on; ours and
SDPA's cuDNN backend) the call loops 1.2 s to settle nvidia-smi's ~1 s power average, then ~1.5 s
while `nvidia-smi` samples clocks.sm, power.draw and the clock-limit reasons every 50 ms; prints
the median SM clock, median power, TFLOP/s of the loop and the most frequent reasons bitmask
(0x4 = SW power cap, 0x1 = idle, 0x8 = HW slowdown, 0x20 / 0x40 = thermal; nvidia-smi -q).
Session 27's first run (no settle) read the first cell after idle ~100-280 W low.

    python scripts/clock_probe.py [--head-dims 64,128,256] [--seqlens 8192,512] [--seconds 1.5] [--bwd] [--matmul]
                                  [--q-scale 1e-3]
"""
import argparse
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

from flash_attn import flash_attn_func

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--head-dims", default="64,128,256")
parser.add_argument("--seconds", type=float, default=1.5)
parser.add_argument("--seqlens", default="8192,512")
parser.add_argument("--matmul", action="store_true", help="first a bf16 8192^3 torch.matmul (a dense-wgmma baseline)")
parser.add_argument("--q-scale", type=float, default=1.0,
                    help="multiply q by this (1e-3: scores ~0, P near-uniform: does the operand data move the power?)")
parser.add_argument("--bwd", action="store_true", help="also the backward at 8k (gradients of a prebuilt graph)")
args = parser.parse_args()


def _smi_fields():
    """clocks.sm, power.draw and, where this driver has it, the active clock-limit reasons."""
    for extra in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        fields = f"clocks.sm,power.draw,{extra}"
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.count(",") == 2:
            return fields
    return "clocks.sm,power.draw"


SMI_FIELDS = _smi_fields()


def sample_while(fn, seconds, settle=1.2):
    """Run fn back to back for `settle` s (nvidia-smi's power.draw is a ~1 s average: without this
    the first cell after idle or a different cell reads low, session 27), then `seconds` more under
    an nvidia-smi sampler; (clock MHz, watts, ms per call, most frequent clock-limit reasons)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    calls, t0 = 0, time.perf_counter()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    n_fields = SMI_FIELDS.count(",") + 1
    rows = [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()
            if line.count(",") == n_fields - 1][2:]  # the first samples may precede the loop
    clocks = [float(r[0]) for r in rows]
    watts = [float(r[1]) for r in rows]
    reasons = statistics.mode([r[2] for r in rows]) if n_fields == 3 and rows else "-"
    return statistics.median(clocks), statistics.median(watts), start.elapsed_time(end) / calls, reasons


def cudnn_fwd(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


def backward_fn(fwd, q, k, v):
    """The backward alone: gradients of one prebuilt forward graph, kept for every call."""
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    out = fwd(qg, kg, vg)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
print(f"{'cell':<24} {'impl':<6} {'SM MHz':>7} {'W':>6} {'TFLOP/s':>8}  limit reasons ({SMI_FIELDS.split(',')[-1]})")
with torch.no_grad():
    if args.matmul:
        a, bm = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        mhz, watts, ms, why = sample_while(lambda: a @ bm, args.seconds)
        print(f"{'matmul 8192^3':<24} {'torch':<6} {mhz:7.0f} {watts:6.0f} {2 * 8192**3 / ms * 1e-9:8.1f}  {why}", flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                q = q * args.q_scale
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                for impl, fn in (("ours", lambda: flash_attn_func(q, k, v, causal=causal)),
                                 ("cudnn", lambda: cudnn_fwd(q, k, v, causal))):
                    try:
                        mhz, watts, ms, why = sample_while(fn, args.seconds)
                    except Exception as exc:  # noqa: BLE001 (a refused backend is a row, not a stop)
                        print(f"d{d} s{s} {'causal' if causal else 'full'}: {impl} n/a ({type(exc).__name__})")
                        continue
                    cell = f"d{d} s{s} {'causal' if causal else 'full'}"
                    print(f"{cell:<24} {impl:<6} {mhz:7.0f} {watts:6.0f} {flops / ms * 1e-9:8.1f}  {why}", flush=True)
                if args.bwd and s == 8192:
                    with torch.enable_grad():
                        for impl, fwd in (("ours", lambda a, b_, c: flash_attn_func(a, b_, c, causal=causal)),
                                          ("cudnn", lambda a, b_, c: cudnn_fwd(a, b_, c, causal).transpose(1, 2))):
                            try:
                                mhz, watts, ms, why = sample_while(backward_fn(fwd, q, k, v), args.seconds)
                            except Exception as exc:  # noqa: BLE001
                                print(f"d{d} s{s} bwd: {impl} n/a ({type(exc).__name__})")
                                continue
                            cell = f"d{d} s{s} {'causal' if causal else 'full'} bwd"
                            print(f"{cell:<24} {impl:<6} {mhz:7.0f} {watts:6.0f} {2.5 * flops / ms * 1e-9:8.1f}  {why}",
                                  flush=True)
