// Warp-specialised sm_90a forward (FA3-style): a producer warp loads Q once and K / V tiles with
// TMA into mbarrier pipelines; 2 or 3 consumer warpgroups (64 query rows each) take turns on the
// tensor cores (pingpong) and overlap each tile's softmax with their own P V GEMM (intra-warpgroup
// overlap). See kernel_traits_fwd_ws_sm90.h (roles, tiles) and flash_fwd_ws_mainloop_sm90.h (the
// barrier protocol). kFeat: the softcap / ALiBi / dropout variant (no S_dmask: those calls stay on
// the SM80-class kernel); dropout only with 64- or 128-key tiles (Traits::kDropoutTiles).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "../block_info.h"
#include "../flash.h"
#include "../mask.h"
#include "../softmax.h"
#include "flash_fwd_ws_epilogue_sm90.h"
#include "flash_fwd_ws_mainloop_sm90.h"
#include "kernel_traits_fwd_ws_sm90.h"

namespace flash {

using namespace cute;

template <typename Traits, bool kFeat = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_ws_kernel_sm90(const __grid_constant__ FwdWsKernelParams<Traits> kp) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    using Element = typename Traits::Element;
    using Pipeline = typename Traits::Pipeline;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kRowsPerWG = Traits::kRowsPerWG;
    FwdParams const &params = kp.p;

    extern __shared__ __align__(1024) char smem[];
    auto &ss = *reinterpret_cast<typename Traits::SharedStorage *>(smem);

    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / params.h_h_k_ratio;
    if constexpr (kFeat) { write_rng_state(params); }  // thread 0 of CTA (0, 0, 0), before any exit
    const BlockInfo binfo(params, bidb);
    if (m_block * kBlockM >= binfo.seqlen_q) return;  // whole CTA, before any barrier
    const Mask mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
    int n_block_min, n_block_max;
    mask.n_block_range(m_block * kBlockM, kBlockM, kBlockN, n_block_min, n_block_max);
    const bool has_work = n_block_max > n_block_min;

    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_group_idx = cutlass::canonical_warp_group_idx();
    if (warp_idx == 0 && cute::elect_one_sync()) {
        cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
    }
    typename Pipeline::Params pipe_params;
    pipe_params.transaction_bytes = Traits::kKVTileBytes;
    pipe_params.role = warp_group_idx == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = threadIdx.x == 0;  // the producer thread
    pipe_params.num_consumers = Traits::kNConsumerThreads;
    // Both constructors initialise their barriers from warp 0 and fence the initialisation.
    Pipeline pipeline_k(ss.pipeline_k, pipe_params, Shape<_1, _1, _1>{});
    Pipeline pipeline_v(ss.pipeline_v, pipe_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before anyone waits on or arrives at them

    if (warp_group_idx == 0) {
        // ---- producer warpgroup: one thread issues every TMA load; the other warps retire ----
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0 && has_work) {
            cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
            cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
            cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
            fwd_ws_load<Traits>(kp, ss, pipeline_k, pipeline_v, binfo, m_block, bidb, bidh, bidh_k, n_block_min,
                                n_block_max);
        }
    } else {
        // ---- consumer warpgroups ----
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        const int wg = warp_group_idx - 1;
        const int wg_tidx = threadIdx.x % 128;
        const int row0 = m_block * kBlockM + wg * kRowsPerWG;

        typename Traits::TiledMmaPV tiled_mma_pv;
        Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kRowsPerWG>, Int<kHeadDim>>{});
        constexpr int kNRows = decltype(size<0>(acc_layout_rowcol(acc_o.layout())))::value;
        OnlineSoftmax<kNRows> softmax;
        Element *smem_o = ss.smem_q.data() + wg * cosize(typename Traits::SmemLayoutQTile{});

        if (!has_work) {  // no visible key for the whole CTA: out = 0, lse = +inf
            clear(acc_o);
            Tensor lse = make_tensor<float>(Shape<Int<kNRows>>{});
            fill(lse, INFINITY);
            fwd_ws_store<Traits>(params, binfo, acc_o, lse, smem_o, wg, wg_tidx, bidb, bidh, row0);
            return;
        }
        if (wg == 0) {  // WG0 takes the first turn on the tensor cores
            cutlass::arch::NamedBarrier::arrive(256, static_cast<uint32_t>(FwdWsBarrier::kSchedWG0));
        }
        // Varlen K/V: rows past the sequence in its last tile are the next sequence's (see fwd_ws_mma).
        const int v_rows_valid = binfo.sum_s_k == -1 ? kBlockN : binfo.seqlen_k - (n_block_max - 1) * kBlockN;
        // Feature variant: shared memory behind SharedStorage holds the dropout flags (kDropoutTiles
        // only; 8 KB per consumer WG) and then, with kFeatScalarsInSmem, one FwdWsFeatures per
        // consumer WG.
        const bool is_dropout = kFeat && Traits::kDropoutTiles && params.p_dropout > 0.f;
        uint4 *drop_flags = reinterpret_cast<uint4 *>(smem + Traits::kSmemSize) + wg * 4 * 128;
        FwdWsFeatures feat_regs{};
        FwdWsFeatures *feat_smem = reinterpret_cast<FwdWsFeatures *>(
                                       smem + Traits::kSmemSize + (Traits::kDropoutTiles ? Traits::kSmemDropoutFlags : 0)) +
                                   wg;
        if constexpr (kFeat) {
            static_assert(sizeof(FwdWsFeatures) <= Traits::kFeatScalarBytes);
            if (!Traits::kFeatScalarsInSmem || wg_tidx == 0) {
                feat_regs.score_mod = ScoreMod(params, bidb, bidh, binfo.seqlen_k - binfo.seqlen_q);
                if (is_dropout) { feat_regs.dropout = Dropout(params, bidb, bidh); }
            }
            if constexpr (Traits::kFeatScalarsInSmem) {
                if (wg_tidx == 0) { *feat_smem = feat_regs; }
                cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(FwdWsBarrier::kEpiWG0) + wg);
            }
        }
        FwdWsFeatures const &feat = Traits::kFeatScalarsInSmem ? *feat_smem : feat_regs;
        fwd_ws_mma<Traits, kFeat>(params, ss, pipeline_k, pipeline_v, mask, wg, wg_tidx, row0, n_block_min,
                                  n_block_max, v_rows_valid, acc_o, softmax, feat, drop_flags);
        if (wg == 0) {  // consume the last WG's last turn hand-over
            cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(FwdWsBarrier::kSchedWG0));
        }
        // Dropout: out (and not the LSE) is scaled by 1 / (1 - p), as in the other kernels.
        Tensor lse = softmax.finalize(acc_o, params.scale_softmax, is_dropout ? params.rp_dropout : 1.f);
        fwd_ws_store<Traits>(params, binfo, acc_o, lse, smem_o, wg, wg_tidx, bidb, bidh, row0);
    }
#endif
}

}  // namespace flash
