// Forward kernel (SM80-class, mma.sync): one CTA per (query block, batch, head).
//   S = Q K^T on tensor cores -> mask -> online softmax in registers -> O += P V,
// K and V tiles streamed through shared memory with cp.async; the next K tile loads while
// softmax and P V run, the V tile while Q K^T runs. O is normalised and written once.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/attn_mods.h"
#include "common/flash.h"
#include "common/kernel_traits.h"
#include "common/mask.h"
#include "common/tile_io.h"
#include "common/softmax.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// The block's O (acc_o) to o_ptr_f() through shared memory (at smem, sQ's place), and the LSE of
// this thread's row mi, lse_of(mi), to lse_ptr_f() from the threads holding column 0 (rows <
// rows_left).
template <typename Traits, typename TiledMma, typename TensorAcc, typename TensorCoordsRC, typename OPtrF,
          typename LsePtrF, typename LseOf>
__forceinline__ __device__ void fwd_store_o_lse(const FwdParams &params, TensorAcc const &acc_o, char *smem,
                                                TensorCoordsRC const &coords_o_rc, OPtrF const &o_ptr_f,
                                                LsePtrF const &lse_ptr_f, LseOf const &lse_of, const int rows_left,
                                                const int tidx) {
    constexpr int kNRows = decltype(size<0>(coords_o_rc))::value;
    store_tile<Traits, TiledMma>(acc_o, smem, typename Traits::SmemLayoutO{}, o_ptr_f(), params.o_row_stride, rows_left,
                                 params.d, tidx);
    if (get<1>(coords_o_rc(0, 0)) == 0) {
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            const int row = get<0>(coords_o_rc(mi, 0));
            if (row < rows_left) lse_ptr_f()[row] = lse_of(mi);
        }
    }
}

