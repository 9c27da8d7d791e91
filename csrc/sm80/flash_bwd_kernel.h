// Backward kernels (SM80-class, mma.sync).
//   preprocess:  softmax_d = rowsum(dO * O)
//   main:        one CTA per (key block, batch, query head); walks the query blocks that can see
//                its keys, recomputing P = exp(S * scale - lse) from the saved LSE:
//                  dV += P^T dO,  dP = dO V^T,  dS = P * (dP - softmax_d),
//                  dK += dS^T Q,  dQ += dS K (fp32 atomics into dq_accum)
//                Q and dO are double-buffered: block m+1 loads while block m computes.
//   convert_dq:  dq = dq_accum * scale in the input dtype.
// The kFeat variant adds softcap, ALiBi and dropout (P recomputed exactly as in the forward) and
// the deterministic dQ order (params.deterministic).
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/attn_mods.h"
#include "common/flash.h"
#include "common/bwd_passes.h"
#include "common/tile_io.h"
#include "common/kernel_traits.h"
#include "common/launch_check.h"
#include "common/mask.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// The masked S (acc_s) of the query block at row0 -> P = exp(S * scale - lse) in place; also this
// thread's rows' softmax_d (row_dsum) and, for the softcap gradient, their lse (row_lse). The mask
// stays with the caller: applied here, where row0 and col0 are opaque parameters, it compiles
// differently.
template <bool kMaySoftcap, typename TensorAcc, typename TensorCoordsRC, int kNRows>
__forceinline__ __device__ void scores_to_p(TensorAcc &acc_s, const BwdParams &params,
                                            TensorCoordsRC const &coords_s_rc, const float *lse_ptr,
                                            const float *dsum_ptr, const int seqlen_q, const int row0,
                                            float (&row_dsum)[kNRows], float (&row_lse)[kNRows]) {
    constexpr float kLog2e = 1.4426950408889634f;
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        const int row = row0 + get<0>(coords_s_rc(mi, 0));
        // Rows past seqlen_q get lse = +inf, hence P = 0 and no contribution.
        const float lse = row < seqlen_q ? lse_ptr[row] * kLog2e : INFINITY;
        if constexpr (kMaySoftcap) { row_lse[mi] = lse; }
        row_dsum[mi] = row < seqlen_q ? dsum_ptr[row] : 0.f;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(scores); ++ni) {
            scores(mi, ni) = exp2f(scores(mi, ni) * params.scale_softmax_log2 - lse);
        }
    }
}

// dS (acc_dp) times the softcap's d score / d s = (1 - tanh^2) * softcap_scale (the softcap
// factor is in scale_softmax). tanh is recovered from P = exp2(u * scale_log2 - lse) with
// u = tanh + ALiBi bias rather than kept in registers; where P = 0 it does not matter (no
// softcap with dropout, so acc_s still holds P).
template <int kStatic, typename TensorAcc, typename TensorCoords, typename TensorCoordsRC, int kNRows>
__forceinline__ __device__ void softcap_grad_ds(TensorAcc &acc_dp, TensorAcc const &acc_s, const BwdParams &params,
                                                const ScoreMod &score_mod, TensorCoords const &coords_s,
                                                TensorCoords const &coords_s0, TensorCoordsRC const &coords_s_rc,
                                                TensorCoordsRC const &coords_s0_rc, const float (&row_lse)[kNRows],
                                                const int row0, const int col0) {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
    Tensor dS_rc = make_tensor(acc_dp.data(), acc_layout_rowcol(acc_dp.layout()));
    const float inv_scale_log2 = 1.f / params.scale_softmax_log2;
    // The fixed-set ALiBi in the forward's fp32 form (ScoreMod::add_alibi_fast).
    const float alibi_base = score_mod.alibi_base(coords_s, coords_s0, row0, col0);
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(dS_rc); ++ni) {
            const float p = scores(mi, ni);
            float t = (__log2f(p) + row_lse[mi]) * inv_scale_log2;
            if constexpr ((kStatic & kModAlibi) != 0) {
                const float off = float(get<0>(coords_s0_rc(mi, ni)) - get<1>(coords_s0_rc(mi, ni)));
                t = fmaf(-score_mod.alibi_slope, fabsf(alibi_base + off), t);
            } else if (kStatic == 0 && score_mod.alibi_slope != 0.f) {
                const int dist = row0 + get<0>(coords_s_rc(mi, ni)) + score_mod.diag - col0 -
                                 get<1>(coords_s_rc(mi, ni));
                t -= score_mod.alibi_slope * float(dist < 0 ? -dist : dist);
            }
            dS_rc(mi, ni) = p > 0.f ? dS_rc(mi, ni) * (1.f - t * t) * score_mod.softcap_scale : 0.f;
        }
    }
}

