// The epilogue pieces of the warp-specialised sm_90a backward (flash_bwd_ws_kernel_sm90.h): the
// consumers' dQ tile into shared memory (its own buffers, or the split-d Q / dO stage), the dQ
// writer warp's bulk reduce-adds into dq_accum (in the deterministic order where asked), and dK /
// dV out through shared memory.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/bwd_passes.h"  // accum_row0
#include "common/tile_io.h"
#include "common/mask.h"
#include "sm90/kernel_traits_bwd_ws_sm90.h"
#include "sm90/flash_bwd_ws_mainloop_sm90.h"  // bwd_ws_consumer_sync

namespace flash {

using namespace cute;

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
// fastest): with params.bwd_ws_head_group = 1, one head after the other. Calls with a bounded
// right window (causal) interleave the key blocks of params.bwd_ws_head_group heads (n-major
// within the group, only the group's Q / dO in L2), the longest CTAs (key block 0: every query
// block) first (flash::bwd_ws_causal_head_group). Deterministic ones walk each head's key blocks
// downwards, so the long CTAs launch last: one head after the other, the last head's long CTAs
// then run alone at the end (a list-scheduling simulation of the 8k d256 causal backward, 16
// heads x 128 key blocks on 132 SMs: 7.4% over the average load); interleaving heads ends on
// several heads' long CTAs at once: 6.4%, 2 heads as good as 16 (measured: d256 -2%, d128 +0.8%;
// the binding picks 2 heads at d256 only). Every deterministic CTA still waits only for CTAs
// launched before it (key block n + 1 of its own head).
__forceinline__ __device__ void bwd_ws_tile_coords(BwdParams const &params, int &n_block, int &bidb, int &bidh) {
    const bool descending = params.deterministic && bwd_ws_det_descending(params);
    const int group = max(params.bwd_ws_head_group, 1);
    if (group == 1 && !descending) {
        n_block = blockIdx.x, bidb = blockIdx.y, bidh = blockIdx.z;
        return;
    }
    const int n_blocks = gridDim.x, heads = gridDim.y * gridDim.z;
    const int linear = blockIdx.x + n_blocks * (blockIdx.y + gridDim.y * blockIdx.z);
    const int g = linear / (group * n_blocks);
    const int heads_in_group = min(group, heads - g * group);
    const int r = linear - g * group * n_blocks;
    n_block = descending ? n_blocks - 1 - r / heads_in_group : r / heads_in_group;
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

// Deterministic calls, lane 0 of the dQ writer: wait until the CTAs before this one in the slice's
// order have added query block m_block's tile (acquire load of its counter), then order their adds
// (ordered before their release) before this CTA's bulk reduce (async proxy).
template <int kBlockM, int kBlockN, int kSleepNs>
__forceinline__ __device__ void bwd_ws_dq_wait_turn(BwdWsDqOrder const &order, int m_block) {
    const int turn = order.template rank<kBlockM, kBlockN>(m_block);
    while (ld_acquire_gpu(order.counters + m_block) != turn) { __nanosleep(kSleepNs); }
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ... and once this CTA's bulk reduce-adds were issued: wait until the adds themselves completed
// (not only the source read), make them visible to the generic proxy, then release the counter
// that lets the next CTA add.
__forceinline__ __device__ void bwd_ws_dq_pass_turn(BwdWsDqOrder const &order, int m_block) {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(order.counters + m_block) : "memory");
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
            if (det) { bwd_ws_dq_wait_turn<kBlockM, Traits::kBlockN, /*kSleepNs=*/64>(order, m_block); }
            // Dense dq_accum has seqlen_q_rounded (a multiple of 128) rows per head: a block
            // height that does not divide 128 (80) adds only the tile's rows below it (the rest
            // are rows past the sequence, zeros). Varlen: within the sequence's 128 rows of padding.
            uint32_t bytes = Traits::kdQTileBytes;
            if constexpr (128 % kBlockM != 0) {
                if (binfo.sum_s_q == -1) {
                    const int rows = min(kBlockM, params.seqlen_q_rounded - m_block * kBlockM);
                    bytes = static_cast<uint32_t>(rows) * kHeadDim * sizeof(float);
                }
            }
            Sm90BulkReduceAddF32::copy(ss.smem_dq.data() + buf * (kBlockM * kHeadDim),
                                       dq_accum_ptr + int64_t(m_block) * kBlockM * kHeadDim, bytes);
            cute::tma_store_arrive();
            if (det) {
                bwd_ws_dq_pass_turn(order, m_block);
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

// ---- split-d: where rows 32-63 of the fp32 dQ tile of a stage go --------------------------------
// The dO stage (as wide as the Q stage at dv == d), or with a V head dim of its own (narrower dO)
// the stage's half of smem_dq_hi.
template <typename Traits>
__forceinline__ __device__ float *bwd_ws_dq_hi_stages(typename Traits::SharedStorage &ss) {
    if constexpr (Traits::kOwnHeadDimV) {
        return ss.smem_dq_hi.data();
    } else {
        return reinterpret_cast<float *>(ss.smem_do.data());
    }
}

// ---- split-d dQ writer: warp 1 of the producer warpgroup -----------------------------------------
// Head dim 256 has no room for a dQ buffer (two stages of Q / dO, K, V, P^T / dS^T: 224 KB). So a
// query block's Q / dO stage, once every GEMM that reads it has completed, holds its fp32 dQ tile
// (rows 0-31 over Q, 32-63 over dO, 32 KB each (a V head dim of its own: over smem_dq_hi), 8-float groups XOR-swizzled (dq_accum_swizzle) so that
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
            if (det) { bwd_ws_dq_wait_turn<kBlockM, Traits::kBlockN, /*kSleepNs=*/32>(order, m_block); }
            float *dst = dq_accum_ptr + int64_t(m_block) * kBlockM * kHeadDim;
            Sm90BulkReduceAddF32::copy(reinterpret_cast<float const *>(ss.smem_q.data()) + stage * kHalfFloats, dst,
                                       kHalfFloats * sizeof(float));
            Sm90BulkReduceAddF32::copy(bwd_ws_dq_hi_stages<Traits>(ss) + stage * kHalfFloats,
                                       dst + kHalfFloats, kHalfFloats * sizeof(float));
            cute::tma_store_arrive();
            cute::tma_store_wait<0>();  // the stage has been read: the producer may refill it
            uint64_t *empty = reinterpret_cast<uint64_t *>(&ss.pipeline.empty_barrier_[stage]);
            asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.release.cta.shared::cta.b64 st, [%0], %1;\n}\n"
                         :
                         : "r"(cute::cast_smem_ptr_to_uint(empty)), "r"(Traits::kNConsumerThreads)
                         : "memory");
            if (det) { bwd_ws_dq_pass_turn(order, m_block); }
        }
        __syncwarp();
    }
    cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0));
}

