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

#include "common/block_info.h"
#include "common/flash.h"
#include "common/mask.h"
#include "common/softmax.h"
#include "sm90/flash_fwd_ws_epilogue_sm90.h"
#include "sm90/flash_fwd_ws_mainloop_sm90.h"
#include "sm90/kernel_traits_fwd_ws_sm90.h"

namespace flash {

using namespace cute;

// A tile's coordinates and key-block range; `valid` false past a varlen sequence's rows.
struct FwdWsTile {
    int m_block, bidb, bidh, n_block_min, n_block_max;
    bool valid, has_work;
};

// The tiles (m block, batch, head), linearised with m fastest (the 3-D grid's order), and the
// walk over them. kPersistent: a 1-D grid of at most one CTA per SM, each walking the tiles
// blockIdx.x, + gridDim.x, ... (or drawing them, see fwd_ws_producer). Otherwise the 3-D grid
// (m blocks, b, h), one tile per CTA (t unused): the tile loops run once and compile to
// straight-line code.
template <int kBlockM, int kBlockN, bool kPersistent>
struct FwdWsTileSchedule {
    FwdParams const &params;
    int num_m_blocks, num_tiles, tile_first, tile_stride;

    __forceinline__ __device__ explicit FwdWsTileSchedule(FwdParams const &params_)
        : params(params_),
          num_m_blocks(ceil_div(params_.seqlen_q, kBlockM)),
          num_tiles(kPersistent ? num_m_blocks * params_.b * params_.h : 1),
          tile_first(kPersistent ? int(blockIdx.x) : 0),
          tile_stride(kPersistent ? int(gridDim.x) : 1) {}

    __forceinline__ __device__ int batch_of(int t) const {
        return kPersistent ? (t / num_m_blocks) % params.b : int(blockIdx.y);
    }
    __forceinline__ __device__ int head_of(int t) const {
        return kPersistent ? t / (num_m_blocks * params.b) : int(blockIdx.z);
    }
    __forceinline__ __device__ FwdWsTile tile(int t, BlockInfo const &binfo) const {
        FwdWsTile tile;
        // Longest (causal) blocks first.
        tile.m_block = kPersistent ? num_m_blocks - 1 - t % num_m_blocks : int(gridDim.x - 1 - blockIdx.x);
        tile.bidb = batch_of(t);
        tile.bidh = head_of(t);
        tile.valid = tile.m_block * kBlockM < binfo.seqlen_q;
        const Mask mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
        mask.n_block_range(tile.m_block * kBlockM, kBlockM, kBlockN, tile.n_block_min, tile.n_block_max);
        tile.has_work = tile.valid && tile.n_block_max > tile.n_block_min;
        return tile;
    }
};

// ---- producer: the one thread that issues every TMA load ---------------------------------------
// Walks the schedule's tiles and issues each one's Q, K and V loads (fwd_ws_load); tiles past a
// varlen sequence's rows are skipped. Persistent kernel: also hands each tile to the consumers and
// ends their loop (the kernel's Q / O protocol).
template <typename Traits, bool kPersistent, typename Schedule>
__forceinline__ __device__ void fwd_ws_producer(FwdWsKernelParams<Traits> const &kp, typename Traits::SharedStorage &ss,
                                                typename Traits::Pipeline &pipeline_k,
                                                typename Traits::Pipeline &pipeline_v, Schedule const &sched) {
    using Pipeline = typename Traits::Pipeline;
    FwdParams const &params = kp.p;
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    auto state_k = cutlass::make_producer_start_state<Pipeline>();
    auto state_v = cutlass::make_producer_start_state<Pipeline>();
    // (params.tile_count_ptr read where used, from parameter space: no register held.)
    auto draw_tile = [&](int t) {
        if constexpr (kPersistent) {
            if (params.tile_count_ptr != nullptr) {
                return int(gridDim.x) + atomicAdd(params.tile_count_ptr, 1);
            }
        }
        return t + sched.tile_stride;
    };
    int valid_tiles = 0;
    auto wait_q_free = [&]() {
        if (kPersistent && valid_tiles > 0) {
            cutlass::arch::ClusterBarrier::wait(&ss.barrier_q_empty, (valid_tiles - 1) & 1);
        }
    };
    for (int t = sched.tile_first; t < sched.num_tiles;) {
        const BlockInfo binfo(params, sched.batch_of(t));
        const FwdWsTile tile = sched.tile(t, binfo);
        if (!tile.valid) {
            t = draw_tile(t);
            continue;
        }
        // Before the Q load (or the arrival for a tile without work): the previous tile's
        // consumers are done with the Q tiles, and ss.tile_next with it.
        auto before_q = [&]() {
            wait_q_free();
            if constexpr (kPersistent) { ss.tile_next = t; }
        };
        if (!tile.has_work) {
            // No loads, but barrier_q still completes a phase (the kernel's Q / O protocol).
            if constexpr (kPersistent) {
                before_q();
                cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q);
            }
        } else {
            fwd_ws_load<Traits, kPersistent>(kp, ss, pipeline_k, pipeline_v, binfo, tile.m_block, tile.bidb,
                                             tile.bidh, tile.bidh / params.h_h_k_ratio, tile.n_block_min,
                                             tile.n_block_max, state_k, state_v, before_q);
        }
        ++valid_tiles;
        // Drawn after this tile's loads are issued (the producer runs kStages tiles ahead of
        // the consumers, which hides the atomic's latency): a value held across the loads
        // spilled at the producer's 24 registers.
        t = draw_tile(t);
    }
    if constexpr (kPersistent) {  // the end: one more phase of barrier_q, tile -1
        wait_q_free();
        ss.tile_next = -1;
        cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q);
        if (params.tile_count_ptr != nullptr) {
            // The last CTA out zeroes the counter and the exit count for the next call
            // (the binding keeps one counter per stream, zeroed once): every CTA's last
            // draw is ordered before its exit count by the fence, so none draws after.
            __threadfence();
            if (atomicAdd(params.tile_count_ptr + 1, 1) == int(gridDim.x) - 1) {
                atomicExch(params.tile_count_ptr, 0);
                atomicExch(params.tile_count_ptr + 1, 0);
            }
        }
    }
}

