// The passes around every backward kernel: the preprocess (softmax_d = rowsum(dO * O), dq_accum
// zeroed) and the dQ conversion (dq = dq_accum * scale in the input dtype), and their launch around
// the main kernel.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/launch_check.h"
#include "common/mask.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// Preprocess / convert: a group of kLanes lanes per (row, head, batch), 8 elements (one 16-byte
// vector of dO / O / dQ) per lane, kLanes the power of two >= head_dim_tile / 8: every lane of a
// warp busy at any head dim (one warp per row left 24 of 32 lanes idle at d64, and those kernels
// took 2x cuDNN's time for the same bytes: ncu).
constexpr int kPassThreads = 256;

template <int kLanes>
__forceinline__ __device__ unsigned lane_group_mask() {
    const int lane = threadIdx.x % 32;
    return kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1u) << (lane & ~(kLanes - 1));
}

// The swizzle of dq_accum's rows (BwdParams::dq_accum_swizzled): float c of row r (counted from
// the sequence's row 0; every dQ tile starts at a multiple of 8 rows) sits at c ^
// dq_accum_swizzle(r), which permutes the four 8-float groups of each 32-float span by bits 1-2 of
// the row. The WS backward's tiles go to shared memory in this layout with conflict-free stores:
// row-major float2 stores (8 rows x 8 floats a warp: rows 2 i and 2 i + 1 on one 8-bank group,
// 2 wavefronts, the minimum for 256 bytes) and the swapped dQ^T's 4-byte stores (rows q0 + {0, 1}
// for lanes with q0 = 2 (lane % 4), 8 head-dim columns: 32 banks, 1 wavefront).
__host__ __device__ __forceinline__ constexpr int dq_accum_swizzle(int row) { return ((row >> 1) & 3) << 3; }

// Row index of (batch bidb, head bidh, query row 0) in softmax_d and dq_accum. Dense: (b, h,
// seqlen_q_rounded). Varlen: (h, accum_rows), sequence b at cu_seqlens_q[b] + 128 * b, so the
// rows a 128-row (or smaller) query block rounds up to stay inside the sequence's own padding.
__forceinline__ __device__ int64_t accum_row0(const BwdParams &params, const BlockInfo &binfo, int bidb, int bidh) {
    return binfo.sum_s_q == -1 ? (int64_t(bidb) * params.h + bidh) * params.seqlen_q_rounded
                               : int64_t(bidh) * params.accum_rows + binfo.sum_s_q + 128 * int64_t(bidb);
}

// softmax_d = rowsum(dO * O) and, with params.dq_accum_zero_in_preprocess, the row's dq_accum
// zeroed: rows < seqlen_q_rounded, and in varlen only the sequence's own rows and its 128 rows of
// padding (the main kernels add into rows < round_up(seqlen_q, kBlockM) <= both bounds).
// dO's and O's head dim: params.d, or (kOwnHeadDimV: flash_bwd_preprocess_dv_kernel) params.dv.
template <typename Element, int kLanes, bool kOwnHeadDimV>
__forceinline__ __device__ void bwd_preprocess_row(BwdParams const &params) {
    constexpr int kRows = kPassThreads / kLanes;
    const int lane = threadIdx.x % kLanes;
    const int row = blockIdx.x * kRows + threadIdx.x / kLanes;
    const int bidb = blockIdx.y, bidh = blockIdx.z;
    const BlockInfo binfo(params, bidb);
    // A lane group leaves (or stays) as a whole: its shuffles name only its own lanes.
    if (row >= params.seqlen_q_rounded) return;
    const bool padding = row >= binfo.seqlen_q;
    if (padding && binfo.sum_s_q != -1 && row >= binfo.seqlen_q + 128) return;  // another sequence's rows
    const int64_t row_index = accum_row0(params, binfo, bidb, bidh) + row;
    if (params.dq_accum_zero_in_preprocess) {
        float4 *acc_row = reinterpret_cast<float4 *>(params.dq_accum_ptr + row_index * params.head_dim_tile);
        for (int c = lane; c < params.head_dim_tile / 4; c += kLanes) { acc_row[c] = make_float4(0.f, 0.f, 0.f, 0.f); }
    }
    if (padding) {  // never read as a row's value: 0
        if (lane == 0) params.softmax_d_ptr[row_index] = 0.f;
        return;
    }
    const Element *do_row = reinterpret_cast<const Element *>(params.do_ptr) +
                            binfo.q_offset(params.do_batch_stride, params.do_row_stride, bidb) +
                            bidh * params.do_head_stride + int64_t(row) * params.do_row_stride;
    const Element *o_row = reinterpret_cast<const Element *>(params.o_ptr) +
                           binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) +
                           bidh * params.o_head_stride + int64_t(row) * params.o_row_stride;
    float dot = 0.f;
    // d / dv is a multiple of 8: 16-byte vectors
    for (int c = lane * 8; c < (kOwnHeadDimV ? params.dv : params.d); c += kLanes * 8) {
        const uint4 a = *reinterpret_cast<const uint4 *>(do_row + c);
        const uint4 b = *reinterpret_cast<const uint4 *>(o_row + c);
        const Element *ea = reinterpret_cast<const Element *>(&a);
        const Element *eb = reinterpret_cast<const Element *>(&b);
        CUTE_UNROLL
        for (int i = 0; i < 8; ++i) { dot += float(ea[i]) * float(eb[i]); }
    }
    const unsigned mask = lane_group_mask<kLanes>();
    CUTE_UNROLL
    for (int offset = kLanes / 2; offset > 0; offset /= 2) { dot += __shfl_xor_sync(mask, dot, offset); }
    if (lane == 0) params.softmax_d_ptr[row_index] = dot;
}