// A query block's dQ (acc_dq) added into dq_accum with fp32 atomics; in the semaphore-ordered
// deterministic mode after the key blocks above this one, then letting the next one in.
template <typename Traits, bool kFeat, int kStatic, typename TensorAcc, typename ThrMma>
__forceinline__ __device__ void add_dq_atomic(TensorAcc const &acc_dq, ThrMma const &thr_mma_dq, float *dq_accum_ptr,
                                              const Mask &mask, const bool deterministic, int *dq_semaphore,
                                              const int m_block, const int n_block, const int row0, const int tidx) {
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    // dq_accum rows are padded to a multiple of kBlockM and columns to kHeadDim: no predicates.
    Tensor gdQaccum = make_tensor(make_gmem_ptr(dq_accum_ptr + index_t(row0) * kHeadDim),
                                  Shape<Int<kBlockM>, Int<kHeadDim>>{}, Stride<Int<kHeadDim>, _1>{});
    Tensor tdQgdQaccum = thr_mma_dq.partition_C(gdQaccum);
    static_assert(decltype(size<0>(acc_dq))::value == 4);
    // Scalar fp32 atomics instead of the float2 ones measured 1.35x slower at d256.
    if constexpr (kFeat && kStatic == 0) {
        if (deterministic) {
            // Wait for the key blocks above this one that also see this query block.
            if (tidx == 0) {
                const int target = mask.last_n_block_seeing(m_block, kBlockM, Traits::kBlockN) - n_block;
                const volatile int *sem = dq_semaphore + m_block * (kBlockM / 64);
                while (*sem != target) {}
                __threadfence();
            }
            __syncthreads();
        }
    }
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 2) {  // elements (i, i+1) are adjacent columns
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2 *>(&tdQgdQaccum(i)), make_float2(acc_dq(i), acc_dq(i + 1)));
#else
        atomicAdd(&tdQgdQaccum(i), acc_dq(i));
        atomicAdd(&tdQgdQaccum(i + 1), acc_dq(i + 1));
#endif
    }
    if constexpr (kFeat && kStatic == 0) {
        if (deterministic) {  // publish this block's dQ, then let the next key block in
            __threadfence();
            __syncthreads();
            if (tidx == 0) atomicAdd(dq_semaphore + m_block * (kBlockM / 64), 1);
        }
    }
}

// dP (acc_dp) -> dS = P * (dP - softmax_d) in place, with P in acc_s and softmax_d of this
// thread's rows in row_dsum; with softcap, times its gradient (softcap_grad_ds).
template <typename Traits, int kStatic, bool kMayDropout, bool kMaySoftcap, typename TensorAcc, typename TensorCoords,
          typename TensorCoordsRC, int kNRows>
