// The mainloop pieces of the warp-specialised sm_90a backward (flash_bwd_ws_kernel_sm90.h): the
// producer's TMA loads of Q / dO / LSE / softmax_d, the consumers' K / V load, the dropout keep
// flags, and the steps of one query block: P^T from S^T, dS^T from dP^T, dS^T (and P^T) into
// shared memory for the dQ GEMM.
#pragma once

#include <cute/arch/copy_sm80.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/attn_mods.h"  // ScoreMod (kMod)
#include "common/block_info.h"
#include "common/flash.h"
#include "common/bwd_passes.h"  // accum_row0
#include "common/tile_io.h"
#include "common/mask.h"
#include "common/utils.h"
#include "sm90/dropout_sm90.h"
#include "sm90/flash_fwd_kernel_sm90.h"  // wgmma
#include "sm90/kernel_traits_bwd_ws_sm90.h"

namespace flash {

using namespace cute;

__forceinline__ __device__ void bwd_ws_consumer_sync(BwdWsBarrier barrier) {
    cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(barrier));
}

// Element offsets of a (batch, head)'s row 0 in the LSE / softmax_d buffers (< 2^31: the launcher
// checks the buffer sizes). Dense LSE (b, h, seqlen_q), varlen (h, total_q).
__forceinline__ __device__ int bwd_ws_lse_row0(BwdParams const &params, BlockInfo const &binfo, int bidb, int bidh) {
    return static_cast<int>((binfo.sum_s_q != -1 ? int64_t(binfo.sum_s_q) : int64_t(bidb) * params.lse_batch_stride) +
                            int64_t(bidh) * params.lse_head_stride);
}
__forceinline__ __device__ int bwd_ws_dsum_row0(BwdParams const &params, BlockInfo const &binfo, int bidb, int bidh) {
    return static_cast<int>(accum_row0(params, binfo, bidb, bidh));
}

