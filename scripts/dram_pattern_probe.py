#!/usr/bin/env python3
"""Does the order in which a decode kernel reads the KV cache change the DRAM bandwidth it gets?
(issue 4: our decode and cuDNN's read at the same ~4.5 TB/s; the last 0.2% at 32k.)

Both decode kernels give each CTA one (batch, KV head) and read that head's 256-byte rows, which sit
2 KB apart in the (batch, seqlen, 8 heads, 128) cache. A CTA that owned a key range of a batch for
all its heads would read contiguous 2 KB rows instead. This probe times the two access orders alone
(no attention math), with the same bytes, CTA count, threads and loads in flight per CTA:

  per-head:     CTA (b, h) reads K and V rows (b, s, h, :) for every s (the decode kernels' order);
  head-major:   CTA (b, q) reads K and V rows (b, s, :, :) for s in the q-th of h_k key ranges;
  per-head-rev: per-head with the CTA index order (h, b) instead of (b, h).
  flat-G:       G CTAs, CTA i copying the i-th of G contiguous pieces of K and of V (session 21: do
                all 132 SMs read faster than the decode kernels' 128 CTAs? a stream-K decode
                would split the (batch, KV head, key tile) space this way).

Each CTA (256 threads) copies 32 KB per step with cp.async into a 3-stage shared-memory ring (up to
96 KB in flight, as the CTA decode kernel), nothing computed. Shapes: the issue-4 decode shapes (b16 4k and 32k,
b4 128k: 32 / 128 / 128 CTAs). GB/s = K and V bytes / median time, CUDA events after an L2 flush
that reads a 256 MB buffer; rounds interleaved.

    python scripts/dram_pattern_probe.py [--rounds 5]
"""
import argparse
import statistics

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <algorithm>

__device__ __forceinline__ void cp_async_16(uint4 *smem, const uint4 *gmem) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem));
}

constexpr int kStages = 3;  // 32 KB per stage: up to 96 KB in flight per CTA, as the decode kernel
constexpr int kPerThread = 8;  // 16-byte copies per thread per stage: 4 of K, 4 of V

// mode 0: per-head (CTA = b * hk + h); 1: head-major (CTA = b * hk + q, key range q of hk);
// 2: per-head, CTA = h * batch + b; 3: flat, gridDim.x contiguous pieces of the whole cache. 256
// threads; a row of one head is 16 chunks of 16 bytes.
template <int kMode>
__global__ void __launch_bounds__(256) probe_kernel(const uint4 *k, const uint4 *v, int batch, int seqlen, int hk,
                                                     uint4 *out) {
    extern __shared__ uint4 ring[];  // kStages x kPerThread x 256
    const int t = threadIdx.x;
    const int64_t row_chunks = int64_t(hk) * 16;  // 16-byte chunks per (b, s) row of all heads
    int steps;
    int64_t base;
    const int64_t total = int64_t(batch) * seqlen * row_chunks;  // 16-byte chunks of K (and of V)
    constexpr int kStepChunks = 256 * kPerThread / 2;
    if (kMode == 3) {
        const int64_t total_steps = (total + kStepChunks - 1) / kStepChunks;
        const int64_t per_cta = (total_steps + gridDim.x - 1) / gridDim.x;
        const int64_t first = int64_t(blockIdx.x) * per_cta;
        base = first * kStepChunks;
        steps = int(first >= total_steps ? 0 : (total_steps - first < per_cta ? total_steps - first : per_cta));
    } else if (kMode == 1) {
        const int b = blockIdx.x / hk, q = blockIdx.x % hk;
        const int rows = seqlen / hk;
        base = (int64_t(b) * seqlen + int64_t(q) * rows) * row_chunks;
        steps = int(int64_t(rows) * row_chunks / (256 * kPerThread / 2));
    } else {
        const int b = kMode == 0 ? blockIdx.x / hk : blockIdx.x % batch;
        const int h = kMode == 0 ? blockIdx.x % hk : blockIdx.x / batch;
        base = int64_t(b) * seqlen * row_chunks + int64_t(h) * 16;
        steps = seqlen / (16 * kPerThread / 2);  // 16 rows x 16 chunks per copy round
    }
    auto issue = [&](int step) {
        uint4 *dst = ring + (step % kStages) * (kPerThread * 256);
#pragma unroll
        for (int u = 0; u < kPerThread / 2; ++u) {
            int64_t i;
            if (kMode == 3) {
                i = base + int64_t(step) * kStepChunks + u * 256 + t;
                if (i >= total) continue;
            } else if (kMode == 1) {
                i = base + int64_t(step) * (256 * kPerThread / 2) + u * 256 + t;  // contiguous 4 KB per u
            } else {
                const int s = step * (16 * kPerThread / 2) + u * 16 + t / 16;
                i = base + int64_t(s) * row_chunks + (t % 16);  // 256-byte rows, 2 KB apart
            }
            cp_async_16(dst + (2 * u) * 256 + t, k + i);
            cp_async_16(dst + (2 * u + 1) * 256 + t, v + i);
        }
        asm volatile("cp.async.commit_group;");
    };
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
        __syncthreads();  // stage step landed for every thread; stage step - 1 is free
        if (step + kStages - 1 < steps) issue(step + kStages - 1);
        else asm volatile("cp.async.commit_group;");
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    out[int64_t(blockIdx.x) * 256 + t] = ring[t];
}

