// The split-KV combine: each row's output from the per-split partial outputs and LSEs (oaccum,
// lse_accum) of the split-KV kernels, SM80-class and sm_90a alike.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "common/launch_check.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// The largest split count (the binding caps num_splits at 128): 4 lse values per lane.
constexpr int kMaxCombineSplits = 128;

// kPerLane consecutive fp32 values at p (p aligned to their size when kPerLane is a power of two).
template <int kPerLane>
__forceinline__ __device__ void load_partial(float (&dst)[kPerLane], const float *p) {
    if constexpr (kPerLane % 4 == 0) {
        CUTE_UNROLL
        for (int e = 0; e < kPerLane; e += 4) {
            const float4 v = *reinterpret_cast<const float4 *>(p + e);
            dst[e] = v.x, dst[e + 1] = v.y, dst[e + 2] = v.z, dst[e + 3] = v.w;
        }
    } else if constexpr (kPerLane % 2 == 0) {
        CUTE_UNROLL
        for (int e = 0; e < kPerLane; e += 2) {
            const float2 v = *reinterpret_cast<const float2 *>(p + e);
            dst[e] = v.x, dst[e + 1] = v.y;
        }
    } else {
        CUTE_UNROLL
        for (int e = 0; e < kPerLane; ++e) { dst[e] = p[e]; }
    }
}

// Merges the splits: lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s. One warp per
// (b, h, query) row. A row with no visible key in any split gets out = 0 and lse = +inf. The
// learnable sink (the partials leave it out) is one more term of the sum that carries no output:
// lse = log(sum_s exp(lse_s) + exp(sink)), so an empty row gets lse = sink.
// Latency is all that matters here (a few hundred rows, partials in L2): lane s holds lse of
// splits s, s + 32, ..., so the row's lse takes one load round; then each lane owns kHeadDim / 32
// consecutive columns and the partials of 8 splits are loaded (vector loads) before any is used,
// so a row costs ~num_splits / 8 dependent load rounds, not num_splits (the serial
// form was 2 + num_splits rounds).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256) flash_fwd_splitkv_combine_kernel(const __grid_constant__ FwdParams params) {
    static_assert(kHeadDim % 32 == 0);
    constexpr int kPerLane = kHeadDim / 32;
    constexpr int kLseRegs = kMaxCombineSplits / 32;
    constexpr int kChunk = 8;  // partials in flight per lane
    pdl_wait_primary();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row = int64_t(blockIdx.x) * 8 + warp;  // over (b, h, seqlen_q)
    const int64_t rows = int64_t(params.b) * params.h * params.seqlen_q;
    if (row >= rows) return;
    const int num_splits = params.num_splits;
    const int64_t split_stride = rows;
    float lse_s[kLseRegs];
    float m = -INFINITY;
    CUTE_UNROLL
    for (int k = 0; k < kLseRegs; ++k) {
        const int s = lane + 32 * k;
        lse_s[k] = s < num_splits ? params.lse_accum_ptr[s * split_stride + row] : -INFINITY;
        m = fmaxf(m, lse_s[k]);
    }
    CUTE_UNROLL
    for (int off = 16; off > 0; off /= 2) { m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, off)); }
    const int i = int(row % params.seqlen_q);
    const int head = int((row / params.seqlen_q) % params.h);
    const int bidb = int(row / (int64_t(params.seqlen_q) * params.h));
    const float sink = learnable_sink_of(params, head);
    m = fmaxf(m, sink);
    float sum = 0.f;
    if (m != -INFINITY) {
        CUTE_UNROLL
        for (int k = 0; k < kLseRegs; ++k) { sum += lse_s[k] == -INFINITY ? 0.f : __expf(lse_s[k] - m); }
    }
    CUTE_UNROLL
    for (int off = 16; off > 0; off /= 2) { sum += __shfl_xor_sync(0xffffffff, sum, off); }
    if (sink != -INFINITY) { sum += __expf(sink - m); }  // once, after the lanes' sums
    const bool empty = m == -INFINITY || sum == 0.f;
    const float lse = empty ? INFINITY : m + __logf(sum);
    // Weight of split lane + 32 k; 0 for empty splits (whose partials are never read: they may hold
    // anything, NaN included).
    float weight[kLseRegs];
    CUTE_UNROLL
    for (int k = 0; k < kLseRegs; ++k) { weight[k] = empty || lse_s[k] == -INFINITY ? 0.f : __expf(lse_s[k] - lse); }

    if (lane == 0) params.softmax_lse_ptr[bidb * params.lse_batch_stride + head * params.lse_head_stride + i] = lse;
    float acc[kPerLane];
    CUTE_UNROLL
    for (int e = 0; e < kPerLane; ++e) { acc[e] = 0.f; }
    const float *partial = params.oaccum_ptr + row * params.head_dim_tile + lane * kPerLane;
    const int64_t partial_split_stride = split_stride * params.head_dim_tile;
    CUTE_UNROLL
    for (int k = 0; k < kLseRegs; ++k) {
        if (32 * k >= num_splits) break;
#pragma unroll 1
        for (int c = 0; c < 32; c += kChunk) {
            const int s0 = 32 * k + c;
            if (s0 >= num_splits) break;
            float part[kChunk][kPerLane];
            CUTE_UNROLL
            for (int j = 0; j < kChunk; ++j) {
                if (s0 + j < num_splits) load_partial<kPerLane>(part[j], partial + (s0 + j) * partial_split_stride);
            }
            CUTE_UNROLL
            for (int j = 0; j < kChunk; ++j) {
                const float w = __shfl_sync(0xffffffff, weight[k], c + j);
                if (s0 + j < num_splits && w != 0.f) {  // warp-uniform
                    CUTE_UNROLL
                    for (int e = 0; e < kPerLane; ++e) { acc[e] += w * part[j][e]; }
                }
            }
        }
    }
    Element *out = reinterpret_cast<Element *>(params.o_ptr) + bidb * params.o_batch_stride +
                   int64_t(i) * params.o_row_stride + int64_t(head) * params.o_head_stride;
    CUTE_UNROLL
    for (int e = 0; e < kPerLane; ++e) {
        const int col = lane * kPerLane + e;
        if (col < params.d) out[col] = Element(acc[e]);
    }
}

// The combine step after a split-KV kernel (nothing to do with one split); with params.decode_pdl
// a programmatic dependent launch (see pdl_launch_dependents).
template <typename Element, int kHeadDim>
void launch_splitkv_combine(FwdParams &params, cudaStream_t stream) {
    if (params.num_splits <= 1) return;
    const int64_t rows = int64_t(params.b) * params.h * params.seqlen_q;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>((rows + 7) / 8));
    config.blockDim = dim3(256);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = params.decode_pdl ? 1 : 0;
    FLASH_CUDA_CHECK(cudaLaunchKernelEx(&config, &flash_fwd_splitkv_combine_kernel<Element, kHeadDim>, params));
    FLASH_CHECK_LAUNCH();
}

}  // namespace flash