// ---- producer: one thread ---------------------------------------------------------------------
template <typename Traits>
__forceinline__ __device__ void bwd_ws_load(BwdWsKernelParams<Traits> const &kp, typename Traits::SharedStorage &ss,
                                            typename Traits::Pipeline &pipeline, BlockInfo const &binfo, int bidb,
                                            int bidh, int m_block_min, int m_block_max) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    BwdParams const &params = kp.p;
    const bool varlen_q = binfo.sum_s_q != -1;

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQdO{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    Tensor sLSE = make_tensor(make_smem_ptr(ss.smem_lse.data()), typename Traits::SmemLayoutRow{});
    Tensor sdsum = make_tensor(make_smem_ptr(ss.smem_dsum.data()), typename Traits::SmemLayoutRow{});

    // Varlen: the sequence starts at row cu_seqlens_q[b] of the packed tensor (batch index 0).
    Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, bidh, varlen_q ? 0 : bidb);
    // dO: (rows, dv, heads, batch); the kernel arguments carry Q's shape, dv is params.dv.
    auto shape_do = [&]() {
        if constexpr (Traits::kOwnHeadDimV) {
            return make_shape(get<0>(kp.shape_q), params.dv, get<2>(kp.shape_q), get<3>(kp.shape_q));
        } else {
            return kp.shape_q;
        }
    }();
    Tensor mdO = kp.tma_do.get_tma_tensor(shape_do)(_, _, bidh, varlen_q ? 0 : bidb);
    Tensor gQ = local_tile(domain_offset(make_coord(varlen_q ? binfo.sum_s_q : 0, _0{}), mQ),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (M, d, m)
    Tensor gdO = local_tile(domain_offset(make_coord(varlen_q ? binfo.sum_s_q : 0, _0{}), mdO),
                            Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{}, make_coord(_, _0{}));
    // The LSE / softmax_d boxes start 16-byte aligned, up to kRowShiftMax - 1 elements before the
    // row (see the traits); the consumers skip that shift.
    const int lse_row0 = bwd_ws_lse_row0(params, binfo, bidb, bidh);
    const int dsum_row0 = bwd_ws_dsum_row0(params, binfo, bidb, bidh);
    Tensor mLSE = kp.tma_lse.get_tma_tensor(kp.shape_lse);
    Tensor mdsum = kp.tma_dsum.get_tma_tensor(kp.shape_dsum);
    constexpr int kAlign = Traits::kRowShiftMax;
    auto row_box = [&](auto const &m_row, int row0, int m_block) {  // (kRowBox, 1) from row0 + 64 m_block, aligned
        return local_tile(domain_offset(make_coord(row0 / kAlign * kAlign + m_block * kBlockM), m_row),
                          Shape<Int<Traits::kRowBox>>{}, make_coord(_));
    };

    // (TMA, block) views of global and (TMA, stage) views of shared memory.
    auto tma_q = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto tma_do = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    auto &tQgQ = get<0>(tma_q);
    auto &tQsQ = get<1>(tma_q);
    auto &tdOgdO = get<0>(tma_do);
    auto &tdOsdO = get<1>(tma_do);

    auto state = cutlass::make_producer_start_state<typename Traits::Pipeline>();
    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        pipeline.producer_acquire(state);  // the slot is free; arms full[s] with kStageBytes
        auto &full = *pipeline.producer_get_barrier(state);
        const int s = state.index();
        copy(kp.tma_q.with(full), tQgQ(_, m_block), tQsQ(_, s));
        copy(kp.tma_do.with(full), tdOgdO(_, m_block), tdOsdO(_, s));
        {
            Tensor gLSE = row_box(mLSE, lse_row0, m_block);
            Tensor gdsum = row_box(mdsum, dsum_row0, m_block);
            auto tma_lse = tma_partition(kp.tma_lse, Int<0>{}, Layout<_1>{}, group_modes<0, 1>(sLSE), group_modes<0, 1>(gLSE));
            auto tma_dsum = tma_partition(kp.tma_dsum, Int<0>{}, Layout<_1>{}, group_modes<0, 1>(sdsum),
                                          group_modes<0, 1>(gdsum));
            copy(kp.tma_lse.with(full), get<0>(tma_lse)(_, 0), get<1>(tma_lse)(_, s));
            copy(kp.tma_dsum.with(full), get<0>(tma_dsum)(_, 0), get<1>(tma_dsum)(_, s));
        }
        ++state;
    }
    // No producer_tail: without clusters the CTA (and its shared memory) lives until the
    // consumers finish, and every slot issued here is consumed by them.
}

// ---- dropout flags (Traits::kDropoutInProducer): warps 2-3 of the producer warpgroup ----------
// Block m's flags (dropout_bwd_generate2's 256 thread items, four per producer thread) into
// buffer t % 2 (t = m - m_block_min) once the consumers have released its block t - 2. This
// takes the Philox calls off the consumers, whose dependent chain between the GEMMs they
// lengthened; these warps otherwise idle and the SM's issue slots are far from busy.
template <typename Traits>
__forceinline__ __device__ void bwd_ws_dropout_producer(BwdParams const &params, typename Traits::SharedStorage &ss,
                                                        int bidb, int bidh, int n_block, int m_block_min,
                                                        int m_block_max, int ptid) {
    constexpr int kBuffers = Traits::kDropFlagBuffers;
    const Dropout dropout(params, bidb, bidh);
    for (int m_block = m_block_min, t = 0; m_block < m_block_max; ++m_block, ++t) {
        const int b = t % kBuffers;
        cutlass::arch::ClusterBarrier::wait(&ss.drop_empty[b], ((t / kBuffers) & 1) ^ 1);
        uint32_t *flags = ss.smem_drop_flags.data() + b * Traits::kDropFlagWords;
#pragma unroll 1
        for (int item = ptid; item < Traits::kNConsumerThreads; item += Traits::kDropProducerThreads) {
            dropout_bwd_generate2<Traits::kBlockM, Traits::kBlockN, Traits::kNConsumerThreads>(dropout, flags, m_block,
                                                                                               n_block, item);
        }
        cutlass::arch::ClusterBarrier::arrive(&ss.drop_full[b]);
    }
}