// ---- consumers: one warpgroup ------------------------------------------------------------------
// A tile without a visible key: out = 0, lse = +inf (or the learnable sink's LSE).
// release_q(): this warpgroup's arrival on barrier_q_empty (the kernel's Q / O protocol).
template <typename Traits, bool kPersistent, bool kOwnO, bool kMayTmaO, typename TensorO, typename ReleaseQ>
__forceinline__ __device__ void fwd_ws_store_empty_tile(FwdWsKernelParams<Traits> const &kp, BlockInfo const &binfo,
                                                        FwdWsTile const &tile, TensorO &acc_o,
                                                        typename Traits::Element *smem_o, int wg, int wg_tidx,
                                                        int row0, ReleaseQ &&release_q) {
    constexpr int kNRows = decltype(size<0>(acc_layout_rowcol(acc_o.layout())))::value;
    if constexpr (kOwnO) { release_q(); }
    clear(acc_o);
    Tensor lse = make_tensor<float>(Shape<Int<kNRows>>{});
    fill(lse, empty_row_lse(learnable_sink_of(kp.p, tile.bidh)));
    fwd_ws_store<Traits, kMayTmaO>(kp, binfo, acc_o, lse, smem_o, wg, wg_tidx, tile.bidb, tile.bidh, row0);
    if constexpr (kPersistent && !kOwnO) { release_q(); }
}

