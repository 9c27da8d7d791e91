// Pieces shared by the split-KV kernels (sm80/flash_fwd_splitkv_kernel.h and
// sm80/flash_fwd_splitkv_cta_kernel.h, SM80-class, and sm90/flash_fwd_decode_sm90.h, the sm_90a
// bulk-copy one): the split's key tiles, the Q load, the rows' state with the per-tile score
// modifiers and masks, and the end-of-kernel merge of the warps' softmax states with the store of
// the (partial) output. The kernels give each warp its own keys, 16 packed rows and its own online
// softmax.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/kv_index_check.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// Programmatic dependent launch (sm_90+): the combine kernel is launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so that its launch and CTA setup overlap the
// tail of the split kernel; the split kernels signal launch_dependents at their start (the
// dependent grid is then scheduled once every split CTA has started) and the combine kernel waits
// for the split kernel's completion and memory flush before it reads a partial. Both are no-ops
// before sm_90 and without the launch attribute. (cutlass/arch/grid_dependency_control.h has the
// same two instructions, but only for sm_90a builds and behind the GEMM dispatch headers.)
__forceinline__ __device__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__forceinline__ __device__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// One 16-byte cp.async; pred false zero-fills the 16 bytes (source size 0, gmem not read).
__forceinline__ __device__ void cp_async_16_zfill(void *smem, const void *gmem, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_size = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
#endif
}

// A split-KV CTA's block of work, from the grid (b * h_k, blocks of kBlockM packed rows, splits):
// packed row p of the block (p0 <= p < p0 + kBlockM) is (query p / g, query head bidh_k * g + p % g),
// so the g query heads of KV head bidh_k share one read of K and V (GQA packing).
template <int kBlockM_>
struct SplitKVBlock {
    static constexpr int kBlockM = kBlockM_;
    int m_block, split, bidb, bidh_k, g;
    int kv_error;  // the sequence's bad KV-cache index value, when the kernel checks them
    BlockInfo binfo;
    int seqlen_q, seqlen_k, packed_rows, p0, diag;

    __forceinline__ __device__ explicit SplitKVBlock(const FwdParams &params)
        : m_block(blockIdx.y),
          split(blockIdx.z),
          bidb(blockIdx.x / params.h_k),
          bidh_k(blockIdx.x % params.h_k),
          g(params.h_h_k_ratio),
          kv_error(params.kv_index_record == nullptr ? int(kIndexOk) : kv_index_error(params, bidb)),
          binfo(params, bidb, kv_error != kIndexOk),
          seqlen_q(binfo.seqlen_q),
          seqlen_k(binfo.seqlen_k),
          packed_rows(seqlen_q * g),
          p0(m_block * kBlockM),
          diag(seqlen_k - seqlen_q) {
        // The sequence's first CTA reports.
        if (kv_error != kIndexOk && threadIdx.x == 0 && m_block == 0 && split == 0 && bidh_k == 0) {
            report_kv_index_error(params, bidb, kv_error);
        }
    }
    // No packed row of the block is in the sequence (uniform over the CTA).
    __forceinline__ __device__ bool empty() const { return p0 >= packed_rows; }
};

// A split's key tiles: [begin, end) in units of the kernel's tile (none when end <= begin).
struct SplitKVTiles {
    int begin, end;
};

// The keys the block's packed rows can see (the sequence, cut by the causal / sliding window
// bounds), in whole tiles of kTileKeys keys, and the block's split's share of them.
template <int kTileKeys, typename Block>
__forceinline__ __device__ SplitKVTiles splitkv_split_tiles(const FwdParams &params, Block const &blk) {
    constexpr int kBlockM = Block::kBlockM;
    const int p0 = blk.p0, packed_rows = blk.packed_rows, g = blk.g, seqlen_k = blk.seqlen_k, diag = blk.diag,
              split = blk.split;
    const int i_first = p0 / g;
    const int i_last_q = (min(p0 + kBlockM, packed_rows) - 1) / g;
    int n_begin = 0, n_end = seqlen_k;
    if (params.window_right < kWindowUnbounded) n_end = max(0, min(n_end, i_last_q + diag + params.window_right + 1));
    if (params.window_left < kWindowUnbounded) n_begin = max(0, i_first + diag - params.window_left);
    const int t_begin = n_begin / kTileKeys;
    const int t_end = n_end > n_begin ? ceil_div(n_end, kTileKeys) : t_begin;
    const int tiles_per_split = ceil_div(t_end - t_begin, params.num_splits);
    const int s_begin = t_begin + split * tiles_per_split;
    return {s_begin, min(t_end, s_begin + tiles_per_split)};
}