// ---- dropout flags on the consumers' side ----------------------------------------------------------
    // kDropout: the keep flags of query block m sit in buffer (m - m_block_min) % 2 of
    // smem_drop_flags (layout 2 of dropout_sm90.h; at d64 the 256 consumer threads generate each
    // block's 512 Philox groups together and each thread reads back the 16 words its elements need;
    // at d128 the producer warps do, see below). Blocks m_block_min and m_block_min + 1 are
    // generated before the first barrier, block m + 2
    // in block m after the dS barrier, while the dQ GEMM runs: every reader of that buffer (block
    // m) has passed the barrier, and block m + 1's dS barrier orders the writes before block
    // m + 2 reads them. Dropped elements are cleared in P (dV += P_drop^T dO, with 1 / (1 - p) on
    // dV at the end) and in dP^T (dS^T = P^T * (dP_drop^T / (1 - p) - softmax_d)).
    // The Philox key and counter base are re-read for each generation (two cached loads) rather than
    // kept in registers through the loop: the consumers are at their register limit there.
    // kSplitD (64-key blocks, the exchange form): half of each 128-key Philox group's words, 1024
    // flag words per block (dropout_bwd_generate2_half), read in the exchange form's accumulator
    // layout; P^T then has one shared buffer (Traits::kPBuffers, BwdWsBarrier::kPFree). Block
    // m + 1's flags are generated in block m while its S^T / dP^T GEMMs run (the dQ window holds
    // the dK, dV and dQ accumulators, 192 registers, and spilled): its buffer's readers (block
    // m - 1) passed block m - 1's dS barrier before any thread got here, and block m's dS barrier
    // orders the writes before block m + 1 reads them.
    // Traits::kDropoutInProducer (d128): warps 2-3 of the producer warpgroup generate every
    // block's flags into buffer (m - m_block_min) % 2 (bwd_ws_dropout_producer); the consumers wait
    // for the buffer's full barrier before their first read (the P^T mask) and arrive on its empty
    // barrier after their last (the dP^T mask); make_drop_flags does nothing there.
template <typename Traits>
struct BwdWsDropFlags {
    BwdParams const &params;
    typename Traits::SharedStorage &ss;
    int m_block_min, n_block, bidb, bidh, tidx;

    __forceinline__ __device__ uint32_t *flags(int m_block) const {
        if constexpr (Traits::kDropout) {
            return ss.smem_drop_flags.data() + ((m_block - m_block_min) % Traits::kDropFlagBuffers) * Traits::kDropFlagWords;
        } else {
            return nullptr;
        }
    }
    __forceinline__ __device__ void wait_full(int m_block) const {
        if constexpr (Traits::kDropoutInProducer) {
            const int t = m_block - m_block_min;
            cutlass::arch::ClusterBarrier::wait(&ss.drop_full[t % Traits::kDropFlagBuffers],
                                                (t / Traits::kDropFlagBuffers) & 1);
        }
    }
    __forceinline__ __device__ void release(int m_block) const {
        if constexpr (Traits::kDropoutInProducer) {
            cutlass::arch::ClusterBarrier::arrive(&ss.drop_empty[(m_block - m_block_min) % Traits::kDropFlagBuffers]);
        }
    }
    __forceinline__ __device__ void make(int m_block) const {
        if constexpr (Traits::kDropoutInProducer) {
            // generated by the producer warps (bwd_ws_dropout_producer)
        } else if constexpr (Traits::kDropout && Traits::kSplitD) {
            dropout_bwd_generate2_half<Traits::kNConsumerThreads>(Dropout(params, bidb, bidh), flags(m_block), m_block,
                                                                  n_block, tidx);
        } else if constexpr (Traits::kDropout) {
            dropout_bwd_generate2<Traits::kBlockM, Traits::kBlockN, Traits::kNConsumerThreads>(
                Dropout(params, bidb, bidh), flags(m_block), m_block, n_block, tidx);
        }
    }
};