__forceinline__ __device__ void bwd_dp_to_ds(TensorAcc &acc_dp, TensorAcc &acc_s, const BwdParams &params,
                                             const ScoreMod &score_mod, const Dropout &dropout, const bool is_dropout,
                                             const bool has_softcap, TensorCoords const &coords_s,
                                             TensorCoords const &coords_s0, TensorCoordsRC const &coords_s_rc,
                                             TensorCoordsRC const &coords_s0_rc, const float (&row_dsum)[kNRows],
                                             const float (&row_lse)[kNRows], const int row0, const int col0) {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
    Tensor dS = make_tensor(acc_dp.data(), acc_layout_rowcol(acc_dp.layout()));
    if constexpr (kMayDropout) {
        if (is_dropout) {
            // Out = (P * Z) V with Z = keep / (1 - p): dS = P * (dP * Z - rowsum(dO * O)), and
            // dV takes P * Z (left in acc_s). Element (e, m, n) lies in row e / 2 + 2 m of the
            // (rows, cols) view.
            dropout.template for_each<Traits::kWarpsNSdP>(acc_s, coords_s, row0, col0,
                                                          [&](int e, int m, int n, bool keep) {
                const float p = acc_s(e, m, n);
                const float dp = keep ? acc_dp(e, m, n) * dropout.rp : 0.f;
                acc_dp(e, m, n) = p * (dp - row_dsum[e / 2 + 2 * m]);
                acc_s(e, m, n) = keep ? p * dropout.rp : 0.f;
            });
        }
    }
    if (!is_dropout) {
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(dS); ++ni) { dS(mi, ni) = scores(mi, ni) * (dS(mi, ni) - row_dsum[mi]); }
        }
    }
    if constexpr (kMaySoftcap) {
        if (has_softcap) {
            softcap_grad_ds<kStatic>(acc_dp, acc_s, params, score_mod, coords_s, coords_s0, coords_s_rc, coords_s0_rc,
                                     row_lse, row0, col0);
        }
    }
}

// P and dS (acc_s, acc_dp) in the input type into shared memory (tPsP, tdSsdS: this thread's
// part), read there by every warp's dV, dK and dQ GEMMs.
template <typename Element, typename TensorAcc, typename SmemCopy, typename ThrSmemCopy, typename TensorSP,
          typename TensorSdS>
__forceinline__ __device__ void bwd_store_p_ds(TensorAcc const &acc_s, TensorAcc const &acc_dp,
                                               SmemCopy const &smem_copy_PdS, ThrSmemCopy const &thr_smem_copy_PdS,
                                               TensorSP &tPsP, TensorSdS &tdSsdS) {
    Tensor rP = convert_type<Element>(acc_s);
    Tensor rdS = convert_type<Element>(acc_dp);
    cute::copy(smem_copy_PdS, thr_smem_copy_PdS.retile_S(rP), tPsP);
    cute::copy(smem_copy_PdS, thr_smem_copy_PdS.retile_S(rdS), tdSsdS);
    __syncthreads();  // P and dS visible to all warps
}