// splitkv_split_tiles with the block-table entries checked, where the kernel checks the index
// values (kv_index_record, paged keys): a split whose keys lie on a page with a bad entry reads no
// key (its tiles come back empty). The m_block 0, head 0 CTA of each split also checks its share
// of the row's pages in use (the host checks' columns, in num_splits shares: together they cover
// the pages a window skips too) and reports the share's first bad entry. In one pass over both
// ranges before the kernel's first page load (the entries stay in L1 for that load); uniform over
// the CTA. kMayBePaged false: a kernel compiled for contiguous keys only.
template <int kTileKeys, bool kMayBePaged = true, typename Block>
__device__ SplitKVTiles splitkv_checked_tiles(const FwdParams &params, Block const &blk) {
    const SplitKVTiles tiles = splitkv_split_tiles<kTileKeys>(params, blk);
    if (!kMayBePaged || params.kv_index_record == nullptr || params.block_table == nullptr || blk.kv_error != kIndexOk) return tiles;
    const int page = params.page_block_size, leftpad = blk.binfo.leftpad_k;
    int read_lo = 0, read_hi = 0;
    if (tiles.end > tiles.begin) {
        read_lo = (leftpad + tiles.begin * kTileKeys) / page;
        read_hi = ceil_div(leftpad + min(tiles.end * kTileKeys, blk.seqlen_k), page);
    }
    int share_lo = 0, share_hi = 0;
    if (blk.m_block == 0 && blk.bidh_k == 0) {
        const int in_use = kv_pages_in_use(params, blk.bidb), share = ceil_div(in_use, params.num_splits);
        share_lo = min(in_use, blk.split * share), share_hi = min(in_use, share_lo + share);
    }
    const int lo = share_lo < share_hi ? min(read_lo, share_lo) : read_lo;
    const int hi = max(read_hi, share_hi);
    const int *row = params.block_table + int64_t(blk.bidb) * params.block_table_batch_stride;
    bool bad_read = false, bad_share = false;
    for (int c = lo + int(threadIdx.x); c < hi; c += int(blockDim.x)) {
        if (kv_page_bad(params, row[c])) {
            bad_read |= c >= read_lo && c < read_hi;
            bad_share |= c >= share_lo && c < share_hi;
        }
    }
    if (__syncthreads_or(bad_share) && threadIdx.x == 0) {
        int col = share_lo;
        while (!kv_page_bad(params, row[col])) ++col;
        bool earlier = false;  // a bad entry of the row before this share: its split reports it
        for (int c = 0; c < share_lo && !earlier; ++c) earlier = kv_page_bad(params, row[c]);
        if (!earlier) report_kv_page_error(params, blk.bidb, col);
    }
    return __syncthreads_or(bad_read) ? SplitKVTiles{tiles.begin, tiles.begin} : tiles;
}

// Q of the block's packed rows into sQ (cp.async, zero-filled past the last row and past d; the
// caller fences).
template <int kHeadDim, int kNThreads, typename Element, typename Block, typename TensorQ>
__forceinline__ __device__ void splitkv_load_q(const FwdParams &params, Block const &blk, TensorQ &sQ, int tidx) {
    using index_t = int64_t;
    constexpr int kBlockM = Block::kBlockM;
    const BlockInfo &binfo = blk.binfo;
    const int p0 = blk.p0, packed_rows = blk.packed_rows, g = blk.g, bidb = blk.bidb, bidh_k = blk.bidh_k;
    constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
    const Element *q_base = reinterpret_cast<const Element *>(params.q_ptr) +
                            binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb);
    for (int idx = tidx; idx < kBlockM * kChunksPerRow; idx += kNThreads) {
        const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
        const int p = p0 + r;
        const bool ok = p < packed_rows && c < params.d;
        const Element *src = ok ? q_base + index_t(p / g) * params.q_row_stride +
                                      index_t(bidh_k * g + p % g) * params.q_head_stride + c
                                : q_base;
        cp_async_16_zfill(&sQ(r, c), src, ok);
    }
}

// Q's A-operand fragment of S = Q K^T, copied from shared memory (tSsQ: this thread's partition)
// into registers, so that the K tiles are the only ldmatrix traffic of the S GEMMs.
template <typename TensorSQ, typename TensorRQ, typename Copy, typename ThrCopy>
__forceinline__ __device__ void splitkv_q_to_regs(TensorSQ const &tSsQ, TensorRQ &tSrQ, Copy const &smem_copy_Q,
                                                  ThrCopy const &thr_smem_copy_Q) {
    Tensor tSrQ_view = thr_smem_copy_Q.retile_D(tSrQ);
    cute::copy(smem_copy_Q, tSsQ, tSrQ_view);
}