// ---- consumers: K and V once (cp.async, zero-filled past seqlen_k and the head dim) --------------
template <typename Traits, typename TensorSK, typename TensorSV>
__forceinline__ __device__ void bwd_ws_load_kv(BwdParams const &params, BlockInfo const &binfo, TensorSK &sK,
                                               TensorSV &sV, int bidb, int bidh_k, int col0, int keys_left, int tidx) {
    using Element = typename Traits::Element;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    typename Traits::GmemTiledCopyLoad gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);
    auto [gK, gV] = kv_block_gmem<Element, kBlockN, kHeadDim>(params, binfo, bidb, bidh_k, col0);
    Tensor tKsK = thr_gmem_copy.partition_D(sK);
    Tensor tVsV = thr_gmem_copy.partition_D(sV);
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gK), tKsK, tKVcKV, tKVpKV, keys_left);
    if constexpr (Traits::kOwnHeadDimV) {  // V: (kBlockN, dv), columns < params.dv
        constexpr int kHeadDimV = Traits::kHeadDimV;
        Tensor tVcV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
        Tensor tVpV = make_col_predicate(tVcV, params.dv);
        auto [gK_dv, gV_dv] = kv_block_gmem<Element, kBlockN, kHeadDimV>(params, binfo, bidb, bidh_k, col0);
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gV_dv), tVsV, tVcV, tVpV, keys_left);
    } else {
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gV), tVsV, tKVcKV, tKVpKV, keys_left);
    }
    cp_async_fence();
}

// Varlen: rows [rows_valid, kBlockM) of stage's Q and dO tiles hold rows past the sequence (see
// flash_bwd_ws_kernel_sm90.h): zeroed by the 256 consumer threads, 16-byte chunks (contiguous
// under the swizzle), before the GEMMs. Only the last query block of a sequence.
template <typename Traits, typename TensorSQ, typename TensorSdO>
__forceinline__ __device__ void bwd_ws_zero_qdo_tail(TensorSQ &sQ, TensorSdO &sdO, int stage, int rows_valid, int tidx) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kChunks = Traits::kHeadDim / 8;
    const int n = (kBlockM - rows_valid) * kChunks;
    if constexpr (Traits::kOwnHeadDimV) {  // dO at dv: its own loop
        for (int i = tidx; i < n; i += Traits::kNConsumerThreads) {
            const int row = rows_valid + i / kChunks, col = (i % kChunks) * 8;
            *reinterpret_cast<uint4 *>(&sQ(row, col, stage)) = make_uint4(0, 0, 0, 0);
        }
        constexpr int kChunksV = Traits::kHeadDimV / 8;
        const int nv = (kBlockM - rows_valid) * kChunksV;
        for (int i = tidx; i < nv; i += Traits::kNConsumerThreads) {
            const int row = rows_valid + i / kChunksV, col = (i % kChunksV) * 8;
            *reinterpret_cast<uint4 *>(&sdO(row, col, stage)) = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int i = tidx; i < n; i += Traits::kNConsumerThreads) {
            const int row = rows_valid + i / kChunks, col = (i % kChunks) * 8;
            *reinterpret_cast<uint4 *>(&sQ(row, col, stage)) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(&sdO(row, col, stage)) = make_uint4(0, 0, 0, 0);
        }
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before wgmma (async proxy) reads
    bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);
}

