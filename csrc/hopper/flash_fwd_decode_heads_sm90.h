// Hopper (sm_90a) split-KV decode kernel in which one CTA reads a key's K and V rows for a group
// of kGroup KV heads at once ("heads" variant, FLASH_ATTN_DECODE_KERNEL=heads).
//
// Why: in a (batch, seqlen, h_k, d) cache (or paged (blocks, page, h_k, d)) the rows of the
// h_k heads of one key sit next to each other. The per-head kernels (flash_fwd_decode_sm90.h,
// flash_fwd_splitkv_kernel.h) give each CTA one KV head, so eight CTAs read interleaved 256-byte
// pieces at a 2 KB stride. Here a CTA owns kGroup consecutive heads (all 8 of a 32 / 8 GQA model
// at d = 128), so each key's K (and V) row for the group is ONE contiguous 2 KB bulk copy, and a
// 16-token page is 32 KB of consecutive requests: fewer copy instructions per byte and
// sequential DRAM traffic.
//
// Work split: grid (b * h_k / kGroup, packed-row blocks, splits). A CTA walks its split's key
// tiles (kBlockN keys each) in order; every tile is shared by all heads of the group:
//  * one producer warp: lane l copies K or V row (l % kBlockN) of the tile, kGroup * d elements,
//    into a CTA-wide ring of kStages tiles ("full" mbarrier per stage, armed with the tile's
//    byte count: fewer for the tile cut by the end of the sequence, whose missing rows are
//    zeroed so that masked probabilities (0) never meet stale NaN / Inf in P V);
//  * kGroup consumer warps: warp w computes KV head w of the group (its h / h_k query heads x
//    seqlen_q rows, GQA-packed in a 16-row MMA tile, Q in registers) against its d-column slice
//    of each tile, keeps its own online softmax over all the split's keys (no cross-warp merge)
//    and releases the stage on the "empty" mbarrier (one arrive per warp);
//  * split-KV partials and the combine kernel as the other decode kernels.
//
// Shared memory rows are padded by 16 bytes (bulk copies cannot swizzle): the 8 keys an ldmatrix
// phase reads are then 4 banks apart, conflict-free, at any head slice.
//
// Requirements (host-checked in flash_api.cpp, else the per-head sm_90a kernel runs): d equal to
// the head-dim tile (64 or 128), h_k a multiple of kGroup, k / v head stride == d (the group's
// rows contiguous), 16-byte aligned rows and page / batch strides (the binding checks those).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "../block_info.h"
#include "../flash.h"
#include "../flash_fwd_splitkv_common.h"
#include "../kernel_traits.h"
#include "../softmax.h"
#include "../utils.h"