// kFeat: the variant with softcap, ALiBi and dropout (each on at run time when its parameter is
// set); the plain variant compiles none of it. kStatic (kFeat only; attn_mods.h): 0 for that
// run-time form, else kModStatic | the features compiled in and always on (no S_dmask).
template <typename Traits, bool kFeat, int kStatic = 0>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_fwd_kernel(const __grid_constant__ FwdParams params) {
    static_assert(kFeat || kStatic == 0);
    constexpr bool kMayDropout = kFeat && (kStatic == 0 || (kStatic & kModDropout) != 0);
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    using TiledMma = typename Traits::TiledMma;

    extern __shared__ __align__(1024) char smem[];
    const int tidx = threadIdx.x;
    // Longest (causal) query blocks first, so the tail of the grid is short work.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / params.h_h_k_ratio;

    write_rng_state(params);  // zeros without dropout

    const BlockInfo binfo(params, bidb);
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    if (m_block * kBlockM >= seqlen_q) return;

    const Mask mask{seqlen_k, seqlen_k - seqlen_q, params.window_left, params.window_right};
    const int row0 = m_block * kBlockM;
    int n_block_min, n_block_max;
    mask.n_block_range(row0, kBlockM, kBlockN, n_block_min, n_block_max);

    Element *q_ptr = reinterpret_cast<Element *>(params.q_ptr) +
                     binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb) + bidh * params.q_head_stride +
                     row0 * params.q_row_stride;
    auto o_ptr_f = [&]() { return reinterpret_cast<Element *>(params.o_ptr) +
                     binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) + bidh * params.o_head_stride +
                     row0 * params.o_row_stride; };
    auto lse_ptr_f = [&]() { return params.softmax_lse_ptr + (binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                     bidh * params.lse_head_stride + row0; };
    const int rows_left = seqlen_q - row0;

    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(tidx);
    Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    Tensor coords_o = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor coords_o_rc = make_tensor(coords_o.data(), acc_layout_rowcol(coords_o.layout()));
    constexpr int kNRows = decltype(size<0>(coords_o_rc))::value;

    // No key visible to any row of this block (causal with seqlen_q > seqlen_k, or a window):
    // out = 0, lse = +inf (the sink's logit with a learnable sink).
    if (n_block_max <= n_block_min) {
        clear(acc_o);
        fwd_store_o_lse<Traits, TiledMma>(params, acc_o, smem, coords_o_rc, o_ptr_f, lse_ptr_f,
                                          [&](int) { return empty_row_lse(learnable_sink_of(params, bidh)); },
                                          rows_left, tidx);
        return;
    }

    // Global tiles. K/V are indexed by n_block through a runtime offset.
    Tensor gQ = make_tensor(make_gmem_ptr(q_ptr), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                            make_stride(params.q_row_stride, _1{}));
    const index_t k_base = binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) + bidh_k * params.k_head_stride;
    const index_t v_base = binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) + bidh_k * params.v_head_stride;
    auto gK_at = [&](int n_block) {
        return block_rows_gmem<kBlockN, kHeadDim>(reinterpret_cast<Element *>(params.k_ptr), k_base, n_block,
                                                  params.k_row_stride);
    };
    auto gV_at = [&](int n_block) {
        return block_rows_gmem<kBlockN, kHeadDim>(reinterpret_cast<Element *>(params.v_ptr), v_base, n_block,
                                                  params.v_row_stride);
    };

    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element *>(smem)), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
    Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});

    typename Traits::GmemTiledCopyLoad gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tQsQ = thr_gmem_copy.partition_D(sQ);
    Tensor tKsK = thr_gmem_copy.partition_D(sK);
    Tensor tVsV = thr_gmem_copy.partition_D(sV);
    Tensor tQcQ = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tQpQ = make_col_predicate(tQcQ, params.d);
    Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);
    auto load_K = [&](int n_block) {
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gK_at(n_block)), tKsK, tKVcKV, tKVpKV,
                  seqlen_k - n_block * kBlockN);
    };
    auto load_V = [&](int n_block) {
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gV_at(n_block)), tVsV, tKVcKV, tKVpKV,
                  seqlen_k - n_block * kBlockN);
    };

    // Register fragments and smem->register copies (ldmatrix).
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK);
    Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);
    auto smem_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_Q = smem_copy_Q.get_thread_slice(tidx);
    Tensor tSsQ = thr_smem_copy_Q.partition_S(sQ);
    auto smem_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto thr_smem_copy_K = smem_copy_K.get_thread_slice(tidx);
    Tensor tSsK = thr_smem_copy_K.partition_S(sK);
    auto smem_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
    auto thr_smem_copy_V = smem_copy_V.get_thread_slice(tidx);
    Tensor tOsVt = thr_smem_copy_V.partition_S(sVt);

    Tensor coords_s = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    // Thread 0's (constant) coordinates: per-element offsets for the fixed-set ALiBi.
    Tensor coords_s0 = tiled_mma.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    // Prologue: Q and the last K tile (the only one that can be partial) in flight.
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gQ), tQsQ, tQcQ, tQpQ, rows_left);
    int n_block = n_block_max - 1;
    load_K(n_block);
    cp_async_fence();

    clear(acc_o);
    OnlineSoftmax<kNRows> softmax;

    // Feature state; the plain variant never touches it.
    const ScoreMod score_mod = kFeat ? ScoreMod(params, bidb, bidh, seqlen_k - seqlen_q) : ScoreMod{};
    const bool is_dropout = kStatic != 0 ? kMayDropout : kFeat && params.p_dropout > 0.f;
    const Dropout dropout = is_dropout ? Dropout(params, bidb, bidh) : Dropout{};

    auto step = [&](auto is_first) {
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        cp_async_wait<0>();
        __syncthreads();  // K(n_block) landed; every warp is done reading V(n_block + 1)
        load_V(n_block);
        cp_async_fence();

        gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_Q, smem_copy_K, thr_smem_copy_Q,
                thr_smem_copy_K);
        if constexpr (kFeat) { score_mod.template apply_set<kStatic>(acc_s, coords_s, coords_s0, row0, n_block * kBlockN); }
        if (mask.tile_needs_mask(row0, n_block * kBlockN, kBlockM, kBlockN)) {
            mask.apply(acc_s, coords_s, row0, n_block * kBlockN);
        }

        cp_async_wait<0>();
        __syncthreads();  // V(n_block) landed; every warp is done reading K(n_block)
        if (n_block > n_block_min) {
            load_K(n_block - 1);
            cp_async_fence();
        }

        softmax.template update<decltype(is_first)::value>(acc_s, acc_o, params.scale_softmax_log2);
        if constexpr (kMayDropout) {
            if (is_dropout) {
                // P is exp(score - running max) here; dropped elements leave the P V product (the
                // row sums above already hold every element). S_dmask (testing) gets -P for them.
                Element *s_dmask = kStatic != 0 || params.s_dmask_ptr == nullptr ? nullptr :
                    reinterpret_cast<Element *>(params.s_dmask_ptr) + bidb * params.s_dmask_batch_stride +
                    bidh * params.s_dmask_head_stride;
                const int col0 = n_block * kBlockN;
                dropout.template for_each<1>(acc_s, coords_s, row0, col0, [&](int e, int m, int n, bool keep) {
                    const float p = acc_s(e, m, n);
                    if (s_dmask != nullptr) {
                        const int row = row0 + get<0>(coords_s(e, m, n)), col = col0 + get<1>(coords_s(e, m, n));
                        s_dmask[index_t(row) * params.s_dmask_row_stride + col] = Element(keep ? p : -p);
                    }
                    acc_s(e, m, n) = keep ? p : 0.f;
                });
            }
        }

        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_V, thr_smem_copy_V);
    };

    step(cute::true_type{});
    for (--n_block; n_block >= n_block_min; --n_block) { step(cute::false_type{}); }

    // Epilogue: normalise, write O (through smem, reusing sQ) and the LSE.
    Tensor lse = softmax.finalize(acc_o, params.scale_softmax, is_dropout ? params.rp_dropout : 1.f,
                                  learnable_sink_of(params, bidh));
    __syncthreads();  // sQ is about to be overwritten by O
    fwd_store_o_lse<Traits, TiledMma>(params, acc_o, smem, coords_o_rc, o_ptr_f, lse_ptr_f,
                                      [&](int mi) { return lse(mi); }, rows_left, tidx);
}

}  // namespace flash
