// Main loop of the warp-specialised sm_90a forward: the producer's TMA loads and the consumer
// warpgroups' GEMMs + online softmax.
//
// Pipelines (cutlass::PipelineTmaAsync, kStages slots each, separate for K and V):
//   full[s]:  1 producer arrival (arrive_and_expect_tx by the producer thread) + the TMA bytes.
//   empty[s]: 256 arrivals, one per consumer thread (consumer_release); cluster size 1.
// Load order (producer):   K[0], {K[t], V[t-1]} for t = 1 .. n-1, V[n-1]  (walk t: key block
//                          n_block_max - 1 - t, from the right so causal blocks mask first).
// Consume order (each WG): K[0]; {K[t], V[t-1]} for t >= 1; V[n-1]. Both WGs read every stage
//                          and each of their 256 threads releases it once.
// Q: one mbarrier (arrival count 1, 2 x 64-row TMA tiles of bytes), waited at phase 0.
//
// Pingpong (named barriers kSchedWG0 + w, 256 threads each): a WG issues its GEMMs of an
// iteration only between sync(own) and arrive(next = (w + 1) % kNConsumerWG), so the WGs take
// turns on the tensor cores in a ring and one WG's softmax runs under the others' GEMMs:
//   start:            WG0 arrive(kSchedWG0)                     (WG0 goes first)
//   every iteration:  sync(own) ; issue S = Q K^T [; O += P V] ; arrive(next)
//   end:              WG0 sync(kSchedWG0)   consumes the last WG's last arrive (leaves no
//                     barrier half-complete at exit)
// Both WGs run the same number of iterations (the key-block range is the CTA's, not the WG's).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/mask.h"
#include "common/softmax.h"
#include "common/utils.h"
#include "common/attn_mods.h"
#include "sm90/dropout_sm90.h"
#include "sm90/flash_fwd_kernel_sm90.h"  // wgmma()
#include "sm90/kernel_traits_fwd_ws_sm90.h"

namespace flash {

using namespace cute;

// ---- producer: one thread ---------------------------------------------------------------------
// wait_q_free(): called before the Q load. The persistent kernel waits there until the previous
// tile's epilogue is done with the Q tiles, and then issues the first K tile before Q
// (kKFirst) so that its load overlaps that epilogue.
template <typename Traits, bool kKFirst = false, typename WaitQFree>
__forceinline__ __device__ void fwd_ws_load(FwdWsKernelParams<Traits> const &kp, typename Traits::SharedStorage &ss,
                                            typename Traits::Pipeline &pipeline_k, typename Traits::Pipeline &pipeline_v,
                                            BlockInfo const &binfo, int m_block, int bidb, int bidh, int bidh_k,
                                            int n_block_min, int n_block_max, typename Traits::PipelineState &state_k,
                                            typename Traits::PipelineState &state_v, WaitQFree &&wait_q_free) {
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kHeadDimV = Traits::kHeadDimV;
    constexpr int kRowsPerWG = Traits::kRowsPerWG;
    const bool varlen_q = binfo.sum_s_q != -1;
    const bool varlen_k = binfo.sum_s_k != -1;

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});

    // Varlen: the sequence starts at row cu_seqlens[b] of the packed tensor (batch index 0).
    Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, bidh, varlen_q ? 0 : bidb);
    Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, bidh_k, varlen_k ? 0 : bidb);
    Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, bidh_k, varlen_k ? 0 : bidb);
    Tensor gQ = local_tile(domain_offset(make_coord(varlen_q ? binfo.sum_s_q : 0, _0{}), mQ),
                           Shape<Int<kRowsPerWG>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (64, d, m)
    Tensor gK = local_tile(domain_offset(make_coord(varlen_k ? binfo.sum_s_k : 0, _0{}), mK),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, d, n)
    Tensor gV = local_tile(domain_offset(make_coord(varlen_k ? binfo.sum_s_k : 0, _0{}), mV),
                           Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));  // (N, dv, n)

    // (TMA, tile) views of global and (TMA, slot) views of shared memory.
    auto tma_q = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto tma_k = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto tma_v = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    auto &tQgQ = get<0>(tma_q);
    auto &tQsQ = get<1>(tma_q);
    auto &tKgK = get<0>(tma_k);
    auto &tKsK = get<1>(tma_k);
    auto &tVgV = get<0>(tma_v);
    auto &tVsV = get<1>(tma_v);

    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    auto load_q = [&]() {
        wait_q_free();
        Barrier::arrive_and_expect_tx(&ss.barrier_q, Traits::kNConsumerWG * Traits::kQTileBytes);
        CUTE_UNROLL
        for (int wg = 0; wg < Traits::kNConsumerWG; ++wg) {
            copy(kp.tma_q.with(ss.barrier_q, 0, TMA::CacheHintSm90::EVICT_FIRST),
                 tQgQ(_, m_block * Traits::kNConsumerWG + wg), tQsQ(_, wg));
        }
    };
    if constexpr (!kKFirst) { load_q(); }

    // K / V are read by every query block of the head: keep them in L2. state_k / state_v: the
    // producer's ring positions, carried from tile to tile by the persistent kernel.
    auto load_k = [&](int n_block) {
        pipeline_k.producer_acquire(state_k);
        copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(state_k), 0, TMA::CacheHintSm90::EVICT_LAST),
             tKgK(_, n_block), tKsK(_, state_k.index()));
        ++state_k;
    };
    auto load_v = [&](int n_block) {
        pipeline_v.producer_acquire(state_v);
        copy(kp.tma_v.with(*pipeline_v.producer_get_barrier(state_v), 0, TMA::CacheHintSm90::EVICT_LAST),
             tVgV(_, n_block), tVsV(_, state_v.index()));
        ++state_v;
    };
    load_k(n_block_max - 1);
    if constexpr (kKFirst) { load_q(); }
    for (int n_block = n_block_max - 2; n_block >= n_block_min; --n_block) {
        load_k(n_block);
        load_v(n_block + 1);
    }
    load_v(n_block_min);
    // No producer_tail: without clusters the CTA (and its shared memory) lives until the
    // consumers finish, and every slot issued here is consumed by them.
}

