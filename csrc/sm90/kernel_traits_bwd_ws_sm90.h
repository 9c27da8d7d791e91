// Tiles, shared-memory layouts, TMA types and shared storage of the warp-specialised sm_90a
// backward (flash_bwd_ws_kernel_sm90.h).
//
// One CTA per (128-key block, batch, query head), 3 warpgroups:
//   warpgroup 0:    producer. One thread issues the TMA loads of each query block's Q and dO tiles
//                   and its LSE and softmax_d rows into a kStages-deep ring (PipelineTmaAsync);
//                   registers cut to kProducerRegs, its other warps retire.
//   warpgroups 1-2: consumers, exactly the GEMMs, tiles and register layouts of the lock-step
//                   kernel (BwdKernelTraitsSm90<d, 64, 128>: warpgroup w + 1 owns keys
//                   [64 w, 64 w + 64)), registers raised to kConsumerRegs.
#pragma once

#include <type_traits>

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/flash.h"
#include "sm90/kernel_traits_bwd_sm90.h"
#include "sm90/kernel_traits_sm90.h"  // GmmaSmemAtomK

namespace flash {

using namespace cute;

// Named barriers of the warp-specialised backward (ids above CUTLASS's reserved ones), all over
// the 256 consumer threads: the producer warpgroup never joins them, and __syncthreads would wait
// for its retired warps.
enum class BwdWsBarrier : uint32_t {
    kConsumers = 0,  // K / V landed; dK / dV staging (epilogue)
    kdS = 1,         // both warpgroups' dS^T of this query block are in shared memory
    // dQ through shared memory: over the 256 consumer threads + the dQ writer warp. (Split-d:
    // the same ids, buffer = pipeline stage; kdQEmpty0 once, after the last block: Q / dO are
    // free for the dK / dV staging.)
    kdQFull0 = 2,   // dQ buffer 0 (1: kdQFull0 + 1) written by the consumers, the writer may read it
    kdQEmpty0 = 4,  // the writer's bulk reduce has finished reading dQ buffer 0 (1: kdQEmpty0 + 1)
    // The split-d kMod kernel's deterministic dQ (consumers' ordered atomics): this CTA's turn
    // has come / its atomics are done. (CUTLASS leaves user ids 0-7.)
    kdQOrder = 6,
    // The split-d dropout kernel's single P^T buffer: both warpgroups' dV GEMMs of the previous
    // query block (its readers) have completed.
    kPFree = 7,
};

// dQ leaves through shared memory and one bulk reduce-add per query block (FA3), issued by
// warp 1 of the producer warpgroup, instead of per-thread fp32 atomics. kMod: softcap and ALiBi
// (the score modifiers of attn_mods.h) and the deterministic dQ. kDropout (with kMod): dropout,
// with ALiBi or not; the keep flags of query block m sit in buffer (m - m_block_min) % 2 in shared
// memory (layout 2 of dropout_sm90.h). At d128 warps 2-3 of the producer warpgroup generate them,
// handed over by a full / empty mbarrier pair per buffer (kDropoutInProducer); at d64 (and in the
// split-d kernel) the consumers do, block m + 2 while block m's dQ GEMM runs (see
// flash_bwd_ws_kernel_sm90.h).
// kSplitD (head dim 256): 64-key CTAs whose two consumer warpgroups split the head dim of dK / dV
// / dQ instead of the keys, and S^T / dP^T by queries, with P^T and dS^T through shared memory
// (BwdKernelTraitsSm90SplitD). Its dQ tiles leave through the query block's own Q / dO stage
// (no room for a dQ buffer at d256) and bulk reduces by warp 1 of the producer warpgroup
// (bwd_ws_write_dq_split_d), which also hands each stage back to the producer; in the slice's
// order for deterministic calls (BwdWsDqOrder). bf16 8k bwd: the deterministic calls
// 14.4 -> 7.7 ms (ordered fp32 atomics need a gpu-scope fence to publish them, which makes ptxas
// emit them as ATOMG), below the atomics kernel's plain 9.6 ms, hence every such call's kernel.
// kBlockM (not split-d, not dropout): query rows per step, 64, or 128 (d64, plain
// and kMod: FA3's d64 tiles; each consumer warpgroup's S^T / dP^T is 64 keys x 128 queries, dQ 64
// queries x d; deterministic calls count one counter per 128-row block, in the same buffer).
// kHeadDimV_: V's (and dO's, O's, dV's) head dim where it differs from Q's and K's (DeepSeek MLA:
// 192 / 128; the plain and kMod kernels, split-d or not, not dropout): V and dO tiles, their TMA
// and dP^T = V dO^T's K extent at kHeadDimV, the dV accumulator and its staging at kHeadDimV; S^T,
// dK and dQ at kHeadDim. kHeadDimV == kHeadDim: the types (and code) of the one-width kernel.
// Split-d with its own dv (192 / 128: each warpgroup owns dK 64 x 96 and dV 64 x 64): Q and K on
// SW64 atoms (kKSw64: the warpgroups' d / 2 = 96 column halves of Q^T and K^T, the MN-major B
// operands of dK and dQ, start on an atom), and the dQ tile's rows 32-63 go to a buffer of their
// own (smem_dq_hi, one per stage) instead of the narrower dO stage.
template <int kHeadDim_, int kStages_, typename Element_, bool kMod_ = false, bool kDropout_ = false,
          bool kSplitD_ = false, int kBlockM_ = 64, int kHeadDimV_ = kHeadDim_>
struct BwdWsTraitsSm90 : std::conditional_t<kSplitD_, BwdKernelTraitsSm90SplitD<kHeadDim_, Element_>,
                                            BwdKernelTraitsSm90<kHeadDim_, kBlockM_, 128, Element_>> {
    // The lock-step traits supply the tiled MMAs, the K / V / dS / dK-dV layouts and the 256-thread
    // copy atoms (GmemTiledCopyLoad for K / V, the store_tile atoms), all indexed by the consumer
    // thread index 0..255.
    using Base = std::conditional_t<kSplitD_, BwdKernelTraitsSm90SplitD<kHeadDim_, Element_>,
                                    BwdKernelTraitsSm90<kHeadDim_, kBlockM_, 128, Element_>>;
    static_assert(kBlockM_ == 64 || (!kSplitD_ && !kDropout_),
                  "128-row query blocks: the plain and score-modifier / deterministic kernels only");
    using typename Base::Element;
    using Base::kBlockM;
    using Base::kBlockN;
    using Base::kHeadDim;
    static_assert(Base::kNWarpgroups == 2);
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr bool kOwnHeadDimV = kHeadDimV != kHeadDim;
    static_assert(!kOwnHeadDimV || !kDropout_,
                  "a V head dim of its own: the plain and score-modifier kernels (not dropout)");
    static_assert(!kOwnHeadDimV || !kSplitD_ || (kHeadDimV / 2) % 32 == 0,
                  "split-d: each warpgroup's dV columns start at a multiple of 32");
    static_assert(kHeadDimV % 64 == 0 || !kOwnHeadDimV);
    static constexpr int kStages = kStages_;  // query blocks in flight in the Q / dO / LSE / softmax_d ring
    static constexpr bool kMod = kMod_;
    static constexpr bool kDropout = kDropout_;
    static_assert(!kDropout || kMod, "the dropout variant is a kMod kernel");
    static constexpr bool kSplitD = kSplitD_;
    static_assert(!kSplitD || kStages == 2, "split-d: dQ through the Q / dO stage of each of the two stages");
    static constexpr int kNConsumerThreads = 256;
    static constexpr int kNThreads = 128 + kNConsumerThreads;
    static_assert(Base::kNThreads == kNConsumerThreads);
    // FA3's split for one producer + two consumer warpgroups: 128 x 24 + 256 x 240 = 64512 registers.
    // The dropout kernel (not split-d) gives warps 2-3 of the producer warpgroup the Philox calls
    // (kDropoutInProducer). The setmaxnreg pool is the CTA's launch allocation, 384 x 168 = 64512
    // (128 x 32 + 256 x 240 = 65536 leaves the consumers' setmaxnreg.inc waiting forever: a
    // hang). 24 / 240: the Philox loop fits in 24 registers without spills (d128), and
    // the consumers spill 76 bytes at 232.
    // d64 stays on the consumers' generation: there the producer form (40 / 232 registers)
    // measured 1.38x the plain backward against 1.36x (d128: 1.14x against 1.20x).
    static constexpr bool kDropoutInProducer = kDropout && !kSplitD_ && kHeadDim == 128;
    static constexpr int kDropProducerThreads = 64;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    static_assert(128 * kProducerRegs + kNConsumerThreads * kConsumerRegs <= (128 + kNConsumerThreads) * 168);

    // K: the base's SW128 tiles, except where each warpgroup's dQ columns (d / 2 = 96 at MLA's
    // d192) would start inside a 64-column SW128 atom of K^T, the MN-major B operand of dQ = dS K
    // (not a canonical GMMA layout there): SW64 atoms, 32 columns wide. Split-d: Q too (the dK
    // columns, halves of Q^T); dO where dV's halves (dv / 2) would (not at dv 128).
    static constexpr bool kKSw64 = kHeadDim % 64 == 0 && (kHeadDim / Base::kdQWgN) % 64 != 0 &&
                                   (kHeadDim / Base::kdQWgN) % 32 == 0 && kHeadDim > 128;
    static constexpr bool kQSw64 = kSplitD_ && kKSw64;
    static constexpr bool kdOSw64 = kSplitD_ && kHeadDimV % 64 == 0 && (kHeadDimV / 2) % 64 != 0;
    using SmemAtom = std::conditional_t<kQSw64, GMMA::Layout_K_SW64_Atom<Element>, GmmaSmemAtomK<Element, kHeadDim>>;
    // Q / dO: (kBlockM, d, stage), K-major, one TMA tile per stage; Q^T / dO^T over the same bytes.
    // (SmemLayoutQdO*: Q's, at kHeadDim; SmemLayoutdO*: dO's, at kHeadDimV, the same types at
    // kHeadDimV == kHeadDim.)
    using SmemLayoutQdOTile = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    using SmemLayoutQdO = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
    using SmemLayoutQdOt = decltype(composition(
        SmemLayoutQdO{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
    using SmemAtomV = std::conditional_t<kdOSw64, GMMA::Layout_K_SW64_Atom<Element>, GmmaSmemAtomK<Element, kHeadDimV>>;
    using SmemLayoutdOTile = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
    using SmemLayoutdO = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStages>>{}));
    using SmemLayoutdOt = decltype(composition(
        SmemLayoutdO{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
    using SmemLayoutKV = std::conditional_t<
        kKSw64,
        decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<Element>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{})),
        typename Base::SmemLayoutKV>;
    using SmemLayoutKt = std::conditional_t<
        kKSw64,
        decltype(composition(SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{}))),
        typename Base::SmemLayoutKt>;
    // V: (kBlockN, dv), K-major (the A operand of dP^T = V dO^T).
    using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
    // dP^T = V dO^T: (kBlockN, kBlockM) over K extent dv; dV += P^T dO: (kBlockN, dv). At
    // kHeadDimV == kHeadDim these are the base's TiledMmaSdP / TiledMmadKV. Split-d: the base's
    // forms (queries split for dP^T; dV's columns split, P^T from shared memory) at dv.
    using TiledMmadPOwn = std::conditional_t<
        kSplitD_,
        decltype(make_tiled_mma(
            GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM / 2>, Int<kHeadDimV>>>(),
            Layout<Shape<_1, _2, _1>>{})),
        decltype(make_tiled_mma(
            GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDimV>>>(),
            Layout<Shape<_2, _1, _1>>{}))>;
    using TiledMmadVOwn = std::conditional_t<
        kSplitD_,
        decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV / 2>, Int<kBlockM>>,
                                                     GMMA::Major::K, GMMA::Major::MN>(),
                                Layout<Shape<_1, _2, _1>>{})),
        decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockM>>,
                                                     GMMA::Major::K, GMMA::Major::MN>(),
                                Layout<Shape<_2, _1, _1>>{}))>;
    using TiledMmadP = std::conditional_t<kOwnHeadDimV, TiledMmadPOwn, typename Base::TiledMmaSdP>;
    using TiledMmadV = std::conditional_t<kOwnHeadDimV, TiledMmadVOwn, typename Base::TiledMmadKV>;
    // dK's and dV's staging tiles (store_dk_dv), dV's after dK's. Split-d, where a warpgroup's
    // half (d / 2 = 96) starts inside the base's 64-column atom: 32-column atoms (Swizzle<2, 3, 3>),
    // as the accumulator-to-shared copy's column partition needs.
    using SmemLayoutAtom32 = decltype(composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, _32>, Stride<_32, _1>>{}));
    template <int kCols>
    using SmemLayoutStage = decltype(tile_to_shape(
        std::conditional_t<kSplitD_ && (kCols / 2) % 64 != 0, SmemLayoutAtom32, typename Base::SmemLayoutAtom>{},
        Shape<Int<kBlockN>, Int<kCols>>{}));
    using SmemLayoutdKV = std::conditional_t<kSplitD_ && (kHeadDim / 2) % 64 != 0, SmemLayoutStage<kHeadDim>,
                                             typename Base::SmemLayoutdKV>;
    using SmemLayoutdV = std::conditional_t<kOwnHeadDimV, SmemLayoutStage<kHeadDimV>, SmemLayoutdKV>;
    // dS (m, n, buffer), two buffers: a warpgroup writes block i + 1's dS^T while the other may
    // still run block i's dQ = dS K, so one barrier per query block suffices (see the kernel).
    static constexpr int kdSBuffers = 2;
    using SmemLayoutdS = decltype(tile_to_shape(typename Base::SmemAtomdS{},
                                                Shape<Int<kBlockM>, Int<kBlockN>, Int<kdSBuffers>>{}));
    using SmemLayoutdSt = decltype(composition(
        SmemLayoutdS{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kdSBuffers>>{}, Step<_2, _1, _3>{})));
    // LSE / softmax_d rows: one 1-D TMA box per stage. A tiled TMA load must start at a 16-byte
    // aligned global address (the H200 raises an illegal instruction otherwise: seqlen_q % 4 != 0),
    // and a (batch, head) row starts at any element offset
    // (LSE: b h seqlen_q + h seqlen_q; varlen softmax_d: cu_seqlens_q[b] + 128 b). So the box
    // starts at the row's offset rounded down to 4 elements and is kRowShiftMax longer; the
    // consumers read it from the shift (offset % 4) on. Stages 128-byte aligned for the TMA.
    static constexpr int kRowShiftMax = 4;
    static constexpr int kRowBox = kBlockM + kRowShiftMax;        // 68 floats: 272 bytes
    static constexpr int kRowStageStride = (kRowBox + 31) / 32 * 32;  // 96 floats: 384 bytes
    using SmemLayoutRowTile = Layout<Shape<Int<kRowBox>>>;
    using SmemLayoutRow = Layout<Shape<Int<kRowBox>, Int<kStages>>, Stride<_1, Int<kRowStageStride>>>;

    // Global tensors as the TMA sees them. Q / dO: (rows, d, heads, batch), d contiguous; dense:
    // rows = seqlen_q, batch = b; varlen: rows = total_q, batch = 1 (as the forward). LSE /
    // softmax_d: the whole fp32 buffer as one 1-D tensor, each (batch, head) row found by an
    // element offset: their row strides (seqlen_q, accum_rows) are not multiples of 16 bytes in
    // general, which a 2-D TMA tensor would need.
    using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
    using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
    using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const *>(nullptr)), GmemShape{}, GmemStride{}));
    using GmemShapeRow = Shape<int32_t>;
    using GmemTensorRow = decltype(make_tensor(make_gmem_ptr(static_cast<float const *>(nullptr)), GmemShapeRow{},
                                               Stride<_1>{}));
    using TmaQdO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQdOTile{},
                                          Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
    // dO's (kBlockM, dv) tiles: TmaQdO itself at kHeadDimV == kHeadDim.
    using TmadO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutdOTile{},
                                         Shape<Int<kBlockM>, Int<kHeadDimV>>{}, _1{}));
    using TmaRow = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorRow{}, SmemLayoutRowTile{}, Shape<Int<kRowBox>>{},
                                          _1{}));
    // Bytes landing per stage; a TMA box counts in full, zero-filled parts included.
    static constexpr uint32_t kStageBytes =
        kBlockM * (kHeadDim + kHeadDimV) * sizeof(Element) + 2 * kRowBox * sizeof(float);

    using Pipeline = cutlass::PipelineTmaAsync<kStages>;
    using PipelineState = typename Pipeline::PipelineState;

    // dQ tiles (not split-d): (kBlockM, d, buffer) fp32, row-major, byte for byte the dq_accum rows
    // they are added to (one contiguous 1-D bulk reduce per tile); with params.dq_accum_swizzled
    // (always, for the d64 / d128 kernels) float c of row r sits at c ^ dq_accum_swizzle(r) in
    // both, which makes the consumers' float2 stores conflict-free (see bwd_ws_dq_to_smem) and which
    // the dQ conversion undoes. Double-buffered where that fits (kdQBuffers): the consumers
    // fill one while the writer's reduce still reads the other.
    struct SharedStoragePlain {
        // Q, dO, K and V first and contiguous: the dK / dV staging of the epilogue reuses them.
        cute::array_aligned<Element, cosize_v<SmemLayoutQdO>, 1024> smem_q;
        cute::array_aligned<Element, cosize_v<SmemLayoutdO>, 1024> smem_do;
        cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> smem_k;
        cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> smem_v;
        cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> smem_ds;
        cute::array_aligned<float, cosize_v<SmemLayoutRow>, 128> smem_lse;  // TMA: 128-byte aligned boxes
        cute::array_aligned<float, cosize_v<SmemLayoutRow>, 128> smem_dsum;
        typename Pipeline::SharedStorage pipeline;
    };
    // Dropout keep flags (kDropout): layout 2 of dropout_sm90.h, one byte per element of the
    // 64 x 128 tile (2048 words) per buffer; LDS.128 / STS.64: 16-byte aligned.
    static constexpr int kDropFlagBuffers = 2;
    static constexpr int kDropFlagWords = kBlockM * kBlockN / 4;
    template <int kBuffers>
    struct SharedStorageDqBuffersN : SharedStoragePlain {
        cute::array_aligned<float, kBuffers * kBlockM * kHeadDim, 128> smem_dq;  // bulk copies: 16-byte aligned
    };
    template <int kBuffers>
    struct SharedStorageDropoutN : SharedStorageDqBuffersN<kBuffers> {
        cute::array_aligned<uint32_t, kDropFlagBuffers * kDropFlagWords, 128> smem_drop_flags;
        // kDropoutInProducer: buffer b is full (the producer warps' kDropProducerThreads arrivals)
        // / empty (the consumer threads' arrivals after their last read of its flags).
        alignas(8) uint64_t drop_full[kDropFlagBuffers];
        alignas(8) uint64_t drop_empty[kDropFlagBuffers];
    };
    template <int kBuffers>
    using SharedStorageDqN = std::conditional_t<kDropout, SharedStorageDropoutN<kBuffers>, SharedStorageDqBuffersN<kBuffers>>;
    // Two dQ buffers where they fit, else one: the d128 dropout kernel keeps one (the two flag
    // buffers take its place: 226 KB otherwise + 16 KB), and so does a wider Q (MLA's d192): the
    // writer has read the tile long before the consumers finish the next block's five GEMMs.
    static constexpr int kdQBuffers = sizeof(SharedStorageDqN<2>) <= 227 * 1024 ? 2 : 1;
    using SmemLayoutdQ = Layout<Shape<Int<kBlockM>, Int<kHeadDim>, Int<kdQBuffers>>,
                                Stride<Int<kHeadDim>, _1, Int<kBlockM * kHeadDim>>>;
    static constexpr uint32_t kdQTileBytes = kBlockM * kHeadDim * sizeof(float);
    static constexpr int kNdQSyncThreads = kNConsumerThreads + 32;  // consumers + the writer warp
    using SharedStorageDqBuffers = SharedStorageDqBuffersN<kdQBuffers>;
    using SharedStorageDropout = SharedStorageDropoutN<kdQBuffers>;
    // kSplitD: P^T beside dS^T (same layout; two buffers, one with dropout, whose two
    // 4 KB flag buffers would not fit next to a second one: 224 KB + 8 KB > 227 KB).
    static constexpr int kPBuffers = kDropout ? 1 : 2;
    using SmemLayoutP = decltype(tile_to_shape(typename Base::SmemAtomdS{},
                                               Shape<Int<kBlockM>, Int<kBlockN>, Int<kPBuffers>>{}));
    using SmemLayoutPt = decltype(composition(
        SmemLayoutP{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kPBuffers>>{}, Step<_2, _1, _3>{})));
    struct SharedStorageSplitD : SharedStoragePlain {
        cute::array_aligned<Element, cosize_v<SmemLayoutP>, 1024> smem_p;
    };
    struct SharedStorageSplitDDropout : SharedStorageSplitD {
        cute::array_aligned<uint32_t, kDropFlagBuffers * kDropFlagWords, 128> smem_drop_flags;
    };
    // Split-d with its own dv: rows 32-63 of each stage's fp32 dQ tile (rows 0-31 fill the Q
    // stage exactly, the dO stage is too narrow), bulk-copy source: 16-byte aligned.
    static constexpr int kdQHalfFloats = kBlockM / 2 * kHeadDim;
    struct SharedStorageSplitDdQHi : SharedStorageSplitD {
        cute::array_aligned<float, kStages * kdQHalfFloats, 128> smem_dq_hi;
    };
    using SharedStorageSplitDNoDrop = std::conditional_t<kOwnHeadDimV, SharedStorageSplitDdQHi, SharedStorageSplitD>;
    using SharedStorage = std::conditional_t<
        kSplitD, std::conditional_t<kDropout, SharedStorageSplitDDropout, SharedStorageSplitDNoDrop>,
        std::conditional_t<kDropout, SharedStorageDropout, SharedStorageDqBuffers>>;
    static constexpr int kSmemSize = sizeof(SharedStorage);
    static_assert(kSmemSize <= 227 * 1024, "shared memory of the sm_90a backward (warp-specialised) too large");
    static_assert(cosize(SmemLayoutdKV{}) + cosize(SmemLayoutdV{}) <=
                  cosize(SmemLayoutQdO{}) + cosize(SmemLayoutdO{}) + cosize(SmemLayoutKV{}) +
                      cosize(SmemLayoutV{}));
};

// Kernel arguments: the plain parameters plus the TMA descriptors (grid constants: TMA reads the
// descriptors from parameter space) and the global shapes they were built with.
template <typename Traits>
struct BwdWsKernelParams {
    BwdParams p;
    typename Traits::TmaQdO tma_q;
    typename Traits::TmadO tma_do;  // TmaQdO but for a V head dim of its own
    typename Traits::TmaRow tma_lse;
    typename Traits::TmaRow tma_dsum;
    typename Traits::GmemShape shape_q;
    typename Traits::GmemShapeRow shape_lse, shape_dsum;
};

}  // namespace flash