// The feature variant's per-(batch, head) scalars for warpgroup wg (FwdWsFeatures): in feat_regs,
// or, with Traits::kFeatScalarsInSmem, computed by the warpgroup's first thread into its copy in
// shared memory behind SharedStorage and the dropout flags (kDropoutTiles only; 8 KB per consumer
// WG), which the returned reference then names.
template <typename Traits, bool kFeat>
__forceinline__ __device__ FwdWsFeatures const &fwd_ws_features(FwdParams const &params, char *smem,
                                                                BlockInfo const &binfo, FwdWsTile const &tile,
                                                                int wg, int wg_tidx, bool is_dropout,
                                                                FwdWsFeatures &feat_regs) {
    FwdWsFeatures *feat_smem = reinterpret_cast<FwdWsFeatures *>(
                                   smem + Traits::kSmemSize + (Traits::kDropoutTiles ? Traits::kSmemDropoutFlags : 0)) +
                               wg;
    if constexpr (kFeat) {
        static_assert(sizeof(FwdWsFeatures) <= Traits::kFeatScalarBytes);
        if (!Traits::kFeatScalarsInSmem || wg_tidx == 0) {
            feat_regs.score_mod = ScoreMod(params, tile.bidb, tile.bidh, binfo.seqlen_k - binfo.seqlen_q);
            if (is_dropout) { feat_regs.dropout = Dropout(params, tile.bidb, tile.bidh); }
        }
        if constexpr (Traits::kFeatScalarsInSmem) {
            if (wg_tidx == 0) { *feat_smem = feat_regs; }
            cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(FwdWsBarrier::kEpiWG0) + wg);
        }
    }
    return Traits::kFeatScalarsInSmem ? *feat_smem : feat_regs;
}

// Normalises O, then stores it and the LSE. t: the tile's index in the schedule; release_q() as
// for fwd_ws_store_empty_tile.
template <typename Traits, bool kPersistent, bool kOwnO, bool kMayTmaO, typename Schedule, typename TensorO,
          typename Softmax, typename ReleaseQ>
__forceinline__ __device__ void fwd_ws_finalize_and_store(FwdWsKernelParams<Traits> const &kp, Schedule const &sched,
                                                          int t, BlockInfo const &binfo, FwdWsTile const &tile,
                                                          TensorO &acc_o, Softmax &softmax,
                                                          typename Traits::Element *smem_o, int wg, int wg_tidx,
                                                          int row0, bool is_dropout, float sink, ReleaseQ &&release_q) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kRowsPerWG = Traits::kRowsPerWG;
    FwdParams const &params = kp.p;
    // Dropout: out (and not the LSE) is scaled by 1 / (1 - p), as in the other kernels.
    Tensor lse = softmax.finalize(acc_o, params.scale_softmax, is_dropout ? params.rp_dropout : 1.f, sink);
    if constexpr (kPersistent) {
        // The tile's coordinates again from t: fewer registers held across the main loop.
        const BlockInfo binfo_epi(params, sched.batch_of(t));
        const FwdWsTile tile_epi = sched.tile(t, binfo_epi);
        fwd_ws_store<Traits, kMayTmaO>(kp, binfo_epi, acc_o, lse, smem_o, wg, wg_tidx, tile_epi.bidb, tile_epi.bidh,
                                       tile_epi.m_block * kBlockM + wg * kRowsPerWG);
        if constexpr (!kOwnO) { release_q(); }
    } else {
        fwd_ws_store<Traits, kMayTmaO>(kp, binfo, acc_o, lse, smem_o, wg, wg_tidx, tile.bidb, tile.bidh, row0);
    }
}