// ---- consumers: one warpgroup --------------------------------------------------------------------
// The per-(batch, head) scalars of the feature variant (kFeat): ScoreMod (softcap, ALiBi), applied
// to S before the mask, and the Philox key / counter base of the dropout. With
// Traits::kFeatScalarsInSmem (d64: 3 consumer WGs at 160 registers, 154 used by the plain variant)
// they live in shared memory (one copy per consumer warpgroup, Traits::kFeatScalarBytes) and are
// read where used (a few LDS per tile, no register across the main loop); elsewhere in registers
// (ptxas spills at d256 with the shared-memory copy, none with registers).
struct FwdWsFeatures {
    ScoreMod score_mod;
    Dropout dropout;
};

// Ends ptxas's scheduling block here. Without it ptxas moves the WARPGROUP.DEPBAR that waits for
// the warpgroup's own P V GEMM (warpgroup_wait<0>, placed after the softmax in the source) up
// to the top of the softmax's block, above the row max and the exps, so that every softmax
// waited for the previous P V and the intra-warpgroup overlap was lost (found
// unexplained then; probably the scheduler wants to interleave the F2FP conversions into P,
// which must follow the wait, with the MUFU.EX2s). A branch on a value the compiler cannot
// know splits the block: the running row sums, which are never negative (sums of exponentials;
// NaN compares false) and depend on every exponential of the tile, so that none of them can be
// sunk below the branch either (a branch on a kernel parameter let NVVM sink the d64 feature
// kernel's exps below it). Its body is a nanosleep, which, unlike a trap, leaves the wgmmas
// unserialised (a trap there made ptxas wait after every wgmma and spill 240 bytes).
template <typename RowTensor>
__forceinline__ __device__ void scheduling_block_boundary(RowTensor const &row_sum) {
    float lowest = row_sum(0);
    CUTE_UNROLL
    for (int mi = 1; mi < size(row_sum); ++mi) { lowest = fminf(lowest, row_sum(mi)); }
    if (lowest < 0.f) { __nanosleep(32); }
}