namespace flash {

using namespace cute;

template <int kHeadDim_, typename Element_>
struct DecodeHeadsKernelTraitsSm90 {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    // KV heads per CTA = consumer warps. 8 covers the common GQA layouts (h_k = 8, 16, ...) with a
    // 2 KB (d = 128) or 1 KB (d = 64) row per key; smaller h_k runs the per-head kernel.
    static constexpr int kGroup = kDecodeHeadsGroup;
    static constexpr int kBlockM = 16;  // packed rows per warp (one MMA row tile)
    static constexpr int kNConsumerWarps = kGroup;
    static constexpr int kProducerWarp = kGroup;
    static constexpr int kNThreads = (kGroup + 1) * 32;
    // Keys per tile: 16 at d = 128 (one P V k-step; 32 rows = one bulk copy per producer lane),
    // 32 at d = 64 (two per lane); about 64 KB of K + V either way.
    static constexpr int kBlockN = kHeadDim <= 64 ? 32 : 16;
    static constexpr int kCopiesPerLane = 2 * kBlockN / 32;
    static_assert(kCopiesPerLane * 32 == 2 * kBlockN);
    static constexpr int kRowElems = kGroup * kHeadDim;  // one key's K (or V) for the whole group
    static constexpr int kRowBytes = kRowElems * int(sizeof(Element));
    static_assert(kRowBytes % 16 == 0);
    // +16 bytes per row: consecutive keys 4 banks apart (ldmatrix reads 8 keys x 16 bytes).
    static constexpr int kSmemRowStride = kRowElems + 8;
    static constexpr int kTileElems = kBlockN * kSmemRowStride;  // one of K, V
    static constexpr int kStageBytes = 2 * kTileElems * int(sizeof(Element));
    // As many stages as fit in the 227 KB opt-in limit: 3 (198 KB at d = 128, 200 KB at d = 64),
    // i.e. ~190 KB of K / V in flight per SM, as the per-head kernel.
    static constexpr int kSmemLimit = 227 * 1024;
    static constexpr int kStages = (kSmemLimit - 64) / (kStageBytes + 16);
    static_assert(kStages >= 2);
    static constexpr int kSmemKVBytes = kStages * kStageBytes;
    static constexpr int kSmemBarrierOffset = kSmemKVBytes;  // full[kStages], empty[kStages]
    static constexpr int kSmemSize = kSmemBarrierOffset + 2 * kStages * 8;
    static_assert(kSmemSize <= kSmemLimit);
    static_assert(kStageBytes % 16 == 0 && (kSmemRowStride * int(sizeof(Element))) % 16 == 0 &&
                      (kHeadDim * int(sizeof(Element))) % 16 == 0,
                  "bulk copies and ldmatrix need 16-byte aligned rows and head slices");

