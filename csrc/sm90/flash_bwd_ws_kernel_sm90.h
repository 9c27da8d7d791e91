// Warp-specialised sm_90a backward (FA3-style): the plain calls, (Traits::kMod) those with softcap
// and / or ALiBi and the deterministic dQ, and (Traits::kDropout) dropout, with ALiBi or not. The
// default for the calls it serves; the lock-step kernel takes the others.
//
// One CTA per (128-key block, batch, query head), walking the 64-row query blocks that can see its
// keys, as the lock-step kernel; what changes is who loads what and how the warps wait:
//
//   producer warpgroup (one thread): per query block, TMA loads of Q, dO (64 x d tiles) and of the
//       LSE and softmax_d rows (64 floats each, 1-D boxes) into stage s of a kStages-deep ring,
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

#include <cute/arch/copy_sm80.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
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

// Element-wise fp32 add of a contiguous shared-memory block into global memory by the TMA unit
// (one thread issues it; completion through the bulk async-group: tma_store_arrive /
// tma_store_wait). CuTe 4.2 has the tensor (descriptor) form, SM90_TMA_REDUCE_ADD_*, but not this
// plain 1-D form, which needs no descriptor and so serves dense and varlen dq_accum alike.
// Addresses 16-byte aligned, bytes a multiple of 16; each element's add is atomic.
struct Sm90BulkReduceAddF32 {
    __forceinline__ __device__ static void copy(float const *smem_ptr, float *gmem_ptr, uint32_t bytes) {
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                     :
                     : "l"(gmem_ptr), "r"(cute::cast_smem_ptr_to_uint(smem_ptr)), "r"(bytes)
                     : "memory");
    }
};

// store_tile's barrier for the consumer warpgroups (the producer warps never reach it).
struct BwdWsConsumerSync {
    __forceinline__ __device__ void operator()() const { bwd_ws_consumer_sync(BwdWsBarrier::kConsumers); }
};

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
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutQdO{});
    Tensor sLSE = make_tensor(make_smem_ptr(ss.smem_lse.data()), typename Traits::SmemLayoutRow{});
    Tensor sdsum = make_tensor(make_smem_ptr(ss.smem_dsum.data()), typename Traits::SmemLayoutRow{});

    // Varlen: the sequence starts at row cu_seqlens_q[b] of the packed tensor (batch index 0).
    Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, bidh, varlen_q ? 0 : bidb);
    Tensor mdO = kp.tma_do.get_tma_tensor(kp.shape_q)(_, _, bidh, varlen_q ? 0 : bidb);
    Tensor gQ = local_tile(domain_offset(make_coord(varlen_q ? binfo.sum_s_q : 0, _0{}), mQ),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (M, d, m)
    Tensor gdO = local_tile(domain_offset(make_coord(varlen_q ? binfo.sum_s_q : 0, _0{}), mdO),
                            Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));
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

// ---- deterministic dQ (params.bwd_ws_det) --------------------------------------------------------
// Key block n adds its dQ tiles into slice n % splits of dq_accum. The key blocks that see query
// block m form an interval [first, last] (both ends of m_block_range grow with the key block);
// those sharing a slice add m's tile one after the other, in ascending key-block order, or
// descending when the window's right side is bounded (causal): there key block n starts at a
// query block that grows with n, so in ascending order CTA n would wait for CTA n - 1 to work
// its way up to n's first block, and in descending order the CTA it waits for started earlier
// in the query blocks. The grid is walked in the same order (bwd_ws_tile_coords maps the launch
// order to descending key blocks of each head), so a CTA only ever waits for CTAs launched
// before it: no CTA can wait for one that is not resident yet.
struct BwdWsDqOrder {
    int *counters;  // this (slice, b, h)'s counters, one per 64-row query block (zeroed)
    Mask mask;
    int n_block, splits, slice;
    bool descending;

    template <int kBlockM, int kBlockN>
    __device__ int rank(int m_block) const {
        if (descending) {
            const int last = mask.last_n_block_seeing(m_block, kBlockM, kBlockN);
            const int last_in_slice = last - ((last - slice) % splits + splits) % splits;
            return (last_in_slice - n_block) / splits;
        }
        const int first = mask.first_n_block_seeing(m_block, kBlockM, kBlockN);
        const int first_in_slice = first + ((slice - first) % splits + splits) % splits;
        return (n_block - first_in_slice) / splits;
    }
};

