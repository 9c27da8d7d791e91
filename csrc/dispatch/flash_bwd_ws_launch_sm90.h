// Launch of the warp-specialised sm_90a backward (flash_bwd_ws_kernel_sm90.h): tile configuration
// per head dim, the TMA descriptors over q / dout (dense (b, s, h, d) or varlen packed (total, h,
// d)) and over the LSE / softmax_d buffers, grid and error checks. Instantiated per (dtype, head
// dim) by instantiations/flash_bwd_ws_sm90_hdim*_*.cu (plain), *_mod.cu (softcap / ALiBi /
// deterministic) and *_drop.cu (dropout); a V head dim of its own (192 / 128, split-d) by
// flash_bwd_ws_sm90_hdim192x128_*.cu (run_mha_bwd_head_dim_v, flash_dispatch.cpp);
// called from run_mha_bwd_ (flash_bwd_launch.h) when params.bwd_ws is set.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/flash.h"
#include "common/bwd_passes.h"
#include "dispatch/flash_bwd_launch.h"  // the declaration of run_mha_bwd_ws_sm90
#include "common/launch_check.h"
#include "sm90/flash_bwd_ws_kernel_sm90.h"
#include "sm90/kernel_traits_bwd_ws_sm90.h"

namespace flash {

// Stages of the Q / dO / LSE / softmax_d ring per head dim (64 x 128 tiles, 128-key CTAs):
//   d64:  3 stages: Q + dO 3 x 16 KB + K + V 32 KB + dS 2 x 16 KB         = 112 KB
//   d128: 2 stages: Q + dO 2 x 32 KB + K + V 64 KB + dS 2 x 16 KB         = 160 KB
// (d128 with 3 stages would take 192 KB; FA3 keeps 2 there.)
// The two fp32 dQ tiles of the bulk reduce-add add d64 2 x 16 KB = 146 KB, d128 2 x 32 KB =
// 226 KB (of 227).
// kDropout adds two 8 KB keep-flag buffers: d64 146 + 16 = 162 KB; d128 takes one dQ buffer
// fewer (226 - 32 + 16 = 210 KB).
template <typename Element, int kHeadDim, bool kMod = false, bool kDropout = false>
using BwdWsTraitsFor = BwdWsTraitsSm90<kHeadDim, kHeadDim == 64 ? 3 : 2, Element, kMod, kDropout>;

namespace bwd_ws_detail {

// TMA wants every global stride a multiple of 16 bytes; a mode of extent 1 is never stepped
// through, so its stride may be anything: give it one the TMA accepts.
inline int64_t tma_stride(int64_t stride, int extent) { return extent <= 1 ? 8 : stride; }
inline bool tma_stride_ok(int64_t stride, int extent) { return extent <= 1 || (stride > 0 && stride % 8 == 0); }

template <typename Traits>
void launch(BwdParams &params, cudaStream_t stream, int rows_q, int batch_q, int64_t lse_elems, int64_t dsum_elems) {
    using Element = typename Traits::Element;
    // dq_accum's layout for the conversion and the kernel (kp.p is a copy): the dQ tiles of every
    // warp-specialised kernel (its shared buffers, or the split-d Q / dO stage) swizzle.
    params.dq_accum_swizzled = true;
    FLASH_BIND_CONTEXT();
    BwdWsKernelParams<Traits> kp{};
    kp.p = params;
    kp.shape_q = make_shape(rows_q, params.d, params.h, batch_q);
    kp.shape_lse = make_shape(static_cast<int32_t>(lse_elems));
    kp.shape_dsum = make_shape(static_cast<int32_t>(dsum_elems));
    auto gmem = [&](void *ptr, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
        return make_tensor(make_gmem_ptr(static_cast<Element const *>(ptr)), kp.shape_q,
                           make_stride(tma_stride(row_stride, rows_q), _1{}, tma_stride(head_stride, params.h),
                                       tma_stride(batch_stride, batch_q)));
    };
    auto row_tensor = [&](float const *ptr, typename Traits::GmemShapeRow shape) {
        return make_tensor(make_gmem_ptr(ptr), shape, Stride<_1>{});
    };
    using TileQdO = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.q_ptr, params.q_row_stride, params.q_head_stride, params.q_batch_stride),
                             typename Traits::SmemLayoutQdOTile{}, TileQdO{}, _1{});
    if constexpr (Traits::kOwnHeadDimV) {  // dO: (rows, dv, heads, batch) (the kernel rebuilds this shape)
        auto shape_do = make_shape(rows_q, params.dv, params.h, batch_q);
        Tensor gdO = make_tensor(make_gmem_ptr(static_cast<Element const *>(params.do_ptr)), shape_do,
                                 make_stride(tma_stride(params.do_row_stride, rows_q), _1{},
                                             tma_stride(params.do_head_stride, params.h),
                                             tma_stride(params.do_batch_stride, batch_q)));
        kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, gdO, typename Traits::SmemLayoutdOTile{},
                                  Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{}, _1{});
    } else {
        kp.tma_do = make_tma_copy(SM90_TMA_LOAD{},
                                  gmem(params.do_ptr, params.do_row_stride, params.do_head_stride, params.do_batch_stride),
                                  typename Traits::SmemLayoutQdOTile{}, TileQdO{}, _1{});
    }
    kp.tma_lse = make_tma_copy(SM90_TMA_LOAD{}, row_tensor(params.softmax_lse_ptr, kp.shape_lse),
                               typename Traits::SmemLayoutRowTile{}, Shape<Int<Traits::kRowBox>>{}, _1{});
    kp.tma_dsum = make_tma_copy(SM90_TMA_LOAD{}, row_tensor(params.softmax_d_ptr, kp.shape_dsum),
                                typename Traits::SmemLayoutRowTile{}, Shape<Int<Traits::kRowBox>>{}, _1{});

    // softmax_d = rowsum(dO * O) over params.dv columns where V has a head dim of its own.
    launch_bwd_passes<Element, Traits::kHeadDim, /*kMaySwizzle=*/true, Traits::kOwnHeadDimV>(params, stream, [&] {
        constexpr int smem_size = Traits::kSmemSize;
        auto kernel = &flash_bwd_ws_kernel_sm90<Traits>;
        FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
        params.dq_slice_block_m = Traits::kBlockM, params.dq_slice_block_n = Traits::kBlockN;  // the conversion's view
        const dim3 grid(ceil_div(params.seqlen_k, Traits::kBlockN), params.b, params.h);
        kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(kp);
        FLASH_CHECK_LAUNCH();
    });
}

}  // namespace bwd_ws_detail

