// Split-KV forward for decoding and KV-cache attention (SM80-class mma.sync, runs on sm_80+).
//
// One CTA per (batch * KV head, block of 16 packed query rows, split). A packed row is one
// (query position, query head of this KV head's group) pair, so the h / h_k query heads that
// share a KV head are computed from one read of K and V (GQA packing): decode with 32 query
// heads over 8 KV heads puts 4 rows in a tile instead of reading the cache 4 times.
//
// The keys of the split are cut into tiles of kBlockNw keys dealt round-robin to the warps. Each
// warp streams its own tiles through its own cp.async ring of kStages K/V buffers (no CTA-wide
// barrier in the main loop) and keeps its own online-softmax state; the warps merge through
// shared memory at the end. K/V rows are addressed one by one, so a paged cache (any page size)
// costs only a block-table lookup per row.
//
// num_splits == 1 writes out / softmax_lse; otherwise fp32 partial outputs and LSEs per split
// that flash_fwd_splitkv_combine_kernel merges.
//
// kMod: the variant with the score modifiers softcap and ALiBi (attn_mods.h's ScoreMod, applied
// per packed row: the ALiBi slope is that of the row's query head, the distance that of its query
// position). No dropout here (KV-cache attention has none; the binding rejects it).
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/splitkv_merge.h"
#include "common/kernel_traits.h"
#include "common/launch_check.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// kNWarps warps, each streaming tiles of kBlockNw keys through a ring of kStages buffers;
// kQInRegs: Q read from shared memory once and kept in registers (the K tiles are the only
// ldmatrix traffic of S = Q K^T). Two shapes are launched (flash_fwd_splitkv_launch.h): the
// default 4 warps (about 100 KB of shared memory, two CTAs per SM) and, at d = 128 on GPUs with
// >= 196 KB of shared memory per block, SplitKVWideTraits: 8 warps, one CTA per SM.
template <int kHeadDim_, typename Element_, int kNWarps_ = 4, int kBlockNw_ = (kHeadDim_ <= 64 ? 32 : 16),
          int kStages_ = 0, bool kQInRegs_ = false>
struct SplitKVKernelTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = 16;  // packed rows per CTA
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr bool kQInRegs = kQInRegs_;
    // Keys per warp tile: 16-key tiles (one k-step of P V) for d >= 128, 32 below.
    static constexpr int kBlockNw = kBlockNw_;
    // Per-warp ring depth (default): about 24 KB of K+V in flight per warp.
    static constexpr int kTileBytes = 2 * kBlockNw * kHeadDim * int(sizeof(Element));
    static constexpr int kStages = kStages_ > 0 ? kStages_ : kTileBytes <= 4096 ? 6 : kTileBytes <= 8192 ? 3 : 2;
    // One warp's view: FwdKernelTraits with one warp, 16 rows and kBlockNw keys gives the MMA,
    // the swizzled smem layouts and the ldmatrix atoms.
    using WarpTraits = FwdKernelTraits<kHeadDim, kBlockM, kBlockNw, 1, Element>;
    static constexpr int kTileElems = kBlockNw * kHeadDim;
    static constexpr int kQElems = kBlockM * kHeadDim;
    // smem: Q | per warp, per stage: K tile, V tile. The end-of-kernel merge reuses the K/V area.
    static constexpr int kSmemKVElems = kNWarps * kStages * 2 * kTileElems;
    static constexpr int kMergeBytes = kNWarps * kBlockM * kHeadDim * 4 + 2 * kNWarps * kBlockM * 4;
    static_assert(kMergeBytes <= kSmemKVElems * int(sizeof(Element)));
    static constexpr int kSmemSize = (kQElems + kSmemKVElems) * int(sizeof(Element));
};