__forceinline__ __device__ bool bwd_ws_det_descending(BwdParams const &params) {
    return params.window_right < kWindowUnbounded;
}

// The CTA's (key block, batch, head). Grid (key blocks, b, h), launched in linear order (x
// fastest). Deterministic calls with a bounded right window (causal) walk each head's key blocks
// downwards, so each head's longest CTAs (key block 0: every query block) launch last; one head
// after the other, the last head's long CTAs then run alone at the end (a list-scheduling
// simulation of the 8k d256 causal backward, 16 heads x 128 key blocks on 132 SMs: 7.4% over the
// average load, ascending non-deterministic order 0.7%). Interleaving the key blocks of
// params.bwd_ws_det_head_group heads (n-major within the group) ends on several heads' long CTAs
// at once: 6.4% in that simulation, 2 heads as good as 16, and only the group's Q / dO live in L2
// (measured: d256 -2%, d128 +0.8%; the binding picks 2 heads at d256 only).
// Every CTA still waits only for CTAs launched before it (key block n + 1 of its own head).
__forceinline__ __device__ void bwd_ws_tile_coords(BwdParams const &params, int &n_block, int &bidb, int &bidh) {
    if (!(params.deterministic && bwd_ws_det_descending(params))) {
        n_block = blockIdx.x, bidb = blockIdx.y, bidh = blockIdx.z;
        return;
    }
    const int n_blocks = gridDim.x, heads = gridDim.y * gridDim.z;
    const int group = max(params.bwd_ws_det_head_group, 1);
    const int linear = blockIdx.x + n_blocks * (blockIdx.y + gridDim.y * blockIdx.z);
    const int g = linear / (group * n_blocks);
    const int heads_in_group = min(group, heads - g * group);
    const int r = linear - g * group * n_blocks;
    n_block = n_blocks - 1 - r / heads_in_group;
    const int bh = g * group + r % heads_in_group;
    bidb = bh % gridDim.y, bidh = bh / gridDim.y;
}

// Key block n_block's place in the deterministic order (params.deterministic with bwd_ws_det),
// and the element offset of its dq_accum slice.
__forceinline__ __device__ BwdWsDqOrder bwd_ws_dq_order(BwdParams const &params, BlockInfo const &binfo, int n_block,
                                                        int bidb, int bidh, int64_t &slice_offset) {
    BwdWsDqOrder order{};
    order.splits = max(params.dq_accum_splits, 1);
    order.slice = n_block % order.splits;
    order.n_block = n_block;
    order.mask = Mask{binfo.seqlen_k, binfo.seqlen_k - binfo.seqlen_q, params.window_left, params.window_right};
    order.descending = bwd_ws_det_descending(params);
    order.counters = params.dq_semaphore_ptr +
                     ((int64_t(order.slice) * params.b + bidb) * params.h + bidh) * (params.seqlen_q_rounded / 64);
    slice_offset = int64_t(order.slice) * params.dq_accum_split_stride;
    return order;
}

__forceinline__ __device__ int ld_acquire_gpu(int const *ptr) {
    int value;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(ptr) : "memory");
    return value;
}

// The dQ writers' destination: this (batch, head)'s rows of dq_accum, in this key block's slice
// and with its place in the slice's order (`order`) when deterministic. dq_accum rows are padded
// to a multiple of 128 (dense) or by 128 per sequence (varlen) and hold kHeadDim floats each:
// every 64-row tile is in bounds and one contiguous block.
template <int kHeadDim>
__forceinline__ __device__ float *bwd_ws_dq_writer_dst(BwdParams const &params, BlockInfo const &binfo, int n_block,
                                                      int bidb, int bidh, bool det, BwdWsDqOrder &order) {
    int64_t slice_offset = 0;
    if (det) { order = bwd_ws_dq_order(params, binfo, n_block, bidb, bidh, slice_offset); }
    return params.dq_accum_ptr + slice_offset + accum_row0(params, binfo, bidb, bidh) * kHeadDim;
}