// kRowPrefetch (the plain d128 kernel: 16 query columns per thread): LSE log2e of this
// thread's query columns read from shared memory into registers while S^T runs, and
// softmax_d while dV / dP^T run. Read after the wait (a wgmma wait is a memory barrier to
// the compiler), each load's latency stalled the exp2 right behind it (ncu,
// d128: ~5% of the stall samples at the LSE, ~3% at softmax_d). The score-modifier /
// dropout kernels spill with it (24 / 68 bytes), and the d64 kernel (32 columns per
// thread: 300 bytes), so they read in place. The d256 split-d kernels took it without
// spills but were no faster (causal 2% slower).
// Past the sequence the LSE box holds another row's value (or the TMA's zero fill):
// read 0 there, so that the masked -inf stays a clean 0 (never -inf - -inf).
template <typename Traits, typename TensorC>
constexpr bool bwd_ws_row_prefetch() {
    constexpr int kQueryCols = decltype(size<1>(std::declval<TensorC>()))::value;
    return !Traits::kSplitD && !Traits::kMod && kQueryCols <= 16;
}

// ---- consumers, one query block: P^T = exp2(S^T * scale log2e - LSE log2e) ----------------------
// After the S^T GEMM (the oldest wgmma in flight) is waited for: the score modifiers, the masks
// where the tile needs them, the exponent in place in acc_s (fp32 P^T, kept for dS^T), and P^T
// in Element with dropout's zeros (the return value). lse_stage: this stage's LSE row from this
// (batch, head)'s row 0.
template <typename Traits, typename TensorAcc, typename TensorC, typename TensorCrc>
__forceinline__ __device__ auto bwd_ws_p_from_s(BwdParams const &params, TensorAcc &acc_s, TensorC const &coords_st,
                                                TensorCrc const &coords_st_rc, ScoreMod const &score_mod,
                                                Mask const &mask, BwdWsDropFlags<Traits> const &drop, int m_block,
                                                const float *lse_stage, int row0, int col0, int seqlen_q,
                                                bool rows_past_end) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr float kLog2e = 1.4426950408889634f;
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (key, query)
    constexpr int kQueryCols = decltype(size<1>(scores))::value;
    constexpr bool kRowPrefetch = bwd_ws_row_prefetch<Traits, TensorCrc>();
    auto lse_log2_of = [&](int r) { return row0 + r < seqlen_q ? lse_stage[r] * kLog2e : 0.f; };
    float lse_log2_cols[kRowPrefetch ? kQueryCols : 1];
    if constexpr (kRowPrefetch) {
        CUTE_UNROLL
        for (int ni = 0; ni < kQueryCols; ++ni) { lse_log2_cols[ni] = lse_log2_of(get<1>(coords_st_rc(0, ni))); }
    }
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);
    if constexpr (Traits::kDropout || (Traits::kMod && kHeadDim == 64)) {
        // No softcap with dropout (the binding), nor at d64 (the launcher declines it there):
        // ALiBi only, and no softcap gradient below (registers for the 128-row d64 blocks).
        score_mod.apply_alibi_t(acc_s, coords_st, row0, col0);
    } else if constexpr (Traits::kMod) {
        score_mod.apply_t(acc_s, coords_st, row0, col0);
    }
    // The tile's rows past the sequence (see flash_bwd_ws_kernel_sm90.h) are masked too.
    if (rows_past_end || mask.tile_needs_mask(row0, col0, kBlockM, kBlockN)) {
        mask.apply_t(acc_s, coords_st, row0, col0, seqlen_q);
    }
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(scores); ++ni) {
        const float lse_log2 = kRowPrefetch ? lse_log2_cols[ni] : lse_log2_of(get<1>(coords_st_rc(0, ni)));
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(scores); ++mi) {
            scores(mi, ni) = exp2f(scores(mi, ni) * params.scale_softmax_log2 - lse_log2);
        }
    }
    Tensor rP = make_tensor_like<Element>(acc_s);
    convert_into(acc_s, rP);
    if constexpr (Traits::kDropout) {
        if constexpr (Traits::kSplitD) {
            dropout_bwd_apply_p_half(rP, drop.flags(m_block), coords_st);
        } else {
            drop.wait_full(m_block);
            dropout_bwd_apply_p2<kBlockM>(rP, drop.flags(m_block), coords_st);
        }
    }
    return rP;
}