// Online-softmax step of one warp tile that skips O *= exp(m_old - m_new) when no row of the tile
// raised its running max (a warp vote; after the first tiles the max rarely moves). Multiplying by 1
// is exact, so the result is bitwise that of softmax.update.
template <typename Softmax, typename TensorS, typename TensorO>
__forceinline__ __device__ void splitkv_softmax_update_skip_rescale(Softmax &softmax, TensorS &acc_s, TensorO &acc_o,
                                                                    float scale_log2) {
    const auto rescale = softmax.template update_scores</*kFirst=*/false>(acc_s, scale_log2);
    bool moved = false;
    CUTE_UNROLL
    for (int mi = 0; mi < size(rescale); ++mi) { moved |= rescale(mi) != 1.f; }
    if (__any_sync(0xffffffffu, moved)) { softmax.rescale_o(acc_o, rescale); }
}

// Per-row state of this thread's kNRows packed rows of the block (blk.p0 + the row of
// coords_s_rc(mi, 0)): the query index (for the causal / window mask; -1 past the end) and, with
// kMod, the ALiBi slope of the row's query head as -slope / scale_softmax (as ScoreMod: the bias is
// added before scaling).
template <bool kMod, int kNRows, typename TensorC, typename Block>
__forceinline__ __device__ void splitkv_row_state(const FwdParams &params, TensorC const &coords_s_rc, Block const &blk,
                                                  int (&row_q)[kNRows], float (&alibi_slope)[kNRows]) {
    const int p0 = blk.p0, packed_rows = blk.packed_rows, g = blk.g, bidb = blk.bidb, bidh_k = blk.bidh_k;
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        const int p = p0 + get<0>(coords_s_rc(mi, 0));
        row_q[mi] = p < packed_rows ? p / g : -1;
        if constexpr (kMod) {
            const int head = bidh_k * g + p % g;
            alibi_slope[mi] = params.alibi_slopes_ptr == nullptr || p >= packed_rows
                                  ? 0.f
                                  : -params.alibi_slopes_ptr[bidb * params.alibi_slopes_batch_stride + head] /
                                        params.scale_softmax;
        }
    }
}

// Softcap and ALiBi (kMod only), then the key masks (past the end of the sequence, causal /
// sliding window) of one kBlockNw-key score tile whose first key is col0. row_q: the query index
// of this thread's rows (-1 past the end); alibi_slope: -slope / scale_softmax of their heads.
template <bool kMod, int kBlockNw, int kNRows, typename TensorS, typename TensorC>
__forceinline__ __device__ void splitkv_mod_and_mask(TensorS &acc_s, TensorC const &coords_s_rc, const int (&row_q)[kNRows],
                                                     const float (&alibi_slope)[kNRows], int col0, int seqlen_k,
                                                     int diag, bool needs_row_mask, const FwdParams &params) {
    if constexpr (kMod) {
        Tensor s_rc = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
        if (params.softcap_scale > 0.f) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) { acc_s(i) = tanhf(acc_s(i) * params.softcap_scale); }
        }
        if (params.alibi_slopes_ptr != nullptr) {
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(s_rc); ++ni) {
                    const int dist = row_q[mi] + diag - col0 - get<1>(coords_s_rc(mi, ni));
                    s_rc(mi, ni) += alibi_slope[mi] * float(dist < 0 ? -dist : dist);
                }
            }
        }
    }
    if (col0 + kBlockNw > seqlen_k || needs_row_mask) {
        Tensor s_rc = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            const int i = row_q[mi];
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(s_rc); ++ni) {
                const int col = col0 + get<1>(coords_s_rc(mi, ni));
                const bool masked = (col >= seqlen_k) | (col > i + diag + params.window_right) |
                                    (col < i + diag - params.window_left);
                s_rc(mi, ni) = masked ? -INFINITY : s_rc(mi, ni);
            }
        }
    }
}

// Merges the warps of a CTA, O = sum_w exp(m_w - M) O_w / L with L = sum_w exp(m_w - M) l_w, and
// writes the block's packed rows: out / softmax_lse when num_splits == 1 (with the learnable sink,
// as OnlineSoftmax::finalize), else this split's fp32 partial output and LSE, both without the
// sink (the combine adds it once). smem_merge: kNWarps * kBlockM * (kHeadDim + 2) floats that no warp reads
// any more (the caller synchronises the CTA before the call).
template <int kNWarps, int kHeadDim, int kNThreads, typename Element, typename Block, typename ThrMma,
          typename TensorO, typename Softmax>