template <typename Element, int kLanes>
__global__ void __launch_bounds__(kPassThreads) flash_bwd_preprocess_kernel(const __grid_constant__ BwdParams params) {
    bwd_preprocess_row<Element, kLanes, false>(params);
}
// The backward with a V head dim of its own (params.dv < params.d: DeepSeek MLA's 192 / 128).
template <typename Element, int kLanes>
__global__ void __launch_bounds__(kPassThreads) flash_bwd_preprocess_dv_kernel(const __grid_constant__ BwdParams params) {
    bwd_preprocess_row<Element, kLanes, true>(params);
}

// dq = dq_accum * scale in the input dtype (summing the slices of the deterministic modes).
// kSwizzled: params.dq_accum_swizzled (its own kernel: the run-time form spilled at 32 registers).
template <typename Element, int kLanes, bool kSwizzled = false>
__global__ void __launch_bounds__(kPassThreads) flash_bwd_convert_dq_kernel(const __grid_constant__ BwdParams params) {
    constexpr int kRows = kPassThreads / kLanes;
    const int lane = threadIdx.x % kLanes;
    const int row = blockIdx.x * kRows + threadIdx.x / kLanes;
    const int bidb = blockIdx.y, bidh = blockIdx.z;
    const BlockInfo binfo(params, bidb);
    if (row >= binfo.seqlen_q) return;
    const float *acc_row = params.dq_accum_ptr + (accum_row0(params, binfo, bidb, bidh) + row) * params.head_dim_tile;
    Element *dq_row = reinterpret_cast<Element *>(params.dq_ptr) +
                      binfo.q_offset(params.dq_batch_stride, params.dq_row_stride, bidb) +
                      bidh * params.dq_head_stride + int64_t(row) * params.dq_row_stride;
    const int splits = params.dq_accum_splits > 1 ? params.dq_accum_splits : 1;
    // Bit s: slice s holds this row (splits <= 8; the deterministic sm_90a backward sums its
    // slices in order). With params.dq_store_first the slices are not zeroed and slice s holds a
    // row only if key block s's first write (a store) covered it.
    uint32_t holds = 0xffu;
    if (params.dq_store_first) {
        const Mask mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
        const int bm = params.dq_slice_block_m, bn = params.dq_slice_block_n;
        const int n_blocks = ceil_div(binfo.seqlen_k, bn);
        holds = 0;
        for (int s = 0; s < splits && s < n_blocks; ++s) {
            int m_min, m_max;
            mask.m_block_range(s * bn, bn, bm, m_min, m_max);
            if (row >= m_min * bm && row < m_max * bm) holds |= 1u << s;
        }
    }
    for (int c = lane * 8; c < params.d; c += kLanes * 8) {
        float vals[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < splits; ++s) {
            if (!(holds >> s & 1u)) continue;
            const float *slice = acc_row + int64_t(s) * params.dq_accum_split_stride;
            // (kSwizzled: float c of the row at c ^ dq_accum_swizzle(row); c is a multiple of 8.)
            const int swz = kSwizzled ? dq_accum_swizzle(row) : 0;
            const float4 a = *reinterpret_cast<const float4 *>(slice + (c ^ swz));
            const float4 b = *reinterpret_cast<const float4 *>(slice + ((c + 4) ^ swz));
            vals[0] += a.x, vals[1] += a.y, vals[2] += a.z, vals[3] += a.w;
            vals[4] += b.x, vals[5] += b.y, vals[6] += b.z, vals[7] += b.w;
        }
        uint4 packed;
        Element *out = reinterpret_cast<Element *>(&packed);
        CUTE_UNROLL
        for (int i = 0; i < 8; ++i) { out[i] = Element(vals[i] * params.scale_softmax); }
        *reinterpret_cast<uint4 *>(dq_row + c) = packed;
    }
}