// ---- consumers: the hand-off of a dQ buffer to the writer warp (not split-d) ---------------------
// Block block_idx (from m_block_min) fills buffer dq_buf once the writer has read the tile it held
// kdQBuffers blocks before; then the writes are fenced for the bulk copy (async proxy) and the
// buffer marked full.
template <typename Traits>
__forceinline__ __device__ void bwd_ws_dq_buffer_wait(int block_idx, uint32_t dq_buf) {
    if (block_idx >= Traits::kdQBuffers) {
        cutlass::arch::NamedBarrier::sync(Traits::kNdQSyncThreads,
                                          static_cast<uint32_t>(BwdWsBarrier::kdQEmpty0) + dq_buf);
    }
}
template <typename Traits>
__forceinline__ __device__ void bwd_ws_dq_buffer_full(uint32_t dq_buf) {
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the bulk copy reads
    cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads,
                                        static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + dq_buf);
}

// ---- consumers, Traits::kdQSwapped: the dQ^T accumulator (d, kBlockM) into a shared buffer ------
// The same row-major swizzled fp32 tile as bwd_ws_dq_to_smem, from the transposed accumulator: a
// thread holds head-dim rows d0 + {0, 8} and query columns q0 + 8 k + {0, 1} (q0 = 2 (lane % 4)),
// i.e. tile rows q and columns d, one 4-byte store each. Every q of the thread has the swizzle
// dq_accum_swizzle(q0) (bits 1-2 of q0 + 8 k + j are those of q0), and (d0 + dd) ^ swz =
// (d0 ^ swz) ^ dd (bit 3 of d0 is 0): two pointers, one per dd in {0, 8}, and compile-time row
// offsets from them; conflict-free (see dq_accum_swizzle).
template <typename Traits, typename ThrMmadQ, typename TensordQ>
__forceinline__ __device__ void bwd_ws_dq_t_to_smem(typename Traits::SharedStorage &ss, ThrMmadQ const &thr_mma_dq,
                                                    TensordQ const &dq, int block_idx) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    const uint32_t dq_buf = block_idx % Traits::kdQBuffers;
    Tensor cdQ = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kHeadDim>, Int<kBlockM>>{}));  // (d, q)
    const int d0 = get<0>(cdQ(0)), q0 = get<1>(cdQ(0));
    const int swz = dq_accum_swizzle(q0);
    float *base = ss.smem_dq.data() + static_cast<int>(dq_buf) * (kBlockM * kHeadDim) + q0 * kHeadDim;
    float *col_ptr[2] = {base + (d0 ^ swz), base + ((d0 ^ swz) ^ 8)};
    bwd_ws_dq_buffer_wait<Traits>(block_idx, dq_buf);
    CUTE_UNROLL
    for (int i = 0; i < size(dq); ++i) {
        const int dd = get<0>(cdQ(i)) - d0, dq_row = get<1>(cdQ(i)) - q0;  // compile-time once unrolled
        col_ptr[(dd >> 3) & 1][dq_row * kHeadDim + (dd & ~8)] = dq(i);
    }
    bwd_ws_dq_buffer_full<Traits>(dq_buf);
}