namespace bwd_ws_detail {

// The TMA geometry of a call, or false (nothing launched) where the kernel cannot address it:
// K/V-cache refinements (never set by the backward binding, checked anyway), head dims that are not
// multiples of 8, q / dout strides the TMA cannot address (not multiples of 16 bytes), LSE /
// softmax_d buffers of 2^31 elements or more (1-D TMA coordinates are int32).
// kHeadDimV: the traits' V head dim; where it differs from kHeadDim, V / dO / O / dV may be any
// multiple of 8 up to it below params.d (the caller also checks the head-dim tile), else
// params.dv must be params.d.
template <int kHeadDim, int kHeadDimV = kHeadDim>
bool tma_geometry(BwdParams const &params, int &rows_q, int &batch_q, int64_t &lse_elems, int64_t &dsum_elems) {
    if (params.seqused_k != nullptr || params.leftpad_k != nullptr || params.kv_batch_idx != nullptr ||
        params.block_table != nullptr || params.d > kHeadDim || params.d % 8 != 0) {
        return false;
    }
    if constexpr (kHeadDimV != kHeadDim) {
        if (params.dv > kHeadDimV || params.dv % 8 != 0 || params.dv <= 0 || params.dv >= params.d) return false;
    } else {
        if (params.dv != params.d) return false;
    }
    const bool varlen_q = params.cu_seqlens_q != nullptr;
    rows_q = varlen_q ? params.total_q : params.seqlen_q;
    batch_q = varlen_q ? 1 : params.b;
    if (rows_q <= 0) return false;
    if (reinterpret_cast<uintptr_t>(params.q_ptr) % 16 != 0 || reinterpret_cast<uintptr_t>(params.do_ptr) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(params.softmax_lse_ptr) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(params.softmax_d_ptr) % 16 != 0) {
        return false;
    }
    if (!(tma_stride_ok(params.q_row_stride, rows_q) && tma_stride_ok(params.q_head_stride, params.h) &&
          tma_stride_ok(params.q_batch_stride, batch_q) && tma_stride_ok(params.do_row_stride, rows_q) &&
          tma_stride_ok(params.do_head_stride, params.h) && tma_stride_ok(params.do_batch_stride, batch_q))) {
        return false;
    }
    // Elements of the LSE / softmax_d buffers as the kernel addresses them (one past the last).
    // Dense LSE (b, h, seqlen_q), varlen (h, total_q); softmax_d (b, h, seqlen_q_rounded), varlen
    // (h, accum_rows).
    lse_elems = varlen_q ? int64_t(params.h - 1) * params.lse_head_stride + params.total_q
                         : int64_t(params.b - 1) * params.lse_batch_stride + int64_t(params.h - 1) * params.lse_head_stride +
                               params.seqlen_q;
    dsum_elems = varlen_q ? int64_t(params.h) * params.accum_rows : int64_t(params.b) * params.h * params.seqlen_q_rounded;
    return lse_elems < (int64_t(1) << 31) && dsum_elems < (int64_t(1) << 31);
}

}  // namespace bwd_ws_detail

