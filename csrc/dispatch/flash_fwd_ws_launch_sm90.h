// Launch of the warp-specialised sm_90a forward: tile configuration per head dim, the TMA
// descriptors over the params' q / k / v (dense (b, s, h, d) or varlen packed (total, h, d),
// arbitrary row / head / batch strides, d contiguous), grid and error checks. Instantiated per
// (dtype, head dim, variant) by instantiations/flash_fwd_ws_sm90_hdim*_*{,_feat}.cu; called from
// run_mha_fwd_ (flash_fwd_launch.h) when params.fwd_ws is set.
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "common/flash.h"
#include "common/heuristics.h"
#include "dispatch/flash_fwd_launch.h"  // the declaration of run_mha_fwd_ws_sm90
#include "common/launch_check.h"
#include "sm90/flash_fwd_ws_kernel_sm90.h"
#include "sm90/kernel_traits_fwd_ws_sm90.h"

namespace flash {

// (kBlockM, kBlockN, stages) per head dim; kBlockM = 64 x consumer warpgroups.
//   d64:  192 x 128, 4 stages: Q 24 KB + (K + V) 4 x 32 KB  = 152 KB  (3 consumer WGs, FA3's shape)
//   d128: 128 x 128, 2 stages: Q 32 KB + (K + V) 2 x 64 KB  = 160 KB
//   d256: 128 x 64,  2 stages: Q 64 KB + (K + V) 2 x 64 KB  = 192 KB
// FA3's d128 128 x 176 and d256 128 x 80 tiles measured 20-25% slower here (H200, bf16, 16k tokens:
// d128 476 vs 605, d256 459 vs 613 TFLOP/s at seqlen 8k; docs/perf-notes.md).
// Feature variant: the same tiles (dropout needs 64- or 128-key tiles: whole 128-key Philox groups,
// dropout_sm90.h) plus 8 KB of dropout flags per consumer warpgroup (d64 176 KB, d128 176 KB,
// d256 208 KB).
template <typename Element, int kHeadDim>
using FwdWsTraitsFor = std::conditional_t<
    kHeadDim == 64, FwdWsTraitsSm90<64, 128, 4, Element, 3>,
    std::conditional_t<kHeadDim == 128, FwdWsTraitsSm90<128, 128, 2, Element>, FwdWsTraitsSm90<256, 64, 2, Element>>>;

namespace fwd_ws_detail {

// TMA wants every global stride a multiple of 16 bytes; a mode of extent 1 is never stepped
// through, so its stride may be anything: give it one the TMA accepts.
inline int64_t tma_stride(int64_t stride, int extent) { return extent <= 1 ? 8 : stride; }
inline bool tma_stride_ok(int64_t stride, int extent) { return extent <= 1 || (stride > 0 && stride % 8 == 0); }

// kMayPersist: also compile the persistent kernel (plain variant, default tiles only), run where
// fwd_ws_use_persistent (flash.h) says so.
template <typename Traits, bool kFeat, bool kMayPersist = false>
void launch(FwdParams &params, cudaStream_t stream, int rows_q, int batch_q, int rows_k, int batch_k) {
    using Element = typename Traits::Element;
    FLASH_BIND_CONTEXT();
    FwdWsKernelParams<Traits> kp{};
    kp.p = params;
    kp.shape_q = make_shape(rows_q, params.d, params.h, batch_q);
    kp.shape_k = make_shape(rows_k, params.d, params.h_k, batch_k);
    kp.shape_v = make_shape(rows_k, params.dv, params.h_k, batch_k);
    auto gmem = [&](void *ptr, typename Traits::GmemShape shape, int64_t row_stride, int64_t head_stride,
                    int64_t batch_stride) {
        return make_tensor(make_gmem_ptr(static_cast<Element const *>(ptr)), shape,
                           make_stride(tma_stride(row_stride, get<0>(shape)), _1{}, tma_stride(head_stride, get<2>(shape)),
                                       tma_stride(batch_stride, get<3>(shape))));
    };
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.q_ptr, kp.shape_q, params.q_row_stride, params.q_head_stride,
                                                   params.q_batch_stride),
                             typename Traits::SmemLayoutQTile{}, Shape<Int<Traits::kRowsPerWG>, Int<Traits::kHeadDim>>{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.k_ptr, kp.shape_k, params.k_row_stride, params.k_head_stride,
                                                   params.k_batch_stride),
                             typename Traits::SmemLayoutKVTile{}, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.v_ptr, kp.shape_v, params.v_row_stride, params.v_head_stride,
                                                   params.v_batch_stride),
                             typename Traits::SmemLayoutVTile{}, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{});
    // O: the TMA store of the kernels that compile it in (see fwd_ws_store), on dense calls where
    // the TMA can address O; otherwise kp.tma_o stays zero and unused (no descriptor to encode).
    kp.o_tma = Traits::template kTmaStoreOFor<kFeat> && params.fwd_tma_o && params.cu_seqlens_q == nullptr &&
               reinterpret_cast<uintptr_t>(params.o_ptr) % 16 == 0 && tma_stride_ok(params.o_row_stride, rows_q) &&
               tma_stride_ok(params.o_head_stride, params.h) && tma_stride_ok(params.o_batch_stride, batch_q);
    if (kp.o_tma) {
        auto gmem_o = make_tensor(make_gmem_ptr(static_cast<Element *>(params.o_ptr)), kp.shape_q,
                                  make_stride(tma_stride(params.o_row_stride, rows_q), _1{},
                                              tma_stride(params.o_head_stride, params.h),
                                              tma_stride(params.o_batch_stride, batch_q)));
        kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, gmem_o, typename Traits::SmemLayoutOTma{},
                                 Shape<Int<Traits::kRowsPerWG>, Int<Traits::kHeadDim>>{}, _1{});
    }

    constexpr int smem_size_tile = Traits::template kSmemSizeFor<kFeat>;
    static_assert(smem_size_tile <= 227 * 1024, "shared memory of the sm_90a forward (warp-specialised) too large");
    // Persistent (kMayPersist, fwd_ws_use_persistent): one CTA per SM walking the tiles, so that
    // a tile's epilogue and the next tile's Q / K / V loads overlap (the producer runs ahead into
    // the next tile while the consumers finish and store O) and no CTA launch / prologue per tile.
    const int num_m_blocks = ceil_div(params.seqlen_q, Traits::kBlockM);
    const int64_t num_tiles = int64_t(num_m_blocks) * params.b * params.h;
    const bool persistent =
        kMayPersist && fwd_ws_use_persistent(params, Traits::kHeadDim) && num_tiles < (int64_t(1) << 31);
    auto kernel = &flash_fwd_ws_kernel_sm90<Traits, kFeat, false>;
    int smem_size = smem_size_tile;
    if constexpr (kMayPersist) {
        static_assert(!kFeat);
        if (persistent) {
            kernel = &flash_fwd_ws_kernel_sm90<Traits, false, true>;
            smem_size = Traits::kSmemSizePersistent;  // + O's own staging buffer where it fits
        }
    }
    FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
    dim3 grid(num_m_blocks, params.b, params.h);
    if (persistent) {
        int device = 0, sms = 0;
        FLASH_CUDA_CHECK(cudaGetDevice(&device));
        FLASH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        grid = dim3(static_cast<unsigned>(std::min<int64_t>(num_tiles, sms)), 1, 1);
    }
    kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(kp);
    FLASH_CHECK_LAUNCH();
}

}  // namespace fwd_ws_detail