// ---- consumers, one query block: dS^T = P^T * (dP^T - softmax_d) -------------------------------
// After the dP^T GEMM is waited for; with dropout, dP^T of the kept elements / (1 - p). acc_s holds
// the fp32 P^T (bwd_ws_p_from_s); dsum_cols: softmax_d of this thread's query columns where
// prefetched (bwd_ws_row_prefetch), else read from dsum_stage. Returns dS^T in Element.
template <typename Traits, typename TensorAcc, typename TensorC, typename TensorCrc, int kNCols>
__forceinline__ __device__ auto bwd_ws_ds_from_dp(BwdParams const &params, TensorAcc &acc_dp, TensorAcc &acc_s,
                                                  TensorC const &coords_st, TensorCrc const &coords_st_rc,
                                                  ScoreMod const &score_mod, BwdWsDropFlags<Traits> const &drop,
                                                  int m_block, const float *lse_stage, const float *dsum_stage,
                                                  const float (&dsum_cols)[kNCols], int row0, int col0, int seqlen_q) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr float kLog2e = 1.4426950408889634f;
    constexpr bool kRowPrefetch = bwd_ws_row_prefetch<Traits, TensorCrc>();
    if constexpr (Traits::kSplitD) {
        warpgroup_wait<0>();  // dP^T ready (no dV in flight: it waits for the exchange)
    } else {
        warpgroup_wait<1>();  // dP^T ready (dV may still run)
    }
    warpgroup_fence_operand(acc_dp);
    if constexpr (Traits::kDropout) {
        if constexpr (Traits::kSplitD) {
            dropout_bwd_apply_dp_half(acc_dp, drop.flags(m_block), coords_st);
        } else {
            dropout_bwd_apply_dp2<kBlockM>(acc_dp, drop.flags(m_block), coords_st);
            drop.release(m_block);
        }
    }
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (key, query)
    const float dp_scale = Traits::kDropout ? params.rp_dropout : 1.f;
    Tensor dS = make_tensor(acc_dp.data(), acc_layout_rowcol(acc_dp.layout()));
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(dS); ++ni) {
        const float dsum = kRowPrefetch ? dsum_cols[ni] : dsum_stage[get<1>(coords_st_rc(0, ni))];
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(dS); ++mi) {
            dS(mi, ni) = scores(mi, ni) * (Traits::kDropout ? dS(mi, ni) * dp_scale - dsum : dS(mi, ni) - dsum);
        }
    }
    if constexpr (Traits::kMod && !Traits::kDropout && kHeadDim != 64) {
        // Rows past the sequence read LSE 0 (their P is 0 anyway), as in bwd_ws_p_from_s.
        score_mod.softcap_grad_t(acc_dp, acc_s, coords_st, row0, col0, params.scale_softmax_log2, [&](int i) {
            const int r = get<1>(coords_st(i));
            return row0 + r < seqlen_q ? lse_stage[r] * kLog2e : 0.f;
        });
    }
    Tensor rdS = make_tensor_like<Element>(acc_dp);
    convert_into(acc_dp, rdS);
    return rdS;
}

// ---- consumers, one query block: dS^T (kSplitD: and P^T) into shared memory --------------------
// dQ = dS K runs over the whole key block: dS^T of both warpgroups through shared memory (buffer
// ds_buf), then the kdS barrier over the 256 consumer threads. kSplitD: each warpgroup writes its
// 32 queries of dS^T and of P^T (tPsPt: this thread's P^T elements; 0 otherwise).
template <typename Traits, typename TensordS, typename TensorP, typename TensorSdSt, typename TensordSsdSt,
          typename TensorPsPt>
