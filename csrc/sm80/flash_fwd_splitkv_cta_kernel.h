// Split-KV decode at d = 128 with cuDNN's schedule: the default for contiguous caches without
// softcap / ALiBi (flash_fwd_splitkv_launch.h: 64-key CTA tiles, 4 warps x 16 keys, K and V
// together, 3 buffers).
//
// The wide kernel (flash_fwd_splitkv_kernel.h) lets each of 8 warps stream its own 16-key tiles
// through its own ring: up to 192 KB of K / V in flight per SM, issued by 8 independent streams.
// cuDNN's decode kernel (ncu) reads the same bytes at 94-96% of DRAM peak against the
// wide kernel's 91-93.5% with the opposite shape: 4 warps, one CTA per (batch, KV head), 128-key
// CTA tiles (each warp takes 32 keys of a tile), K and V loaded by the whole CTA one 32 KB burst
// at a time, ~86 KB of shared memory. This kernel is that schedule:
//
//   top:  barrier (every warp is past P V of tile it - 1)  -> issue V(it + S - 1)
//   A:    wait K(it), barrier                               -> S = Q K(it)^T, masks, softmax
//   B:    wait V(it), barrier (every warp is past S(it))    -> issue K(it + S); O += P V(it)
//
// with S = kStages buffers each of K and V (S = 1 is cuDNN's 64 KB); kTogether issues K and V of a
// tile together at the top (no step B barrier). The warps keep their own online softmax and merge
// at the end (splitkv_merge_and_store), as in the wide kernel; the splits are whole CTA tiles.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/splitkv_merge.h"
#include "sm80/flash_fwd_splitkv_kernel.h"
#include "common/kernel_traits.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// kNWarps 4 (cuDNN's) or 8 (16 keys per warp, two warps per scheduler); kTogether: K and V of a
// tile issued together at the top of the loop (one barrier fewer, no K / V alternation).
// kBlockN_: keys per CTA tile (128; 64 for the A/B variants with more, smaller bursts).
template <typename Element_, int kStages_, int kNWarps_ = 4, bool kTogether_ = false, int kBlockN_ = 128>
struct SplitKVCtaTraits {
    using Element = Element_;
    static constexpr int kHeadDim = 128;
    static constexpr int kBlockM = 16;  // packed rows per CTA
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr int kBlockN = kBlockN_;             // keys per CTA tile
    static constexpr int kBlockNw = kBlockN / kNWarps;   // keys per warp of a tile
    static constexpr int kStages = kStages_;
    static constexpr bool kTogether = kTogether_;
    static_assert(!kTogether || kStages >= 2, "together with one buffer would leave nothing in flight");
    // One warp's view (16 rows x 32 keys): MMA, swizzled smem layouts, ldmatrix atoms.
    using WarpTraits = FwdKernelTraits<kHeadDim, kBlockM, kBlockNw, 1, Element>;
    static constexpr int kSubTileElems = kBlockNw * kHeadDim;  // one warp's keys of K (or V)
    static constexpr int kTileElems = kBlockN * kHeadDim;
    static constexpr int kQElems = kBlockM * kHeadDim;
    static constexpr int kRingElems = kStages * kTileElems;  // the K ring; the V ring follows it
    static constexpr int kMergeBytes = kNWarps * kBlockM * kHeadDim * 4 + 2 * kNWarps * kBlockM * 4;
    static_assert(kMergeBytes <= 2 * kRingElems * int(sizeof(Element)));
    static constexpr int kSmemSize = (kQElems + 2 * kRingElems) * int(sizeof(Element));
};

// Block-table entry of each 16-key chunk of CTA tile `tile` (0 past seqlen_k): a thread's rows
// of a chunk lie in one power-of-two page, so the tile's copies need no division per row.
template <int kBlockN, int kPageChunks>
__forceinline__ __device__ void splitkv_cta_load_pages(int (&chunk_page)[kPageChunks], const int *block_table, int tile,
                                                       int seqlen_k, int page_shift) {
    CUTE_UNROLL
    for (int c = 0; c < kPageChunks; ++c) {
        const int key = tile * kBlockN + 16 * c;
        chunk_page[c] = key < seqlen_k ? block_table[key >> page_shift] : 0;
    }
}

