// Hopper (sm_90a) forward: warpgroup MMAs (wgmma) with the score tile of block j+1 computed
// while the softmax of block j runs and P_j V_j accumulates (intra-warpgroup overlap).
//
// One CTA per (128-query block, batch, head): two warpgroups of 64 rows each. K and V tiles are
// double-buffered in shared memory and loaded with cp.async by every thread, one block ahead:
//
//   iteration t:  wait K[t], V[t-1]; barrier
//                 S_t  = Q K[t]^T        (wgmma, async)
//                 O   += P_{t-1} V[t-1]  (wgmma, async, A from registers)
//                 issue cp.async of K[t+1], V[t]
//                 wait S_t -> mask, softmax statistics, exp       (overlaps the P V GEMM)
//                 wait P V -> rescale O, P_t = bf16(S_t)
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/tile_io.h"
#include "common/mask.h"
#include "common/softmax.h"
#include "common/attn_mods.h"
#include "sm90/dropout_sm90.h"
#include "common/utils.h"
#include "sm90/kernel_traits_sm90.h"

namespace flash {

using namespace cute;

// Issues one warpgroup GEMM over the whole K extent. kWait < 0 leaves it in flight.
template <bool kZeroInit, int kWait, typename TiledMma, typename TensorA, typename TensorB, typename TensorC>
__forceinline__ __device__ void wgmma(TiledMma &tiled_mma, TensorA const &tCrA, TensorB const &tCrB, TensorC &tCrC) {
    constexpr bool kRegA = !std::is_same_v<typename TensorA::iterator, GMMA::DescriptorIterator>;
    if constexpr (kRegA) { warpgroup_fence_operand(const_cast<TensorA &>(tCrA)); }
    warpgroup_fence_operand(tCrC);
    warpgroup_arrive();
    if constexpr (kZeroInit) { tiled_mma.accumulate_ = GMMA::ScaleOut::Zero; }
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
        cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    if constexpr (kWait >= 0) { warpgroup_wait<kWait>(); }
    warpgroup_fence_operand(tCrC);
    if constexpr (kRegA) { warpgroup_fence_operand(const_cast<TensorA &>(tCrA)); }
}

// Dropout keep flags of key block n_block into drop_flags, generated while its S GEMM runs (they
// do not depend on the scores). A 64-key tile shares its 128-key Philox groups with its neighbour:
// the first of the pair to be visited (the walk goes down) generates both halves.
template <typename Traits, bool kFeat, typename TensorC>
__device__ void fwd_sm90_generate_dropout(Dropout const &dropout, bool const &is_dropout, TensorC const &coords_s,
                                          int const &row0, int n_block, int const &n_block_max,
                                          uint4 *const &drop_flags, int const &tidx) {
    if constexpr (kFeat) {
        if (is_dropout && (Traits::kBlockN == 128 || n_block % 2 == 1 || n_block == n_block_max - 1)) {
            dropout_fwd_generate<Traits::kNThreads>(dropout, coords_s, row0, n_block * Traits::kBlockN, drop_flags,
                                                    tidx);
        }
    }
}

// Dropped elements leave the P V product (the row sums already hold every element).
template <typename Traits, bool kFeat, typename TensorP>
__device__ void fwd_sm90_apply_dropout(TensorP &rP, bool const &is_dropout, int n_block, uint4 *const &drop_flags,
                                       int const &tidx) {
    if constexpr (kFeat) {
        if (is_dropout) {
            dropout_fwd_apply<Traits::kBlockN, Traits::kNThreads>(rP, drop_flags, n_block * Traits::kBlockN, tidx);
        }
    }
}

// kFeat: the variant with softcap, ALiBi and dropout (each on at run time when its parameter is
// set; S_dmask is left to the SM80-class kernel).
template <typename Traits, bool kFeat = false>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) flash_fwd_kernel_sm90(const __grid_constant__ FwdParams params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;

    extern __shared__ __align__(1024) char smem[];  // 128-byte swizzle atoms want 1 KB alignment
    const int tidx = threadIdx.x;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / params.h_h_k_ratio;

    write_rng_state(params);  // zeros without dropout

    const BlockInfo binfo(params, bidb);
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    if (m_block * kBlockM >= seqlen_q) return;
    const Mask mask{seqlen_k, seqlen_k - seqlen_q, params.window_left, params.window_right};
    const int row0 = m_block * kBlockM;
    const int rows_left = seqlen_q - row0;
    int n_block_min, n_block_max;
    mask.n_block_range(row0, kBlockM, kBlockN, n_block_min, n_block_max);

    typename Traits::TiledMmaQK tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(tidx);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tidx);
    Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    Tensor coords_o = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor coords_o_rc = make_tensor(coords_o.data(), acc_layout_rowcol(coords_o.layout()));
    constexpr int kNRows = decltype(size<0>(coords_o_rc))::value;

    auto write_out = [&](auto const &lse) {
        Element *o_ptr = reinterpret_cast<Element *>(params.o_ptr) +
                         binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) +
                         bidh * params.o_head_stride + row0 * params.o_row_stride;
        float *lse_ptr = params.softmax_lse_ptr +
                         (binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                         bidh * params.lse_head_stride + row0;
        store_tile<Traits, typename Traits::TiledMmaPV>(acc_o, smem, typename Traits::SmemLayoutO{}, o_ptr,
                                                        params.o_row_stride, rows_left, params.d, tidx);
        if (get<1>(coords_o_rc(0, 0)) == 0) {
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                const int row = get<0>(coords_o_rc(mi, 0));
                if (row < rows_left) lse_ptr[row] = lse(mi);
            }
        }
    };

    if (n_block_max <= n_block_min) {  // no visible key: out = 0, lse = +inf (or the sink's logit)
        clear(acc_o);
        Tensor lse = make_tensor<float>(Shape<Int<kNRows>>{});
        fill(lse, empty_row_lse(learnable_sink_of(params, bidh)));
        write_out(lse);
        return;
    }

    Element *smem_q = reinterpret_cast<Element *>(smem);
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem_q + Traits::kSmemQElems), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem_q + Traits::kSmemQElems + Traits::kSmemKVElems),
                            typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});

    // ---- global -> shared (cp.async, predicated on seqlen and head dim) ----
    Tensor gQ = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.q_ptr) +
                                          binfo.q_offset(params.q_batch_stride, params.q_row_stride, bidb) +
                                          bidh * params.q_head_stride + index_t(row0) * params.q_row_stride),
                            Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(params.q_row_stride, _1{}));
    const index_t k_base = binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) + bidh_k * params.k_head_stride;
    const index_t v_base = binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) + bidh_k * params.v_head_stride;

    typename Traits::GmemTiledCopyLoad gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tQsQ = thr_gmem_copy.partition_D(sQ);
    Tensor tKsK = thr_gmem_copy.partition_D(sK);  // (CPY, CPY_N, CPY_K, stage)
    Tensor tVsV = thr_gmem_copy.partition_D(sV);
    Tensor tQcQ = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tQpQ = make_col_predicate(tQcQ, params.d);
    Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);
    auto load_K = [&](int n_block, int stage) {
        Tensor g = block_rows_gmem<kBlockN, kHeadDim>(reinterpret_cast<Element *>(params.k_ptr), k_base, n_block,
                                                      params.k_row_stride);
        Tensor dst = tKsK(_, _, _, stage);
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(g), dst, tKVcKV, tKVpKV, seqlen_k - n_block * kBlockN);
    };
    auto load_V = [&](int n_block, int stage) {
        Tensor g = block_rows_gmem<kBlockN, kHeadDim>(reinterpret_cast<Element *>(params.v_ptr), v_base, n_block,
                                                      params.v_row_stride);
        Tensor dst = tVsV(_, _, _, stage);
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(g), dst, tKVcKV, tKVpKV, seqlen_k - n_block * kBlockN);
    };
    // cp.async writes through the generic proxy; wgmma reads through the async proxy.
    auto wait_loads_and_sync = [&]() {
        cp_async_wait<0>();
        cutlass::arch::fence_view_async_shared();
        __syncthreads();
    };

    // ---- MMA operands ----
    Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);    // smem descriptors
    Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrVt = thr_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor coords_s = thr_mma_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    const ScoreMod score_mod = kFeat ? ScoreMod(params, bidb, bidh, seqlen_k - seqlen_q) : ScoreMod{};
    const bool is_dropout = kFeat && params.p_dropout > 0.f;
    const Dropout dropout = is_dropout ? Dropout(params, bidb, bidh) : Dropout{};
    uint4 *drop_flags = reinterpret_cast<uint4 *>(smem + Traits::kSmemSize);  // kFeat only
    OnlineSoftmax<kNRows> softmax;
    const int n_blocks = n_block_max - n_block_min;
    int n_block = n_block_max - 1;  // block t of the walk is n_block_max - 1 - t

    // Prologue: Q and K[0], then S_0 while K[1] and V[0] load.
    load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gQ), tQsQ, tQcQ, tQpQ, rows_left);
    load_K(n_block, 0);
    cp_async_fence();
    wait_loads_and_sync();
    if (n_blocks > 1) { load_K(n_block - 1, 1); }
    load_V(n_block, 0);
    cp_async_fence();

    Tensor acc_s = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, 0), acc_s);
    fwd_sm90_generate_dropout<Traits, kFeat>(dropout, is_dropout, coords_s, row0, n_block, n_block_max, drop_flags, tidx);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    if constexpr (kFeat) { score_mod.apply(acc_s, coords_s, row0, n_block * kBlockN); }
    if (mask.tile_needs_mask(row0, n_block * kBlockN, kBlockM, kBlockN)) {
        mask.apply(acc_s, coords_s, row0, n_block * kBlockN);
    }
    softmax.template update_scores</*kFirst=*/true>(acc_s, params.scale_softmax_log2);
    Tensor rP = make_tensor<Element>(acc_s.layout());
    convert_into(acc_s, rP);
    fwd_sm90_apply_dropout<Traits, kFeat>(rP, is_dropout, n_block, drop_flags, tidx);
    clear(acc_o);

    for (int t = 1; t < n_blocks; ++t) {
        --n_block;
        const int stage = t & 1;
        wait_loads_and_sync();  // K[t] and V[t-1] landed; all warps are past iteration t-1

        Tensor acc_s_next = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, stage), acc_s_next);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_pv, tOrP, tOrVt(_, _, _, stage ^ 1), acc_o);
        // Next tiles load while the tensor cores run: K[t+1] replaces K[t-1] and V[t] replaces
        // V[t-2], both finished with before the barrier above.
        if (t + 1 < n_blocks) { load_K(n_block - 1, stage ^ 1); }
        load_V(n_block, stage);
        cp_async_fence();
        fwd_sm90_generate_dropout<Traits, kFeat>(dropout, is_dropout, coords_s, row0, n_block, n_block_max, drop_flags,
                                                 tidx);
        warpgroup_wait<1>();  // S_t ready; P_{t-1} V[t-1] may still run
        warpgroup_fence_operand(acc_s_next);
        if constexpr (kFeat) { score_mod.apply(acc_s_next, coords_s, row0, n_block * kBlockN); }
        if (mask.tile_needs_mask(row0, n_block * kBlockN, kBlockM, kBlockN)) {
            mask.apply(acc_s_next, coords_s, row0, n_block * kBlockN);
        }
        auto rescale = softmax.template update_scores</*kFirst=*/false>(acc_s_next, params.scale_softmax_log2);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        softmax.rescale_o(acc_o, rescale);
        convert_into(acc_s_next, rP);
        fwd_sm90_apply_dropout<Traits, kFeat>(rP, is_dropout, n_block, drop_flags, tidx);
    }

    // Last P V.
    wait_loads_and_sync();
    {
        Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
        wgmma</*kZeroInit=*/false, /*kWait=*/0>(tiled_mma_pv, tOrP, tOrVt(_, _, _, (n_blocks - 1) & 1), acc_o);
    }

    Tensor lse = softmax.finalize(acc_o, params.scale_softmax, is_dropout ? params.rp_dropout : 1.f,
                                  learnable_sink_of(params, bidh));
    __syncthreads();  // sQ (reused for O) is no longer read by any wgmma
    write_out(lse);
#endif
}

}  // namespace flash
