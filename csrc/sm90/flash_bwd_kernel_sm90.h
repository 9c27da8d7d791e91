// Hopper (sm_90a) backward main kernel: warpgroup MMAs (wgmma) for all five GEMMs.
//
// One CTA per (key block, batch, query head), one warpgroup per 64 keys, walking the query blocks that
// can see its keys. Per query block m (Q, dO, LSE, softmax_d double-buffered, loaded with
// cp.async one block ahead):
//
//   S^T  = K Q^T, dP^T = V dO^T             (wgmma SS, both in flight together)
//   P^T  = exp2(S^T * scale log2e - LSE log2e)          (masked where the tile needs it)
//   dS^T = P^T * (dP^T - softmax_d)
//   dV  += P^T dO,  dK += dS^T Q             (wgmma RS: P^T, dS^T straight from the accumulators)
//   dS^T -> shared memory; dQ = dS K         (wgmma SS)  -> fp32 atomics into dq_accum
//
// The preprocess (softmax_d) and dq conversion kernels are the SM80-class ones.
// kFeat adds softcap, ALiBi, dropout (the drop flags of the next query block are generated into
// shared memory while GEMMs run) and the deterministic dQ (per-CTA dq_accum slices).
//
// Dropout flags (kFeat with dropout): layout 2 of dropout_sm90.h (4 LDS.128 per application, 4
// STS.64 per generation), generated after dQ = dS K is issued, in the longest window (dV, dK and
// dQ in flight, nothing else left to issue). The alternatives measured on the H200 (
// bf16 8k d128: dropout bwd 1.18x of plain here) were the first layout (16 LDS.32 per
// application) and generation in the S / dP window, ahead of the softmax: 1.24x; removed.
#pragma once

#include <cute/arch/copy_sm80.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/tile_io.h"
#include "common/attn_mods.h"
#include "sm90/dropout_sm90.h"
#include "common/utils.h"
#include "sm90/flash_fwd_kernel_sm90.h"  // wgmma
#include "sm90/kernel_traits_bwd_sm90.h"

namespace flash {

using namespace cute;

// Q and dO of query block m_block into stage `stage` (cp.async, zero-filled past seqlen_q and the
// head dim), and its LSE and softmax_d rows, one value per thread of the first 2 kBlockM.
template <typename Traits, typename GmemCopy, typename ThrGmemCopy, typename TensorSQ, typename TensorSdO,
          typename TensorCQ, typename TensorPQ>
__forceinline__ __device__ void bwd_sm90_load_qdo(const BwdParams &params, GmemCopy const &gmem_copy,
                                                  ThrGmemCopy const &thr_gmem_copy, TensorSQ &tQsQ, TensorSdO &tdOsdO,
                                                  TensorCQ const &tQcQ, TensorPQ const &tQpQ, const int64_t q_base,
                                                  const int64_t do_base, const float *lse_ptr, const float *dsum_ptr,
                                                  float *smem_lse, float *smem_dsum, const int seqlen_q,
                                                  const int m_block, const int stage, const int tidx) {
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    const int row0 = m_block * kBlockM;
    const int rows = seqlen_q - row0;
    Tensor gQ = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.q_ptr) + q_base +
                                          index_t(row0) * params.q_row_stride),
                            Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(params.q_row_stride, _1{}));
    Tensor gdO = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.do_ptr) + do_base +
                                           index_t(row0) * params.do_row_stride),
                             Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(params.do_row_stride, _1{}));
    Tensor tQsQ_stage = tQsQ(_, _, _, stage);
    Tensor tdOsdO_stage = tdOsdO(_, _, _, stage);
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gQ), tQsQ_stage, tQcQ, tQpQ, rows);
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gdO), tdOsdO_stage, tQcQ, tQpQ, rows);
    // Rows past seqlen_q read as LSE = softmax_d = 0 with Q = dO = 0: P^T dO = 0 and dS = 0,
    // so they contribute nothing.
    if (tidx < 2 * kBlockM) {
        const int r = tidx % kBlockM;
        const bool valid = r < rows;
        const float *src = tidx < kBlockM ? lse_ptr + row0 + r : dsum_ptr + row0 + r;
        float *dst = (tidx < kBlockM ? smem_lse : smem_dsum) + stage * kBlockM + r;
        SM80_CP_ASYNC_CACHEALWAYS_ZFILL<float>::copy(*(valid ? src : lse_ptr), *dst, valid);
    }
}

