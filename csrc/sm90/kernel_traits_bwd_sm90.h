// Tile shapes, shared-memory layouts and warpgroup MMAs of the sm_90a backward.
//
// One CTA owns kBlockN (64 or 128) keys; each of its warpgroups owns 64 of them and computes the
// transposed score tiles S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T come out of the
// accumulators already in the register layout of the A operand of dV += P^T dO and
// dK += dS^T Q (no shared-memory round trip for those two GEMMs). dS^T is also written to shared
// memory, MN-major, for dQ = dS K, which both warpgroups compute together (80-row query blocks:
// keys-contiguous, for dQ^T = K^T dS^T, see kdQSwapped).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "common/kernel_traits.h"
#include "sm90/kernel_traits_sm90.h"  // GmmaSmemAtomK

namespace flash {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, typename Element_, int kMinBlocksPerSm_ = 1>
struct BwdKernelTraitsSm90 : KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kBlockN_ / 16, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kBlockM_, kBlockN_, kBlockN_ / 16, Element_>;
    using typename Base::Element;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    static_assert(kBlockM == 64 || kBlockM == 80 || kBlockM == 128);
    static_assert(kBlockN == 64 || kBlockN == 128);
    static constexpr int kNWarpgroups = kBlockN / 64;
    static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
    static constexpr int kStages = 2;  // Q, dO, LSE and softmax_d are double-buffered

