// Epilogue of the warp-specialised sm_90a forward: one consumer warpgroup writes its 64 rows of O
// (through shared memory; then one TMA store, which clips at the sequence's rows and at d, for
// dense calls (kp.o_tma), or 16-byte global stores predicated on both for varlen ones) and of
// softmax_lse, in the layouts the other forward kernels use.
//
// TMA store protocol: thread 0 of the warpgroup issues the store and commits it as a bulk group;
// the staging tile must not be written again, nor handed to a TMA load, before the store has read
// it: thread 0 waits for that (fwd_ws_store_drain) at the top of the next fwd_ws_store, before
// releasing a Q tile that doubles as staging (the persistent kernel without its own O buffer), and
// before the warpgroup exits (the CTA's shared memory goes away with it).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/flash.h"
#include "common/tile_io.h"
#include "common/utils.h"
#include "sm90/kernel_traits_fwd_ws_sm90.h"

namespace flash {

using namespace cute;

// The staged tile s to global memory, 16 bytes per thread and copy, predicated on the rows left in
// the sequence and on d.
template <typename Traits, typename TensorS>
__forceinline__ __device__ void fwd_ws_store_threads(FwdParams const &params, BlockInfo const &binfo, TensorS const &s,
                                                     int wg_tidx, int bidb, int bidh, int row0, int rows_left) {
    using Element = typename Traits::Element;
    using EpiBase = typename Traits::EpiBase;
    constexpr int kRows = Traits::kRowsPerWG;
    constexpr int kHeadDimV = Traits::kHeadDimV;
    Element *o_ptr = reinterpret_cast<Element *>(params.o_ptr) +
                     binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) + bidh * params.o_head_stride +
                     int64_t(row0) * params.o_row_stride;
    smem_tile_to_gmem<typename EpiBase::GmemTiledCopyStore, kRows, kHeadDimV>(s, o_ptr, params.o_row_stride, rows_left,
                                                                             params.dv, wg_tidx);
}

// kMayTma: the TMA path is compiled in (Traits::kTmaStoreOFor; elsewhere the launcher sets
// kp.o_tma false).
template <bool kMayTma, typename Traits>
__forceinline__ __device__ void fwd_ws_store_drain(FwdWsKernelParams<Traits> const &kp, int wg_tidx) {
    if constexpr (kMayTma) {
        if (kp.o_tma && wg_tidx == 0) { tma_store_wait<0>(); }
    }
}

// acc_o: the warpgroup's normalised (64, kHeadDimV) accumulator; lse: its rows' LSE (kNRows per
// thread); smem_o: 64 x kHeadDimV elements only this warpgroup touches (its Q tile, which no GEMM
// reads any more, or its own staging buffer); row0: the warpgroup's first row in the sequence.
template <typename Traits, bool kMayTma, typename TensorO, typename TensorL>
__forceinline__ __device__ void fwd_ws_store(FwdWsKernelParams<Traits> const &kp, BlockInfo const &binfo,
                                             TensorO const &acc_o, TensorL const &lse, typename Traits::Element *smem_o,
                                             int wg, int wg_tidx, int bidb, int bidh, int row0) {
    FwdParams const &params = kp.p;
    using Element = typename Traits::Element;
    using EpiBase = typename Traits::EpiBase;
    constexpr int kRows = Traits::kRowsPerWG;
    constexpr int kHeadDimV = Traits::kHeadDimV;
    const uint32_t epi_barrier = static_cast<uint32_t>(FwdWsBarrier::kEpiWG0) + wg;
    const int rows_left = binfo.seqlen_q - row0;

    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(wg_tidx);

    // Registers -> shared. Every warp of the warpgroup is past its last GEMM on this tile first,
    // and the previous tile's TMA store has read the staging tile.
    fwd_ws_store_drain<kMayTma>(kp, wg_tidx);
    cutlass::arch::NamedBarrier::sync(128, epi_barrier);
    Tensor r = convert_type<Element>(acc_o);
    auto smem_copy = make_tiled_copy_C(typename EpiBase::SmemCopyAtomStore{}, tiled_mma_pv);
    auto thr_smem_copy = smem_copy.get_thread_slice(wg_tidx);
    auto store_by_threads = [&]() {
        Tensor s = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutO{});
        cute::copy(smem_copy, thr_smem_copy.retile_S(r), thr_smem_copy.partition_D(s));
        cutlass::arch::NamedBarrier::sync(128, epi_barrier);
        fwd_ws_store_threads<Traits>(params, binfo, s, wg_tidx, bidb, bidh, row0, rows_left);
    };
    if constexpr (kMayTma) {
        if (kp.o_tma) {
            Tensor s = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutOTma{});
            cute::copy(smem_copy, thr_smem_copy.retile_S(r), thr_smem_copy.partition_D(s));
            cutlass::arch::fence_view_async_shared();  // the generic-proxy writes, before the TMA reads them
            cutlass::arch::NamedBarrier::sync(128, epi_barrier);
            // Shared -> global: one TMA store of the (64, d) tile (rows past seqlen_q and columns
            // past d are clipped by the TMA), issued and committed by thread 0.
            if (wg_tidx == 0) {
                Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_q)(_, _, bidh, bidb);
                Tensor gO = local_tile(mO, Shape<Int<kRows>, Int<kHeadDimV>>{}, make_coord(row0 / kRows, _0{}));  // (64, d)
                auto thr_tma_o = kp.tma_o.get_slice(_0{});
                cute::copy(kp.tma_o, thr_tma_o.partition_S(s), thr_tma_o.partition_D(gO));
                tma_store_arrive();
            }
        } else {
            store_by_threads();
        }
    } else {
        store_by_threads();
    }

    // LSE: the thread holding column 0 of a row writes it.
    Tensor coords_o = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kHeadDimV>>{}));
    Tensor coords_o_rc = make_tensor(coords_o.data(), acc_layout_rowcol(coords_o.layout()));
    float *lse_ptr = params.softmax_lse_ptr + (binfo.sum_s_q == -1 ? bidb * params.lse_batch_stride : binfo.sum_s_q) +
                     bidh * params.lse_head_stride + row0;
    if (get<1>(coords_o_rc(0, 0)) == 0) {
        CUTE_UNROLL
        for (int mi = 0; mi < decltype(size<0>(coords_o_rc))::value; ++mi) {
            const int row = get<0>(coords_o_rc(mi, 0));
            if (row < rows_left) lse_ptr[row] = lse(mi);
        }
    }
}

}  // namespace flash