// kFeat: see the top of the file; kPersistent: see FwdWsTileSchedule.
template <typename Traits, bool kFeat = false, bool kPersistent = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_ws_kernel_sm90(const __grid_constant__ FwdWsKernelParams<Traits> kp) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
    using Element = typename Traits::Element;
    using Pipeline = typename Traits::Pipeline;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kRowsPerWG = Traits::kRowsPerWG;
    constexpr int kHeadDimV = Traits::kHeadDimV;
    constexpr bool kMayTmaO = Traits::template kTmaStoreOFor<kFeat>;  // the O tile's TMA store compiled in
    FwdParams const &params = kp.p;

    extern __shared__ __align__(1024) char smem[];
    auto &ss = *reinterpret_cast<typename Traits::SharedStorage *>(smem);

    const FwdWsTileSchedule<kBlockM, kBlockN, kPersistent> sched(params);
    write_rng_state(params);  // thread 0 of CTA (0, 0, 0), before any exit; zeros without dropout

    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_group_idx = cutlass::canonical_warp_group_idx();
    if (warp_idx == 0 && cute::elect_one_sync()) {
        cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
        cutlass::arch::ClusterBarrier::init(&ss.barrier_q_empty, Traits::kNConsumerThreads);
    }
    typename Pipeline::Params pipe_params;
    pipe_params.transaction_bytes = Traits::kKTileBytes;
    pipe_params.role = warp_group_idx == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = threadIdx.x == 0;  // the producer thread
    pipe_params.num_consumers = Traits::kNConsumerThreads;
    // Both constructors initialise their barriers from warp 0 and fence the initialisation.
    Pipeline pipeline_k(ss.pipeline_k, pipe_params, Shape<_1, _1, _1>{});
    pipe_params.transaction_bytes = Traits::kVTileBytes;
    Pipeline pipeline_v(ss.pipeline_v, pipe_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before anyone waits on or arrives at them

    // Tile hand-out (persistent kernel): the producer thread picks the tiles, static (blockIdx.x,
    // + gridDim.x, ...) or dynamic (params.tile_count_ptr: gridDim.x + atomicAdd, so that a CTA
    // that got short causal tiles takes more; the static order gave causal CTAs up to 3x each
    // other's work, see docs/perf-notes.md),
    // and passes each to the consumers in ss.tile_next, written before its arrival on barrier_q;
    // -1 (after the last tile) ends the consumers' loop. Tiles past a varlen sequence's rows are
    // skipped by the producer alone.
    // Q / O protocol across tiles: the producer loads a tile's Q only after every consumer thread
    // has arrived on barrier_q_empty for the previous tile: right after its last S GEMM where O
    // has its own buffer (Traits::kPersistentOwnO), after its epilogue otherwise (O staged in the
    // Q tiles). barrier_q completes one phase per tile handed out, and one for the end (a plain
    // producer arrival for tiles without work and for the end), so that neither side gets two
    // phases ahead and the parity waits stay unambiguous.
    constexpr bool kOwnO = kPersistent && Traits::kPersistentOwnO;
    if (warp_group_idx == 0) {
        // ---- producer warpgroup: one thread issues every TMA load; the other warps retire ----
        // The persistent tile loop spilled 248 B at the producer's 24 registers (d128): 40 / 232
        // there (0 spills; the 2-WG pool is 64512 = 128 x 40 + 256 x 232). The 3-WG split (d64)
        // has no room to move: 40 B of producer spills, measured harmless.
        cutlass::arch::warpgroup_reg_dealloc<kPersistent && Traits::kNConsumerWG == 2 ? 40 : Traits::kProducerRegs>();
        if (threadIdx.x == 0) { fwd_ws_producer<Traits, kPersistent>(kp, ss, pipeline_k, pipeline_v, sched); }
    } else {
        // ---- consumer warpgroups ----
        cutlass::arch::warpgroup_reg_alloc<kPersistent && Traits::kNConsumerWG == 2 ? 232 : Traits::kConsumerRegs>();
        const int wg = warp_group_idx - 1;
        const int wg_tidx = threadIdx.x % 128;
        Element *smem_o = kOwnO ? reinterpret_cast<Element *>(smem + Traits::kSmemOOffset) +
                                      wg * cosize(typename Traits::SmemLayoutQTile{})
                                : ss.smem_q.data() + wg * cosize(typename Traits::SmemLayoutQTile{});
        typename Traits::PipelineState state_k, state_v;  // consumer start: stage 0, phase 0
        // Persistent kernel: every consumer thread arrives once per tile (see above). Where O was
        // staged in Q, our generic-proxy smem accesses must be ordered before the next Q's TMA
        // writes; the early release follows reads by wgmma (async proxy) only.
        // Without kOwnO the Q tile is O's staging tile: a TMA store of O must have read it before
        // the producer's next Q load writes it.
        auto release_q = [&]() {
            if constexpr (!kOwnO) {
                cutlass::arch::fence_view_async_shared();
                fwd_ws_store_drain<kMayTmaO>(kp, wg_tidx);
            }
            cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q_empty);
        };
        int valid_tiles = 0;  // barrier_q completes one phase per tile (persistent kernel)
        for (int t = sched.tile_first;;) {
            const int q_phase = kPersistent ? valid_tiles & 1 : 0;
            if constexpr (kPersistent) {
                cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, q_phase);
                t = ss.tile_next;
                if (t < 0) break;
            }
            const BlockInfo binfo(params, sched.batch_of(t));
            const FwdWsTile tile = sched.tile(t, binfo);
            if (!kPersistent && !tile.valid) break;
            const int row0 = tile.m_block * kBlockM + wg * kRowsPerWG;

            typename Traits::TiledMmaPV tiled_mma_pv;
            Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kRowsPerWG>, Int<kHeadDimV>>{});
            constexpr int kNRows = decltype(size<0>(acc_layout_rowcol(acc_o.layout())))::value;
            OnlineSoftmax<kNRows> softmax;

            ++valid_tiles;
            if (!tile.has_work) {
                fwd_ws_store_empty_tile<Traits, kPersistent, kOwnO, kMayTmaO>(kp, binfo, tile, acc_o, smem_o, wg, wg_tidx,
                                                                              row0, release_q);
                if constexpr (!kPersistent) { break; }
                continue;
            }
            if (wg == 0) {  // WG0 takes the first turn on the tensor cores
                cutlass::arch::NamedBarrier::arrive(256, static_cast<uint32_t>(FwdWsBarrier::kSchedWG0));
            }
            const Mask mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
            // Varlen K/V: rows past the sequence in its last tile are the next sequence's (see fwd_ws_mma).
            const int v_rows_valid =
                binfo.sum_s_k == -1 ? kBlockN : binfo.seqlen_k - (tile.n_block_max - 1) * kBlockN;
            const bool is_dropout = kFeat && Traits::kDropoutTiles && params.p_dropout > 0.f;
            // This warpgroup's dropout keep flags, behind SharedStorage (kDropoutTiles only).
            uint4 *drop_flags = reinterpret_cast<uint4 *>(smem + Traits::kSmemSize) + wg * 4 * 128;
            // The sink's logit, loaded before the main loop: loaded at the epilogue, its latency
            // showed in short (windowed) tiles.
            const float sink = learnable_sink_of(params, tile.bidh);
            FwdWsFeatures feat_regs{};
            FwdWsFeatures const &feat =
                fwd_ws_features<Traits, kFeat>(params, smem, binfo, tile, wg, wg_tidx, is_dropout, feat_regs);
            fwd_ws_mma<Traits, kFeat, kPersistent>(params, ss, pipeline_k, pipeline_v, mask, wg, wg_tidx, row0, tile.n_block_min,
                                                   tile.n_block_max, v_rows_valid, acc_o, softmax, feat, drop_flags, state_k,
                                                   state_v, q_phase, [&]() {
                                                       if constexpr (kOwnO) { release_q(); }
                                                   });
            if (wg == 0) {  // consume the last WG's last turn hand-over
                cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(FwdWsBarrier::kSchedWG0));
            }
            fwd_ws_finalize_and_store<Traits, kPersistent, kOwnO, kMayTmaO>(kp, sched, t, binfo, tile, acc_o, softmax,
                                                                            smem_o, wg, wg_tidx, row0, is_dropout, sink,
                                                                            release_q);
            if constexpr (!kPersistent) { break; }
        }
        fwd_ws_store_drain<kMayTmaO>(kp, wg_tidx);  // the last TMA store has read its tile before the CTA exits
    }
#endif
}

}  // namespace flash