// ---- consumers: query block dq_block's dQ tile (registers, complete) into a shared buffer ------
// For the writer warp's bulk reduce into dq_accum (not split-d). block_idx: dq_block - m_block_min.
// The store addresses are ready before the wait for the buffer, and only the 16 stores follow it:
// in the deterministic mode the consumers do wait there, for the writer's ordered reduce-adds
// (each after the previous key block's has completed). Formed per element (the swizzle of
// each element's row and column), ptxas put ~55 address instructions behind that wait in the
// d128 score-modifier / deterministic kernel (27 at 4c914a8, 5 now).
template <typename Traits, typename ThrMmadQ, typename TensordQ>
__forceinline__ __device__ void bwd_ws_dq_to_smem(typename Traits::SharedStorage &ss, ThrMmadQ const &thr_mma_dq,
                                                  TensordQ const &dq, int block_idx) {
    if constexpr (Traits::kdQSwapped) {
        bwd_ws_dq_t_to_smem<Traits>(ss, thr_mma_dq, dq, block_idx);
        return;
    }
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    // dQ tile -> shared buffer (block parity), for the writer warp's bulk reduce. The
    // buffer's previous tile (block - 2) must have been read out first.
    const uint32_t dq_buf = block_idx % Traits::kdQBuffers;
    // Row-major fp32, as dq_accum. A warp's float2 store covers 8 rows x 32 bytes (lanes
    // 4 i .. 4 i + 3: row r0 + i, one 8-float group) at a row pitch of kHeadDim x 4 bytes
    // (a multiple of 128): plain, all 8 rows hit the same 8 banks (8-way conflicts, 22% of
    // the kernel's shared-memory wavefronts in ncu). Swizzled (every warp-specialised kernel:
    // the launcher sets params.dq_accum_swizzled, which the conversion reads), float c of row r
    // sits at c ^ dq_accum_swizzle(r), and rows r0 .. r0 + 7 land two by two on the four
    // 8-bank groups: 2 wavefronts per store, the minimum for 256 bytes.
    // A thread's elements (wgmma accumulator layout) are rows r0 + 8 a and column pairs
    // c0 + 8 j + {0, 1}, with c0 % 32 < 8 (a warpgroup's dQ columns start at a multiple of 32):
    // one swizzle for all of them, and it only permutes the four 8-float groups of each
    // 32-float span. So four pointers, one per group k of the span, and compile-time offsets from
    // them: group k at float (tile0 + 8 k) ^ swz = tile0_swz ^ 8 k (bits 3-4 of tile0 are 0: the
    // buffer and row offsets are multiples of 128 floats). All four come from one value: four
    // pointers computed apart and held through the loop cost the d128 plain and dropout kernels
    // in-loop spills.
    static_assert((kHeadDim / Traits::kdQWgN) % 32 == 0, "a warpgroup's dQ columns start at a multiple of 32");
    Tensor cdQ = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    const int r0 = get<0>(cdQ(0)), c0 = get<1>(cdQ(0));
    const int tile0_swz = static_cast<int>(dq_buf) * (kBlockM * kHeadDim) + ((r0 * kHeadDim + c0) ^ dq_accum_swizzle(r0));
    float *group_ptr[4];
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) { group_ptr[k] = ss.smem_dq.data() + (tile0_swz ^ (8 * k)); }
    bwd_ws_dq_buffer_wait<Traits>(block_idx, dq_buf);
    CUTE_UNROLL
    for (int i = 0; i < size(dq); i += 2) {  // elements (i, i+1) are adjacent columns
        // Offsets from element 0: compile-time constants once unrolled.
        const int dr = get<0>(cdQ(i)) - r0, dc = get<1>(cdQ(i)) - c0;
        const int k = (dc / 8) % 4;
        *reinterpret_cast<float2 *>(group_ptr[k] + dr * kHeadDim + (dc - 8 * k)) = make_float2(dq(i), dq(i + 1));
    }
    bwd_ws_dq_buffer_full<Traits>(dq_buf);
}