__forceinline__ __device__ void bwd_ws_ds_p_to_smem(typename Traits::TiledMmaSdP const &tiled_mma_sdp, TensordS &rdS,
                                                    TensorP &rP, TensorSdSt &sdSt, TensordSsdSt &tdSsdSt,
                                                    TensorPsPt &tPsPt, int ds_buf, int m_block, int m_block_min,
                                                    int tidx) {
    using Element = typename Traits::Element;
    if constexpr (!Traits::kSplitD) {
        // stmatrix: four 8 x 8 tiles per instruction, each tile row 8 queries = 16 contiguous
        // bytes of the MN-major dS buffer (FA3's SM90_U32x4_STSM_N for a transposed S / dP with
        // an MN-major dS). An element-wise copy compiles to 16 generic 4-byte ST per thread at
        // d128 (ncu: lg_throttle, and the fence / barrier behind them waiting on the long
        // scoreboard).
        // (kdQSwapped: dS keys-contiguous, the transposing stmatrix, as FA3's swapped S / dP.)
        using StsmAtom = std::conditional_t<Traits::kdQSwapped, SM90_U16x8_STSM_T, SM90_U32x4_STSM_N>;
        auto r2s_copy_ds = make_tiled_copy_C(Copy_Atom<StsmAtom, Element>{}, tiled_mma_sdp);
        auto r2s_thr_copy_ds = r2s_copy_ds.get_thread_slice(tidx);
        Tensor tdSsdSt_stsm = r2s_thr_copy_ds.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, buffer)
        cute::copy(r2s_copy_ds, r2s_thr_copy_ds.retile_S(rdS), tdSsdSt_stsm(_, _, _, ds_buf));
    } else {
        Tensor tdSsdSt_buf = tdSsdSt(_, _, _, ds_buf);
        cute::copy(rdS, tdSsdSt_buf);
    }
    if constexpr (Traits::kSplitD) {
        if constexpr (Traits::kPBuffers == 1) {
            // One P^T buffer (dropout): the previous block's dV GEMMs, in both warpgroups,
            // have read it (each waited for all its GEMMs before leaving that block).
            if (m_block > m_block_min) { bwd_ws_consumer_sync(BwdWsBarrier::kPFree); }
        }
        Tensor tPsPt_buf = tPsPt(_, _, _, Traits::kPBuffers == 1 ? 0 : ds_buf);
        cute::copy(rP, tPsPt_buf);
    }
    cutlass::arch::fence_view_async_shared();
    bwd_ws_consumer_sync(BwdWsBarrier::kdS);
}

// ---- consumers, one query block: dQ = dS K over the whole key block -----------------------------
// (Traits::kdQSwapped: dQ^T = K^T dS^T.) A / B: the GEMM's operands in wgmma order. Waited for
// before it returns. kDropout: block m + 2's flags while dV, dK and dQ run (see BwdWsDropFlags).
template <typename Traits, typename TensorA, typename TensorB, typename TensorAcc>
__forceinline__ __device__ void bwd_ws_dq_gemm(typename Traits::TiledMmadQ &tiled_mma_dq, TensorA const &tdQrA,
                                               TensorB const &tdQrB, TensorAcc &acc_dq,
                                               BwdWsDropFlags<Traits> const &drop, int m_block, int m_block_max) {
    if constexpr (Traits::kDropout) {
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_dq, tdQrA, tdQrB, acc_dq);
        if constexpr (!Traits::kSplitD) {
            if (m_block + 2 < m_block_max) { drop.make(m_block + 2); }
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_dq);
    } else {
        wgmma</*kZeroInit=*/true, /*kWait=*/0>(tiled_mma_dq, tdQrA, tdQrB, acc_dq);
    }
}

}  // namespace flash