// Whether the warp-specialised forward with these traits serves the call (false: nothing is
// launched, and the caller runs another kernel). Not served: KV-cache refinements (seqused_k,
// leftpad_k, kv_batch_idx, paged K/V), S_dmask (return_attn_probs with dropout), score modifiers /
// dropout in the plain variant (kFeat = false), strides the TMA cannot address (not multiples of
// 16 bytes), a varlen call without total_k, head dims other than the traits' (a V head dim of its
// own only with traits that have one).
template <typename Traits, bool kFeat>
bool fwd_ws_serves(FwdParams const &params) {
    constexpr bool kOwnHeadDimV = Traits::kHeadDimV != Traits::kHeadDim;
    if (params.seqused_k != nullptr || params.leftpad_k != nullptr || params.kv_batch_idx != nullptr ||
        params.block_table != nullptr || (!kFeat && has_features(params)) || params.s_dmask_ptr != nullptr ||
        params.d > Traits::kHeadDim || params.d % 8 != 0 ||
        (kOwnHeadDimV ? params.dv > Traits::kHeadDimV || params.dv % 8 != 0 : params.dv != params.d)) {
        return false;
    }
    const bool varlen_q = params.cu_seqlens_q != nullptr;
    const bool varlen_k = params.cu_seqlens_k != nullptr;
    const int rows_q = varlen_q ? params.total_q : params.seqlen_q;
    const int batch_q = varlen_q ? 1 : params.b;
    const int rows_k = varlen_k ? params.total_k : params.seqlen_k;
    const int batch_k = varlen_k ? 1 : params.b;
    if (rows_q <= 0 || rows_k <= 0) return false;
    if (reinterpret_cast<uintptr_t>(params.q_ptr) % 16 != 0 || reinterpret_cast<uintptr_t>(params.k_ptr) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(params.v_ptr) % 16 != 0) {
        return false;
    }
    using fwd_ws_detail::tma_stride_ok;
    return tma_stride_ok(params.q_row_stride, rows_q) && tma_stride_ok(params.q_head_stride, params.h) &&
           tma_stride_ok(params.q_batch_stride, batch_q) && tma_stride_ok(params.k_row_stride, rows_k) &&
           tma_stride_ok(params.k_head_stride, params.h_k) && tma_stride_ok(params.k_batch_stride, batch_k) &&
           tma_stride_ok(params.v_row_stride, rows_k) && tma_stride_ok(params.v_head_stride, params.h_k) &&
           tma_stride_ok(params.v_batch_stride, batch_k);
}