// FA3's d128 tile for the plain calls without a window (flash::bwd_ws_d128_block_m): 80-row query
// blocks, S^T / dP^T 64 keys x 80 queries per warpgroup, dQ^T = K^T dS^T swapped; Q + dO 2 x 2 x
// 20 KB + K + V 64 KB + dS 2 x 20 KB + one 40 KB dQ tile = 225 KB. Its wgmma N = 80 needs CuTe's
// extended shapes, whose header alone adds ~20 s to a unit's compile: the kernel has units of its
// own (flash_bwd_ws_sm90_hdim128m80_*.cu, which define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
// before any CuTe header), and the other units see only this declaration.
template <typename Element>
void run_mha_bwd_ws_sm90_d128_m80(BwdParams &params, cudaStream_t stream, int rows_q, int batch_q, int64_t lse_elems,
                                  int64_t dsum_elems);
#if defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
template <typename Element>
void run_mha_bwd_ws_sm90_d128_m80(BwdParams &params, cudaStream_t stream, int rows_q, int batch_q, int64_t lse_elems,
                                  int64_t dsum_elems) {
    using Traits = BwdWsTraitsSm90<128, 2, Element, /*kMod=*/false, /*kDropout=*/false, /*kSplitD=*/false,
                                   /*kBlockM=*/80>;
    bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
}
#endif