// One tensor's (K or V) tile `tile` into buffer `stage` of `ring`, issued by the whole CTA: 16
// threads per row (256 contiguous bytes), rows kRowsPerPass apart per pass; row r goes to warp
// r / kBlockNw's sub-tile. Rows past seqlen_k are zero-filled. kPaged: chunk_page holds the
// block-table entry of each 16-key chunk of the tile, and head is relative to the page base.
template <typename Traits, bool kPaged, typename Element, int kPageSlots>
__forceinline__ __device__ void splitkv_cta_load_tile(const FwdParams &params, const Element *head, int64_t row_stride,
                                                      [[maybe_unused]] int64_t page_stride, Element *ring, int tile,
                                                      int stage, int seqlen_k,
                                                      [[maybe_unused]] const int (&chunk_page)[kPageSlots],
                                                      int load_row, int load_col) {
    using index_t = int64_t;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kBlockNw = Traits::kBlockNw;
    constexpr int kRowsPerPass = Traits::kNThreads / (Traits::kHeadDim / 8);  // rows of a tile one pass loads
    static_assert(kBlockN % kRowsPerPass == 0);
    static_assert(!kPaged || (kRowsPerPass == 8 && kBlockN % 16 == 0), "paged: two rows of a thread per 16-row chunk");
    auto sub_tile = [&](int w) {
        return make_tensor(make_smem_ptr(ring + (stage * Traits::kNWarps + w) * Traits::kSubTileElems),
                           typename Traits::WarpTraits::SmemLayoutKV{});
    };
    if constexpr (kPaged) {
        CUTE_UNROLL
        for (int c = 0; c < kBlockN / 16; ++c) {
            const int key = tile * kBlockN + 16 * c;  // first key of the chunk
            const int in_page = (key & (params.page_block_size - 1)) + load_row;
            const Element *src = head + index_t(chunk_page[c]) * page_stride + index_t(in_page) * row_stride + load_col;
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
                const int r = 16 * c + load_row + 8 * h;  // row of the tile
                const bool ok = tile * kBlockN + r < seqlen_k;
                Tensor s = sub_tile(r / kBlockNw);
                cp_async_16_zfill(&s(r % kBlockNw, load_col), ok ? src + index_t(8 * h) * row_stride : head, ok);
            }
        }
    } else {
        const int key0 = tile * kBlockN + load_row;
        const Element *src = head + index_t(key0) * row_stride + load_col;
        CUTE_UNROLL
        for (int j = 0; j < kBlockN / kRowsPerPass; ++j) {
            const int r = load_row + j * kRowsPerPass;  // row of the tile
            const bool ok = key0 + j * kRowsPerPass < seqlen_k;
            Tensor s = sub_tile(r / kBlockNw);
            cp_async_16_zfill(&s(r % kBlockNw, load_col), ok ? src + index_t(j * kRowsPerPass) * row_stride : head,
                              ok);
        }
    }
}

// The first cp.async groups after Q's: K(0), V(0), ..., V(S - 2), K(S - 1) (kTogether: tiles
// 0 .. S - 2, K and V in one group). Groups past the last tile are issued empty, so the waits of
// the main loop count the same for every n_tiles.
template <int kStages, bool kTogether, typename LoadK, typename LoadV>
__forceinline__ __device__ void splitkv_cta_issue_first_tiles(int n_tiles, LoadK const &load_k, LoadV const &load_v) {
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
        if constexpr (kTogether) {
            if (s < kStages - 1) {
                if (s < n_tiles) { load_k(s); load_v(s); }
                cp_async_fence();
            }
        } else {
            if (s > 0) {
                if (s - 1 < n_tiles) load_v(s - 1);
                cp_async_fence();
            }
            if (s < n_tiles) load_k(s);
            cp_async_fence();
        }
    }
}