// One key block: dK, dV of its keys and its dQ contributions (fp32 atomics into dq_accum, at
// element offset dq_slice: this CTA's slice in the sliced deterministic mode).
// kStatic (kFeat only; attn_mods.h): 0 for the run-time feature form, whose key block is
// blockIdx.x (reversed in its semaphore-ordered deterministic mode, see flash_bwd_kernel), else
// kModStatic | the features compiled in and always on, with the key block n_block_arg.
// kDqBeforeDk (plain kernels only): the dQ GEMM and its atomics before the dK GEMM (FA2's order:
// the reductions drain while dK runs), else after it.
template <typename Traits, bool kFeat, int kStatic, bool kDqBeforeDk = false>
__forceinline__ __device__ void bwd_block(const BwdParams &params, const int n_block_arg, const int64_t dq_slice) {
    static_assert(kFeat || kStatic == 0);
    static_assert(!kDqBeforeDk || !kFeat);
    constexpr bool kMayDropout = kFeat && (kStatic == 0 || (kStatic & kModDropout) != 0);
    constexpr bool kMaySoftcap = kFeat && (kStatic == 0 || (kStatic & kModSoftcap) != 0);
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    using TiledMmaSdP = typename Traits::TiledMmaSdP;
    using TiledMmadKV = typename Traits::TiledMmadKV;
    using TiledMmadQ = typename Traits::TiledMmadQ;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x;
    // Semaphore-ordered dQ: the highest key blocks start first, so a CTA only ever waits for
    // CTAs dispatched before it.
    const bool deterministic = kFeat && kStatic == 0 && params.deterministic;
    const int n_block = kStatic != 0 ? n_block_arg : deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / params.h_h_k_ratio;

    const BlockInfo binfo(params, bidb);
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    const int col0 = n_block * kBlockN;
    if (col0 >= seqlen_k) return;
    const Mask mask{seqlen_k, seqlen_k - seqlen_q, params.window_left, params.window_right};

    // Query blocks that can see at least one key of this block.
    int m_block_min, m_block_max;
    mask.m_block_range(col0, kBlockN, kBlockM, m_block_min, m_block_max);

    Element *dk_ptr = reinterpret_cast<Element *>(params.dk_ptr) +
                      binfo.k_offset(params.dk_batch_stride, params.dk_row_stride, bidb) + bidh * params.dk_head_stride +
                      index_t(col0) * params.dk_row_stride;
    Element *dv_ptr = reinterpret_cast<Element *>(params.dv_ptr) +
                      binfo.k_offset(params.dv_batch_stride, params.dv_row_stride, bidb) + bidh * params.dv_head_stride +
                      index_t(col0) * params.dv_row_stride;
    const int keys_left = seqlen_k - col0;

    TiledMmadKV tiled_mma_dkv;
    auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tidx);
    Tensor acc_dk = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(acc_dk);
    clear(acc_dv);

    auto store_dk_dv = [&]() {
        // dK and dV go through separate smem regions, so one barrier covers both.
        __syncthreads();
        store_tile<Traits, TiledMmadKV>(acc_dk, smem, typename Traits::SmemLayoutdKV{}, dk_ptr, params.dk_row_stride,
                                        keys_left, params.d, tidx);
        store_tile<Traits, TiledMmadKV>(acc_dv, smem + Traits::kSmemKVSize, typename Traits::SmemLayoutdKV{}, dv_ptr,
                                        params.dv_row_stride, keys_left, params.d, tidx);
    };
    if (m_block_max <= m_block_min) {  // no query sees these keys: dK = dV = 0
        store_dk_dv();
        return;
    }

    const index_t q_base = binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb) + bidh * params.q_head_stride;
    const index_t do_base = binfo.q_offset(params.do_batch_stride, params.do_row_stride, bidb) + bidh * params.do_head_stride;
    auto gQ_at = [&](int m_block) {
        return block_rows_gmem<kBlockM, kHeadDim>(reinterpret_cast<Element *>(params.q_ptr), q_base, m_block,
                                                  params.q_row_stride);
    };
    auto gdO_at = [&](int m_block) {
        return block_rows_gmem<kBlockM, kHeadDim>(reinterpret_cast<Element *>(params.do_ptr), do_base, m_block,
                                                  params.do_row_stride);
    };
    Tensor gK = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.k_ptr) +
                                          binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) +
                                          bidh_k * params.k_head_stride + index_t(col0) * params.k_row_stride),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.v_ptr) +
                                          binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) +
                                          bidh_k * params.v_head_stride + index_t(col0) * params.v_row_stride),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.v_row_stride, _1{}));
    const float *lse_ptr = params.softmax_lse_ptr +
                           (binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                           bidh * params.lse_head_stride;
    const index_t accum_row = accum_row0(params, binfo, bidb, bidh);
    const float *dsum_ptr = params.softmax_d_ptr + accum_row;
    float *dq_accum_ptr = params.dq_accum_ptr + (kStatic != 0 ? dq_slice : 0) + accum_row * kHeadDim;

    // Shared memory: Q[2] | dO[2] | K | V | dS | P
    Element *smem_q = reinterpret_cast<Element *>(smem);
    constexpr int kQdOElems = Traits::kSmemQdOSize / sizeof(Element);
    constexpr int kKVElems = Traits::kSmemKVSize / sizeof(Element);
    constexpr int kPdSElems = Traits::kSmemPdSSize / sizeof(Element);
    Element *smem_do = smem_q + 2 * kQdOElems;
    Element *smem_k = smem_do + 2 * kQdOElems;
    Element *smem_v = smem_k + kKVElems;
    Element *smem_ds = smem_v + kKVElems;
    Element *smem_p = smem_ds + kPdSElems;

    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdO{});
    Tensor sQt = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdOt{});
    Tensor sQtNoSwizzle = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdOtNoSwizzle{});
    Tensor sdO = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdOt{});
    Tensor sdOtNoSwizzle = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdOtNoSwizzle{});
    Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});
    Tensor sKtNoSwizzle = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKtNoSwizzle{});
    Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
    Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSt{});
    Tensor sdStNoSwizzle = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdStNoSwizzle{});
    Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdS{});
    Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSt{});
    Tensor sPtNoSwizzle = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdStNoSwizzle{});

    // A partitioned smem tensor of buffer 0, moved to buffer `buf` of a double-buffered pair.
    auto in_buffer = [&](auto const &t, int buf) { return make_tensor(t.data() + buf * kQdOElems, t.layout()); };

    // ---- global -> shared loads ----
    typename Traits::GmemTiledCopyLoad gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tQsQ = thr_gmem_copy.partition_D(sQ);
    Tensor tdOsdO = thr_gmem_copy.partition_D(sdO);
    Tensor tQcQ = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tQpQ = make_col_predicate(tQcQ, params.d);
    Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);
    // Predicated (branchy) cp.async: measured 12% faster here than the zero-fill variant the
    // forward kernels use (H200, d=128, docs/perf-notes.md).
    auto load = [&](auto const &src, auto &dst, auto const &coords, auto const &pred_k, int rows) {
        copy_tile(gmem_copy, src, dst, coords, pred_k, rows);
    };
    auto load_QdO = [&](int m_block, int buf) {
        Tensor tQsQ_buf = in_buffer(tQsQ, buf);
        load(thr_gmem_copy.partition_S(gQ_at(m_block)), tQsQ_buf, tQcQ, tQpQ, seqlen_q - m_block * kBlockM);
        Tensor tdOsdO_buf = in_buffer(tdOsdO, buf);
        load(thr_gmem_copy.partition_S(gdO_at(m_block)), tdOsdO_buf, tQcQ, tQpQ, seqlen_q - m_block * kBlockM);
    };

    // ---- MMA partitions ----
    TiledMmaSdP tiled_mma_sdp;
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(tidx);
    Tensor tSrQ = thr_mma_sdp.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma_sdp.partition_fragment_B(sK);
    Tensor tdPrdO = thr_mma_sdp.partition_fragment_A(sdO);
    Tensor tdPrV = thr_mma_sdp.partition_fragment_B(sV);
    auto smem_copy_sdp_A = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma_sdp);
    auto thr_smem_copy_sdp_A = smem_copy_sdp_A.get_thread_slice(tidx);
    auto smem_copy_sdp_B = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma_sdp);
    auto thr_smem_copy_sdp_B = smem_copy_sdp_B.get_thread_slice(tidx);
    Tensor tSsQ = thr_smem_copy_sdp_A.partition_S(sQ);
    Tensor tdPsdO = thr_smem_copy_sdp_A.partition_S(sdO);
    Tensor tSsK = thr_smem_copy_sdp_B.partition_S(sK);
    Tensor tdPsV = thr_smem_copy_sdp_B.partition_S(sV);

    // P and dS: registers -> smem
    auto smem_copy_PdS = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, tiled_mma_sdp);
    auto thr_smem_copy_PdS = smem_copy_PdS.get_thread_slice(tidx);
    Tensor tPsP = thr_smem_copy_PdS.partition_D(sP);
    Tensor tdSsdS = thr_smem_copy_PdS.partition_D(sdS);

    // dV += P^T dO and dK += dS^T Q: both operands read transposed from smem.
    Tensor tdVrPt = thr_mma_dkv.partition_fragment_A(sPtNoSwizzle);
    Tensor tdVrdO = thr_mma_dkv.partition_fragment_B(sdOtNoSwizzle);
    Tensor tdKrdSt = thr_mma_dkv.partition_fragment_A(sdStNoSwizzle);
    Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQtNoSwizzle);
    auto smem_copy_dkv_A = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dkv);
    auto thr_smem_copy_dkv_A = smem_copy_dkv_A.get_thread_slice(tidx);
    auto smem_copy_dkv_B = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dkv);
    auto thr_smem_copy_dkv_B = smem_copy_dkv_B.get_thread_slice(tidx);
    Tensor tdVsPt = thr_smem_copy_dkv_A.partition_S(sPt);
    Tensor tdKsdSt = thr_smem_copy_dkv_A.partition_S(sdSt);
    Tensor tdVsdOt = thr_smem_copy_dkv_B.partition_S(sdOt);
    Tensor tdKsQt = thr_smem_copy_dkv_B.partition_S(sQt);

    // dQ = dS K
    TiledMmadQ tiled_mma_dq;
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(tidx);
    Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);
    Tensor tdQrKt = thr_mma_dq.partition_fragment_B(sKtNoSwizzle);
    auto smem_copy_dq_A = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma_dq);
    auto thr_smem_copy_dq_A = smem_copy_dq_A.get_thread_slice(tidx);
    auto smem_copy_dq_B = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dq);
    auto thr_smem_copy_dq_B = smem_copy_dq_B.get_thread_slice(tidx);
    Tensor tdQsdS = thr_smem_copy_dq_A.partition_S(sdS);
    Tensor tdQsKt = thr_smem_copy_dq_B.partition_S(sKt);

    Tensor coords_s = thr_mma_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor coords_s_rc = make_tensor(coords_s.data(), acc_layout_rowcol(coords_s.layout()));
    // Thread 0's (constant) coordinates: per-element offsets for the fixed-set ALiBi.
    Tensor coords_s0 = tiled_mma_sdp.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor coords_s0_rc = make_tensor(coords_s0.data(), acc_layout_rowcol(coords_s0.layout()));
    constexpr int kNRows = decltype(size<0>(coords_s_rc))::value;

    // ---- prologue: K, V once; Q and dO of the first query block ----
    Tensor tKsK = thr_gmem_copy.partition_D(sK);
    Tensor tVsV = thr_gmem_copy.partition_D(sV);
    load(thr_gmem_copy.partition_S(gK), tKsK, tKVcKV, tKVpKV, keys_left);
    load(thr_gmem_copy.partition_S(gV), tVsV, tKVcKV, tKVpKV, keys_left);
    load_QdO(m_block_min, 0);
    cp_async_fence();

    // Feature state; the plain variant never touches it.
    const ScoreMod score_mod = kFeat ? ScoreMod(params, bidb, bidh, seqlen_k - seqlen_q) : ScoreMod{};
    const bool is_dropout = kStatic != 0 ? kMayDropout : kFeat && params.p_dropout > 0.f;
    const bool has_softcap = kStatic != 0 ? kMaySoftcap : kFeat && score_mod.has_softcap();
    const Dropout dropout = is_dropout ? Dropout(params, bidb, bidh) : Dropout{};
    int *dq_semaphore = deterministic ? params.dq_semaphore_ptr + (index_t(bidb) * params.h + bidh) *
                                                                      (params.seqlen_q_rounded / 64)
                                      : nullptr;

    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int buf = (m_block - m_block_min) & 1;
        const int row0 = m_block * kBlockM;

        cp_async_wait<0>();
        __syncthreads();  // Q/dO[buf] landed; every warp is done with the previous block's smem
        if (m_block + 1 < m_block_max) {
            load_QdO(m_block + 1, buf ^ 1);
            cp_async_fence();
        }

        // S = Q K^T, masked, then P = exp(S * scale - lse).
        Tensor acc_s = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        gemm_ss(acc_s, tSrQ, tSrK, in_buffer(tSsQ, buf), tSsK, tiled_mma_sdp, smem_copy_sdp_A, smem_copy_sdp_B,
                thr_smem_copy_sdp_A, thr_smem_copy_sdp_B);
        if constexpr (kFeat) { score_mod.template apply_set<kStatic>(acc_s, coords_s, coords_s0, row0, col0); }
        if (mask.tile_needs_mask(row0, col0, kBlockM, kBlockN)) { mask.apply(acc_s, coords_s, row0, col0); }
        float row_dsum[kNRows];
        [[maybe_unused]] float row_lse[kNRows];  // softcap: recovers tanh from P
        scores_to_p<kMaySoftcap>(acc_s, params, coords_s_rc, lse_ptr, dsum_ptr, seqlen_q, row0, row_dsum, row_lse);

        // dP = dO V^T; dS = P * (dP - softmax_d).
        Tensor acc_dp = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_dp);
        gemm_ss(acc_dp, tdPrdO, tdPrV, in_buffer(tdPsdO, buf), tdPsV, tiled_mma_sdp, smem_copy_sdp_A,
                smem_copy_sdp_B, thr_smem_copy_sdp_A, thr_smem_copy_sdp_B);
        bwd_dp_to_ds<Traits, kStatic, kMayDropout, kMaySoftcap>(acc_dp, acc_s, params, score_mod, dropout, is_dropout,
                                                                has_softcap, coords_s, coords_s0, coords_s_rc,
                                                                coords_s0_rc, row_dsum, row_lse, row0, col0);
        bwd_store_p_ds<Element>(acc_s, acc_dp, smem_copy_PdS, thr_smem_copy_PdS, tPsP, tdSsdS);

        gemm_ss(acc_dv, tdVrPt, tdVrdO, tdVsPt, in_buffer(tdVsdOt, buf), tiled_mma_dkv, smem_copy_dkv_A,
                smem_copy_dkv_B, thr_smem_copy_dkv_A, thr_smem_copy_dkv_B);
        auto gemm_dk = [&]() {
            gemm_ss(acc_dk, tdKrdSt, tdKrQt, tdKsdSt, in_buffer(tdKsQt, buf), tiled_mma_dkv, smem_copy_dkv_A,
                    smem_copy_dkv_B, thr_smem_copy_dkv_A, thr_smem_copy_dkv_B);
        };
        auto dq_and_atomics = [&]() {
            Tensor acc_dq = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
            clear(acc_dq);
            gemm_ss(acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, tiled_mma_dq, smem_copy_dq_A, smem_copy_dq_B,
                    thr_smem_copy_dq_A, thr_smem_copy_dq_B);
            add_dq_atomic<Traits, kFeat, kStatic>(acc_dq, thr_mma_dq, dq_accum_ptr, mask, deterministic, dq_semaphore,
                                                  m_block, n_block, row0, tidx);
        };
        if constexpr (kDqBeforeDk) {
            dq_and_atomics();
            gemm_dk();
        } else {
            gemm_dk();
            dq_and_atomics();
        }
    }

    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) { acc_dk(i) *= params.scale_softmax; }
    store_dk_dv();
}