// The masked S^T (acc_s: the (key, query) accumulators of the query block at row0) -> P^T =
// exp2(S^T * scale log2e - LSE log2e) in place; lse_stage: the block's LSE rows in shared memory.
template <typename Traits, typename TensorAcc, typename TensorCoords, typename TensorCoordsRC>
__forceinline__ __device__ void bwd_sm90_scores_to_p(TensorAcc &acc_s, const BwdParams &params,
                                                     TensorCoords const &coords_st, TensorCoordsRC const &coords_st_rc,
                                                     const float *lse_stage, const Mask &mask, const int seqlen_k,
                                                     const int diag, const int row0, const int col0) {
    constexpr float kLog2e = 1.4426950408889634f;
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (key, query)
    if (mask.tile_needs_mask(row0, col0, Traits::kBlockM, Traits::kBlockN)) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
            const int key = col0 + get<0>(coords_st(i));
            const int row = row0 + get<1>(coords_st(i));
            const bool masked = (key >= seqlen_k) | (key > row + diag + params.window_right) |
                                (key < row + diag - params.window_left);
            acc_s(i) = masked ? -INFINITY : acc_s(i);
        }
    }
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(scores); ++ni) {
        const float lse_log2 = lse_stage[get<1>(coords_st_rc(0, ni))] * kLog2e;
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(scores); ++mi) {
            scores(mi, ni) = exp2f(scores(mi, ni) * params.scale_softmax_log2 - lse_log2);
        }
    }
}

// dP^T (acc_dp) -> dS^T = P^T * (dP^T * dp_scale - softmax_d) in place (acc_s: P^T), then the
// softcap's gradient factor (kFeat); dsum_stage and lse_stage: the block's softmax_d and LSE rows.
template <bool kFeat, typename TensorAcc, typename TensorCoords, typename TensorCoordsRC>
__forceinline__ __device__ void bwd_sm90_dp_to_ds(TensorAcc &acc_dp, TensorAcc const &acc_s, const BwdParams &params,
                                                  const ScoreMod &score_mod, TensorCoords const &coords_st,
                                                  TensorCoordsRC const &coords_st_rc, const float *lse_stage,
                                                  const float *dsum_stage, const float dp_scale, const int row0,
                                                  const int col0) {
    constexpr float kLog2e = 1.4426950408889634f;
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
    Tensor dS = make_tensor(acc_dp.data(), acc_layout_rowcol(acc_dp.layout()));
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(dS); ++ni) {
        const float dsum = dsum_stage[get<1>(coords_st_rc(0, ni))];
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(dS); ++mi) { dS(mi, ni) = scores(mi, ni) * (dS(mi, ni) * dp_scale - dsum); }
    }
    if constexpr (kFeat) {
        score_mod.softcap_grad_t(acc_dp, acc_s, coords_st, row0, col0, params.scale_softmax_log2,
                                 [&](int i) { return lse_stage[get<1>(coords_st(i))] * kLog2e; });
    }
}

// dQ of the query block at row0 (acc_dq) into its dq_accum rows: a plain store where this is the
// slice element's first write (dq_store), else fp32 atomics. dq_accum rows are padded to a
// multiple of 128 and columns to kHeadDim: no predicates.
template <typename Traits, typename TensorAcc, typename ThrMma>
__forceinline__ __device__ void bwd_sm90_add_dq(TensorAcc const &acc_dq, ThrMma const &thr_mma_dq, float *dq_accum_ptr,
                                                const int row0, const bool dq_store) {
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    Tensor gdQaccum = make_tensor(make_gmem_ptr(dq_accum_ptr + index_t(row0) * kHeadDim),
                                  Shape<Int<kBlockM>, Int<kHeadDim>>{}, Stride<Int<kHeadDim>, _1>{});
    Tensor tdQgdQaccum = thr_mma_dq.partition_C(gdQaccum);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 2) {  // elements (i, i+1) are adjacent columns
        if (dq_store) {  // first write of this slice element (params.dq_store_first)
            *reinterpret_cast<float2 *>(&tdQgdQaccum(i)) = make_float2(acc_dq(i), acc_dq(i + 1));
        } else {
            atomicAdd(reinterpret_cast<float2 *>(&tdQgdQaccum(i)), make_float2(acc_dq(i), acc_dq(i + 1)));
        }
    }
}

// K and V of the key block at col0 (keys_left rows, zero-filled past them and the head dim) into
// sK / sV, loaded once per key block.
template <typename Traits, typename GmemCopy, typename ThrGmemCopy, typename TensorSK, typename TensorSV,
          typename TensorCKV, typename TensorPKV>