// Decode at d = 128 on H100 / H200: 8 warps x 3 stages of 16-key tiles (196 KB, one CTA per SM),
// Q in registers. With one CTA per (batch, KV head) and no split, this is what reads the cache
// fastest: per-warp latency (S GEMM -> softmax -> P V on a 16-key tile) is what limits a warp, so
// two warps per scheduler beat deeper rings (docs/perf-notes.md, decode_probe logs).
template <typename Element>
using SplitKVWideTraits = SplitKVKernelTraits<128, Element, 8, 16, 3, true>;
static_assert(SplitKVWideTraits<cutlass::bfloat16_t>::kSmemSize == kSplitKVWideSmemBytes);

// One warp's K and V tile `tile` into sK / sV, 16-byte copies per lane; keys past seqlen_k and
// columns past d are zero-filled. Dense rows are k_dense / v_dense plus the key's row stride; paged
// rows look their page up in pages (paged_chunks: the tile's 16-key chunks, fetched ahead) or,
// otherwise, in block_table row by row.
template <int kBlockNw, int kHeadDim, typename TensorK, typename TensorV, typename Element, int kPageChunks>
__forceinline__ __device__ void splitkv_warp_load_tile(const FwdParams &params, TensorK &&sK, TensorV &&sV,
                                                       const Element *k_ptr, const Element *v_ptr, int64_t k_dense,
                                                       int64_t v_dense, const int *block_table, bool paged_chunks,
                                                       const int (&pages)[kPageChunks], int leftpad_k, int bidh_k,
                                                       int tile, int seqlen_k, int lane) {
    using index_t = int64_t;
    constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
    CUTE_UNROLL
    for (int j = 0; j < kBlockNw * kChunksPerRow / 32; ++j) {
        const int idx = lane + 32 * j;
        const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
        const int key = tile * kBlockNw + r;
        const bool ok = key < seqlen_k && c < params.d;
        index_t k_off, v_off;
        if (block_table != nullptr) {
            const int row = leftpad_k + key;
            const index_t page = !ok ? 0 : paged_chunks ? pages[r / 16] : block_table[row / params.page_block_size];
            const index_t in_page = row % params.page_block_size;
            k_off = page * params.k_batch_stride + in_page * params.k_row_stride + bidh_k * params.k_head_stride;
            v_off = page * params.v_batch_stride + in_page * params.v_row_stride + bidh_k * params.v_head_stride;
        } else {
            k_off = k_dense + index_t(key) * params.k_row_stride;
            v_off = v_dense + index_t(key) * params.v_row_stride;
        }
        cp_async_16_zfill(&sK(r, c), ok ? k_ptr + k_off + c : k_ptr, ok);
        cp_async_16_zfill(&sV(r, c), ok ? v_ptr + v_off + c : v_ptr, ok);
    }
}

// The first kStages - 1 tiles of this warp (my_first, + kNWarps, ...) into stages 0 .. kStages - 2,
// one cp.async group each; groups past my_count are issued empty, so the main loop's waits count
// the same for every my_count.
template <int kStages, int kNWarps, typename LoadTile>
__forceinline__ __device__ void splitkv_warp_issue_first_tiles(int my_first, int my_count, LoadTile const &load_tile) {
    CUTE_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < my_count) load_tile(my_first + s * kNWarps, s);
        cp_async_fence();
    }
}

// S += Q K^T of one warp tile: Q from registers (kQInRegs, loaded once by splitkv_q_to_regs) or
// re-read from shared memory with each K k-block.
template <bool kQInRegs, typename TensorS, typename TensorRQ, typename TensorRK, typename TensorSQ, typename TensorSK,
          typename TiledMma, typename CopyQ, typename CopyK, typename ThrCopyQ, typename ThrCopyK>
__forceinline__ __device__ void splitkv_gemm_qk(TensorS &acc_s, TensorRQ &tSrQ, TensorRK &tSrK, TensorSQ const &tSsQ,
                                                TensorSK const &tSsK, TiledMma const &tiled_mma, CopyQ const &smem_copy_Q,
                                                CopyK const &smem_copy_K, ThrCopyQ const &thr_smem_copy_Q,
                                                ThrCopyK const &thr_smem_copy_K) {
    if constexpr (kQInRegs) {
        gemm_rs(acc_s, tSrQ, tSrK, tSsK, tiled_mma, smem_copy_K, thr_smem_copy_K);
    } else {
        gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_Q, smem_copy_K, thr_smem_copy_Q, thr_smem_copy_K);
    }
}