// The launch's (rows, batch) extents of Q and of K / V: dense (seqlen, b) or varlen packed (total, 1).
template <typename Traits, bool kFeat, bool kMayPersist = false>
void fwd_ws_launch(FwdParams &params, cudaStream_t stream) {
    const bool varlen_q = params.cu_seqlens_q != nullptr;
    const bool varlen_k = params.cu_seqlens_k != nullptr;
    fwd_ws_detail::launch<Traits, kFeat, kMayPersist>(params, stream, varlen_q ? params.total_q : params.seqlen_q,
                                                      varlen_q ? 1 : params.b,
                                                      varlen_k ? params.total_k : params.seqlen_k,
                                                      varlen_k ? 1 : params.b);
}

// Returns false (nothing launched) for the calls this kernel does not serve (fwd_ws_serves); the
// caller then runs the existing forward.
template <typename Element, int kHeadDim, bool kFeat>
bool run_mha_fwd_ws_sm90(FwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90FwdWs<kHeadDim>);
    using Traits = FwdWsTraitsFor<Element, kHeadDim>;
    if (!fwd_ws_serves<Traits, kFeat>(params)) return false;
    // d64 plain calls on 128 x 128 tiles with 2 consumer warpgroups instead of FA3's 192 x 128 with
    // 3 where flash::fwd_ws_d64_m128 says so (short causal calls and narrow sliding windows, whose
    // 192-row tiles are mostly masked work: 512 = 2.67 x 192).
    if constexpr (kHeadDim == 64 && !kFeat) {
        if (fwd_ws_d64_m128(params)) {
            fwd_ws_launch<FwdWsTraitsSm90<64, 128, 4, Element, 2>, false, true>(params, stream);
            return true;
        }
    }
    static_assert(!kFeat || Traits::kDropoutTiles);
    constexpr bool kMayPersist = !kFeat && kHeadDim <= 128;
    fwd_ws_launch<Traits, kFeat, kMayPersist>(params, stream);
    return true;
}

// A V / O head dim below Q's and K's, plain calls: Q / K 192 with V 128 (DeepSeek MLA prefill) on
// the d128 kernel's 128 x 128 tiles and 2 stages with 192-wide Q and K tiles (Q 48 KB + 2 x (K 48
// + V 32 KB) = 208 KB; O is staged in the Q tiles), and Q / K 128 with V 64 (Q 32 KB + 2 x (K 32
// + V 16 KB) = 128 KB). Returns false for the calls it does not serve.
template <typename Element, int kHeadDim, int kHeadDimV>
using FwdWsTraitsHeadDimV = FwdWsTraitsSm90<kHeadDim, 128, 2, Element, 2, kHeadDimV>;

template <typename Element, int kHeadDim, int kHeadDimV>
bool run_mha_fwd_ws_sm90_head_dim_v(FwdParams &params, cudaStream_t stream) {
    using Traits = FwdWsTraitsHeadDimV<Element, kHeadDim, kHeadDimV>;
    if (!fwd_ws_serves<Traits, false>(params)) return false;
    fwd_ws_launch<Traits, false>(params, stream);
    return true;
}

// Head dims 257-512, plain calls (forward only): Q / K 512 wide with V / O 256 wide, 128 x 32
// tiles, 2 stages (Q 128 KB + 2 x (K 32 + V 16 KB) = 224 KB; O staged in the Q tiles), launched
// once per 256-column half of V and O (the second half's V / O pointers 256 columns on, its V
// width what is left of d). S is computed twice, so at most 2/3 of the GEMM work is useful:
// a stopgap until O is split across warpgroups. Both launches write the same LSE. Returns false
// (nothing launched) where the kernel does not serve the call (score modifiers, dropout, strides
// or KV-cache refinements fwd_ws_serves rejects, a V head dim other than d).
template <typename Element>
using FwdWsTraitsHeadDim512 = FwdWsTraitsSm90<512, 32, 2, Element, 2, 256>;

template <typename Element>
bool run_mha_fwd_ws_sm90_d512(FwdParams &params, cudaStream_t stream) {
    using Traits = FwdWsTraitsHeadDim512<Element>;
    static_assert(Traits::kSmemSize <= 227 * 1024);
    if (params.dv != params.d || params.d <= 256) return false;
    FwdParams halves[2] = {params, params};
    for (int h = 0; h < 2; ++h) {
        halves[h].dv = std::min(256, params.d - 256 * h);
        halves[h].v_ptr = static_cast<char *>(params.v_ptr) + 256 * h * sizeof(Element);
        halves[h].o_ptr = static_cast<char *>(params.o_ptr) + 256 * h * sizeof(Element);
        if (!fwd_ws_serves<Traits, false>(halves[h])) return false;
    }
    for (FwdParams &half : halves) fwd_ws_launch<Traits, false>(half, stream);
    return true;
}

}  // namespace flash
