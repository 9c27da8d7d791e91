// Tiles, shared-memory layouts, TMA types and shared storage of the warp-specialised sm_90a
// forward (flash_fwd_ws_kernel_sm90.h).
//
// One CTA per (kBlockM-query block, batch, head), 1 + kNConsumerWG warpgroups:
//   warpgroup 0: producer. Its warp 0 (one thread) issues the TMA loads of Q (once) and of the
//                K / V tiles into kStages-deep mbarrier pipelines; registers cut to kProducerRegs.
//   warpgroups 1 .. kNConsumerWG: consumers, 64 query rows each (warpgroup w + 1 has the
//                tile's rows [64 w, 64 w + 64)), registers raised to kConsumerRegs.
#pragma once

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/kernel_traits.h"
#include "sm90/kernel_traits_sm90.h"  // GmmaSmemAtomK

namespace flash {

using namespace cute;

// Named barriers of the warp-specialised forward (ids above CUTLASS's reserved ones).
// kSchedWG0 + w: consumer warpgroup w may issue its GEMMs (pingpong; w < 3);
// kEpiWG0 + w: consumer warpgroup w's epilogue (128 threads).
enum class FwdWsBarrier : uint32_t {
    kSchedWG0 = 0,
    kEpiWG0 = 3,
};

// See FwdWsTraitsSm90::kLazyRescaleLog2.
constexpr int kFwdLazyRescaleLog2 = 8;
// The same for the softcap / ALiBi / dropout kernels.
constexpr int kFwdLazyRescaleLog2Feat = 8;
// See FwdWsTraitsSm90::kQInRegs.
constexpr int kFwdQInRegs = 1;

// kHeadDimV_: V's (and O's) head dim where it differs from Q's and K's (DeepSeek MLA: 192 / 128).
template <int kHeadDim_, int kBlockN_, int kStages_, typename Element_, int kNConsumerWG_ = 2,
          int kHeadDimV_ = kHeadDim_>
struct FwdWsTraitsSm90 {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static_assert(kHeadDimV <= kHeadDim, "O is staged in the Q tile");
    static constexpr int kNConsumerWG = kNConsumerWG_;
    static_assert(kNConsumerWG == 2 || kNConsumerWG == 3);
    static constexpr int kBlockM = 64 * kNConsumerWG;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kStages = kStages_;
    static constexpr int kRowsPerWG = 64;
    static_assert(kBlockM == kNConsumerWG * kRowsPerWG);
    static constexpr int kNConsumerThreads = kNConsumerWG * 128;
    static constexpr int kNThreads = 128 + kNConsumerThreads;
    // FA3's splits: 128 x 24 + 256 x 240 = 64512 and 128 x 32 + 384 x 160 = 65536 registers.
    static constexpr int kProducerRegs = kNConsumerWG == 2 ? 24 : 32;
    static constexpr int kConsumerRegs = kNConsumerWG == 2 ? 240 : 160;
    static_assert(kBlockN % 16 == 0 && kHeadDim % 64 == 0 && kHeadDimV % 64 == 0);
    // O's online-softmax rescale placed just before the next P V is issued, where the S GEMM
    // issued right before it covers it (FA3's RescaleOBeforeGemm, which it uses above d128),
    // instead of after the P V wait, on the path from one pingpong turn to the next. Measured
    // (bf16 16k tokens, two-build A/B): d256 plain +0-2% (10 of 12 cells), d64 and
    // d128 1-2.5% slower, the feature kernels mixed (d256 dropout -4%, ALiBi +2%): plain d256 only
    // (the mainloop's kFeat keeps the feature kernels on the other placement).
    static constexpr bool kRescaleOBeforePV = kHeadDimV > 128;  // O's width decides (equal but for MLA)
    // The plain kernels' conditional rescaling (OnlineSoftmax::update_scores kLazyLog2; 0 = every
    // tile rescales O as soon as a row max moves). Measured (two-build A/B):
    // d128 +1-9%, d256 +3-13% (largest at 8k), d64 2-5% slower (its O rescale is only 32 FMULs
    // per tile and the vote costs more than it saves): d >= 128 only.
    static constexpr int kLazyRescaleLog2 = kHeadDimV >= 128 ? kFwdLazyRescaleLog2 : 0;
    static constexpr int kLazyRescaleLog2Feat = kHeadDimV >= 128 ? kFwdLazyRescaleLog2Feat : 0;
    // The plain kernels' TMA store of O (see fwd_ws_store). Measured (run-time A/B):
    // d64 / d128 +1-2.6% at 512-1k, d256 1-2% slower at 512-2k: d <= 128 only.
    // (kHeadDimV == kHeadDim: the O descriptor is built over Q's global shape.)
    static constexpr bool kTmaStoreO = kHeadDim <= 128 && kHeadDimV == kHeadDim;
    // Whether a kernel compiles the TMA store in: the plain ones only (the feature kernels, which
    // spilled 20-100 B with both store paths, keep the per-thread stores).
    template <bool kFeat>
    static constexpr bool kTmaStoreOFor = !kFeat && kTmaStoreO;