    using AtomLayoutKV = Layout<Shape<Int<kNWarpgroups>, _1, _1>>;  // warpgroup w owns keys [64w, 64w + 64)
    // S^T = K Q^T and dP^T = V dO^T: (kBlockN, kBlockM), both operands K-major in smem.
    using TiledMmaSdP = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(), AtomLayoutKV{}));
    // dV += P^T dO, dK += dS^T Q: (kBlockN, d), A from registers, B = dO^T / Q^T (MN-major).
    using TiledMmadKV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                             GMMA::Major::MN>(),
        AtomLayoutKV{}));
    // dQ = dS K: (kBlockM, d). With fewer 64-row query slabs than warpgroups, the warpgroups
    // split the head dim instead. kdQSwapped (kBlockM not a multiple of 64: FA3's 80-row d128
    // blocks, whose wgmma M cannot be the queries): dQ^T = K^T dS^T, (d, kBlockM), warpgroup w on
    // head-dim rows [64 w, 64 w + 64), A = K^T (MN-major), B = dS (kBlockM, kBlockN) K-major.
    static constexpr bool kdQSwapped = kBlockM % 64 != 0;
    static_assert(!kdQSwapped || kHeadDim == 64 * kNWarpgroups, "swapped dQ: one 64-row head-dim slab per warpgroup");
    static constexpr int kdQWgM = kdQSwapped ? 1 : (kBlockM / 64 < kNWarpgroups ? kBlockM / 64 : kNWarpgroups);
    static constexpr int kdQWgN = kNWarpgroups / kdQWgM;
    using TiledMmadQ = std::conditional_t<
        kdQSwapped,
        decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kBlockN>>,
                                                     GMMA::Major::MN, GMMA::Major::K>(),
                                Layout<Shape<Int<kNWarpgroups>, _1, _1>>{})),
        decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / kdQWgN>, Int<kBlockN>>,
                                                     GMMA::Major::MN, GMMA::Major::MN>(),
                                Layout<Shape<Int<kdQWgM>, Int<kdQWgN>, _1>>{}))>;
    // N = 80 needs CuTe's extended wgmma shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, defined by
    // that kernel's own units before any CuTe header); without them the selectors build it from
    // N = 16 atoms, five times the instructions (measured 0.67-0.71x).
    static_assert(size<1>(typename TiledMmaSdP::AtomShape_MNK{}) == kBlockM, "S^T / dP^T: one wgmma across the queries");
    static_assert(!kdQSwapped || size<1>(typename TiledMmadQ::AtomShape_MNK{}) == kBlockM,
                  "dQ^T: one wgmma across the queries");
    // The dQ accumulator's shape: (kBlockM, d), or (d, kBlockM) swapped.
    using ShapedQAcc = std::conditional_t<kdQSwapped, Shape<Int<kHeadDim>, Int<kBlockM>>, Shape<Int<kBlockM>, Int<kHeadDim>>>;

    using SmemLayoutQdO = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{},
                                                 Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
    // Q^T / dO^T (d, m, stage) over the same bytes.
    using SmemLayoutQdOt = decltype(composition(
        SmemLayoutQdO{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
    using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    using SmemLayoutKt = decltype(composition(
        SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
    // dS (m, n), m contiguous: the MN-major A operand of dQ = dS K. Written through the (n, m) view.
    // (kdQSwapped: n contiguous, the K-major B operand of dQ^T = K^T dS^T.)
    using SmemAtomdS = std::conditional_t<kdQSwapped, GmmaSmemAtomK<Element, kBlockN>, GMMA::Layout_MN_SW128_Atom<Element>>;
    using SmemLayoutdS = decltype(tile_to_shape(SmemAtomdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using SmemLayoutdSt = decltype(composition(
        SmemLayoutdS{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, Step<_2, _1>{})));
    // dK / dV leave through FA2-style swizzled tiles and 16-byte global stores.
    using SmemLayoutdKV = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    // V's head dim, and dV's MMA / staging tile (store_dk_dv): d here; the warp-specialised traits
    // (BwdWsTraitsSm90's kHeadDimV) give them a width of their own.
    static constexpr int kHeadDimV = kHeadDim;
    using TiledMmadV = TiledMmadKV;
    using SmemLayoutdV = SmemLayoutdKV;

    static constexpr int kSmemQdOElems = cosize(SmemLayoutQdO{});
    static constexpr int kSmemKVElems = cosize(SmemLayoutKV{});
    static constexpr int kSmemdSElems = cosize(SmemLayoutdS{});
    static constexpr int kSmemElems = 2 * kSmemQdOElems + 2 * kSmemKVElems + kSmemdSElems;
    // LSE and softmax_d of each stage follow, in fp32, then (dropout) each stage's drop flags, a
    // byte per element of the (kBlockN x kBlockM) tile (dropout_sm90.h).
    static constexpr int kSmemDropoutOffset = kSmemElems * sizeof(Element) + 2 * kStages * kBlockM * sizeof(float);
    static constexpr int kSmemDropoutFlagsPerStage = kBlockM * kBlockN;
    static constexpr int kSmemSize = kSmemDropoutOffset + kStages * kSmemDropoutFlagsPerStage;
    static_assert(2 * cosize(SmemLayoutdKV{}) <= kSmemElems);
};

// The split-d tiles of the warp-specialised backward at head dim 256 (kernel_traits_bwd_ws_sm90.h,
// kSplitD; also MLA's 192 / 128 there, with dV's own width): one CTA owns 64 keys and both
// warpgroups work on all of them. dK / dV (64 x 256 fp32) would not fit one warpgroup's registers,
// so the warpgroups split the head dim: warpgroup w owns columns [d/2 w, d/2 (w + 1)) of dK, dV
// and dQ. S^T / dP^T are split by queries (FA3's split:
// warpgroup w on queries [32 w, 32 w + 32)), P^T and dS^T go through shared memory (both halves),
// and dV / dK read their A operand from there (SS).
template <int kHeadDim_, typename Element_>
struct BwdKernelTraitsSm90SplitD : KernelTraitsBase<kHeadDim_, 64, 64, 8, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, 64, 64, 8, Element_>;  // 8 warps: the 256 consumer threads
    using typename Base::Element;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    // Each warpgroup's half starts at a multiple of 32 columns (d192: 96, on SW64 atoms, see
    // BwdWsTraitsSm90::kKSw64).
    static_assert(kHeadDim % 64 == 0);
    static constexpr int kNWarpgroups = 2;
    static constexpr int kStages = 2;

    // S^T = K Q^T and dP^T = V dO^T: (kBlockN, kBlockM), both operands K-major in smem, a
    // 256-thread MMA, warpgroup w on queries [32 w, 32 w + 32).
    using TiledMmaSdP = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM / 2>, Int<kHeadDim>>>(),
        Layout<Shape<_1, _2, _1>>{}));
    // dV += P^T dO, dK += dS^T Q: (kBlockN, d) over the 256 consumer threads, warpgroup w on
    // columns [d/2 w, d/2 (w + 1)); A (P^T, dS^T) from shared memory, K-major (queries contiguous).
    using TiledMmadKV = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockM>>, GMMA::Major::K,
                             GMMA::Major::MN>(),
        Layout<Shape<_1, _2, _1>>{}));
    // dQ = dS K: (kBlockM, d), split along d the same way.
    static constexpr bool kdQSwapped = false;
    static constexpr int kdQWgM = 1;
    static constexpr int kdQWgN = 2;
    using ShapedQAcc = Shape<Int<kBlockM>, Int<kHeadDim>>;
    using SmemAtomdS = GMMA::Layout_MN_SW128_Atom<Element>;  // P^T / dS^T (BwdWsTraitsSm90)
    using TiledMmadQ = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockN>>, GMMA::Major::MN,
                             GMMA::Major::MN>(),
        Layout<Shape<_1, _2, _1>>{}));

    using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    using SmemLayoutKt = decltype(composition(
        SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
    // dK / dV leave through FA2-style swizzled tiles and 16-byte global stores.
    using SmemLayoutdKV = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    // No V width of its own here (store_dk_dv); BwdWsTraitsSm90 overrides these for one.
    static constexpr int kHeadDimV = kHeadDim;
    using TiledMmadV = TiledMmadKV;
    using SmemLayoutdV = SmemLayoutdKV;
};

}  // namespace flash