// Every backward: softmax_d = rowsum(dO * O) (and dq_accum zeroed), the main kernel
// (launch_main), dq conversion. kMaySwizzle: the launching kernel may set
// params.dq_accum_swizzled (the warp-specialised ones), so the swizzled conversion is compiled too.
// kOwnHeadDimV: softmax_d over params.dv columns (flash_bwd_preprocess_dv_kernel).
template <typename Element, int kLanes, bool kMaySwizzle, bool kOwnHeadDimV, typename LaunchMain>
void launch_bwd_passes_lanes(BwdParams &params, cudaStream_t stream, LaunchMain &&launch_main) {
    constexpr int kRows = kPassThreads / kLanes;
    const dim3 grid_rows(ceil_div(params.seqlen_q_rounded, kRows), params.b, params.h);
    if constexpr (kOwnHeadDimV) {
        flash_bwd_preprocess_dv_kernel<Element, kLanes><<<grid_rows, kPassThreads, 0, stream>>>(params);
    } else {
        flash_bwd_preprocess_kernel<Element, kLanes><<<grid_rows, kPassThreads, 0, stream>>>(params);
    }
    FLASH_CHECK_LAUNCH();
    launch_main();
    if constexpr (kMaySwizzle) {
        if (params.dq_accum_swizzled) {
            flash_bwd_convert_dq_kernel<Element, kLanes, true><<<grid_rows, kPassThreads, 0, stream>>>(params);
            FLASH_CHECK_LAUNCH();
            return;
        }
    }
    if (params.dq_accum_swizzled) {  // never set for these kernels; a loud error rather than a wrong dq
        record_launch_error(cudaErrorInvalidValue, "swizzled dq_accum from a kernel that never swizzles", __FILE__,
                            __LINE__);
        return;
    }
    flash_bwd_convert_dq_kernel<Element, kLanes><<<grid_rows, kPassThreads, 0, stream>>>(params);
    FLASH_CHECK_LAUNCH();
}

// The passes' lane group per row: one 16-byte vector per lane over the launching kernel's
// head-dim tile (32, 64, 96 / 128, 192 / 256: 4, 8, 16, 32 lanes; 96 and 192 leave a quarter
// idle). Fixed at compile time by that kernel's tile, so that each translation unit compiles
// one set of passes (the passes' loops are correct for any lane count: only their speed
// depends on it), not all four.
template <int kHeadDimTile>
constexpr int kPassLanes = kHeadDimTile <= 32 ? 4 : kHeadDimTile <= 64 ? 8 : kHeadDimTile <= 128 ? 16 : 32;

template <typename Element, int kHeadDimTile, bool kMaySwizzle = false, bool kOwnHeadDimV = false, typename LaunchMain>
void launch_bwd_passes(BwdParams &params, cudaStream_t stream, LaunchMain &&launch_main) {
    launch_bwd_passes_lanes<Element, kPassLanes<kHeadDimTile>, kMaySwizzle, kOwnHeadDimV>(params, stream, launch_main);
}

}  // namespace flash