// ---- dQ writer (not split-d): warp 1 of the producer warpgroup ----------------------------------
// Per query block: wait until the consumers have written the block's fp32 dQ tile to buffer
// (block parity) and fenced it for the async proxy (kdQFull), add the tile into dq_accum with one
// bulk reduce (lane 0), wait until the TMA unit has read it, and hand the buffer back (kdQEmpty)
// when a later block will refill it. Ordering between CTAs: none, except in the deterministic
// mode (params.bwd_ws_det, BwdWsDqOrder): there lane 0 waits until the CTAs before this one in
// the slice's order have added the tile (acquire load of the block's counter), and after its own
// reduce-add has completed (not just read its source) increments the counter (release).
template <typename Traits>
__forceinline__ __device__ void bwd_ws_write_dq(BwdParams const &params, typename Traits::SharedStorage &ss,
                                                BlockInfo const &binfo, int n_block, int bidb, int bidh,
                                                int m_block_min, int m_block_max) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    // Only with bwd_ws_det (the launcher checks it). Its counters: one per query block of this
    // kernel's kBlockM rows (seqlen_q_rounded / 64 per (slice, b, h) allocated: enough for both).
    const bool det = params.deterministic;
    BwdWsDqOrder order{};
    float *dq_accum_ptr = bwd_ws_dq_writer_dst<kHeadDim>(params, binfo, n_block, bidb, bidh, det, order);
    const bool leader = cute::elect_one_sync();
#pragma unroll 1  // one iteration per query block is plenty for a warp that mostly waits
    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const uint32_t buf = (m_block - m_block_min) % Traits::kdQBuffers;
        cutlass::arch::NamedBarrier::sync(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + buf);
        if (leader) {
            if (det) {
                const int turn = order.template rank<kBlockM, Traits::kBlockN>(m_block);
                while (ld_acquire_gpu(order.counters + m_block) != turn) { __nanosleep(64); }
                // The earlier CTAs' adds (ordered before their release) before our bulk reduce
                // (async proxy).
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
            }
            Sm90BulkReduceAddF32::copy(ss.smem_dq.data() + buf * (kBlockM * kHeadDim),
                                       dq_accum_ptr + int64_t(m_block) * kBlockM * kHeadDim, Traits::kdQTileBytes);
            cute::tma_store_arrive();
            if (det) {
                // The adds themselves completed (not only the source read), then made visible to
                // the generic proxy before the release that lets the next CTA add.
                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(order.counters + m_block) : "memory");
            } else {
                cute::tma_store_wait<0>();  // the buffer has been read (the adds may still be in flight)
            }
        }
        __syncwarp();
        // Only the blocks whose buffer is refilled get an arrival: every arrival is matched by the
        // consumers' sync, and no barrier is left half-arrived at exit.
        if (m_block + Traits::kdQBuffers < m_block_max) {
            cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads,
                                                static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0) + buf);
        }
    }
}

// ---- split-d dQ writer: warp 1 of the producer warpgroup -----------------------------------------
// Head dim 256 has no room for a dQ buffer (two stages of Q / dO, K, V, P^T / dS^T: 224 KB). So a
// query block's Q / dO stage, once every GEMM that reads it has completed, holds its fp32 dQ tile
// (rows 0-31 over Q, 32-63 over dO, 32 KB each, 8-float groups XOR-swizzled by row % 4 so that
// the consumers' stores are conflict-free; the conversion undoes it:
// BwdParams::dq_accum_swizzled), and this warp adds it into dq_accum with two bulk reduces and
// hands the stage back to the producer once they have read it (the consumers do not release it).
// Deterministic calls: in the slice's order (BwdWsDqOrder, as bwd_ws_write_dq), each block's
// adds completed and published before the next CTA's. After the last block it tells the
// consumers that Q / dO are free for the dK / dV staging.
template <typename Traits>
__forceinline__ __device__ void bwd_ws_write_dq_split_d(BwdParams const &params, typename Traits::SharedStorage &ss,
                                                        BlockInfo const &binfo, int n_block, int bidb, int bidh,
                                                        int m_block_min, int m_block_max) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kHalfFloats = kBlockM / 2 * kHeadDim;  // one Q (or dO) stage: 32 rows of fp32 dQ
    static_assert(kHalfFloats * sizeof(float) == kBlockM * kHeadDim * sizeof(typename Traits::Element),
                  "half a dQ tile in fp32 fills one Q / dO stage");
    const bool det = params.deterministic;  // only with bwd_ws_det (the launcher checks it)
    BwdWsDqOrder order{};
    float *dq_accum_ptr = bwd_ws_dq_writer_dst<kHeadDim>(params, binfo, n_block, bidb, bidh, det, order);
    const bool leader = cute::elect_one_sync();