// Returns false (nothing launched) for the calls this kernel does not serve; the caller then runs
// the lock-step sm_90a backward. Served: kMod = false, the plain backward (no softcap / ALiBi /
// dropout / deterministic: those are feature calls, kFeat); kMod = true (from the feature
// dispatch), the calls with softcap (d128) and / or ALiBi, or deterministic, but no dropout, with
// the dQ bulk reduce-add.
// Both: causal / sliding window, MQA / GQA, dense or varlen (deterministic: dense). Not served:
// what tma_geometry rejects.
template <typename Element, int kHeadDim, bool kMod>
bool run_mha_bwd_ws_sm90(BwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90Bwd<kHeadDim>);
    const bool has_mod = params.softcap_scale > 0.f || params.alibi_slopes_ptr != nullptr;
    // kMod: no softcap at d64, where the WS kernel's extra MUFU work (tanh, and log2 to recover
    // it) made the H200's softcap backward slower than the lock-step kernel's (bf16 8k: 15.9 vs
    // 13.7 ms; d128: 9.4 vs 10.4 ms; ALiBi: d64 9.5 vs 10.0 ms, d128 6.3 vs 7.7 ms).
    // Deterministic calls: only those the binding prepared for this kernel (params.bwd_ws_det:
    // zeroed dq_accum slices and counters, dense, dQ bulk reduce-add); they come through the
    // feature dispatch (kMod), with or without score modifiers.
    const bool det_ok = !params.deterministic ||
                        (params.bwd_ws_det && params.dq_semaphore_ptr != nullptr && params.cu_seqlens_q == nullptr);
    const bool served_features = kMod ? (has_mod || params.deterministic) && det_ok && params.p_dropout <= 0.f &&
                                            !(kHeadDim == 64 && params.softcap_scale > 0.f)
                                      : !has_features(params);
    if (!served_features || (params.dq_accum_splits > 1 && !params.deterministic)) return false;
    int rows_q, batch_q;
    int64_t lse_elems, dsum_elems;
    if (!bwd_ws_detail::tma_geometry<kHeadDim>(params, rows_q, batch_q, lse_elems, dsum_elems)) return false;
    // The score-modifier kernel alone in the _mod translation units: the plain kernels stay out of
    // them (discarded branch), so that no kernel is compiled twice. d64: 128-row query blocks
    // (FA3's d64 tiles), 2 stages: Q + dO 2 x 2 x 16 KB + K + V 32 KB + dS 2 x 32 KB + dQ 2 x 32 KB =
    // 224 KB; H200 bf16 8k backward 8.57 -> 7.19 ms (causal 4.54 -> 3.84) against 64-row blocks.
    if constexpr (kHeadDim == 64) {
        using Traits = BwdWsTraitsSm90<64, 2, Element, /*kMod=*/kMod, /*kDropout=*/false, /*kSplitD=*/false,
                                       /*kBlockM=*/128>;
        bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    } else {
        if constexpr (kHeadDim == 128 && !kMod) {
            if (params.bwd_ws_d128_block_m == 80) {
                run_mha_bwd_ws_sm90_d128_m80<Element>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
                return true;
            }
        }
        bwd_ws_detail::launch<BwdWsTraitsFor<Element, kHeadDim, /*kMod=*/kMod>>(params, stream, rows_q, batch_q,
                                                                            lse_elems, dsum_elems);
    }
    return true;
}

// The dropout calls (own translation units, *_drop.cu): dropout with or without ALiBi (softcap with
// dropout is rejected by the binding), dense or varlen, dQ bulk reduce-add, not deterministic
// (those stay on the lock-step kernel's sliced mode).
template <typename Element, int kHeadDim>
bool run_mha_bwd_ws_sm90_dropout(BwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90Bwd<kHeadDim>);
    if (!(params.p_dropout > 0.f && params.softcap_scale <= 0.f &&
          !params.deterministic && params.dq_accum_splits <= 1)) {
        return false;
    }
    int rows_q, batch_q;
    int64_t lse_elems, dsum_elems;
    if (!bwd_ws_detail::tma_geometry<kHeadDim>(params, rows_q, batch_q, lse_elems, dsum_elems)) return false;
    bwd_ws_detail::launch<BwdWsTraitsFor<Element, kHeadDim, /*kMod=*/true, /*kDropout=*/true>>(
        params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    return true;
}