__forceinline__ __device__ void bwd_sm90_load_kv(const BwdParams &params, const BlockInfo &binfo,
                                                 GmemCopy const &gmem_copy, ThrGmemCopy const &thr_gmem_copy,
                                                 TensorSK const &sK, TensorSV const &sV, TensorCKV const &tKVcKV,
                                                 TensorPKV const &tKVpKV, const int bidb, const int bidh_k,
                                                 const int col0, const int keys_left) {
    auto [gK, gV] = kv_block_gmem<typename Traits::Element, Traits::kBlockN, Traits::kHeadDim>(params, binfo, bidb,
                                                                                              bidh_k, col0);
    Tensor tKsK = thr_gmem_copy.partition_D(sK);
    Tensor tVsV = thr_gmem_copy.partition_D(sV);
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gK), tKsK, tKVcKV, tKVpKV, keys_left);
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gV), tVsV, tKVcKV, tKVpKV, keys_left);
}

// P^T of the query block at row0 from S^T (acc_s, left holding P^T) and in the input type (rP),
// then dV += P^T dO issued (dO^T of stage `stage`). rP is the caller's: the wgmma reads it after
// this returns. With dropout, dV takes P * keep / (1 - p): the dropped elements are cleared here,
// 1 / (1 - p) is applied to dV once at the end.
template <typename Traits, bool kFeat, typename TensorAcc, typename TensorRP, typename TensorAccKV, typename TensorB,
          typename TiledMma, typename TensorCoords, typename TensorCoordsRC>
__forceinline__ __device__ void bwd_sm90_p_and_dv(TensorAcc &acc_s, TensorRP &rP, TensorAccKV &acc_dv,
                                                  TiledMma &tiled_mma_dkv, TensorB const &tdVrdOt, const int stage,
                                                  const BwdParams &params, const ScoreMod &score_mod,
                                                  const bool is_dropout, const uint32_t *drop_flags_stage,
                                                  TensorCoords const &coords_st, TensorCoordsRC const &coords_st_rc,
                                                  const float *lse_stage, const Mask &mask, const int seqlen_k,
                                                  const int diag, const int row0, const int col0) {
    if constexpr (kFeat) { score_mod.apply_t(acc_s, coords_st, row0, col0); }
    bwd_sm90_scores_to_p<Traits>(acc_s, params, coords_st, coords_st_rc, lse_stage, mask, seqlen_k, diag, row0, col0);
    convert_into(acc_s, rP);
    if (kFeat && is_dropout) { dropout_bwd_apply_p2<Traits::kBlockM>(rP, drop_flags_stage, coords_st); }
    wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, make_tensor(rP.data(), acc_layout_as_A(rP.layout())),
                                             tdVrdOt(_, _, _, stage), acc_dv);
}

// The end of a key block's walk: dK *= the softmax scale, and with dropout dV *= 1 / (1 - p),
// taken out of every P.
template <bool kFeat, typename TensorAcc>
__forceinline__ __device__ void bwd_sm90_scale_dk_dv(TensorAcc &acc_dk, TensorAcc &acc_dv, const BwdParams &params,
                                                     const Dropout &dropout, const bool is_dropout) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) { acc_dk(i) *= params.scale_softmax; }
    if (kFeat && is_dropout) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dv); ++i) { acc_dv(i) *= dropout.rp; }
    }
}