// kSkipRescale (dispatched for the wide shape's plain calls): skip O *= exp(m_old - m_new) when no row of
// the warp's tile raised its running max (a warp vote; after the first tiles the max rarely moves),
// taking 64 FMULs per lane off the per-tile chain S -> softmax -> P V. Multiplying by 1 is exact,
// so the results are bitwise those of the default.
template <typename Traits, bool kMod = false, bool kSkipRescale = false>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_splitkv_kernel(const __grid_constant__ FwdParams params) {
    pdl_launch_dependents();  // the combine kernel may be scheduled once every CTA has started
    using Element = typename Traits::Element;
    using WT = typename Traits::WarpTraits;
    using TiledMma = typename WT::TiledMma;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockNw = Traits::kBlockNw;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kNWarps = Traits::kNWarps;
    constexpr int kStages = Traits::kStages;
    constexpr int kTileElems = Traits::kTileElems;
    constexpr int kQElems = Traits::kQElems;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x, warp = tidx / 32, lane = tidx % 32;
    // grid: (b * h_k, row blocks, splits): x has no 65535 limit.
    const SplitKVBlock<kBlockM> blk(params);
    if (blk.empty()) return;
    const BlockInfo &binfo = blk.binfo;
    const int bidb = blk.bidb, bidh_k = blk.bidh_k, seqlen_k = blk.seqlen_k, diag = blk.diag;

    // Keys this row block can see, in whole warp tiles, and this split's share of them (none
    // when a page of them has a bad block-table entry).
    const SplitKVTiles tiles = splitkv_checked_tiles<kBlockNw>(params, blk);
    const int s_begin = tiles.begin, s_end = tiles.end;

    // ---- shared memory ----
    Element *smem_q = reinterpret_cast<Element *>(smem);
    Element *smem_kv = smem_q + kQElems;
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename WT::SmemLayoutQ{});
    auto sK_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + ((warp * kStages + stage) * 2) * kTileElems),
                           typename WT::SmemLayoutKV{});
    };
    auto sV_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + ((warp * kStages + stage) * 2 + 1) * kTileElems),
                           typename WT::SmemLayoutKV{});
    };

    splitkv_load_q<kHeadDim, Traits::kNThreads, Element>(params, blk, sQ, tidx);
    cp_async_fence();

    // ---- K/V rows: dense (batch stride, leftpad, kv_batch_idx, varlen offset) or paged ----
    const Element *k_ptr = reinterpret_cast<const Element *>(params.k_ptr);
    const Element *v_ptr = reinterpret_cast<const Element *>(params.v_ptr);
    const int *block_table = params.block_table == nullptr
                                 ? nullptr
                                 : params.block_table + index_t(bidb) * params.block_table_batch_stride;
    const index_t k_dense = binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) + bidh_k * params.k_head_stride;
    const index_t v_dense = binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) + bidh_k * params.v_head_stride;
    // Paged: when the left padding is a multiple of 16, every 16 keys of a tile sit in one page
    // (page sizes are multiples of 16), so a tile needs kPageChunks block-table entries. They are
    // fetched one tile ahead (fetch_pages after each load_tile), so the dependent block-table load
    // does not stall the cp.async issue of the next tile. Otherwise rows look their page up one by one.
    constexpr int kPageChunks = kBlockNw / 16;
    const bool paged_chunks = block_table != nullptr && binfo.leftpad_k % 16 == 0;
    int next_pages[kPageChunks];
    auto fetch_pages = [&](int tile) {
        CUTE_UNROLL
        for (int c = 0; c < kPageChunks; ++c) {
            const int key = tile * kBlockNw + 16 * c;
            next_pages[c] = key < seqlen_k ? block_table[(binfo.leftpad_k + key) / params.page_block_size] : 0;
        }
    };
    auto load_tile = [&](int tile, int stage) {
        splitkv_warp_load_tile<kBlockNw, kHeadDim>(params, sK_at(stage), sV_at(stage), k_ptr, v_ptr, k_dense, v_dense,
                                                   block_table, paged_chunks, next_pages, binfo.leftpad_k, bidh_k,
                                                   tile, seqlen_k, lane);
        if (paged_chunks) { fetch_pages(tile + kNWarps); }  // the next tile this warp loads
    };

    // This warp's tiles: s_begin + warp, + kNWarps, ...
    const int my_first = s_begin + warp;
    const int my_count = my_first < s_end ? ceil_div(s_end - my_first, kNWarps) : 0;
    if (paged_chunks && my_count > 0) { fetch_pages(my_first); }
    splitkv_warp_issue_first_tiles<kStages, kNWarps>(my_first, my_count, load_tile);

    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(lane);
    Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    clear(acc_o);
    Tensor coords_s = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockNw>>{}));
    Tensor coords_s_rc = make_tensor(coords_s.data(), acc_layout_rowcol(coords_s.layout()));
    constexpr int kNRows = decltype(size<0>(coords_s_rc))::value;
    static_assert(kNRows == 2);
    // Query index (-1 past the end) and, with kMod, ALiBi slope of this thread's rows.
    int row_q[kNRows];
    [[maybe_unused]] float alibi_slope[kNRows];
    splitkv_row_state<kMod>(params, coords_s_rc, blk, row_q, alibi_slope);
    const bool needs_row_mask = params.window_left < kWindowUnbounded || params.window_right < kWindowUnbounded;

    OnlineSoftmax<kNRows> softmax;
    softmax.reset();

    Tensor sK0 = sK_at(0);
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
    Tensor tSsQ = thr_smem_copy_Q.partition_S(sQ);

    cp_async_wait<kStages - 1>();  // Q (the first group) landed for this thread
    __syncthreads();               // ... and for every thread
    if constexpr (Traits::kQInRegs) { splitkv_q_to_regs(tSsQ, tSrQ, smem_copy_Q, thr_smem_copy_Q); }

    for (int it = 0; it < my_count; ++it) {
        const int stage = it % kStages;
        const int tile = my_first + it * kNWarps;
        // Keep kStages - 1 tiles in flight: issue tile it + kStages - 1 into the buffer that
        // tile it - 1 used (every lane finished it before the __syncwarp at the end of it - 1).
        if (it + kStages - 1 < my_count) load_tile(my_first + (it + kStages - 1) * kNWarps, (it + kStages - 1) % kStages);
        cp_async_fence();
        cp_async_wait<kStages - 1>();
        __syncwarp();

        Tensor sK = sK_at(stage);
        Tensor sVt = make_tensor(sK.data() + kTileElems, typename WT::SmemLayoutVt{});
        Tensor tSsK = thr_smem_copy_K.partition_S(sK);
        Tensor tOsVt = thr_smem_copy_V.partition_S(sVt);

        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockNw>>{});
        clear(acc_s);
        splitkv_gemm_qk<Traits::kQInRegs>(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_Q, smem_copy_K,
                                          thr_smem_copy_Q, thr_smem_copy_K);

        splitkv_mod_and_mask<kMod, kBlockNw>(acc_s, coords_s_rc, row_q, alibi_slope, tile * kBlockNw, seqlen_k, diag,
                                             needs_row_mask, params);
        if constexpr (kSkipRescale) {
            splitkv_softmax_update_skip_rescale(softmax, acc_s, acc_o, params.scale_softmax_log2);
        } else {
            softmax.template update</*kFirst=*/false>(acc_s, acc_o, params.scale_softmax_log2);
        }

        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_V, thr_smem_copy_V);
        __syncwarp();  // every lane is done with this stage's buffers before they are refilled
    }
    cp_async_wait<0>();

    __syncthreads();  // all warps are done with their K/V buffers: the merge reuses them
    splitkv_merge_and_store<kNWarps, kHeadDim, Traits::kNThreads, Element>(
        params, blk, reinterpret_cast<float *>(smem_kv), thr_mma, acc_o, softmax, tidx);
}

}  // namespace flash
