// Hopper (sm_90a) split-KV forward for decoding: K/V rows stream in through bulk async copies
// (cp.async.bulk, the TMA unit's 1-D copy) whose completion is counted on an mbarrier.
//
// Same work split as the SM80-class flash_fwd_splitkv_kernel (GQA-packed 16-row blocks, keys cut
// into per-warp tiles dealt round-robin, one online softmax per warp, a shared-memory merge at the
// end, split-KV partials + the combine kernel), with a cheaper and deeper load path:
//
//  * One bulk copy per K or V row: a lane copies a whole row (256 bytes at d = 128 in 16-bit
//    types), so a 16-key d128 tile (16 K + 16 V rows) is one copy instruction per lane, against
//    16 cp.async of 16 bytes and their address arithmetic. A row's address is all the copy needs,
//    so a paged cache costs the same as a contiguous one: the page of each lane's row comes from
//    a block-table load issued one tile ahead.
//  * Per warp, a ring of kStages tiles, each with a "full" mbarrier: lane 0 arms it with the
//    tile's byte count (arrive.expect_tx; fewer rows for the tile cut by the end of the sequence),
//    the copies complete it. A warp refills a stage only after it has read it (warp-private ring:
//    no empty barrier; a proxy fence + __syncwarp order the reads before the async writes).
//  * 8 warps and ~210 KB of shared memory: one CTA per SM with up to 24 tiles (~200 KB) of K/V
//    in flight; Q stays in registers for the whole loop.
//
// Shared memory K/V rows are padded by 16 bytes (bulk copies cannot swizzle), which keeps the
// eight 16-byte rows read by each ldmatrix phase on distinct banks.
//
// Requirements (checked on the host, else the SM80-class kernel runs): d equal to the head-dim
// tile (64 or 128), rows 16-byte aligned (the binding checks it).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/splitkv_merge.h"
#include "common/splitkv_combine.h"
#include "common/kernel_traits.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

template <int kHeadDim_, typename Element_>
struct DecodeKernelTraitsSm90 {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = 16;  // packed rows per CTA
    static constexpr int kNWarps = 8;
    static constexpr int kNThreads = kNWarps * 32;
    // Keys per warp tile: 16 at d = 128 (32 rows: one bulk copy per lane), 32 at d = 64.
    static constexpr int kBlockNw = kHeadDim <= 64 ? 32 : 16;
    static constexpr int kCopiesPerLane = 2 * kBlockNw / 32;
    static_assert(kCopiesPerLane * 32 == 2 * kBlockNw);
    static constexpr int kRowBytes = kHeadDim * int(sizeof(Element));  // one K or V row, one bulk copy
    static_assert(kRowBytes % 16 == 0);
    // Shared-memory row stride in elements: +16 bytes moves consecutive rows by 4 banks.
    static constexpr int kSmemRowStride = kHeadDim + 8;
    static constexpr int kTileElems = kBlockNw * kSmemRowStride;  // one of K, V
    static constexpr int kStageBytes = 2 * kTileElems * int(sizeof(Element));
    static constexpr int kQBytes = kBlockM * kHeadDim * int(sizeof(Element));
    // As many stages as fit in 224 KB (3 at d = 64 and d = 128: 213 / 218 KB in all).
    static constexpr int kStages = (224 * 1024 - kQBytes) / (kNWarps * (kStageBytes + 8));
    static_assert(kStages >= 2);
    static constexpr int kSmemKVBytes = kNWarps * kStages * kStageBytes;
    static constexpr int kSmemBarrierOffset = kQBytes + kSmemKVBytes;  // (kNWarps, kStages) mbarriers
    static constexpr int kSmemSize = kSmemBarrierOffset + kNWarps * kStages * 8;
    static_assert(kQBytes % 16 == 0 && kStageBytes % 16 == 0 && (kSmemRowStride * int(sizeof(Element))) % 16 == 0,
                  "bulk copies and ldmatrix need 16-byte aligned rows");
    // The end-of-kernel merge reuses the K/V area.
    static_assert(kNWarps * kBlockM * (kHeadDim + 2) * 4 <= kSmemKVBytes);

    // One warp's MMA, Q layout and ldmatrix atoms (as the SM80-class split kernel).
    using WarpTraits = FwdKernelTraits<kHeadDim, kBlockM, kBlockNw, 1, Element>;
    // K (keys, d) and V^T (d, keys) over the same padded, unswizzled rows.
    using SmemLayoutKV = Layout<Shape<Int<kBlockNw>, Int<kHeadDim>>, Stride<Int<kSmemRowStride>, _1>>;
    using SmemLayoutVt = Layout<Shape<Int<kHeadDim>, Int<kBlockNw>>, Stride<_1, Int<kSmemRowStride>>>;
};

