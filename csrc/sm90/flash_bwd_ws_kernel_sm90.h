// Warp-specialised sm_90a backward (FA3-style): the plain calls, (Traits::kMod) those with softcap
// and / or ALiBi and the deterministic dQ, and (Traits::kDropout) dropout, with ALiBi or not. The
// default for the calls it serves; the lock-step kernel takes the others.
//
// One CTA per (128-key block, batch, query head), walking the query blocks (Traits::kBlockM rows:
// 64; d64 128; d128 without a window 80) that can see its keys, as the lock-step kernel; what
// changes is who loads what and how the warps wait:
//
//   producer warpgroup (one thread): per query block, TMA loads of Q, dO (kBlockM x d tiles) and of
//       the LSE and softmax_d rows (kBlockM floats each, 1-D boxes) into stage s of a kStages-deep ring,
//       all on stage s's full barrier (PipelineTmaAsync); it runs ahead until the ring is full.
//   consumer warpgroups 1, 2 (keys [0, 64) and [64, 128) of the block; kSplitD, head dim 256: the
//       same 64 keys, head-dim halves of dK / dV / dQ, see BwdKernelTraitsSm90SplitD): K and V
//       once (cp.async, zero-filled past seqlen_k), then per query block
//         wait full[s]
//         S^T = K Q^T, dP^T = V dO^T; P^T; dV += P^T dO; dS^T; dK += dS^T Q
//         dS^T -> dS buffer (block parity); named barrier kdS over the 256 consumer threads
//         dQ = dS K; wait all GEMMs; release stage s (empty[s], 256 arrivals)
//         dQ tile -> shared buffer, added into dq_accum by the dQ writer warp
//
// dQ (FA3's path): the consumers write the block's kBlockM x d fp32 dQ tile, row-major as in
// dq_accum, into a shared buffer (block parity; 2 buffers), fence it for the async proxy and
// arrive on kdQFull[buf]; warp 1 of the producer warpgroup (the dQ writer, otherwise retired)
// syncs on it, one lane issues a bulk reduce-add (cp.reduce.async.bulk .add.f32) of the whole
// tile into dq_accum, waits until the tile has been read (bulk async-group, .read) and arrives
// on kdQEmpty[buf], which the consumers sync on before they refill buf two blocks later: one
// bulk operation per CTA and block instead of 16 (d128) / 8 (d64) float2 atomics per consumer
// thread, issued off the consumers' critical path. (kSplitD: the tile goes through the query
// block's own Q / dO stage instead, bwd_ws_write_dq_split_d.)
//
// This file: the consumers' walk over the query blocks (bwd_ws_consume) and the kernel's roles.
// The producer's loads and the steps of one query block are in flash_bwd_ws_mainloop_sm90.h; the
// dQ write-out (both sides of it) and dK / dV out in flash_bwd_ws_epilogue_sm90.h.
//
// No __syncthreads after the start: the producer's warps retire early. The one cross-warpgroup
// dependency per query block is the dS exchange (dQ needs both halves of dS); with two dS buffers
// a single barrier per block is enough: a warpgroup writes buffer (i & 1) in block i only after
// passing block i - 1's barrier, which the other warpgroup reaches only after its block i - 2 dQ
// GEMM (the last reader of that buffer) has completed.
//
// Query rows past the sequence: dense calls get zeros from the TMA (rows past seqlen_q of the
// tensor); varlen calls get the next sequence's rows or whatever the packed tensor holds past the
// last sequence (the TMA bound is total_q), which the consumers zero in shared memory (Q and dO,
// that block only) before any GEMM reads them: a masked P = 0 alone would still let 0 x NaN into
// dV and dS. Those rows are also masked (S = -inf, P = 0) and read LSE = 0, so they contribute
// exact zeros to dV, dK and dQ; softmax_d past the sequence is 0 (the preprocess writes its
// padding rows).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/attn_mods.h"  // ScoreMod (kMod)
#include "common/block_info.h"
#include "common/flash.h"
#include "common/mask.h"
#include "common/utils.h"
#include "sm90/flash_bwd_ws_epilogue_sm90.h"
#include "sm90/flash_bwd_ws_mainloop_sm90.h"
#include "sm90/flash_fwd_kernel_sm90.h"  // wgmma
#include "sm90/kernel_traits_bwd_ws_sm90.h"

