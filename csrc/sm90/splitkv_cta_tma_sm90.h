// TMA loads for the CTA-schedule decode kernel (flash_fwd_splitkv_cta_kernel.h, kTma;
// measured no faster than cp.async and not dispatched, sm_90a): one thread issues each tile's K and V as TMA tensor copies,
// one per warp sub-tile (each two boxes of 64 columns: CuTe splits the 128-byte swizzle atoms),
// completed on a per-stage mbarrier, instead of 16 cp.async per thread and tile with their address
// arithmetic (cuDNN runs 74 M instructions where the cp.async kernel runs ~137 M at b16 32k).
//
// The warp sub-tiles keep WarpTraits::SmemLayoutKV's function (Swizzle<3, 3, 3> on 64-element
// rows, tiled (16, 128)), written with GMMA's K-major 128-byte-swizzle atom so that make_tma_copy
// recognises the swizzle. Rows past the cache are zero-filled by the TMA unit; rows between the
// sequence's end (cache_seqlens) and the cache's are read as they are: their scores are masked,
// and the kernel zeroes those V rows of the last tile (P = 0 must not meet a NaN).
#pragma once

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "common/flash.h"

namespace flash {

using namespace cute;

template <typename Traits>
struct SplitKVCtaTma {
    using Element = typename Traits::Element;
    static constexpr int kBlockNw = Traits::kBlockNw;
    static constexpr int kHeadDim = Traits::kHeadDim;
    static constexpr int kSubTiles = Traits::kStages * Traits::kNWarps;  // per ring
    using Atom = GMMA::Layout_K_SW128_Atom<Element>;
    using SmemLayoutKV = decltype(tile_to_shape(Atom{}, Shape<Int<kBlockNw>, Int<kHeadDim>>{}));
    using SmemLayoutRing = decltype(tile_to_shape(Atom{}, Shape<Int<kBlockNw>, Int<kHeadDim>, Int<kSubTiles>>{}));
    using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                              make_layout(Shape<Int<kHeadDim>, Int<kBlockNw>>{}, GenRowMajor{})));
    using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
    static_assert(cosize_v<SmemLayoutKV> == Traits::kSubTileElems);
    // Global K / V: (rows, d, h_k, cache batch), d contiguous.
    using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
    using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
    using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const *>(nullptr)), GmemShape{}, GmemStride{}));
    using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKV{},
                                         Shape<Int<kBlockNw>, Int<kHeadDim>>{}, _1{}));
    static constexpr uint32_t kTileBytes = 2u * Traits::kBlockN * kHeadDim * sizeof(Element);  // K and V
    static constexpr int kSmemSize = Traits::kSmemSize + Traits::kStages * 8;                 // + full barriers

    struct Params {
        FwdParams p;
        TmaKV tma_k, tma_v;
        GmemShape shape_k;
    };

    // Host: the descriptors over params' dense K / V cache (kv_cache_batch entries of seqlen_k rows).
    static Params make_params(FwdParams const &params) {
        Params kp{};
        kp.p = params;
        kp.shape_k = make_shape(params.seqlen_k, params.d, params.h_k, params.kv_cache_batch);
        // TMA wants every stride a multiple of 16 bytes; a mode of extent 1 is never stepped.
        auto stride = [](int64_t s, int extent) { return extent <= 1 ? int64_t(8) : s; };
        auto gmem = [&](void const *ptr, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
            return make_tensor(make_gmem_ptr(static_cast<Element const *>(ptr)), kp.shape_k,
                               make_stride(stride(row_stride, params.seqlen_k), _1{}, stride(head_stride, params.h_k),
                                           stride(batch_stride, params.kv_cache_batch)));
        };
        kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.k_ptr, params.k_row_stride, params.k_head_stride,
                                                       params.k_batch_stride),
                                 SmemLayoutKV{}, Shape<Int<kBlockNw>, Int<kHeadDim>>{}, _1{});
        kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.v_ptr, params.v_row_stride, params.v_head_stride,
                                                       params.v_batch_stride),
                                 SmemLayoutKV{}, Shape<Int<kBlockNw>, Int<kHeadDim>>{}, _1{});
        return kp;
    }
    // Whether the TMA can address params' K / V (16-byte aligned base and strides).
    static bool supported(FwdParams const &params) {
        auto ok = [](int64_t s, int extent) { return extent <= 1 || (s > 0 && s % 8 == 0); };
        return reinterpret_cast<uintptr_t>(params.k_ptr) % 16 == 0 && reinterpret_cast<uintptr_t>(params.v_ptr) % 16 == 0 &&
               ok(params.k_row_stride, params.seqlen_k) && ok(params.v_row_stride, params.seqlen_k) &&
               ok(params.k_head_stride, params.h_k) && ok(params.v_head_stride, params.h_k) &&
               ok(params.k_batch_stride, params.kv_cache_batch) && ok(params.v_batch_stride, params.kv_cache_batch);
    }
};

}  // namespace flash