template <typename Traits, bool kMod = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_fwd_decode_kernel_sm90(const __grid_constant__ FwdParams params) {
#if defined(CUTE_ARCH_TMA_SM90_ENABLED)
    pdl_launch_dependents();  // the combine kernel may be scheduled once every CTA has started
    using Element = typename Traits::Element;
    using WT = typename Traits::WarpTraits;
    using TiledMma = typename WT::TiledMma;
    using index_t = int64_t;
    using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockNw = Traits::kBlockNw;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kNWarps = Traits::kNWarps;
    constexpr int kStages = Traits::kStages;
    constexpr int kTileElems = Traits::kTileElems;
    constexpr int kRowBytes = Traits::kRowBytes;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x, warp = tidx / 32, lane = tidx % 32;
    // grid: (b * h_k, row blocks, splits), as the SM80-class split kernel.
    const SplitKVBlock<kBlockM> blk(params);
    if (blk.empty()) return;
    const BlockInfo &binfo = blk.binfo;
    const int bidb = blk.bidb, bidh_k = blk.bidh_k, seqlen_k = blk.seqlen_k, diag = blk.diag;

    // Keys this row block can see, in whole warp tiles, and this split's share of them (none
    // when a page of them has a bad block-table entry).
    const SplitKVTiles tiles = splitkv_checked_tiles<kBlockNw>(params, blk);
    const int s_begin = tiles.begin, s_end = tiles.end;
    // This warp's tiles: s_begin + warp, + kNWarps, ... (all < t_end, so each has >= 1 key < seqlen_k).
    const int my_first = s_begin + warp;
    const int my_count = my_first < s_end ? ceil_div(s_end - my_first, kNWarps) : 0;

    // ---- shared memory: Q | K/V stages (warp, stage, {K, V}) | full barriers (warp, stage) ----
    Element *smem_q = reinterpret_cast<Element *>(smem);
    Element *smem_kv = reinterpret_cast<Element *>(smem + Traits::kQBytes);
    uint64_t *full_bar = reinterpret_cast<uint64_t *>(smem + Traits::kSmemBarrierOffset) + warp * kStages;
    if (tidx < kNWarps * kStages) {
        FullBarrier::init(reinterpret_cast<uint64_t *>(smem + Traits::kSmemBarrierOffset) + tidx, 1);
    }
    cutlass::arch::fence_barrier_init();  // the inits are visible to the async proxy ...
    __syncthreads();                      // ... and to every warp

    // ---- Q: packed row p -> (query p / g, head bidh_k * g + p % g); cp.async, read once into registers ----
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename WT::SmemLayoutQ{});
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
    // Lane l copies the rows of key l % kBlockNw of each tile: K and/or V (rows lane + 32 j of the
    // stage's 2 * kBlockNw rows, K first).
    const int lane_key = lane % kBlockNw;
    // Paged: the block-table entry of this lane's key in a tile; loaded one tile ahead (page holds
    // the entry of the next tile to issue), so the dependent load never stalls the copy issue.
    auto page_of = [&](int tile) {
        const int key = tile * kBlockNw + lane_key;
        return key < seqlen_k ? block_table[(binfo.leftpad_k + key) / params.page_block_size] : 0;
    };
    int page = block_table != nullptr && my_count > 0 ? page_of(my_first) : 0;

    // Issues this warp's tile number i (tile my_first + i * kNWarps) into stage i % kStages, whose
    // previous contents every lane of the warp has finished reading.
    auto issue_tile = [&](int i) {
        const int tile = my_first + i * kNWarps;
        const int stage = i % kStages;
        uint64_t *bar = full_bar + stage;
        const int key = tile * kBlockNw + lane_key;
        // Rows past the end of the sequence are not copied (they may lie outside the cache or the
        // block table): the barrier expects only the copied bytes, and those rows are zeroed so
        // that masked probabilities (0) never meet stale NaN / Inf values in P V.
        const int keys_valid = min(kBlockNw, seqlen_k - tile * kBlockNw);
        if (lane == 0) FullBarrier::arrive_and_expect_tx(bar, uint32_t(2 * keys_valid * kRowBytes));
        index_t k_off, v_off;
        if (block_table != nullptr) {
            const index_t in_page = (binfo.leftpad_k + key) % params.page_block_size;
            k_off = index_t(page) * params.k_batch_stride + in_page * params.k_row_stride + bidh_k * params.k_head_stride;
            v_off = index_t(page) * params.v_batch_stride + in_page * params.v_row_stride + bidh_k * params.v_head_stride;
            page = i + 1 < my_count ? page_of(tile + kNWarps) : 0;
        } else {
            k_off = k_dense + index_t(key) * params.k_row_stride;
            v_off = v_dense + index_t(key) * params.v_row_stride;
        }
        Element *stage_k = smem_kv + (warp * kStages + stage) * 2 * kTileElems;
        CUTE_UNROLL
        for (int j = 0; j < Traits::kCopiesPerLane; ++j) {
            const bool is_v = lane + 32 * j >= kBlockNw;
            Element *dst = stage_k + (is_v ? kTileElems : 0) + lane_key * Traits::kSmemRowStride;
            if (key < seqlen_k) {
                SM90_BULK_COPY_G2S::copy(is_v ? v_ptr + v_off : k_ptr + k_off, bar, dst, kRowBytes);
            } else {
                CUTE_UNROLL
                for (int c = 0; c < kRowBytes / 16; ++c) { reinterpret_cast<uint4 *>(dst)[c] = make_uint4(0, 0, 0, 0); }
            }
        }
    };

    // Fill the ring: kStages tiles in flight from the start.
    CUTE_UNROLL
    for (int i = 0; i < kStages; ++i) {
        if (i < my_count) issue_tile(i);
    }

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

    auto sK_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + (warp * kStages + stage) * 2 * kTileElems),
                           typename Traits::SmemLayoutKV{});
    };
    auto sVt_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + ((warp * kStages + stage) * 2 + 1) * kTileElems),
                           typename Traits::SmemLayoutVt{});
    };
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK_at(0));
    Tensor tOrVt = thr_mma.partition_fragment_B(sVt_at(0));
    auto smem_copy_Q = make_tiled_copy_A(typename WT::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_Q = smem_copy_Q.get_thread_slice(lane);
    auto smem_copy_K = make_tiled_copy_B(typename WT::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_K = smem_copy_K.get_thread_slice(lane);
    auto smem_copy_V = make_tiled_copy_B(typename WT::SmemCopyAtomTransposed{}, tiled_mma);
    auto thr_smem_copy_V = smem_copy_V.get_thread_slice(lane);

    cp_async_wait<0>();  // this thread's Q chunks landed
    __syncthreads();     // ... and every thread's
    {
        Tensor tSsQ = thr_smem_copy_Q.partition_S(sQ);
        Tensor tSrQ_view = thr_smem_copy_Q.retile_D(tSrQ);
        cute::copy(smem_copy_Q, tSsQ, tSrQ_view);
    }

    for (int it = 0; it < my_count; ++it) {
        const int stage = it % kStages;
        const int tile = my_first + it * kNWarps;
        // The stage's u-th fill (u = it / kStages) completes phase u of its barrier.
        FullBarrier::wait(full_bar + stage, uint32_t((it / kStages) & 1));
        __syncwarp();  // the rows other lanes zeroed (tail tile) are visible too

        Tensor tSsK = thr_smem_copy_K.partition_S(sK_at(stage));
        Tensor tOsVt = thr_smem_copy_V.partition_S(sVt_at(stage));

        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockNw>>{});
        clear(acc_s);
        gemm_rs(acc_s, tSrQ, tSrK, tSsK, tiled_mma, smem_copy_K, thr_smem_copy_K);

        splitkv_mod_and_mask<kMod, kBlockNw>(acc_s, coords_s_rc, row_q, alibi_slope, tile * kBlockNw, seqlen_k, diag,
                                             needs_row_mask, params);
        softmax.template update</*kFirst=*/false>(acc_s, acc_o, params.scale_softmax_log2);

        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_V, thr_smem_copy_V);

        // Refill this stage with tile it + kStages. Every lane's reads (and zero stores) of the
        // stage are ordered before the bulk copies' async-proxy writes: fence, then __syncwarp.
        cutlass::arch::fence_view_async_shared();
        __syncwarp();
        if (it + kStages < my_count) issue_tile(it + kStages);
    }

    // Every copy this warp issued has been waited for: the K/V area is free once all warps are here.
    __syncthreads();
    splitkv_merge_and_store<kNWarps, kHeadDim, Traits::kNThreads, Element>(
        params, blk, reinterpret_cast<float *>(smem_kv), thr_mma, acc_o, softmax, tidx);
#endif
}

}  // namespace flash
