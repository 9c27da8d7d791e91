// Tile shapes, shared-memory layouts, MMA and copy atoms for the SM80-class (mma.sync) kernels.
// They run on sm_80 and newer (the H200 included); a Hopper (sm_90a, wgmma/TMA) path gets its own
// traits header beside this one.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flash {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct KernelTraitsBase {
    using Element = Element_;
    using ElementAccum = float;
    using index_t = int64_t;

    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;

    using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                       MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                       MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;

    // Shared-memory tiles are built from (8 x kBlockKSmem) swizzled atoms so that ldmatrix and the
    // 16-byte cp.async stores are bank-conflict free.
    static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
    static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
    using SmemLayoutAtom = decltype(composition(
        Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));

    using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
    using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
    using SmemCopyAtomStore = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

    // Global <-> shared: 16-byte vectors, kGmemThreadsPerRow threads cover kBlockKSmem columns.
    static constexpr int kGmemElemsPerLoad = sizeof(cute::uint128_t) / sizeof(Element);
    static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
    static_assert(kNThreads % kGmemThreadsPerRow == 0);
    using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                  Stride<Int<kGmemThreadsPerRow>, _1>>;
    using GmemTiledCopyLoad = decltype(make_tiled_copy(
        Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
    using GmemTiledCopyStore = decltype(make_tiled_copy(
        Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
};

// Forward: each CTA owns kBlockM query rows; warps split the rows, K/V tiles stream through.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct FwdKernelTraits : KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kNWarps_, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kNWarps_, Element_>;
    using typename Base::Element;
    using typename Base::MmaAtom;
    using typename Base::SmemLayoutAtom;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    using Base::kNWarps;

    using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>, Tile<Int<16 * kNWarps>, _16, _16>>;

    using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    // V^T as the B operand of O += P V: the same bytes, indexed (d, n).
    using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                              make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
    using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
    using SmemLayoutO = SmemLayoutQ;

    static constexpr int kSmemQSize = size(SmemLayoutQ{}) * sizeof(Element);
    static constexpr int kSmemKVSize = size(SmemLayoutKV{}) * 2 * sizeof(Element);
    static constexpr int kSmemSize = kSmemQSize + kSmemKVSize;
};

// Backward: each CTA owns kBlockN keys of one query head and walks the query blocks, keeping
// dK and dV in registers; dQ is accumulated in fp32 global memory.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomLayoutMSdP, int kAtomLayoutNdKV,
          int kAtomLayoutMdQ, typename Element_>
struct BwdKernelTraits : KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kNWarps_, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kNWarps_, Element_>;
    using typename Base::Element;
    using typename Base::MmaAtom;
    using typename Base::SmemLayoutAtom;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    using Base::kNWarps;

    // S = Q K^T and dP = dO V^T: (kBlockM, kBlockN)
    static constexpr int kWarpsNSdP = kNWarps / kAtomLayoutMSdP;
    using TiledMmaSdP = TiledMMA<MmaAtom, Layout<Shape<Int<kAtomLayoutMSdP>, Int<kNWarps / kAtomLayoutMSdP>, _1>>,
                                 Tile<Int<16 * kAtomLayoutMSdP>, Int<16 * kNWarps / kAtomLayoutMSdP>, _16>>;
    // dK = dS^T Q and dV = P^T dO: (kBlockN, kHeadDim)
    using TiledMmadKV = TiledMMA<MmaAtom, Layout<Shape<Int<kAtomLayoutNdKV>, Int<kNWarps / kAtomLayoutNdKV>, _1>>,
                                 Tile<Int<16 * kAtomLayoutNdKV>, Int<16 * kNWarps / kAtomLayoutNdKV>, _16>>;
    // dQ = dS K: (kBlockM, kHeadDim)
    using TiledMmadQ = TiledMMA<MmaAtom, Layout<Shape<Int<kAtomLayoutMdQ>, Int<kNWarps / kAtomLayoutMdQ>, _1>>,
                                Tile<Int<16 * kAtomLayoutMdQ>, Int<16 * kNWarps / kAtomLayoutMdQ>, _16>>;

    using SmemLayoutQdO = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    using SmemLayoutQdOt = decltype(composition(SmemLayoutQdO{},
                                                make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
    using SmemLayoutQdOtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQdOt{}));

    using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    using SmemLayoutKt = decltype(composition(SmemLayoutKV{},
                                              make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
    using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));

    // P and dS tiles (kBlockM, kBlockN), read back both ways (dS K and dS^T Q).
    static constexpr int kPBlockN = kBlockN >= 64 ? 64 : 32;
    using SmemLayoutAtomPdS = decltype(composition(
        Swizzle<kPBlockN == 64 ? 3 : 2, 3, 3>{},
        Layout<Shape<Int<kBlockM>, Int<kPBlockN>>, Stride<Int<kPBlockN>, _1>>{}));
    using SmemLayoutPdS = decltype(tile_to_shape(SmemLayoutAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using SmemLayoutPdSt = decltype(composition(SmemLayoutPdS{},
                                                make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
    using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

    using SmemLayoutdKV = SmemLayoutKV;

    static constexpr int kSmemQdOSize = size(SmemLayoutQdO{}) * sizeof(Element);  // one buffer
    static constexpr int kSmemKVSize = size(SmemLayoutKV{}) * sizeof(Element);    // one of K, V
    static constexpr int kSmemPdSSize = size(SmemLayoutPdS{}) * sizeof(Element);  // one of P, dS
    // Q and dO double-buffered, K, V, P, dS single.
    static constexpr int kSmemSize = 4 * kSmemQdOSize + 2 * kSmemKVSize + 2 * kSmemPdSSize;
};

}  // namespace flash