#pragma unroll 1
    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int stage = (m_block - m_block_min) % Traits::kStages;  // the consumers' pipeline stage
        cutlass::arch::NamedBarrier::sync(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + stage);
        if (leader) {
            if (det) {
                const int turn = order.template rank<kBlockM, Traits::kBlockN>(m_block);
                while (ld_acquire_gpu(order.counters + m_block) != turn) { __nanosleep(32); }
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
            }
            float *dst = dq_accum_ptr + int64_t(m_block) * kBlockM * kHeadDim;
            Sm90BulkReduceAddF32::copy(reinterpret_cast<float const *>(ss.smem_q.data()) + stage * kHalfFloats, dst,
                                       kHalfFloats * sizeof(float));
            Sm90BulkReduceAddF32::copy(reinterpret_cast<float const *>(ss.smem_do.data()) + stage * kHalfFloats,
                                       dst + kHalfFloats, kHalfFloats * sizeof(float));
            cute::tma_store_arrive();
            cute::tma_store_wait<0>();  // the stage has been read: the producer may refill it
            uint64_t *empty = reinterpret_cast<uint64_t *>(&ss.pipeline.empty_barrier_[stage]);
            asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.release.cta.shared::cta.b64 st, [%0], %1;\n}\n"
                         :
                         : "r"(cute::cast_smem_ptr_to_uint(empty)), "r"(Traits::kNConsumerThreads)
                         : "memory");
            if (det) {
                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the adds completed
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(order.counters + m_block) : "memory");
            }
        }
        __syncwarp();
    }
    cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0));
}