    // One warp's MMA and ldmatrix atoms (as the other split kernels).
    using WarpTraits = FwdKernelTraits<kHeadDim, kBlockM, kBlockN, 1, Element>;
    // A warp's head slice of a tile: K (keys, d) and V^T (d, keys) over the padded rows; the base
    // pointer adds the head's column offset (warp * kHeadDim).
    using SmemLayoutK = Layout<Shape<Int<kBlockN>, Int<kHeadDim>>, Stride<Int<kSmemRowStride>, _1>>;
    using SmemLayoutVt = Layout<Shape<Int<kHeadDim>, Int<kBlockN>>, Stride<_1, Int<kSmemRowStride>>>;
};

template <typename Traits, bool kMod = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_decode_heads_kernel_sm90(const __grid_constant__ FwdParams params) {
#if defined(CUTE_ARCH_TMA_SM90_ENABLED)
    using Element = typename Traits::Element;
    using WT = typename Traits::WarpTraits;
    using TiledMma = typename WT::TiledMma;
    using index_t = int64_t;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    constexpr int kGroup = Traits::kGroup;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStages;
    constexpr int kTileElems = Traits::kTileElems;
    constexpr int kRowBytes = Traits::kRowBytes;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x, warp = tidx / 32, lane = tidx % 32;
    const int m_block = blockIdx.y, split = blockIdx.z;
    const int groups = params.h_k / kGroup;
    const int bidb = blockIdx.x / groups, group = blockIdx.x % groups;
    const int g = params.h_h_k_ratio;

    const BlockInfo binfo(params, bidb);
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    const int packed_rows = seqlen_q * g;
    const int p0 = m_block * kBlockM;
    if (p0 >= packed_rows) return;  // uniform over the CTA
    const int diag = seqlen_k - seqlen_q;

    // Keys this row block can see (the masks depend on the query, not the head), in whole tiles,
    // and this split's share of them: tiles [s_begin, s_begin + n_tiles). Every such tile has at
    // least one key < seqlen_k (its first: tile * kBlockN < n_end <= seqlen_k).
    const int i_first = p0 / g;
    const int i_last_q = (min(p0 + kBlockM, packed_rows) - 1) / g;
    int n_begin = 0, n_end = seqlen_k;
    if (params.window_right < kWindowUnbounded) n_end = max(0, min(n_end, i_last_q + diag + params.window_right + 1));
    if (params.window_left < kWindowUnbounded) n_begin = max(0, i_first + diag - params.window_left);
    const int t_begin = n_begin / kBlockN;
    const int t_end = n_end > n_begin ? ceil_div(n_end, kBlockN) : t_begin;
    const int tiles_per_split = ceil_div(t_end - t_begin, params.num_splits);
    const int s_begin = t_begin + split * tiles_per_split;
    const int n_tiles = max(0, min(t_end, s_begin + tiles_per_split) - s_begin);

    // ---- shared memory: K/V stages (stage, {K, V}, key, group row) | full[kStages] | empty[kStages] ----
    Element *smem_kv = reinterpret_cast<Element *>(smem);
    uint64_t *full_bar = reinterpret_cast<uint64_t *>(smem + Traits::kSmemBarrierOffset);
    uint64_t *empty_bar = full_bar + kStages;
    if (tidx < kStages) {
        Barrier::init(full_bar + tidx, 32);       // every producer lane arrives (its zero stores)
        Barrier::init(empty_bar + tidx, kGroup);  // lane 0 of every consumer warp
    }
    cutlass::arch::fence_barrier_init();  // the inits are visible to the async proxy ...
    __syncthreads();                      // ... and to every warp; no CTA-wide barrier after this

    if (warp == Traits::kProducerWarp) {
        // ---------------- producer: one bulk copy per (key, K or V) row of the group ----------------
        const Element *k_ptr = reinterpret_cast<const Element *>(params.k_ptr);
        const Element *v_ptr = reinterpret_cast<const Element *>(params.v_ptr);
        const int *block_table = params.block_table == nullptr
                                     ? nullptr
                                     : params.block_table + index_t(bidb) * params.block_table_batch_stride;
        // Head stride == d (host check): the group's heads are one run of kGroup * d elements.
        const index_t k_group = index_t(group) * kGroup * params.k_head_stride;
        const index_t v_group = index_t(group) * kGroup * params.v_head_stride;
        const index_t k_dense = binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) + k_group;
        const index_t v_dense = binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) + v_group;
        // Lane l copies the rows of key l % kBlockN of each tile: K then V rows in the lane order
        // (rows lane + 32 j of the tile's 2 * kBlockN rows, K first).
        const int lane_key = lane % kBlockN;
        // Paged: this lane's block-table entry, loaded one tile ahead so that the dependent load
        // never stalls the copy issue. Keys past the end read nothing (the table may end there).
        auto page_of = [&](int tile) {
            const int key = tile * kBlockN + lane_key;
            return key < seqlen_k ? block_table[(binfo.leftpad_k + key) / params.page_block_size] : 0;
        };
        int page = block_table != nullptr && n_tiles > 0 ? page_of(s_begin) : 0;
        for (int i = 0; i < n_tiles; ++i) {
            const int stage = i % kStages;
            // Fill u = i / kStages of this stage waits for the consumers' release u - 1 of it.
            if (i >= kStages) Barrier::wait(empty_bar + stage, uint32_t((i / kStages - 1) & 1));
            // The consumers' ldmatrix reads (and earlier zero stores) of the stage come before
            // this fill's async-proxy writes.
            cutlass::arch::fence_view_async_shared();
            const int tile = s_begin + i;
            const int key = tile * kBlockN + lane_key;
            const int keys_valid = min(kBlockN, seqlen_k - tile * kBlockN);  // >= 1
            index_t k_off, v_off;
            if (block_table != nullptr) {
                const index_t in_page = (binfo.leftpad_k + key) % params.page_block_size;
                k_off = index_t(page) * params.k_batch_stride + in_page * params.k_row_stride + k_group;
                v_off = index_t(page) * params.v_batch_stride + in_page * params.v_row_stride + v_group;
                page = i + 1 < n_tiles ? page_of(tile + 1) : 0;
            } else {
                k_off = k_dense + index_t(key) * params.k_row_stride;
                v_off = v_dense + index_t(key) * params.v_row_stride;
            }
            uint64_t *bar = full_bar + stage;
            // Lane 0's key (the tile's first) is always valid, so it never zeroes: it can arm the
            // barrier first. The other lanes arrive after their copies / zero stores (release).
            if (lane == 0) Barrier::arrive_and_expect_tx(bar, uint32_t(2 * keys_valid * kRowBytes));
            Element *stage_k = smem_kv + stage * 2 * kTileElems;
            CUTE_UNROLL
            for (int j = 0; j < Traits::kCopiesPerLane; ++j) {
                const bool is_v = lane + 32 * j >= kBlockN;
                Element *dst = stage_k + (is_v ? kTileElems : 0) + lane_key * Traits::kSmemRowStride;
                if (key < seqlen_k) {
                    SM90_BULK_COPY_G2S::copy(is_v ? v_ptr + v_off : k_ptr + k_off, bar, dst, kRowBytes);
                } else {
                    CUTE_UNROLL
                    for (int c = 0; c < kRowBytes / 16; ++c) { reinterpret_cast<uint4 *>(dst)[c] = make_uint4(0, 0, 0, 0); }
                }
            }
            if (lane != 0) Barrier::arrive(bar);
        }
        // Nothing to wait for: the consumers wait for every tile issued, so the CTA outlives the copies.
        return;
    }

    // ---------------- consumers: warp w = KV head group * kGroup + w ----------------
    const int kv_head = group * kGroup + warp;
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(lane);

    // Q straight from global memory into the MMA A fragment (read once; no shared memory needed):
    // packed row p -> (query p / g, head kv_head * g + p % g); rows past the end are zero.
    Tensor cQ = thr_mma.partition_A(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    // (Only the layout of this never-dereferenced row-major tile matters: it shapes the fragment.)
    Tensor tSrQ = thr_mma.partition_fragment_A(make_tensor(
        make_smem_ptr(static_cast<Element *>(nullptr)), Layout<Shape<Int<kBlockM>, Int<kHeadDim>>, Stride<Int<kHeadDim>, _1>>{}));
    static_assert(decltype(size(cQ))::value == decltype(size(tSrQ))::value);
    {
        const Element *q_base = reinterpret_cast<const Element *>(params.q_ptr) +
                                binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb);
        CUTE_UNROLL
        for (int e = 0; e < size(tSrQ); ++e) {
            const int r = get<0>(cQ(e)), c = get<1>(cQ(e));
            const int p = p0 + r;
            tSrQ(e) = p < packed_rows ? q_base[index_t(p / g) * params.q_row_stride +
                                               index_t(kv_head * g + p % g) * params.q_head_stride + c]
                                      : Element(0.f);
        }
    }

    Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    clear(acc_o);
    Tensor coords_s = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor coords_s_rc = make_tensor(coords_s.data(), acc_layout_rowcol(coords_s.layout()));
    constexpr int kNRows = decltype(size<0>(coords_s_rc))::value;
    static_assert(kNRows == 2);
    // Query index of this thread's rows (for the causal / window mask), -1 past the end.
    int row_q[kNRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        const int p = p0 + get<0>(coords_s_rc(mi, 0));
        row_q[mi] = p < packed_rows ? p / g : -1;
    }
    const bool needs_row_mask = params.window_left < kWindowUnbounded || params.window_right < kWindowUnbounded;
    // Score modifiers: the ALiBi slope of each row's query head (-slope / scale_softmax, as ScoreMod).
    [[maybe_unused]] float alibi_slope[kNRows];
    if constexpr (kMod) {
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            const int p = p0 + get<0>(coords_s_rc(mi, 0));
            const int head = kv_head * g + p % g;
            alibi_slope[mi] = params.alibi_slopes_ptr == nullptr || p >= packed_rows
                                  ? 0.f
                                  : -params.alibi_slopes_ptr[bidb * params.alibi_slopes_batch_stride + head] /
                                        params.scale_softmax;
        }
    }

    OnlineSoftmax<kNRows> softmax;
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) { softmax.row_max(mi) = -INFINITY, softmax.row_sum(mi) = 0.f; }

    // This warp's head slice of stage s: columns [warp * d, warp * d + d) of the group rows.
    auto sK_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + stage * 2 * kTileElems + warp * kHeadDim),
                           typename Traits::SmemLayoutK{});
    };
    auto sVt_at = [&](int stage) {
        return make_tensor(make_smem_ptr(smem_kv + (stage * 2 + 1) * kTileElems + warp * kHeadDim),
                           typename Traits::SmemLayoutVt{});
    };
    Tensor tSrK = thr_mma.partition_fragment_B(sK_at(0));
    Tensor tOrVt = thr_mma.partition_fragment_B(sVt_at(0));
    auto smem_copy_K = make_tiled_copy_B(typename WT::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_K = smem_copy_K.get_thread_slice(lane);
    auto smem_copy_V = make_tiled_copy_B(typename WT::SmemCopyAtomTransposed{}, tiled_mma);
    auto thr_smem_copy_V = smem_copy_V.get_thread_slice(lane);

    for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % kStages;
        const int tile = s_begin + it;
        // The stage's u-th fill (u = it / kStages) completes phase u of its full barrier; the
        // barrier's release / acquire also covers the producer lanes' zero stores.
        Barrier::wait(full_bar + stage, uint32_t((it / kStages) & 1));

        Tensor tSsK = thr_smem_copy_K.partition_S(sK_at(stage));
        Tensor tOsVt = thr_smem_copy_V.partition_S(sVt_at(stage));

        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        gemm_rs(acc_s, tSrQ, tSrK, tSsK, tiled_mma, smem_copy_K, thr_smem_copy_K);

        splitkv_mod_and_mask<kMod, kBlockN>(acc_s, coords_s_rc, row_q, alibi_slope, tile * kBlockN, seqlen_k, diag,
                                            needs_row_mask, params);
        softmax.template update</*kFirst=*/false>(acc_s, acc_o, params.scale_softmax_log2);

        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_V, thr_smem_copy_V);

        // Release the stage: every lane's reads are done (and ordered before the producer's next
        // async-proxy writes: fence, __syncwarp, then one arrive per warp).
        cutlass::arch::fence_view_async_shared();
        __syncwarp();
        if (lane == 0) Barrier::arrive(empty_bar + stage);
    }

    // ---- store: this warp alone saw every key of the split for its rows (no merge) ----
    // finalize: out = acc_o / l, natural-log LSE; a row without a visible key: out 0, LSE +inf.
    auto lse = softmax.finalize(acc_o, params.scale_softmax);
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
    Tensor coords_o = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor coords_o_rc = make_tensor(coords_o.data(), acc_layout_rowcol(coords_o.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        const int p = p0 + get<0>(coords_o_rc(mi, 0));
        if (p >= packed_rows) continue;
        const int i = p / g, head = kv_head * g + p % g;
        const bool writes_lse = get<1>(coords_o_rc(mi, 0)) == 0;  // one lane of the quad
        if (params.num_splits == 1) {
            Element *out = reinterpret_cast<Element *>(params.o_ptr) +
                           binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) +
                           index_t(i) * params.o_row_stride + index_t(head) * params.o_head_stride;
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { out[get<1>(coords_o_rc(mi, ni))] = Element(acc_o_rc(mi, ni)); }
            if (writes_lse) {
                params.softmax_lse_ptr[(binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                                       head * params.lse_head_stride + i] = lse(mi);
            }
        } else {
            // (split, b, h, seqlen_q, head_dim_tile) and (split, b, h, seqlen_q); an empty split's
            // LSE is -inf, which the combine skips.
            const index_t row = ((index_t(split) * params.b + bidb) * params.h + head) * params.seqlen_q + i;
            float *oacc = params.oaccum_ptr + row * params.head_dim_tile;
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { oacc[get<1>(coords_o_rc(mi, ni))] = acc_o_rc(mi, ni); }
            if (writes_lse) params.lse_accum_ptr[row] = lse(mi) == INFINITY ? -INFINITY : lse(mi);
        }
    }
#endif
}

}  // namespace flash