    // S = Q K^T with Q as the register A operand (RS, loaded from its shared tile once per tile)
    // instead of both operands from shared memory (SS): the wgmma then reads K alone from shared
    // memory, 32 instead of 48 KB per (64-row, 128-key) S GEMM at d128. Tried because
    // our d >= 128 forwards run at the 700 W board limit while cuDNN's draw ~570 W; measured
    // (two-build A/B): causal +0.1-3.1% (most at 8k), non-causal +-1%, power unchanged.
    // d128 plain persistent kernel only (ptxas, CUDA 13.0: up to R226 of its 232 registers, no
    // spills; the non-persistent one spilled 328 B, d256 has no room for 64 more registers, the
    // feature kernels spill already).
    static constexpr bool kQInRegs = kHeadDim == 128 && kFwdQInRegs != 0;
    template <bool kFeat, bool kPersistent>
    static constexpr bool kQInRegsFor = !kFeat && kPersistent && kQInRegs;

    // One warpgroup's GEMMs: S = Q K^T (Q from smem or registers, K from smem) and O += P V (P
    // from registers).
    using TiledMmaQK = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>()));
    using TiledMmaQKRegs = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>()));
    template <bool kFeat, bool kPersistent>
    using TiledMmaQKFor = std::conditional_t<kQInRegsFor<kFeat, kPersistent>, TiledMmaQKRegs, TiledMmaQK>;
    using TiledMmaPV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>, GMMA::Major::K,
                             GMMA::Major::MN>()));

    using SmemAtom = GmmaSmemAtomK<Element, kHeadDim>;
    // Q: one (64, d) tile per consumer warpgroup, each loaded by its own TMA copy.
    using SmemLayoutQTile = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kRowsPerWG>, Int<kHeadDim>>{}));
    using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kRowsPerWG>, Int<kHeadDim>, Int<kNConsumerWG>>{}));
    using SmemLayoutKVTile = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
    using SmemAtomV = GmmaSmemAtomK<Element, kHeadDimV>;
    using SmemLayoutVTile = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
    using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
    // V^T (dv, n, stage) over V's bytes: the MN-major B operand of O += P V.
    using SmemLayoutVt = decltype(composition(
        SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

    // Epilogue, per consumer warpgroup: O (64, d) staged in shared memory (the warpgroup's own Q
    // tile, which no GEMM reads any more, or its own buffer: kPersistentOwnO), then either one TMA
    // store (plain d <= 128 kernels on dense calls, params.fwd_tma_o), staged in the Q tile's layout
    // (SmemLayoutOTma: the TMA's 128-byte swizzle), or 16-byte stores by 128 threads from the
    // FA2-style swizzled tile (SmemLayoutO; varlen calls, whose tiles' rows past the sequence
    // belong to the next one while the TMA clips only at the packed tensor's end, and the feature
    // kernels, where the layout change alone made d256 spill 108 B).
    using EpiBase = KernelTraitsBase<kHeadDimV, kRowsPerWG, kBlockN, 4, Element>;
    using SmemLayoutO = decltype(tile_to_shape(typename EpiBase::SmemLayoutAtom{}, Shape<Int<kRowsPerWG>, Int<kHeadDimV>>{}));
    static_assert(cosize(SmemLayoutO{}) <= cosize(SmemLayoutQTile{}));
    using SmemLayoutOTma = SmemLayoutQTile;

    // Global tensors as the TMA sees them: (rows, d, heads, batch), d contiguous. Dense: rows =
    // seqlen, batch = b. Varlen: rows = total rows of the packed tensor, batch = 1.
    using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
    using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
    using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const *>(nullptr)), GmemShape{}, GmemStride{}));
    using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQTile{},
                                        Shape<Int<kRowsPerWG>, Int<kHeadDim>>{}, _1{}));
    using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKVTile{},
                                         Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
    using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutVTile{},
                                        Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));
    using GmemTensorO = decltype(make_tensor(make_gmem_ptr(static_cast<Element *>(nullptr)), GmemShape{}, GmemStride{}));
    using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorO{}, SmemLayoutOTma{},
                                        Shape<Int<kRowsPerWG>, Int<kHeadDim>>{}, _1{}));
    static constexpr uint32_t kQTileBytes = kRowsPerWG * kHeadDim * sizeof(Element);
    static constexpr uint32_t kKTileBytes = kBlockN * kHeadDim * sizeof(Element);
    static constexpr uint32_t kVTileBytes = kBlockN * kHeadDimV * sizeof(Element);

    using Pipeline = cutlass::PipelineTmaAsync<kStages>;
    using PipelineState = typename Pipeline::PipelineState;

    struct SharedStorage {
        cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_q;
        cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> smem_k;
        cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> smem_v;
        typename Pipeline::SharedStorage pipeline_k;
        typename Pipeline::SharedStorage pipeline_v;
        alignas(8) uint64_t barrier_q;
        // Persistent kernel: the consumers' "Q free" barrier (every consumer thread arrives once
        // per tile: after its last S GEMM where O has its own buffer, kPersistentOwnO, else after
        // its epilogue has read the O staged in its Q tile); the producer waits on it before
        // loading the next tile's Q.
        alignas(8) uint64_t barrier_q_empty;
        // Persistent kernel: the tile the producer loads Q for next (its linear index, -1 = no
        // more tiles), written before it arrives on barrier_q and read by the consumers after
        // their wait on it (the mbarrier's release / acquire order the two).
        int tile_next;
    };
    static constexpr int kSmemSize = sizeof(SharedStorage);
    static_assert(kSmemSize <= 227 * 1024, "shared memory of the sm_90a forward (warp-specialised) too large");

    // Persistent kernel: O staged in its own buffer behind SharedStorage (one (64, d) tile per
    // consumer warpgroup) where it fits (d64 152 + 24 KB, d128 160 + 32 KB; not d256, 192 + 64
    // KB), so that each warpgroup releases Q right after its tile's last S GEMM and the producer
    // loads the next tile's Q under that tile's last P V and epilogue. d256 stages O in Q and
    // releases it after the epilogue.
    static constexpr int kSmemOBytes = kNConsumerWG * cosize(SmemLayoutQTile{}) * int(sizeof(Element));
    static constexpr int kSmemOOffset = (kSmemSize + 1023) / 1024 * 1024;
    static constexpr bool kPersistentOwnO = kSmemOOffset + kSmemOBytes <= 227 * 1024;
    static constexpr int kSmemSizePersistent = kPersistentOwnO ? kSmemOOffset + kSmemOBytes : kSmemSize;

    // Feature variant (kFeat) with dropout: dropout_sm90.h's generate / apply work on 64- or
    // 128-key tiles aligned to the 128-key Philox groups; other widths (176, 80) serve softcap /
    // ALiBi only. Each consumer thread parks the keep flags of one 128-key group (4 x 16 bytes)
    // behind SharedStorage: 8 KB per consumer warpgroup, each thread reading back only its own.
    static constexpr bool kDropoutTiles = kBlockN == 64 || kBlockN == 128;
    static constexpr int kSmemDropoutFlags = kNConsumerWG * 128 * 4 * 16;
    // Philox calls of a thread in flight together (dropout_fwd_generate_group; 4 = all of a group).
    // 2 at d64 (3 consumer WGs at 160 registers): 4 and 1 spill there, 2 does not (ptxas, CUDA 13.0).
    static constexpr int kDropoutUnroll = kNConsumerWG == 3 ? 2 : 4;
    // Then, at d64 (160-register consumers), the per-(batch, head) feature scalars (FwdWsFeatures),
    // one copy per consumer warpgroup; elsewhere they stay in registers (flash_fwd_ws_mainloop_sm90.h).
    static constexpr bool kFeatScalarsInSmem = kNConsumerWG == 3;
    static constexpr int kFeatScalarBytes = 64;
    template <bool kFeat>
    static constexpr int kSmemSizeFor =
        kSmemSize + (kFeat ? (kDropoutTiles ? kSmemDropoutFlags : 0) +
                                 (kFeatScalarsInSmem ? kNConsumerWG * kFeatScalarBytes : 0)
                           : 0);
};

// Kernel arguments: the plain parameters plus the TMA descriptors (grid constants: TMA reads the
// descriptors from parameter space) and the global shapes they were built with.
template <typename Traits>
struct FwdWsKernelParams {
    FwdParams p;
    typename Traits::TmaQ tma_q;
    typename Traits::TmaKV tma_k;
    typename Traits::TmaV tma_v;
    // O (shape_q): the epilogue's TMA store where o_tma (kTmaStoreOFor, dense calls with TMA-able
    // strides and params.fwd_tma_o); otherwise zero and unused.
    typename Traits::TmaO tma_o;
    typename Traits::GmemShape shape_q, shape_k, shape_v;
    bool o_tma;
};

}  // namespace flash