// ---- consumers: both warpgroups, tidx = thread index among the 256 consumer threads -------------
template <typename Traits>
__forceinline__ __device__ void bwd_ws_consume(BwdParams const &params, typename Traits::SharedStorage &ss,
                                               typename Traits::Pipeline &pipeline, BlockInfo const &binfo,
                                               int n_block, int bidb, int bidh, int m_block_min, int m_block_max,
                                               int tidx) {
    using Element = typename Traits::Element;
    using index_t = int64_t;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr float kLog2e = 1.4426950408889634f;
    const int bidh_k = bidh / params.h_h_k_ratio;
    const int seqlen_q = binfo.seqlen_q, seqlen_k = binfo.seqlen_k;
    const int col0 = n_block * kBlockN;
    const int keys_left = seqlen_k - col0;
    const int diag = seqlen_k - seqlen_q;
    const Mask mask{seqlen_k, diag, params.window_left, params.window_right};
    // kMod: softcap then ALiBi on S^T before the mask, the softcap derivative on dS^T, as the
    // lock-step feature kernel (flash_bwd_kernel_sm90.h) does on the same accumulator layout.
    const ScoreMod score_mod = Traits::kMod ? ScoreMod(params, bidb, bidh, diag) : ScoreMod{};
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
    auto drop_flags = [&](int m_block) -> uint32_t * {
        if constexpr (Traits::kDropout) {
            return ss.smem_drop_flags.data() + ((m_block - m_block_min) % Traits::kDropFlagBuffers) * Traits::kDropFlagWords;
        } else {
            return nullptr;
        }
    };
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
    auto drop_wait_full = [&](int m_block) {
        if constexpr (Traits::kDropoutInProducer) {
            const int t = m_block - m_block_min;
            cutlass::arch::ClusterBarrier::wait(&ss.drop_full[t % Traits::kDropFlagBuffers],
                                                (t / Traits::kDropFlagBuffers) & 1);
        }
    };
    auto drop_release = [&](int m_block) {
        if constexpr (Traits::kDropoutInProducer) {
            cutlass::arch::ClusterBarrier::arrive(&ss.drop_empty[(m_block - m_block_min) % Traits::kDropFlagBuffers]);
        }
    };
    auto make_drop_flags = [&](int m_block) {
        if constexpr (Traits::kDropoutInProducer) {
            // generated by the producer warps (bwd_ws_dropout_producer)
        } else if constexpr (Traits::kDropout && Traits::kSplitD) {
            dropout_bwd_generate2_half<Traits::kNConsumerThreads>(Dropout(params, bidb, bidh), drop_flags(m_block),
                                                                  m_block, n_block, tidx);
        } else if constexpr (Traits::kDropout) {
            dropout_bwd_generate2<kBlockM, kBlockN, Traits::kNConsumerThreads>(Dropout(params, bidb, bidh),
                                                                               drop_flags(m_block), m_block, n_block,
                                                                               tidx);
        }
    };

    typename Traits::TiledMmadKV tiled_mma_dkv;
    auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tidx);
    Tensor acc_dk = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(acc_dk);
    clear(acc_dv);

    auto store_dk_dv = [&]() {
        // Every wgmma of both warpgroups has finished reading shared memory, and every TMA load
        // issued has landed (each was waited for): Q / dO / K / V are free for the staging.
        bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);
        char *smem = reinterpret_cast<char *>(ss.smem_q.data());
        Element *dk_ptr = reinterpret_cast<Element *>(params.dk_ptr) +
                          binfo.k_offset(params.dk_batch_stride, params.dk_row_stride, bidb) +
                          bidh * params.dk_head_stride + index_t(col0) * params.dk_row_stride;
        Element *dv_ptr = reinterpret_cast<Element *>(params.dv_ptr) +
                          binfo.k_offset(params.dv_batch_stride, params.dv_row_stride, bidb) +
                          bidh * params.dv_head_stride + index_t(col0) * params.dv_row_stride;
        constexpr int kdKVBytes = cosize(typename Traits::SmemLayoutdKV{}) * sizeof(Element);
        store_tile<Traits, typename Traits::TiledMmadKV>(acc_dk, smem, typename Traits::SmemLayoutdKV{}, dk_ptr,
                                                         params.dk_row_stride, keys_left, params.d, tidx,
                                                         BwdWsConsumerSync{});
        store_tile<Traits, typename Traits::TiledMmadKV>(acc_dv, smem + kdKVBytes, typename Traits::SmemLayoutdKV{},
                                                         dv_ptr, params.dv_row_stride, keys_left, params.d, tidx,
                                                         BwdWsConsumerSync{});
    };
    if (m_block_max <= m_block_min) {  // no query sees these keys: dK = dV = 0
        store_dk_dv();
        return;
    }

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQdO{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQdOt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutQdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutQdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutKV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});
    const float *smem_lse = ss.smem_lse.data();
    const float *smem_dsum = ss.smem_dsum.data();
    // Where this (batch, head)'s rows start in each stage's box (the box starts 16-byte aligned).
    const int lse_shift = bwd_ws_lse_row0(params, binfo, bidb, bidh) % Traits::kRowShiftMax;
    const int dsum_shift = bwd_ws_dsum_row0(params, binfo, bidb, bidh) % Traits::kRowShiftMax;

    // ---- K and V once (cp.async, zero-filled past seqlen_k and the head dim) ----
    {
        typename Traits::GmemTiledCopyLoad gmem_copy;
        auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
        Tensor tKVcKV = thr_gmem_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
        Tensor tKVpKV = make_col_predicate(tKVcKV, params.d);
        Tensor gK = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.k_ptr) +
                                              binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) +
                                              bidh_k * params.k_head_stride + index_t(col0) * params.k_row_stride),
                                Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.k_row_stride, _1{}));
        Tensor gV = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.v_ptr) +
                                              binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) +
                                              bidh_k * params.v_head_stride + index_t(col0) * params.v_row_stride),
                                Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.v_row_stride, _1{}));
        Tensor tKsK = thr_gmem_copy.partition_D(sK);
        Tensor tVsV = thr_gmem_copy.partition_D(sV);
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gK), tKsK, tKVcKV, tKVpKV, keys_left);
        load_tile_zfill(gmem_copy, thr_gmem_copy.partition_S(gV), tVsV, tKVcKV, tKVpKV, keys_left);
        cp_async_fence();
    }

    // ---- MMA operands ----
    typename Traits::TiledMmaSdP tiled_mma_sdp;
    // kSplitD: a 256-thread MMA, warpgroup w on queries [32 w, 32 w + 32).
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(tidx);
    Tensor tSrK = thr_mma_sdp.partition_fragment_A(sK);    // smem descriptors
    Tensor tSrQ = thr_mma_sdp.partition_fragment_B(sQ);    // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrV = thr_mma_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_mma_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = thr_mma_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQt);
    typename Traits::TiledMmadQ tiled_mma_dq;
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(tidx);
    Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);  // (MMA, MMA_M, MMA_K, buffer)
    Tensor tdQrKt = thr_mma_dq.partition_fragment_B(sKt);
    Tensor tdSsdSt = thr_mma_sdp.partition_C(sdSt);  // where this thread's dS^T elements go (.., buffer)
    // kSplitD: P^T through shared memory too; dV / dK read both from there (SS).
    auto [tPsPt, tdVrPt, tdKrdSt] = [&]() {
        if constexpr (Traits::kSplitD) {
            Tensor sPt = make_tensor(make_smem_ptr(ss.smem_p.data()), typename Traits::SmemLayoutPt{});
            return cute::make_tuple(thr_mma_sdp.partition_C(sPt), thr_mma_dkv.partition_fragment_A(sPt),
                                    thr_mma_dkv.partition_fragment_A(sdSt));
        } else {
            return cute::make_tuple(0, 0, 0);
        }
    }();

    // Accumulator coordinates: mode 0 = key (within the block), mode 1 = query row.
    Tensor coords_st = thr_mma_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor coords_st_rc = make_tensor(coords_st.data(), acc_layout_rowcol(coords_st.layout()));
    auto new_acc_st = [&]() { return partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{}); };

    // Varlen: rows [rows_valid, kBlockM) of stage's Q and dO tiles hold rows past the sequence
    // (see the header): zeroed by the 256 consumer threads, 16-byte chunks (contiguous under the
    // swizzle), before the GEMMs. Only the last query block of a sequence.
    const bool varlen_q = binfo.sum_s_q != -1;
    auto zero_qdo_tail = [&](int stage, int rows_valid) {
        constexpr int kChunks = kHeadDim / 8;
        const int n = (kBlockM - rows_valid) * kChunks;
        for (int i = tidx; i < n; i += Traits::kNConsumerThreads) {
            const int row = rows_valid + i / kChunks, col = (i % kChunks) * 8;
            *reinterpret_cast<uint4 *>(&sQ(row, col, stage)) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(&sdO(row, col, stage)) = make_uint4(0, 0, 0, 0);
        }
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes before wgmma (async proxy) reads
        bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);
    };

    if constexpr (Traits::kDropout) {  // while K / V land; the barrier below publishes them
        if (m_block_max > m_block_min) { make_drop_flags(m_block_min); }
        if constexpr (!Traits::kSplitD) {  // (split-d: block m + 1 is generated in block m)
            if (m_block_max > m_block_min + 1) { make_drop_flags(m_block_min + 1); }
        }
    }
    // K / V landed (cp.async through the generic proxy; wgmma reads through the async proxy).
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);

    // Query block dq_block's dQ tile (registers, complete) into a shared buffer, for the writer
    // warp's bulk reduce into dq_accum (not split-d).
    auto write_out_dq = [&](auto const &dq, int dq_block) {
        if constexpr (!Traits::kSplitD) {  // (split-d: the Q / dO stage form below)
            // dQ tile -> shared buffer (block parity), for the writer warp's bulk reduce. The
            // buffer's previous tile (block - 2) must have been read out first.
            const int block_idx = dq_block - m_block_min;
            const uint32_t dq_buf = block_idx % Traits::kdQBuffers;
            if (block_idx >= Traits::kdQBuffers) {
                cutlass::arch::NamedBarrier::sync(Traits::kNdQSyncThreads,
                                                  static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0) + dq_buf);
            }
            // Row-major fp32, as dq_accum. A warp's float2 store covers 8 rows x 32 bytes (lanes
            // 4 i .. 4 i + 3: row r0 + i, one 8-float group) at a row pitch of kHeadDim x 4 bytes
            // (a multiple of 128): plain, all 8 rows hit the same 8 banks (8-way conflicts, 22% of
            // the kernel's shared-memory wavefronts in ncu). With the swizzle (float
            // c of row r at c ^ (8 (r % 4)), params.dq_accum_swizzled) rows r0 .. r0 + 3 land on
            // the four 8-bank groups: 2 wavefronts per store, the minimum for 256 bytes.
            float *sdQ_buf = ss.smem_dq.data() + dq_buf * (kBlockM * kHeadDim);
            Tensor cdQ = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
            const int swizzle = params.dq_accum_swizzled ? 3 : 0;  // row bits XORed into the 8-float group
            CUTE_UNROLL
            for (int i = 0; i < size(dq); i += 2) {  // elements (i, i+1) are adjacent columns
                const int r = get<0>(cdQ(i)), c = get<1>(cdQ(i));
                *reinterpret_cast<float2 *>(sdQ_buf + r * kHeadDim + (c ^ ((r & swizzle) << 3))) =
                    make_float2(dq(i), dq(i + 1));
            }
            cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the bulk copy reads
            cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads,
                                                static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + dq_buf);
        }
    };

    typename Traits::PipelineState state;  // consumer start: stage 0, phase 0
    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int row0 = m_block * kBlockM;
        const int ds_buf = (m_block - m_block_min) & 1;
        pipeline.consumer_wait(state);  // Q, dO, LSE and softmax_d of this block landed
        const int stage = state.index();
        const bool rows_past_end = row0 + kBlockM > seqlen_q;
        if (varlen_q && rows_past_end) { zero_qdo_tail(stage, seqlen_q - row0); }

        Tensor acc_s = new_acc_st();
        Tensor acc_dp = new_acc_st();
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
        wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);
        if constexpr (Traits::kDropout && Traits::kSplitD) {
            // Block m + 1's flags while S^T / dP^T run (see make_drop_flags).
            if (m_block + 1 < m_block_max) { make_drop_flags(m_block + 1); }
        }

        // P^T = exp2(S^T * scale log2e - LSE log2e), masked where the tile needs it.
        Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (key, query)
        const float *lse_stage = smem_lse + stage * Traits::kRowStageStride + lse_shift;
        const float *dsum_stage = smem_dsum + stage * Traits::kRowStageStride + dsum_shift;
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
        constexpr int kQueryCols = decltype(size<1>(scores))::value;
        constexpr bool kRowPrefetch = !Traits::kSplitD && !Traits::kMod && kQueryCols <= 16;
        auto lse_log2_of = [&](int r) { return row0 + r < seqlen_q ? lse_stage[r] * kLog2e : 0.f; };
        float lse_log2_cols[kRowPrefetch ? kQueryCols : 1];
        float dsum_cols[kRowPrefetch ? kQueryCols : 1];
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
        // The tile's rows past the sequence (see the header) are masked too.
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
        {
            Tensor converted = convert_type<Element>(acc_s);
            cute::copy(converted, rP);
        }
        if constexpr (Traits::kDropout) {
            if constexpr (Traits::kSplitD) {
                dropout_bwd_apply_p_half(rP, drop_flags(m_block), coords_st);
            } else {
                drop_wait_full(m_block);
                dropout_bwd_apply_p2<kBlockM>(rP, drop_flags(m_block), coords_st);
            }
        }
        if constexpr (kRowPrefetch) {  // softmax_d of the query columns, while dV / dP^T run (see LSE)
            CUTE_UNROLL
            for (int ni = 0; ni < kQueryCols; ++ni) { dsum_cols[ni] = dsum_stage[get<1>(coords_st_rc(0, ni))]; }
        }
        if constexpr (!Traits::kSplitD) {
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, make_tensor(rP.data(), acc_layout_as_A(rP.layout())),
                                                     tdVrdOt(_, _, _, stage), acc_dv);
        }

        // dS^T = P^T * (dP^T - softmax_d); with dropout, dP^T of the kept elements / (1 - p).
        if constexpr (Traits::kSplitD) {
            warpgroup_wait<0>();  // dP^T ready (no dV in flight: it waits for the exchange)
        } else {
            warpgroup_wait<1>();  // dP^T ready (dV may still run)
        }
        warpgroup_fence_operand(acc_dp);
        if constexpr (Traits::kDropout) {
            if constexpr (Traits::kSplitD) {
                dropout_bwd_apply_dp_half(acc_dp, drop_flags(m_block), coords_st);
            } else {
                dropout_bwd_apply_dp2<kBlockM>(acc_dp, drop_flags(m_block), coords_st);
                drop_release(m_block);
            }
        }
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
            // Rows past the sequence read LSE 0 (their P is 0 anyway), as above.
            score_mod.softcap_grad_t(acc_dp, acc_s, coords_st, row0, col0, params.scale_softmax_log2, [&](int i) {
                const int r = get<1>(coords_st(i));
                return row0 + r < seqlen_q ? lse_stage[r] * kLog2e : 0.f;
            });
        }
        Tensor rdS = make_tensor_like<Element>(acc_dp);
        {
            Tensor converted = convert_type<Element>(acc_dp);
            cute::copy(converted, rdS);
        }
        if constexpr (!Traits::kSplitD) {
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, make_tensor(rdS.data(), acc_layout_as_A(rdS.layout())),
                                                     tdKrQt(_, _, _, stage), acc_dk);
        }

        // dQ = dS K over the whole key block: dS^T of both warpgroups through shared memory.
        // kSplitD: each warpgroup writes its 32 queries of dS^T and of P^T.
        if constexpr (!Traits::kSplitD) {
            // stmatrix: four 8 x 8 tiles per instruction, each tile row 8 queries = 16 contiguous
            // bytes of the MN-major dS buffer (FA3's SM90_U32x4_STSM_N for a transposed S / dP with
            // an MN-major dS). An element-wise copy compiles to 16 generic 4-byte ST per thread at
            // d128 (ncu: lg_throttle, and the fence / barrier behind them waiting on the long
            // scoreboard).
            auto r2s_copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_sdp);
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
        if constexpr (Traits::kSplitD) {
            // dV += P^T dO and dK += dS^T Q over this warpgroup's head-dim half, both 64 queries.
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, tdVrPt(_, _, _, Traits::kPBuffers == 1 ? 0 : ds_buf),
                                                     tdVrdOt(_, _, _, stage), acc_dv);
            wgmma</*kZeroInit=*/false, /*kWait=*/-1>(tiled_mma_dkv, tdKrdSt(_, _, _, ds_buf), tdKrQt(_, _, _, stage), acc_dk);
        }
        Tensor acc_dq = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
        if constexpr (Traits::kDropout) {
            // Block m + 2's flags while dV, dK and dQ run (see make_drop_flags).
            wgmma</*kZeroInit=*/true, /*kWait=*/-1>(tiled_mma_dq, tdQrdS(_, _, _, ds_buf), tdQrKt, acc_dq);
            if constexpr (!Traits::kSplitD) {
                if (m_block + 2 < m_block_max) { make_drop_flags(m_block + 2); }
            }
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc_dq);
        } else {
            wgmma</*kZeroInit=*/true, /*kWait=*/0>(tiled_mma_dq, tdQrdS(_, _, _, ds_buf), tdQrKt, acc_dq);
        }
        warpgroup_fence_operand(acc_dv);
        warpgroup_fence_operand(acc_dk);
        if constexpr (Traits::kSplitD) {
            // The dQ tile goes into this block's Q / dO stage once both warpgroups' GEMMs have
            // read it; the writer warp adds it (in order, if deterministic) and releases the
            // stage (bwd_ws_write_dq_split_d).
            bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);
            const int stage = state.index();
            float *half0 = reinterpret_cast<float *>(ss.smem_q.data()) + stage * (kBlockM / 2 * kHeadDim);
            float *half1 = reinterpret_cast<float *>(ss.smem_do.data()) + stage * (kBlockM / 2 * kHeadDim);
            // A thread's rows are r0 and r0 + 8 (wgmma accumulators: warp w of a warpgroup holds
            // rows 16 w .. 16 w + 15), so one half and one swizzle: the 8-float groups of a row
            // are XOR-permuted by (row % 4) (float index c -> c ^ (8 (row % 4))), which spreads a
            // warp's 8 rows x 8 floats over all 32 banks twice (2 wavefronts, the minimum).
            Tensor coords_dq = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
            const int r0 = get<0>(coords_dq(0));
            const int swz = (r0 & 3) << 3;
            float *row_base = (r0 < kBlockM / 2 ? half0 : half1) + (r0 % (kBlockM / 2)) * kHeadDim;
            CUTE_UNROLL
            for (int i = 0; i < size(acc_dq); i += 2) {  // elements (i, i+1) are adjacent columns
                const int dr = get<0>(coords_dq(i)) - r0, c = get<1>(coords_dq(i));
                *reinterpret_cast<float2 *>(row_base + dr * kHeadDim + (c ^ swz)) = make_float2(acc_dq(i), acc_dq(i + 1));
            }
            cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the bulk copies read
            cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads,
                                                static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + stage);
            ++state;
        } else {
            // Every GEMM of this block has completed: Q, dO, LSE and softmax_d of the stage are
            // free for the producer's next load while the dQ tile is written out.
            pipeline.consumer_release(state);
            ++state;
            write_out_dq(acc_dq, m_block);
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
    store_dk_dv();
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