// One key block: dK, dV of its keys and its dQ contributions (atomics into dq_accum + the
// slice offset).
template <typename Traits, bool kFeat>
__forceinline__ __device__ void bwd_block_sm90(const BwdParams &params, const int n_block, const int64_t dq_slice,
                                               const bool dq_store) {
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / params.h_h_k_ratio;

    const BlockInfo binfo(params, bidb);
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    const int col0 = n_block * kBlockN;
    if (col0 >= seqlen_k) return;
    const int keys_left = seqlen_k - col0;
    const int diag = seqlen_k - seqlen_q;
    const Mask mask{seqlen_k, diag, params.window_left, params.window_right};
    int m_block_min, m_block_max;
    mask.m_block_range(col0, kBlockN, kBlockM, m_block_min, m_block_max);

    typename Traits::TiledMmadKV tiled_mma_dkv;
    auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tidx);
    Tensor acc_dk = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(acc_dk);
    clear(acc_dv);

    auto store_dk_dv = [&]() {  // after every wgmma has finished reading shared memory (the barrier)
        flash::store_dk_dv<Traits>(params, binfo, acc_dk, acc_dv, smem, bidb, bidh, col0, keys_left, tidx);
    };
    if (m_block_max <= m_block_min) {  // no query sees these keys: dK = dV = 0
        store_dk_dv();
        return;
    }

    // ---- shared memory: Q[2] | dO[2] | K | V | dS | LSE[2] | softmax_d[2] ----
    Element *smem_q = reinterpret_cast<Element *>(smem);
    Element *smem_do = smem_q + Traits::kSmemQdOElems;
    Element *smem_k = smem_do + Traits::kSmemQdOElems;
    Element *smem_v = smem_k + Traits::kSmemKVElems;
    Element *smem_ds = smem_v + Traits::kSmemKVElems;
    float *smem_lse = reinterpret_cast<float *>(smem_ds + Traits::kSmemdSElems);
    float *smem_dsum = smem_lse + Traits::kStages * kBlockM;
    uint32_t *smem_drop_flags = reinterpret_cast<uint32_t *>(smem + Traits::kSmemDropoutOffset);

    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdO{});
    Tensor sQt = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdOt{});
    Tensor sdO = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdOt{});
    Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
    Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutdSt{});

    // ---- global -> shared (cp.async with zero-fill past seqlen and the head dim) ----
    const index_t q_base = binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb) + bidh * params.q_head_stride;
    const index_t do_base = binfo.q_offset(params.do_batch_stride, params.do_row_stride, bidb) + bidh * params.do_head_stride;
    const float *lse_ptr = params.softmax_lse_ptr +
                           (binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                           bidh * params.lse_head_stride;
    const index_t accum_row = accum_row0(params, binfo, bidb, bidh);  // dense or per-sequence padded
    const float *dsum_ptr = params.softmax_d_ptr + accum_row;
    float *dq_accum_ptr = params.dq_accum_ptr + dq_slice + accum_row * kHeadDim;

    typename Traits::GmemTiledCopyLoad gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tQsQ = thr_gmem_copy.partition_D(sQ);  // (CPY, CPY_M, CPY_K, stage)
    Tensor tdOsdO = thr_gmem_copy.partition_D(sdO);
    Tensor tQcQ = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tQpQ = make_col_predicate(tQcQ, params.d);
    Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);

    auto load_QdO = [&](int m_block, int stage) {
        bwd_sm90_load_qdo<Traits>(params, gmem_copy, thr_gmem_copy, tQsQ, tdOsdO, tQcQ, tQpQ, q_base, do_base, lse_ptr,
                                  dsum_ptr, smem_lse, smem_dsum, seqlen_q, m_block, stage, tidx);
    };

    // ---- MMA operands ----
    typename Traits::TiledMmaSdP tiled_mma_sdp;
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(tidx);
    Tensor tSrK = thr_mma_sdp.partition_fragment_A(sK);    // smem descriptors
    Tensor tSrQ = thr_mma_sdp.partition_fragment_B(sQ);    // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrV = thr_mma_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_mma_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = thr_mma_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQt);
    typename Traits::TiledMmadQ tiled_mma_dq;
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(tidx);
    Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);
    Tensor tdQrKt = thr_mma_dq.partition_fragment_B(sKt);
    Tensor tdSsdSt = thr_mma_sdp.partition_C(sdSt);  // where this thread's dS^T elements go

    // Accumulator coordinates: mode 0 = key (within the block), mode 1 = query row.
    Tensor coords_st = thr_mma_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor coords_st_rc = make_tensor(coords_st.data(), acc_layout_rowcol(coords_st.layout()));
    auto new_acc_st = [&]() { return partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{}); };

    // ---- prologue: K and V once, then the first query block ----
    bwd_sm90_load_kv<Traits>(params, binfo, gmem_copy, thr_gmem_copy, sK, sV, tKVcKV, tKVpKV, bidb, bidh_k, col0,
                             keys_left);
    load_QdO(m_block_min, 0);
    cp_async_fence();

    const ScoreMod score_mod = kFeat ? ScoreMod(params, bidb, bidh, diag) : ScoreMod{};
    const bool is_dropout = kFeat && params.p_dropout > 0.f;
    const Dropout dropout = is_dropout ? Dropout(params, bidb, bidh) : Dropout{};
    constexpr int kDropFlagWords = Traits::kSmemDropoutFlagsPerStage / 4;
    auto make_drop_flags = [&](int m_block, int stage) {
        if constexpr (kFeat) {
            if (is_dropout) {
                dropout_bwd_generate2<kBlockM, kBlockN, Traits::kNThreads>(
                    dropout, smem_drop_flags + stage * kDropFlagWords, m_block, n_block, tidx);
            }
        }
    };
    make_drop_flags(m_block_min, 0);

    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int stage = (m_block - m_block_min) & 1;
        const int row0 = m_block * kBlockM;
        // This block's tiles landed (cp.async writes through the generic proxy, wgmma reads through
        // the async proxy); every warp is done with the last one.
        cp_async_wait<0>();
        cutlass::arch::fence_view_async_shared();
        __syncthreads();
        if (m_block + 1 < m_block_max) { load_QdO(m_block + 1, stage ^ 1); }
        cp_async_fence();

        Tensor acc_s = new_acc_st();
        Tensor acc_dp = new_acc_st();
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);
        const uint32_t *drop_flags_stage = smem_drop_flags + stage * kDropFlagWords;

        // P^T = exp2(S^T * scale log2e - LSE log2e), masked where the tile needs it; dV += P^T dO.
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc_s);
        const float *lse_stage = smem_lse + stage * kBlockM;
        const float *dsum_stage = smem_dsum + stage * kBlockM;
        Tensor rP = make_tensor_like<Element>(acc_s);
        bwd_sm90_p_and_dv<Traits, kFeat>(acc_s, rP, acc_dv, tiled_mma_dkv, tdVrdOt, stage, params, score_mod,
                                         is_dropout, drop_flags_stage, coords_st, coords_st_rc, lse_stage, mask,
                                         seqlen_k, diag, row0, col0);

        // dS^T = P^T * (dP^T - softmax_d).
        warpgroup_wait<1>();  // dP^T ready (dV may still run)
        warpgroup_fence_operand(acc_dp);
        // out = (P * keep / (1 - p)) V: the dP seen by P is dP * keep / (1 - p).
        if (kFeat && is_dropout) { dropout_bwd_apply_dp2<kBlockM>(acc_dp, drop_flags_stage, coords_st); }
        const float dp_scale = kFeat && is_dropout ? dropout.rp : 1.f;
        bwd_sm90_dp_to_ds<kFeat>(acc_dp, acc_s, params, score_mod, coords_st, coords_st_rc, lse_stage, dsum_stage,
                                 dp_scale, row0, col0);
        Tensor rdS = make_tensor_like<Element>(acc_dp);
        convert_into(acc_dp, rdS);
        wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, make_tensor(rdS.data(), acc_layout_as_A(rdS.layout())),
                                                 tdKrQt(_, _, _, stage), acc_dk);

        // dQ = dS K over the whole key block: dS^T of both warpgroups through shared memory.
        cute::copy(rdS, tdSsdSt);
        cutlass::arch::fence_view_async_shared();
        __syncthreads();
        Tensor acc_dq = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
        if constexpr (kFeat) {
            // The next block's flags while dV, dK and dQ run (stage ^ 1 was last read in the
            // previous iteration, before this one's first barrier).
            wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_dq, tdQrdS, tdQrKt, acc_dq);
            if (m_block + 1 < m_block_max) { make_drop_flags(m_block + 1, stage ^ 1); }
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc_dq);
        } else {
            wgmma</*kZeroInit=*/true, /*kWait=*/0>(tiled_mma_dq, tdQrdS, tdQrKt, acc_dq);
        }
        warpgroup_fence_operand(acc_dv);
        warpgroup_fence_operand(acc_dk);

        bwd_sm90_add_dq<Traits>(acc_dq, thr_mma_dq, dq_accum_ptr, row0, dq_store);
    }

    bwd_sm90_scale_dk_dv<kFeat>(acc_dk, acc_dv, params, dropout, is_dropout);
    store_dk_dv();
}

