// Tile shapes, GMMA-compatible shared-memory layouts and warpgroup MMAs for the sm_90a forward.
#pragma once

#include <type_traits>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "common/kernel_traits.h"

namespace flash {

using namespace cute;

// The widest swizzle a K-major tile with kK contiguous 16-bit elements allows.
template <typename Element, int kK>
using GmmaSmemAtomK = std::conditional_t<kK % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                         std::conditional_t<kK % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                                                            GMMA::Layout_K_SW32_Atom<Element>>>;

// kBlockM query rows per CTA, 64 per warpgroup; K/V tiles of kBlockN keys, two stages each.
template <int kHeadDim_, int kBlockM_, int kBlockN_, typename Element_, int kMinBlocksPerSm_ = 1>
struct FwdKernelTraitsSm90 : KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kBlockM_ / 16, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kBlockM_ / 16, Element_>;
    using typename Base::Element;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    static constexpr int kNWarpgroups = kBlockM / 64;
    static constexpr int kStages = 2;
    static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;

    using AtomLayout = Layout<Shape<Int<kNWarpgroups>, _1, _1>>;
    using TiledMmaQK = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), AtomLayout{}));
    using TiledMmaPV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                             GMMA::Major::MN>(),
        AtomLayout{}));

    using SmemLayoutQ = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{},
                                                Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
    // V^T (d, n, stage) over the same bytes: the MN-major B operand of O += P V.
    using SmemLayoutVt = decltype(composition(
        SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
    // O leaves through the FA2-style swizzled tile (reusing Q's bytes) and 16-byte global stores.
    using SmemLayoutO = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));

    static constexpr int kSmemQElems = cosize(SmemLayoutQ{});
    static constexpr int kSmemKVElems = cosize(SmemLayoutKV{});
    static_assert(cosize(SmemLayoutO{}) <= kSmemQElems);
    static constexpr int kSmemSize = (kSmemQElems + 2 * kSmemKVElems) * sizeof(Element);
    // The feature variant adds each thread's dropout flags of one 128-key block (4 x 16 bytes).
    static constexpr int kSmemDropoutFlags = kNWarpgroups * 128 * 4 * 16;
};

}  // namespace flash