namespace flash {

using namespace cute;

// ---- consumers: both warpgroups, tidx = thread index among the 256 consumer threads -------------
template <typename Traits>
__forceinline__ __device__ void bwd_ws_consume(BwdParams const &params, typename Traits::SharedStorage &ss,
                                               typename Traits::Pipeline &pipeline, BlockInfo const &binfo,
                                               int n_block, int bidb, int bidh, int m_block_min, int m_block_max,
                                               int tidx) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    const int bidh_k = bidh / params.h_h_k_ratio;
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    const int col0 = n_block * kBlockN;
    const int keys_left = seqlen_k - col0;
    const int diag = seqlen_k - seqlen_q;
    const Mask mask{seqlen_k, diag, params.window_left, params.window_right};
    // kMod: softcap then ALiBi on S^T before the mask, the softcap derivative on dS^T, as the
    // lock-step feature kernel (flash_bwd_kernel_sm90.h) does on the same accumulator layout.
    const ScoreMod score_mod = Traits::kMod ? ScoreMod(params, bidb, bidh, diag) : ScoreMod{};
    const BwdWsDropFlags<Traits> drop{params, ss, m_block_min, n_block, bidb, bidh, tidx};

    typename Traits::TiledMmadKV tiled_mma_dkv;
    auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tidx);
    Tensor acc_dk = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    // dV += P^T dO: (kBlockN, dv) (Traits::TiledMmadV: TiledMmadKV at kHeadDimV == kHeadDim).
    typename Traits::TiledMmadV tiled_mma_dv;
    auto thr_mma_dv = tiled_mma_dv.get_thread_slice(tidx);
    Tensor acc_dv = partition_fragment_C(tiled_mma_dv, Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{});
    clear(acc_dk);
    clear(acc_dv);
    // dK / dV staged over Q / dO / K / V once every wgmma of both warpgroups has finished reading
    // shared memory and every TMA load issued has landed (each was waited for).
    char *smem_dkv = reinterpret_cast<char *>(ss.smem_q.data());
    if (m_block_max <= m_block_min) {  // no query sees these keys: dK = dV = 0
        store_dk_dv<Traits>(params, binfo, acc_dk, acc_dv, smem_dkv, bidb, bidh, col0, keys_left, tidx,
                            BwdWsConsumerSync{});
        return;
    }

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQdO{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQdOt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});
    const float *smem_lse = ss.smem_lse.data();
    const float *smem_dsum = ss.smem_dsum.data();
    // Where this (batch, head)'s rows start in each stage's box (the box starts 16-byte aligned).
    const int lse_shift = bwd_ws_lse_row0(params, binfo, bidb, bidh) % Traits::kRowShiftMax;
    const int dsum_shift = bwd_ws_dsum_row0(params, binfo, bidb, bidh) % Traits::kRowShiftMax;

    bwd_ws_load_kv<Traits>(params, binfo, sK, sV, bidb, bidh_k, col0, keys_left, tidx);

    // ---- MMA operands ----
    typename Traits::TiledMmaSdP tiled_mma_sdp;
    // kSplitD: a 256-thread MMA, warpgroup w on queries [32 w, 32 w + 32).
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(tidx);
    Tensor tSrK = thr_mma_sdp.partition_fragment_A(sK);    // smem descriptors
    Tensor tSrQ = thr_mma_sdp.partition_fragment_B(sQ);    // (MMA, MMA_N, MMA_K, stage)
    // dP^T = V dO^T over K extent dv (Traits::TiledMmadP: TiledMmaSdP at kHeadDimV == kHeadDim).
    typename Traits::TiledMmadP tiled_mma_dp;
    auto thr_mma_dp = tiled_mma_dp.get_thread_slice(tidx);
    Tensor tdPrV = thr_mma_dp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_mma_dp.partition_fragment_B(sdO);
    Tensor tdVrdOt = thr_mma_dv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQt);
    typename Traits::TiledMmadQ tiled_mma_dq;
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(tidx);
    // dQ = dS K: A = dS (MMA, MMA_M, MMA_K, buffer), B = K^T; swapped, dQ^T = K^T dS^T: A = K^T,
    // B = dS (MMA, MMA_N, MMA_K, buffer).
    Tensor tdQrdS = [&]() {
        if constexpr (Traits::kdQSwapped) {
            return thr_mma_dq.partition_fragment_B(sdS);
        } else {
            return thr_mma_dq.partition_fragment_A(sdS);
        }
    }();
    Tensor tdQrKt = [&]() {
        if constexpr (Traits::kdQSwapped) {
            return thr_mma_dq.partition_fragment_A(sKt);
        } else {
            return thr_mma_dq.partition_fragment_B(sKt);
        }
    }();
    Tensor tdSsdSt = thr_mma_sdp.partition_C(sdSt);  // where this thread's dS^T elements go (.., buffer)
    // kSplitD: P^T through shared memory too; dV / dK read both from there (SS).
    auto [tPsPt, tdVrPt, tdKrdSt] = [&]() {
        if constexpr (Traits::kSplitD) {
            Tensor sPt = make_tensor(make_smem_ptr(ss.smem_p.data()), typename Traits::SmemLayoutPt{});
            return cute::make_tuple(thr_mma_sdp.partition_C(sPt), thr_mma_dv.partition_fragment_A(sPt),
                                    thr_mma_dkv.partition_fragment_A(sdSt));
        } else {
            return cute::make_tuple(0, 0, 0);
        }
    }();

    // Accumulator coordinates: mode 0 = key (within the block), mode 1 = query row.
    Tensor coords_st = thr_mma_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor coords_st_rc = make_tensor(coords_st.data(), acc_layout_rowcol(coords_st.layout()));
    auto new_acc_st = [&]() { return partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{}); };

    const bool varlen_q = binfo.sum_s_q != -1;

    if constexpr (Traits::kDropout) {  // while K / V land; the barrier below publishes them
        if (m_block_max > m_block_min) { drop.make(m_block_min); }
        if constexpr (!Traits::kSplitD) {  // (split-d: block m + 1 is generated in block m)
            if (m_block_max > m_block_min + 1) { drop.make(m_block_min + 1); }
        }
    }
    // K / V landed (cp.async through the generic proxy; wgmma reads through the async proxy).
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);

    constexpr int kQueryCols = decltype(size<1>(coords_st_rc))::value;
    constexpr bool kRowPrefetch = bwd_ws_row_prefetch<Traits, decltype(coords_st_rc)>();
    typename Traits::PipelineState state;  // consumer start: stage 0, phase 0
    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int row0 = m_block * kBlockM;
        const int ds_buf = (m_block - m_block_min) & 1;
        pipeline.consumer_wait(state);  // Q, dO, LSE and softmax_d of this block landed
        const int stage = state.index();
        const bool rows_past_end = row0 + kBlockM > seqlen_q;
        if (varlen_q && rows_past_end) { bwd_ws_zero_qdo_tail<Traits>(sQ, sdO, stage, seqlen_q - row0, tidx); }

        Tensor acc_s = new_acc_st();
        Tensor acc_dp = new_acc_st();
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_dp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);
        if constexpr (Traits::kDropout && Traits::kSplitD) {
            // Block m + 1's flags while S^T / dP^T run (see BwdWsDropFlags).
            if (m_block + 1 < m_block_max) { drop.make(m_block + 1); }
        }

        const float *lse_stage = smem_lse + stage * Traits::kRowStageStride + lse_shift;
        const float *dsum_stage = smem_dsum + stage * Traits::kRowStageStride + dsum_shift;
        Tensor rP = bwd_ws_p_from_s<Traits>(params, acc_s, coords_st, coords_st_rc, score_mod, mask, drop, m_block,
                                            lse_stage, row0, col0, seqlen_q, rows_past_end);
        float dsum_cols[kRowPrefetch ? kQueryCols : 1];
        if constexpr (kRowPrefetch) {  // softmax_d of the query columns, while dV / dP^T run (see LSE)
            CUTE_UNROLL
            for (int ni = 0; ni < kQueryCols; ++ni) { dsum_cols[ni] = dsum_stage[get<1>(coords_st_rc(0, ni))]; }
        }
        if constexpr (!Traits::kSplitD) {
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dv, make_tensor(rP.data(), acc_layout_as_A(rP.layout())),
                                                     tdVrdOt(_, _, _, stage), acc_dv);
        }
        Tensor rdS = bwd_ws_ds_from_dp<Traits>(params, acc_dp, acc_s, coords_st, coords_st_rc, score_mod, drop, m_block,
                                               lse_stage, dsum_stage, dsum_cols, row0, col0, seqlen_q);
        if constexpr (!Traits::kSplitD) {
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, make_tensor(rdS.data(), acc_layout_as_A(rdS.layout())),
                                                     tdKrQt(_, _, _, stage), acc_dk);
        }
        bwd_ws_ds_p_to_smem<Traits>(tiled_mma_sdp, rdS, rP, sdSt, tdSsdSt, tPsPt, ds_buf, m_block, m_block_min, tidx);
        if constexpr (Traits::kSplitD) {
            // dV += P^T dO and dK += dS^T Q over this warpgroup's head-dim half, both 64 queries.
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dv, tdVrPt(_, _, _, Traits::kPBuffers == 1 ? 0 : ds_buf),
                                                     tdVrdOt(_, _, _, stage), acc_dv);
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, tdKrdSt(_, _, _, ds_buf), tdKrQt(_, _, _, stage), acc_dk);
        }
        Tensor acc_dq = partition_fragment_C(tiled_mma_dq, typename Traits::ShapedQAcc{});
        if constexpr (Traits::kdQSwapped) {
            bwd_ws_dq_gemm<Traits>(tiled_mma_dq, tdQrKt, tdQrdS(_, _, _, ds_buf), acc_dq, drop, m_block, m_block_max);
        } else {
            bwd_ws_dq_gemm<Traits>(tiled_mma_dq, tdQrdS(_, _, _, ds_buf), tdQrKt, acc_dq, drop, m_block, m_block_max);
        }
        warpgroup_fence_operand(acc_dv);
        warpgroup_fence_operand(acc_dk);
        if constexpr (Traits::kSplitD) {
            bwd_ws_dq_to_stage<Traits>(ss, thr_mma_dq, acc_dq, state.index());
            ++state;
        } else {
            // Every GEMM of this block has completed: Q, dO, LSE and softmax_d of the stage are
            // free for the producer's next load while the dQ tile is written out.
            pipeline.consumer_release(state);
            ++state;
            bwd_ws_dq_to_smem<Traits>(ss, thr_mma_dq, acc_dq, m_block - m_block_min);
        }
    }
    if constexpr (Traits::kSplitD) {  // the writer has read the last dQ tile out of Q / dO
        cutlass::arch::NamedBarrier::sync(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0));
    }

    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) { acc_dk(i) *= params.scale_softmax; }
    if constexpr (Traits::kDropout) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dv); ++i) { acc_dv(i) *= params.rp_dropout; }
    }
    store_dk_dv<Traits>(params, binfo, acc_dk, acc_dv, smem_dkv, bidb, bidh, col0, keys_left, tidx, BwdWsConsumerSync{});
}