__forceinline__ __device__ void splitkv_merge_and_store(const FwdParams &params, Block const &blk, float *smem_merge,
                                                        ThrMma const &thr_mma, TensorO &acc_o, Softmax &softmax,
                                                        int tidx) {
    constexpr int kBlockM = Block::kBlockM;
    const BlockInfo &binfo = blk.binfo;
    const int p0 = blk.p0, packed_rows = blk.packed_rows, bidb = blk.bidb, bidh_k = blk.bidh_k, split = blk.split;
    using index_t = int64_t;
    constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of the output row
    const int warp = tidx / 32;
    const int g = params.h_h_k_ratio;
    float *s_o = smem_merge;                        // (kNWarps, kBlockM, kHeadDim)
    float *s_max = s_o + kNWarps * kBlockM * kHeadDim;  // (kNWarps, kBlockM)
    float *s_sum = s_max + kNWarps * kBlockM;           // (kNWarps, kBlockM)
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
    Tensor coords_o = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor coords_o_rc = make_tensor(coords_o.data(), acc_layout_rowcol(coords_o.layout()));
    constexpr int kNRows = decltype(size<0>(coords_o_rc))::value;
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        const float sum = quad_allreduce(softmax.row_sum(mi), SumOp{});
        const int r = get<0>(coords_o_rc(mi, 0));
        if (get<1>(coords_o_rc(mi, 0)) == 0) {
            s_max[warp * kBlockM + r] = softmax.row_max(mi);
            s_sum[warp * kBlockM + r] = sum;
        }
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) {
            s_o[(warp * kBlockM + r) * kHeadDim + get<1>(coords_o_rc(mi, ni))] = acc_o_rc(mi, ni);
        }
    }
    __syncthreads();

    // One thread per (row, 8 columns); rows past the end are skipped.
    const float scale_log2 = params.scale_softmax_log2;
    for (int idx = tidx; idx < kBlockM * kChunksPerRow; idx += kNThreads) {
        const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
        const int p = p0 + r;
        if (p >= packed_rows || c >= params.d) continue;
        float m = -INFINITY;
        CUTE_UNROLL
        for (int w = 0; w < kNWarps; ++w) { m = fmaxf(m, s_max[w * kBlockM + r]); }
        float l = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        CUTE_UNROLL
        for (int w = 0; w < kNWarps; ++w) {
            const float mw = s_max[w * kBlockM + r];
            const float f = mw == -INFINITY ? 0.f : exp2f((mw - m) * scale_log2);
            l += f * s_sum[w * kBlockM + r];
            CUTE_UNROLL
            for (int e = 0; e < 8; ++e) { o[e] += f * s_o[(w * kBlockM + r) * kHeadDim + c + e]; }
        }
        const bool empty = l == 0.f || l != l;
        const float inv_l = empty ? 0.f : 1.f / l;
        // Natural-log LSE of the (split's) row; empty: +inf (final) or -inf (partial).
        const int i = p / g, head = bidh_k * g + p % g;
        if (params.num_splits == 1) {
            const float sink = learnable_sink_of(params, head);
            float lse, o_factor = inv_l;
            if (sink == -INFINITY) {
                lse = empty ? INFINITY : m * params.scale_softmax + __logf(l);
            } else {
                const float m_nat = empty ? -INFINITY : m * params.scale_softmax;
                const float m_all = fmaxf(m_nat, sink);
                const float kept = empty ? 0.f : __expf(m_nat - m_all);
                const float denom = l * kept + __expf(sink - m_all);
                lse = m_all + __logf(denom);
                o_factor = kept / denom;
            }
            Element *out = reinterpret_cast<Element *>(params.o_ptr) +
                           binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) +
                           index_t(i) * params.o_row_stride + index_t(head) * params.o_head_stride + c;
            uint4 packed;
            Element *pe = reinterpret_cast<Element *>(&packed);
            CUTE_UNROLL
            for (int e = 0; e < 8; ++e) { pe[e] = Element(o[e] * o_factor); }
            *reinterpret_cast<uint4 *>(out) = packed;
            if (c == 0) {
                params.softmax_lse_ptr[(binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                                       head * params.lse_head_stride + i] = lse;
            }
        } else {
            const float lse = empty ? -INFINITY : m * params.scale_softmax + __logf(l);
            // (split, b, h, seqlen_q, head_dim_tile) and (split, b, h, seqlen_q); dense q only.
            const index_t row = ((index_t(split) * params.b + bidb) * params.h + head) * params.seqlen_q + i;
            float *oacc = params.oaccum_ptr + row * params.head_dim_tile + c;
            *reinterpret_cast<float4 *>(oacc) = make_float4(o[0] * inv_l, o[1] * inv_l, o[2] * inv_l, o[3] * inv_l);
            *reinterpret_cast<float4 *>(oacc + 4) = make_float4(o[4] * inv_l, o[5] * inv_l, o[6] * inv_l, o[7] * inv_l);
            if (c == 0) params.lse_accum_ptr[row] = lse;
        }
    }
}

}  // namespace flash
