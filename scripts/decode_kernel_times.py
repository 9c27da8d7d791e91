#!/usr/bin/env python3
"""Decode (issue 4 shape: bf16 d128, 32 q / 8 kv heads, 1 query token): where the time goes for
ours and SDPA-cuDNN. For each size, three numbers per backend:
  * do_bench median (what benchmarks/benchmark_attn.py --decode reports: L2 flushed before each
    call, CUDA events around the Python call, so host-side gaps inside the call count);
  * the same call replayed from a CUDA graph (no host work in the timed region);
  * the GPU kernels' own time from the profiler (sum of the call's kernels, median over calls)
    and the kernel names.
If ours trails cuDNN in do_bench but not in kernel time, the gap is host-side or a second kernel.

    python scripts/decode_kernel_times.py
"""

import statistics

import torch
import torch.nn.functional as F
import triton.testing
from torch.profiler import ProfilerActivity, profile

from flash_attn import flash_attn_with_kvcache

CONFIGS = ((16, 4096), (16, 32768), (4, 131072))
H, HK, D = 32, 8, 128


def kernel_times(fn, calls=20):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    per_name = {}
    for e in prof.events():
        # Not the L2 flush (flush.zero_(): a FillFunctor elementwise kernel).
        if e.device_type == torch.autograd.DeviceType.CUDA and "fill" not in e.name.lower():
            per_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    total = sum(statistics.median(v) for v in per_name.values())
    names = ", ".join(f"{n[:60]} x{len(v) // calls}" for n, v in per_name.items())
    return total / 1e3, names  # ms


def graph_ms(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print("decode bf16 d128, 32 q / 8 kv heads, 1 token: GB/s (K+V bytes / time)")
    for b, sk in CONFIGS:
        kv_bytes = 2 * b * sk * HK * D * 2
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def ours():
            return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

        with torch.no_grad():
            ref = cudnn().transpose(1, 2).float()
            err = (ours().float() - ref).abs().max().item()
            for name, fn in (("ours", ours), ("cudnn", cudnn)):
                t_bench = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                try:
                    t_graph = graph_ms(fn)
                except Exception as e:  # noqa: BLE001
                    t_graph = float("nan")
                    print(f"  {name}: graph capture failed: {type(e).__name__}: {e}")
                t_kern, names = kernel_times(fn)
                gbps = [kv_bytes / (t * 1e-3) / 1e9 for t in (t_bench, t_graph, t_kern)]
                print(f"b{b:<3} sk {sk:<7} {name:<6} do_bench {gbps[0]:6.0f}  graph {gbps[1]:6.0f}  "
                      f"kernels {gbps[2]:6.0f}  ({t_bench * 1e3:7.1f} / {t_graph * 1e3:7.1f} / "
                      f"{t_kern * 1e3:7.1f} us)  {names}", flush=True)
        print(f"  max |ours - cudnn| = {err:.2e}")


if __name__ == "__main__":
    main()