__forceinline__ __device__ void fwd_ws_sched_sync(int wg) {
    cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(FwdWsBarrier::kSchedWG0) + wg);
}
// The barrier id of the next warpgroup's turn, recomputed from %tid.x each time it is needed: a
// volatile read cannot be merged with earlier ones, so no register holds the id across the main
// loop (the d64 feature variant, at 160 registers, spilled it otherwise).
template <int kNConsumerWG>
__forceinline__ __device__ uint32_t fwd_ws_next_sched_barrier() {
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const uint32_t wg = tid / 128 - 1;  // consumer warpgroup (warpgroup 0 is the producer)
    return static_cast<uint32_t>(FwdWsBarrier::kSchedWG0) + (wg + 1 == kNConsumerWG ? 0 : wg + 1);
}
__forceinline__ __device__ void fwd_ws_sched_arrive(uint32_t barrier) {
    cutlass::arch::NamedBarrier::arrive(256, barrier);
}

// Zeroes rows [v_rows_valid, kBlockN) of V stage `stage` before any P V reads them (see
// fwd_ws_mma's v_rows_valid), then syncs the warpgroup: its generic-proxy writes before wgmma
// (async proxy) reads.
template <typename Traits>
__forceinline__ __device__ void fwd_ws_zero_v_tail(typename Traits::SharedStorage &ss, int v_rows_valid, int stage,
                                                   int wg, int wg_tidx) {
    constexpr int kBlockN = Traits::kBlockN;
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    constexpr int kChunks = Traits::kHeadDimV / 8;  // 16-byte chunks of a row (contiguous under the swizzle)
    const int n = (kBlockN - v_rows_valid) * kChunks;
    for (int i = wg_tidx; i < n; i += 128) {
        *reinterpret_cast<uint4 *>(&sV(v_rows_valid + i / kChunks, (i % kChunks) * 8, stage)) = make_uint4(0, 0, 0, 0);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(FwdWsBarrier::kEpiWG0) + wg);
}

// ---- Dropout in the pingpong ----
// The keep flags of tile n_blk are a pure function of (seed, offset, b, h, row, col): each
// thread runs dropout_fwd_generate_group<128> (the counters of dropout_fwd_generate, computed
// from the column inside the group) on its warpgroup's (64, kBlockN) accumulator coordinates,
// i.e. exactly the Philox calls of the lock-step kernel's threads that own the same elements
// (four per 128-key group: counters (base + 4 (col / 128) + g, row / 16 * 32 +
// (row % 8) * 4 + (col % 8) / 2, b h) for its row = row0 + 16 warp + lane / 4 and the column
// col = 128 (col0 / 128) + 8 g + 2 (lane % 4) of atom g = 0..3, words t = 0..3 for the atoms
// 32 t apart). Only the tile widths that keep the 128-key groups whole are allowed (64, 128:
// Traits::kDropoutTiles; the launcher picks 128 x 128 at d128 and 128 x 64 at d256 for dropout
// calls). A 64-key tile shares its group with its neighbour: the first of the pair the walk
// (downwards) visits generates both halves, as in flash_fwd_kernel_sm90.h.
//
// Where: right after this warpgroup has issued S_t (and P_{t-1} V_{t-1}) and handed the turn
// to the next warpgroup (sched_arrive), before warpgroup_wait<1>. At that point the tensor
// cores hold, in order, the rest of the previous warpgroup's GEMMs (it issued just before our
// sched_sync returned), our S_t and our P V; the next warpgroup, released by our arrive, queues
// its GEMMs behind ours. So the ~4 x 40 integer ops per thread (20 IMAD.WIDE-class multiplies
// per Philox call) run while the tensor cores are busy with the other warpgroup's GEMMs and our
// own S_t - time this warpgroup would otherwise spend blocked in warpgroup_wait<1> - and never
// inside our pingpong turn, which would delay the next warpgroup's issue. The flags go to
// shared memory (16-byte stores, no registers held across the softmax) and come back after
// P_t = bf16(S_t) (dropout_fwd_apply: one PRMT + one AND per packed pair).
template <typename Traits, bool kDropout, typename TensorC>
__forceinline__ __device__ void fwd_ws_generate_dropout(bool is_dropout, FwdWsFeatures const &feat,
                                                        TensorC const &coords_s, int row0, int n_blk,
                                                        int n_block_max, uint4 *drop_flags, int wg_tidx) {
    if constexpr (kDropout) {
        constexpr int kBlockN = Traits::kBlockN;
        if (is_dropout && (kBlockN == 128 || n_blk % 2 == 1 || n_blk == n_block_max - 1)) {
            const Dropout dropout = feat.dropout;
            dropout_fwd_generate_group<128, Traits::kDropoutUnroll>(dropout, coords_s, row0, n_blk * kBlockN,
                                                                  drop_flags, wg_tidx);
        }
    }
}