// kPaged (FwdParams::decode_paged_cta): K / V rows through params.block_table, for power-of-two
// pages without cache_leftpad (the binding checks): a thread's rows of a tile come in 16-row
// chunks (rows 16 c + load_row and + 8) that each lie in one page, so a tile costs the thread
// kBlockN / 16 block-table entries (loaded one tile ahead into registers) and shifts, not a
// division per row. (A division and an entry per row measured 14-22% slower than the sm_90a
// kernel: with one warp per scheduler the copy-issue instructions are on the critical path.)
template <typename Traits, bool kPaged = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_splitkv_cta_kernel(const __grid_constant__ FwdParams params) {
    pdl_launch_dependents();  // the combine kernel may be scheduled once every CTA has started
    using Element = typename Traits::Element;
    using WT = typename Traits::WarpTraits;
    using TiledMma = typename WT::TiledMma;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockNw = Traits::kBlockNw;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kNWarps = Traits::kNWarps;
    constexpr int kNThreads = Traits::kNThreads;
    constexpr int kStages = Traits::kStages;
    constexpr bool kTogether = Traits::kTogether;
    constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x, warp = tidx / 32, lane = tidx % 32;
    const SplitKVBlock<kBlockM> blk(params);
    if (blk.empty()) return;
    const BlockInfo &binfo = blk.binfo;
    const int bidb = blk.bidb, bidh_k = blk.bidh_k, seqlen_k = blk.seqlen_k, diag = blk.diag;

    // Keys this row block can see, in whole CTA tiles, and this split's share of them (none
    // when a page of them has a bad block-table entry).
    const SplitKVTiles tiles = splitkv_checked_tiles<kBlockN, kPaged>(params, blk);
    const int s_begin = tiles.begin, n_tiles = max(0, tiles.end - tiles.begin);

    // ---- shared memory: Q | K ring (kStages x 4 warp sub-tiles) | V ring ----
    Element *smem_q = reinterpret_cast<Element *>(smem);
    Element *smem_k = smem_q + Traits::kQElems;
    Element *smem_v = smem_k + Traits::kRingElems;
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename WT::SmemLayoutQ{});
    auto sub_tile = [&](Element *ring, int stage, int w) {
        return make_tensor(make_smem_ptr(ring + (stage * kNWarps + w) * Traits::kSubTileElems),
                           typename WT::SmemLayoutKV{});
    };

    splitkv_load_q<kHeadDim, kNThreads, Element>(params, blk, sQ, tidx);
    cp_async_fence();

    // ---- K / V tiles (splitkv_cta_load_tile). Paged: the head's rows start at the page base
    // (k_batch_stride is the page stride).
    const index_t k_dense = (kPaged ? 0 : binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb)) +
                            bidh_k * params.k_head_stride;
    const index_t v_dense = (kPaged ? 0 : binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb)) +
                            bidh_k * params.v_head_stride;
    const Element *k_head = reinterpret_cast<const Element *>(params.k_ptr) + k_dense;
    const Element *v_head = reinterpret_cast<const Element *>(params.v_ptr) + v_dense;
    const int load_row = tidx / kChunksPerRow, load_col = (tidx % kChunksPerRow) * 8;
    // kPaged: block-table entry of each 16-key chunk of the next tile to issue (load_pages(it) once
    // the previous tile's copies went out).
    constexpr int kPageChunks = kBlockN / 16;
    [[maybe_unused]] int chunk_page[kPaged ? kPageChunks : 1];
    [[maybe_unused]] const int *block_table =
        kPaged ? params.block_table + index_t(bidb) * params.block_table_batch_stride : nullptr;
    [[maybe_unused]] const int page_shift = kPaged ? __ffs(params.page_block_size) - 1 : 0;  // a power of two
    auto load_pages = [&](int it) {
        if constexpr (kPaged) { splitkv_cta_load_pages<kBlockN>(chunk_page, block_table, s_begin + it, seqlen_k, page_shift); }
    };
    auto load_k = [&](int it) {
        splitkv_cta_load_tile<Traits, kPaged>(params, k_head, params.k_row_stride, params.k_batch_stride, smem_k,
                                              s_begin + it, it % kStages, seqlen_k, chunk_page, load_row, load_col);
    };
    auto load_v = [&](int it) {
        splitkv_cta_load_tile<Traits, kPaged>(params, v_head, params.v_row_stride, params.v_batch_stride, smem_v,
                                              s_begin + it, it % kStages, seqlen_k, chunk_page, load_row, load_col);
        if constexpr (kPaged) { load_pages(it + 1); }  // K and V of tile it are out: the next tile's pages
    };
    if constexpr (kPaged) { load_pages(0); }

    // cp.async groups: Q, K(0), V(0), ..., K(S - 1); then per iteration it: V(it + S - 1), K(it + S)
    // (empty groups past the last tile keep the counts uniform). kTogether: Q, tiles 0 .. S - 2; then
    // per iteration tile it + S - 1 (K and V in one group).
    constexpr int kGroupsAfterQ = kTogether ? kStages - 1 : 2 * kStages - 1;
    splitkv_cta_issue_first_tiles<kStages, kTogether>(n_tiles, load_k, load_v);

    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(lane);
    Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    clear(acc_o);
    Tensor coords_s = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNw>>{}));
    Tensor coords_s_rc = make_tensor(coords_s.data(), acc_layout_rowcol(coords_s.layout()));
    constexpr int kNRows = decltype(size<0>(coords_s_rc))::value;
    static_assert(kNRows == 2);
    int row_q[kNRows];
    [[maybe_unused]] float alibi_slope[kNRows];
    splitkv_row_state<false>(params, coords_s_rc, blk, row_q, alibi_slope);
    const bool needs_row_mask = params.window_left < kWindowUnbounded || params.window_right < kWindowUnbounded;

    OnlineSoftmax<kNRows> softmax;
    softmax.reset();

    Tensor sK0 = sub_tile(smem_k, 0, 0);
    Tensor sVtNoSwizzle0 = make_tensor(sK0.data().get(), typename WT::SmemLayoutVtNoSwizzle{});
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK0);
    Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle0);
    auto smem_copy_Q = make_tiled_copy_A(typename WT::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_Q = smem_copy_Q.get_thread_slice(lane);
    auto smem_copy_K = make_tiled_copy_B(typename WT::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_K = smem_copy_K.get_thread_slice(lane);
    auto smem_copy_V = make_tiled_copy_B(typename WT::SmemCopyAtomTransposed{}, tiled_mma);
    auto thr_smem_copy_V = smem_copy_V.get_thread_slice(lane);

    cp_async_wait<kGroupsAfterQ>();  // Q (the first group) landed for this thread
    __syncthreads();                   // ... and for every thread
    splitkv_q_to_regs(thr_smem_copy_Q.partition_S(sQ), tSrQ, smem_copy_Q, thr_smem_copy_Q);

    for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % kStages;
        // top: every warp is past P V of tile it - 1, whose V buffer (kTogether: K and V buffers)
        // takes tile it + S - 1.
        __syncthreads();
        if (it + kStages - 1 < n_tiles) {
            if constexpr (kTogether) { load_k(it + kStages - 1); }
            load_v(it + kStages - 1);
        }
        cp_async_fence();
        // A: K(it) landed (after it: V(it), K / V of it + 1 .. it + S - 1 -> 2 S - 1 groups;
        // kTogether: tile it landed, S - 1 groups after it).
        cp_async_wait<kGroupsAfterQ>();
        __syncthreads();
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockNw>>{});
        clear(acc_s);
        gemm_rs(acc_s, tSrQ, tSrK, thr_smem_copy_K.partition_S(sub_tile(smem_k, stage, warp)), tiled_mma, smem_copy_K,
                thr_smem_copy_K);
        splitkv_mod_and_mask<false, kBlockNw>(acc_s, coords_s_rc, row_q, alibi_slope,
                                              (s_begin + it) * kBlockN + warp * kBlockNw, seqlen_k, diag,
                                              needs_row_mask, params);
        splitkv_softmax_update_skip_rescale(softmax, acc_s, acc_o, params.scale_softmax_log2);
        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        // B: V(it) landed (after it: K / V of it + 1 .. it + S - 1 -> 2 S - 2 groups); every warp
        // is past S(it), so its K buffer takes tile it + S.
        if constexpr (!kTogether) {
            cp_async_wait<2 * kStages - 2>();
            __syncthreads();
            if (it + kStages < n_tiles) load_k(it + kStages);
            cp_async_fence();
        }
        Tensor sVt = make_tensor(sub_tile(smem_v, stage, warp).data(), typename WT::SmemLayoutVt{});
        gemm_rs(acc_o, tOrP, tOrVt, thr_smem_copy_V.partition_S(sVt), tiled_mma, smem_copy_V, thr_smem_copy_V);
    }
    cp_async_wait<0>();

    __syncthreads();  // all warps are done with their K / V buffers: the merge reuses them
    splitkv_merge_and_store<kNWarps, kHeadDim, kNThreads, Element>(
        params, blk, reinterpret_cast<float *>(smem_k), thr_mma, acc_o, softmax, tidx);
}

}  // namespace flash