// ---- consumers, split-d: the dQ tile into this block's Q / dO stage -----------------------------
// Once both warpgroups' GEMMs have read the stage; the writer warp adds it (in order, if
// deterministic) and releases the stage (bwd_ws_write_dq_split_d).
template <typename Traits, typename ThrMmadQ, typename TensordQ>
__forceinline__ __device__ void bwd_ws_dq_to_stage(typename Traits::SharedStorage &ss, ThrMmadQ const &thr_mma_dq,
                                                   TensordQ const &acc_dq, int stage) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    bwd_ws_consumer_sync(BwdWsBarrier::kConsumers);
    float *half0 = reinterpret_cast<float *>(ss.smem_q.data()) + stage * (kBlockM / 2 * kHeadDim);
    float *half1 = bwd_ws_dq_hi_stages<Traits>(ss) + stage * (kBlockM / 2 * kHeadDim);
    // A thread's rows are r0 and r0 + 8 (wgmma accumulators: warp w of a warpgroup holds
    // rows 16 w .. 16 w + 15), so one half and one swizzle: the 8-float groups of a row
    // are XOR-permuted (float index c -> c ^ dq_accum_swizzle(row)), which spreads a
    // warp's 8 rows x 8 floats over all 32 banks twice (2 wavefronts, the minimum).
    Tensor coords_dq = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    const int r0 = get<0>(coords_dq(0));
    const int swz = dq_accum_swizzle(r0);  // also r0 + 8's, and (r0 - 32)'s in the upper half
    float *row_base = (r0 < kBlockM / 2 ? half0 : half1) + (r0 % (kBlockM / 2)) * kHeadDim;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 2) {  // elements (i, i+1) are adjacent columns
        const int dr = get<0>(coords_dq(i)) - r0, c = get<1>(coords_dq(i));
        *reinterpret_cast<float2 *>(row_base + dr * kHeadDim + (c ^ swz)) = make_float2(acc_dq(i), acc_dq(i + 1));
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes before the bulk copies read
    cutlass::arch::NamedBarrier::arrive(Traits::kNdQSyncThreads, static_cast<uint32_t>(BwdWsBarrier::kdQFull0) + stage);
}

}  // namespace flash