void probe(torch::Tensor k, torch::Tensor v, int64_t mode, int64_t ctas, torch::Tensor out) {
    const int batch = k.size(0), seqlen = k.size(1), hk = k.size(2);
    TORCH_CHECK(k.size(3) == 128 && k.element_size() == 2 && k.is_contiguous() && v.is_contiguous());
    TORCH_CHECK(seqlen % (hk * 64) == 0);
    TORCH_CHECK(out.numel() * 4 >= std::max<int64_t>(ctas, batch * hk) * 256 * 16);
    const dim3 grid(mode == 3 ? ctas : batch * hk);
    auto stream = c10::cuda::getCurrentCUDAStream().stream();
    auto kp = reinterpret_cast<const uint4 *>(k.data_ptr()), vp = reinterpret_cast<const uint4 *>(v.data_ptr());
    auto op = reinterpret_cast<uint4 *>(out.data_ptr());
    const int smem = kStages * kPerThread * 256 * 16;
    static bool attr_set = false;
    if (!attr_set) {
        for (auto f : {probe_kernel<0>, probe_kernel<1>, probe_kernel<2>, probe_kernel<3>}) {
            C10_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        }
        attr_set = true;
    }
    if (mode == 0) probe_kernel<0><<<grid, 256, smem, stream>>>(kp, vp, batch, seqlen, hk, op);
    else if (mode == 1) probe_kernel<1><<<grid, 256, smem, stream>>>(kp, vp, batch, seqlen, hk, op);
    else if (mode == 2) probe_kernel<2><<<grid, 256, smem, stream>>>(kp, vp, batch, seqlen, hk, op);
    else probe_kernel<3><<<grid, 256, smem, stream>>>(kp, vp, batch, seqlen, hk, op);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

CPP_SRC = "void probe(torch::Tensor k, torch::Tensor v, int64_t mode, int64_t ctas, torch::Tensor out);"
# name: (mode, CTAs of the flat mode)
MODES = {"per-head": (0, 0), "head-major": (1, 0), "per-head-rev": (2, 0), "flat-128": (3, 128), "flat-132": (3, 132),
         "flat-264": (3, 264)}


def time_ms(fn, flush, reps=30):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(3):
        fn()
    for i in range(reps):
        flush.sum()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ext = load_inline("dram_pattern_probe", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, functions=["probe"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"], verbose=False)
    flush = torch.randn(64 * 1024 * 1024, device="cuda")  # 256 MB, read (clean lines) before each call
    print(torch.cuda.get_device_name(), torch.__version__)
    for b, s in ((16, 4096), (16, 32768), (4, 131072)):
        torch.manual_seed(b + s)
        k = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty(max(b * 8, 264) * 256 * 4, dtype=torch.int32, device="cuda")
        times = {name: [] for name in MODES}
        for _ in range(args.rounds):
            for name, (mode, ctas) in MODES.items():
                times[name].append(time_ms(lambda: ext.probe(k, v, mode, ctas, out), flush))
        gb = 2 * k.numel() * k.element_size() / 1e9
        cells = "  ".join("%s %5.0f" % (n, gb / (statistics.median(t) * 1e-3)) for n, t in times.items())
        print("b=%-3d s=%-7d CTAs %3d  GB/s: %s" % (b, s, b * 8, cells), flush=True)
        del k, v


if __name__ == "__main__":
    main()