// Grid (key blocks, b, h), 384 threads: warpgroup 0 the producer, 1-2 the consumers.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_bwd_ws_kernel_sm90(const __grid_constant__ BwdWsKernelParams<Traits> kp) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    using Pipeline = typename Traits::Pipeline;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    BwdParams const &params = kp.p;

    extern __shared__ __align__(1024) char smem[];
    auto &ss = *reinterpret_cast<typename Traits::SharedStorage *>(smem);

    // Deterministic calls with a bounded right window walk the key blocks downwards (BwdWsDqOrder).
    int n_block, bidb, bidh;
    bwd_ws_tile_coords(params, n_block, bidb, bidh);
    const BlockInfo binfo(params, bidb);
    const int col0 = n_block * kBlockN;
    if (col0 >= binfo.seqlen_k) return;  // whole CTA (varlen: a shorter sequence), before any barrier
    const Mask mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
    int m_block_min, m_block_max;
    mask.m_block_range(col0, kBlockN, kBlockM, m_block_min, m_block_max);

    const int warp_group_idx = cutlass::canonical_warp_group_idx();
    typename Pipeline::Params pipe_params;
    pipe_params.transaction_bytes = Traits::kStageBytes;
    pipe_params.role = warp_group_idx == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = threadIdx.x == 0;  // the producer thread
    pipe_params.num_consumers = Traits::kNConsumerThreads;
    if constexpr (Traits::kDropoutInProducer) {
        if (threadIdx.x == 0) {
            CUTE_UNROLL
            for (int b = 0; b < Traits::kDropFlagBuffers; ++b) {
                cutlass::arch::ClusterBarrier::init(&ss.drop_full[b], Traits::kDropProducerThreads);
                cutlass::arch::ClusterBarrier::init(&ss.drop_empty[b], Traits::kNConsumerThreads);
            }
        }
    }
    // The constructor initialises the barriers from warp 0 and fences the initialisation.
    Pipeline pipeline(ss.pipeline, pipe_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before anyone waits on or arrives at them

    if (warp_group_idx == 0) {
        // ---- producer warpgroup: one thread issues every TMA load; the other warps retire ----
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        // Warp 1 is the dQ writer. Branching on the warp index first keeps the loader in a
        // warp-uniform region: there ptxas keeps its addresses in uniform registers, while
        // a loader branched into from divergent lanes spills at 24 registers.
        const int warp_idx = cutlass::canonical_warp_idx_sync();
        if (warp_idx == 0) {
            if (threadIdx.x == 0 && m_block_max > m_block_min) {
                cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
                cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
                cute::prefetch_tma_descriptor(kp.tma_lse.get_tma_descriptor());
                cute::prefetch_tma_descriptor(kp.tma_dsum.get_tma_descriptor());
                bwd_ws_load<Traits>(kp, ss, pipeline, binfo, bidb, bidh, m_block_min, m_block_max);
            }
        } else if (warp_idx == 1 && m_block_max > m_block_min) {
            if constexpr (!Traits::kSplitD) {
                bwd_ws_write_dq<Traits>(params, ss, binfo, n_block, bidb, bidh, m_block_min, m_block_max);
            } else {  // split-d: the dQ tile sits in the Q / dO stage
                bwd_ws_write_dq_split_d<Traits>(params, ss, binfo, n_block, bidb, bidh, m_block_min,
                                                m_block_max);
            }
        } else if constexpr (Traits::kDropoutInProducer) {
            if (m_block_max > m_block_min) {  // warps 2-3: the dropout flags
                bwd_ws_dropout_producer<Traits>(params, ss, bidb, bidh, n_block, m_block_min, m_block_max,
                                                int(threadIdx.x) - 64);
            }
        }
    } else {
        // ---- consumer warpgroups ----
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        bwd_ws_consume<Traits>(params, ss, pipeline, binfo, n_block, bidb, bidh, m_block_min, m_block_max,
                               threadIdx.x - 128);
    }
#endif
}

}  // namespace flash