// Dropped elements leave the P V product only (the row sums already hold every element).
template <typename Traits, bool kDropout, typename TensorP>
__forceinline__ __device__ void fwd_ws_apply_dropout(bool is_dropout, TensorP &rP_tile, uint4 const *drop_flags,
                                                     int n_blk, int wg_tidx) {
    if constexpr (kDropout) {
        if (is_dropout) { dropout_fwd_apply<Traits::kBlockN, 128>(rP_tile, drop_flags, n_blk * Traits::kBlockN, wg_tidx); }
    }
}

// Runs the key blocks [n_block_min, n_block_max) for the 64 rows of warpgroup wg (rows row0 ..
// row0 + 63 of the sequence) and leaves the unnormalised O in acc_o and the statistics in softmax.
// wg_tidx: thread index within the warpgroup.
//
// v_rows_valid < kBlockN: the rows of the first V tile (key block n_block_max - 1) at or past
// v_rows_valid get zeroed in shared memory before any P V reads them. A varlen sequence's last
// tile holds the next sequence's rows there (or, past the packed tensor's last sequence, whatever
// memory the tensor has): P is 0 for them, but 0 x NaN would still leak into O. Dense tiles need
// no such care (the TMA zero-fills rows past seqlen_k), nor do K tiles (masked by a select).
// Both WGs zero the same rows (identical values; each before its own reads).
//
// kFeat: apply feat.score_mod to every S tile before the mask and, with dropout (params.p_dropout
// > 0, Traits::kDropoutTiles only), the dropout mask to every P tile ("Dropout in the pingpong"
// above). feat: this warpgroup's FwdWsFeatures (registers or shared memory); drop_flags: its
// 4 x 128 x 16-byte flags area (each thread's keep flags of one 128-key Philox group).
// kPersistent: the persistent kernel's call (Traits::kQInRegsFor: Q in registers for S = Q K^T).
// q_done(): called once this warpgroup's last S GEMM of the tile has completed (its last read of
// Q; the persistent kernel releases Q there when O has its own staging buffer).
template <typename Traits, bool kFeat, bool kPersistent, typename TensorO, typename Softmax, typename QDone>
__forceinline__ __device__ void fwd_ws_mma(FwdParams const &params, typename Traits::SharedStorage &ss,
                                           typename Traits::Pipeline &pipeline_k, typename Traits::Pipeline &pipeline_v,
                                           Mask const &mask, int wg, int wg_tidx, int row0, int n_block_min,
                                           int n_block_max, int v_rows_valid, TensorO &acc_o, Softmax &softmax,
                                           FwdWsFeatures const &feat, uint4 *drop_flags,
                                           typename Traits::PipelineState &state_k, typename Traits::PipelineState &state_v,
                                           int q_phase, QDone &&q_done) {
    using Element = typename Traits::Element;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kRowsPerWG = Traits::kRowsPerWG;
    constexpr bool kDropout = kFeat && Traits::kDropoutTiles;
    const bool is_dropout = kDropout && params.p_dropout > 0.f;  // a kernel parameter: no register
    constexpr bool kRescaleOBeforePV = Traits::kRescaleOBeforePV && !kFeat;
    // Conditional rescaling (see OnlineSoftmax::update_scores); O's rescale skipped where no row of
    // the warp moved. Softcap bounds the scores and ALiBi only shifts them; dropout zeroes P after
    // the row sum is taken, so a stale max changes none of them.
    constexpr int kLazy = kFeat ? Traits::kLazyRescaleLog2Feat : Traits::kLazyRescaleLog2;
    auto rescale_o = [&](auto &o, auto const &factors) {
        if constexpr (kLazy > 0) {
            softmax.rescale_o_if_moved(o, factors);
        } else {
            softmax.rescale_o(o, factors);
        }
    };

    constexpr bool kQRegs = Traits::template kQInRegsFor<kFeat, kPersistent>;
    typename Traits::template TiledMmaQKFor<kFeat, kPersistent> tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(wg_tidx);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(wg_tidx);

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ(_, _, wg));  // smem descriptors, or kQRegs: registers
    Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);            // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrVt = thr_mma_pv.partition_fragment_B(sVt);          // (MMA, MMA_N, MMA_K, stage)
    Tensor coords_s = thr_mma_qk.partition_C(make_identity_tensor(Shape<Int<kRowsPerWG>, Int<kBlockN>>{}));
    auto new_acc_s = [&]() { return partition_fragment_C(tiled_mma_qk, Shape<Int<kRowsPerWG>, Int<kBlockN>>{}); };
    auto mask_tile = [&](auto &acc_s, int n_block) {
        // Softcap, then ALiBi, then the mask: the order of the other forward kernels.
        if constexpr (kFeat) {
            const ScoreMod score_mod = feat.score_mod;
            score_mod.apply(acc_s, coords_s, row0, n_block * kBlockN);
        }
        if (mask.tile_needs_mask(row0, n_block * kBlockN, kRowsPerWG, kBlockN)) {
            mask.apply(acc_s, coords_s, row0, n_block * kBlockN);
        }
    };

    const int n_blocks = n_block_max - n_block_min;
    int n_block = n_block_max - 1;

    // Q landed (q_phase: the parity of this CTA's count of tiles with work before this one).
    cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, q_phase);
    if constexpr (kQRegs) {  // ldmatrix; the TMA's writes are visible once the barrier completed
        auto smem_copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, tiled_mma_qk);
        auto thr_copy_q = smem_copy_q.get_thread_slice(wg_tidx);
        cute::copy(smem_copy_q, thr_copy_q.partition_S(sQ(_, _, wg)), thr_copy_q.retile_D(tSrQ));
    }

    // First tile: S_0 alone.
    Tensor acc_s = new_acc_s();
    const uint32_t next_barrier0 = fwd_ws_next_sched_barrier<Traits::kNConsumerWG>();
    pipeline_k.consumer_wait(state_k);
    fwd_ws_sched_sync(wg);
    wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
    fwd_ws_sched_arrive(next_barrier0);
    // Under the tensor cores' S_0 GEMMs (see "Dropout in the pingpong").
    fwd_ws_generate_dropout<Traits, kDropout>(is_dropout, feat, coords_s, row0, n_block, n_block_max, drop_flags, wg_tidx);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    pipeline_k.consumer_release(state_k);
    ++state_k;
    if (n_blocks == 1) { q_done(); }
    mask_tile(acc_s, n_block);
    // rescale: O's factor for the latest S tile's row maxima (all 1 after the first tile), applied
    // either right after that tile's P V has completed or, with kRescaleOBeforePV, just
    // before the next P V is issued, under the S GEMM then in flight.
    auto rescale = softmax.template update_scores</*kFirst=*/true>(acc_s, params.scale_softmax_log2);
    Tensor rP = make_tensor<Element>(acc_s.layout());
    convert_into(acc_s, rP);
    fwd_ws_apply_dropout<Traits, kDropout>(is_dropout, rP, drop_flags, n_block, wg_tidx);
    clear(acc_o);

    // Iteration t: S_t = Q K[t]^T and O += P_{t-1} V[t-1] in flight together; the softmax of S_t
    // runs while P V (and the other WG's GEMMs) occupy the tensor cores.
    for (int t = 1; t < n_blocks; ++t) {
        --n_block;
        if (t == 1 && v_rows_valid < kBlockN) {  // outside the pingpong turn
            pipeline_v.consumer_wait(state_v);
            fwd_ws_zero_v_tail<Traits>(ss, v_rows_valid, state_v.index(), wg, wg_tidx);
        }
        Tensor acc_s_next = new_acc_s();
        const uint32_t next_barrier = fwd_ws_next_sched_barrier<Traits::kNConsumerWG>();
        pipeline_k.consumer_wait(state_k);
        fwd_ws_sched_sync(wg);
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s_next);
        if constexpr (kRescaleOBeforePV) { rescale_o(acc_o, rescale); }
        pipeline_v.consumer_wait(state_v);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_pv, tOrP, tOrVt(_, _, _, state_v.index()), acc_o);
        fwd_ws_sched_arrive(next_barrier);
        // Under the other warpgroup's GEMMs and our S_t (see "Dropout in the pingpong").
        fwd_ws_generate_dropout<Traits, kDropout>(is_dropout, feat, coords_s, row0, n_block, n_block_max, drop_flags,
                                                  wg_tidx);
        warpgroup_wait<1>();  // S_t ready; P V may still run
        warpgroup_fence_operand(acc_s_next);
        pipeline_k.consumer_release(state_k);
        ++state_k;
        if (t == n_blocks - 1) { q_done(); }
        mask_tile(acc_s_next, n_block);
        rescale = softmax.template update_scores</*kFirst=*/false, kLazy>(acc_s_next, params.scale_softmax_log2);
        // Measured : plain d128 / d256 forward +2-9%; the feature kernels 3-6% slower
        // and the plain d64 one 0-4% slower (MUFU-bound there), so only the plain d >= 128 kernels.
        if constexpr (!kFeat && Traits::kHeadDim >= 128) {
            scheduling_block_boundary(softmax.row_sum);  // keeps the P V wait below the exps
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        pipeline_v.consumer_release(state_v);
        ++state_v;
        if constexpr (!kRescaleOBeforePV) { rescale_o(acc_o, rescale); }
        convert_into(acc_s_next, rP);
        fwd_ws_apply_dropout<Traits, kDropout>(is_dropout, rP, drop_flags, n_block, wg_tidx);
    }

    // Last P V (outside the pingpong turns).
    if constexpr (kRescaleOBeforePV) { rescale_o(acc_o, rescale); }
    pipeline_v.consumer_wait(state_v);
    if (n_blocks == 1 && v_rows_valid < kBlockN) {
        fwd_ws_zero_v_tail<Traits>(ss, v_rows_valid, state_v.index(), wg, wg_tidx);
    }
    {
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        wgmma</*kZeroInit=*/false, /*kWait=*/0>(tiled_mma_pv, tOrP, tOrVt(_, _, _, state_v.index()), acc_o);
    }
    pipeline_v.consumer_release(state_v);
    // The persistent kernel carries state_v into the next tile: without this step its consumers
    // would start the next tile one V slot behind the producer (which advances once per load_v),
    // wait on a slot whose phase had already completed and release it twice, and a CTA's second
    // tile would hang.
    ++state_v;
}

}  // namespace flash

// ---- Dropout in this schedule: implemented above ("Dropout in the pingpong", fwd_ws_generate_dropout). ----
//
// Compared with the lock-step kernel, where the Philox work sits between the GEMM issue and
// warpgroup_wait<1> as well but can only hide behind the warpgroup's own S GEMM (and all
// warpgroups hit the integer pipes at the same time), here it hides behind the other
// warpgroups' GEMMs too: with two WGs the tensor cores alternate between them, so a WG has
// roughly one GEMM pair of the other WG (plus its own P V) to cover its softmax + Philox.
// Flags: 8 KB per WG behind SharedStorage (d64 192 x 128: 152 + 24 KB; d128 128 x 128: 160 + 16
// KB; d256 128 x 64: 192 + 16 KB). rng_state is written by thread 0 of CTA (0, 0, 0) (the
// producer thread) before any early exit.
//
// Not done (fallback if the integer pipes turn out to be the bottleneck on the GPU): give the
// Philox to the producer warpgroup's three idle warps (1 thread issues TMA today), generating the
// flags of tile t + 1 into a double-buffered smem ring guarded by one more mbarrier pair per slot
// (full: 96 producer-thread arrivals; empty: consumer arrivals), at ~40-56 producer registers.