// Head dim 256: the split-d kernel (kSplitD: 64-key CTAs, the consumer warpgroups split the head
// dim; BwdKernelTraitsSm90SplitD: S^T / dP^T split by queries, P^T / dS^T through shared memory,
// 224 KB; dQ through the Q / dO stage), dense or varlen, causal / sliding
// window, MQA / GQA. One kernel takes the plain calls and those with softcap and / or ALiBi or
// deterministic (dense, the slices and counters the binding prepared: params.bwd_ws_det; the
// writer warp adds each dQ tile in the slice's order): the score modifiers are run-time branches,
// and plain calls ran faster on it than on a kernel without them (6.06 vs 6.50 ms for bf16 8k).
// Dropout (with ALiBi or not, not deterministic: those keep the SM80-class kernels' sliced mode)
// has its own kernel: one P^T buffer and two 4 KB flag buffers. Returns false (nothing launched)
// for the calls it does not serve.
template <typename Element>
bool run_mha_bwd_ws_sm90_d256(BwdParams &params, cudaStream_t stream) {
    const bool det_ok = !params.deterministic ||
                        (params.bwd_ws_det && params.dq_semaphore_ptr != nullptr && params.cu_seqlens_q == nullptr);
    const bool dropout = params.p_dropout > 0.f;
    const bool served = dropout ? !params.deterministic && params.softcap_scale <= 0.f : det_ok;
    if (!served || (params.dq_accum_splits > 1 && !params.deterministic)) return false;
    int rows_q, batch_q;
    int64_t lse_elems, dsum_elems;
    if (!bwd_ws_detail::tma_geometry<256>(params, rows_q, batch_q, lse_elems, dsum_elems)) return false;
    if (dropout) {
        using Traits = BwdWsTraitsSm90<256, 2, Element, /*kMod=*/true, /*kDropout=*/true, /*kSplitD=*/true>;
        bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    } else {
        using Traits = BwdWsTraitsSm90<256, 2, Element, /*kMod=*/true, /*kDropout=*/false, /*kSplitD=*/true>;
        bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    }
    return true;
}

// A V head dim of its own (params.dv < params.d): Q / K 192 with V 128 (DeepSeek MLA) on the
// split-d kernel (BwdWsTraitsSm90<192, 2, Element, kMod, false, kSplitD, 64, 128>: 64-key CTAs,
// each consumer warpgroup dK 64 x 96 and dV 64 x 64; rows 32-63 of the fp32 dQ tile through
// smem_dq_hi; 206848 B of shared memory). dq_accum: (.., seqlen_q_rounded, 192) rows, swizzled as
// every WS kernel's (the conversion at head_dim_tile 192 reads the same layout). Plain calls on
// the kMod = false kernel; softcap / ALiBi / deterministic (dense, bwd_ws_det) on the kMod one.
// Not served (false, nothing launched; the binding then runs V / dO / O zero-padded to d):
// dropout, a head-dim tile other than 192, dv > 128 or not a multiple of 8, what tma_geometry
// rejects.
template <typename Element, int kHeadDim, int kHeadDimV>
bool run_mha_bwd_ws_sm90_head_dim_v(BwdParams &params, cudaStream_t stream) {
    static_assert(kHeadDim == 192 && kHeadDimV == 128, "instantiated for DeepSeek MLA's 192 / 128 only");
    if (params.p_dropout > 0.f || params.head_dim_tile != kHeadDim) return false;
    const bool det_ok = !params.deterministic ||
                        (params.bwd_ws_det && params.dq_semaphore_ptr != nullptr && params.cu_seqlens_q == nullptr);
    if (!det_ok || (params.dq_accum_splits > 1 && !params.deterministic)) return false;
    int rows_q, batch_q;
    int64_t lse_elems, dsum_elems;
    if (!bwd_ws_detail::tma_geometry<kHeadDim, kHeadDimV>(params, rows_q, batch_q, lse_elems, dsum_elems)) return false;
    if (has_features(params)) {  // softcap / ALiBi / deterministic (no dropout: checked above)
        using Traits = BwdWsTraitsSm90<kHeadDim, 2, Element, /*kMod=*/true, /*kDropout=*/false, /*kSplitD=*/true,
                                       /*kBlockM=*/64, kHeadDimV>;
        static_assert(Traits::kOwnHeadDimV && Traits::kSmemSize <= 227 * 1024);
        bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    } else {
        using Traits = BwdWsTraitsSm90<kHeadDim, 2, Element, /*kMod=*/false, /*kDropout=*/false, /*kSplitD=*/true,
                                       /*kBlockM=*/64, kHeadDimV>;
        static_assert(Traits::kOwnHeadDimV && Traits::kSmemSize <= 227 * 1024);
        bwd_ws_detail::launch<Traits>(params, stream, rows_q, batch_q, lse_elems, dsum_elems);
    }
    return true;
}

}  // namespace flash