// Grid (key blocks, b, h); deterministic (kFeat): (dq_accum_splits, b, h), CTA s walking the key
// blocks in rounds of splits, zig-zag (block round * splits + s in even rounds, + splits - 1 - s
// in odd ones: with a causal mask a key block's work falls with its index, and the pairs even it
// out), adding its dQ into slice s of dq_accum. Each slice element is updated by one thread of
// one CTA, in program order, so the sums (and their order in the conversion) are fixed: no
// counters, no waiting.
template <typename Traits, bool kFeat>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) flash_bwd_kernel_sm90(const __grid_constant__ BwdParams params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    // One call site (one inlined copy of the block code): the plain grid runs one iteration.
    const bool sliced = kFeat && params.deterministic;
    const int64_t dq_slice = sliced ? int64_t(blockIdx.x) * params.dq_accum_split_stride : 0;
    const int n_blocks = sliced ? ceil_div(params.seqlen_k, Traits::kBlockN) : blockIdx.x + 1;
    const int splits = gridDim.x, s = blockIdx.x;
    for (int round = 0, n_block = s; n_block < n_blocks;
         ++round, n_block = round * splits + ((round & 1) ? splits - 1 - s : s)) {
        if (round > 0) { __syncthreads(); }  // the last block's dK/dV staging was read
        bwd_block_sm90<Traits, kFeat>(params, n_block, dq_slice, sliced && params.dq_store_first && round == 0);
    }
#endif
}

}  // namespace flash