// Generic variants (kStatic == 0): grid (key blocks, b, h). Their deterministic mode adds dQ in
// descending key-block order, so the highest key blocks start first: a CTA only ever waits for
// CTAs dispatched before it.
// Fixed-feature-set variants (kStatic != 0) make dQ deterministic with per-CTA dq_accum slices
// instead, as the sm_90a backward does: grid (dq_accum_splits, b, h), CTA s walking the key
// blocks in rounds of gridDim.x, zig-zag (s in even rounds, gridDim.x - 1 - s in odd ones, which
// evens out causal work), adding its dQ into slice s. Each slice element is updated by one thread
// of one CTA, in program order, so the sums (and their order in the conversion) are fixed.
template <typename Traits, bool kFeat, int kStatic = 0, bool kDqBeforeDk = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_bwd_kernel(const __grid_constant__ BwdParams params) {
    if constexpr (kStatic == 0) {
        bwd_block<Traits, kFeat, kStatic, kDqBeforeDk>(params, 0, 0);
    } else {
        const bool sliced = params.deterministic;
        const int64_t dq_slice = sliced ? int64_t(blockIdx.x) * params.dq_accum_split_stride : 0;
        const int n_blocks = ceil_div(params.seqlen_k, Traits::kBlockN);
        const int splits = gridDim.x;
        int n_block = blockIdx.x;
        for (int round = 1;; ++round) {  // one call site: one inlined copy of the block code
            bwd_block<Traits, kFeat, kStatic>(params, n_block, dq_slice);
            if (!sliced) break;
            n_block = round * splits + ((round & 1) ? splits - 1 - int(blockIdx.x) : int(blockIdx.x));
            if (n_block >= n_blocks) break;
            __syncthreads();  // the last block's dK/dV staging has been read
        }
    }
}

}  // namespace flash
