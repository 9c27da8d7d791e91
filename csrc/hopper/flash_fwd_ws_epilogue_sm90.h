// Epilogue of the warp-specialised sm_90a forward: one consumer warpgroup writes its 64 rows of O
// (through shared memory, 16-byte global stores, predicated on the sequence's rows and on d) and
// of softmax_lse, in the layouts the other forward kernels use.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "../block_info.h"
#include "../flash.h"
#include "../utils.h"
#include "kernel_traits_fwd_ws_sm90.h"

namespace flash {

using namespace cute;

// acc_o: the warpgroup's normalised (64, kHeadDim) accumulator; lse: its rows' LSE (kNRows per
// thread); smem_o: 64 x kHeadDim elements only this warpgroup touches (its Q tile, which no GEMM
// reads any more); row0: the warpgroup's first row in the sequence.
template <typename Traits, typename TensorO, typename TensorL>
__forceinline__ __device__ void fwd_ws_store(FwdParams const &params, BlockInfo const &binfo, TensorO const &acc_o,
                                             TensorL const &lse, typename Traits::Element *smem_o, int wg, int wg_tidx,
                                             int bidb, int bidh, int row0) {
    using Element = typename Traits::Element;
    using EpiBase = typename Traits::EpiBase;
    constexpr int kRows = Traits::kRowsPerWG;
    constexpr int kHeadDim = Traits::kHeadDim;
    const uint32_t epi_barrier = static_cast<uint32_t>(FwdWsBarrier::kEpiWG0) + wg;
    const int rows_left = binfo.seqlen_q - row0;

    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(wg_tidx);

    // Registers -> shared. Every warp of the warpgroup is past its last GEMM on this tile first.
    cutlass::arch::NamedBarrier::sync(128, epi_barrier);
    Tensor r = convert_type<Element>(acc_o);
    Tensor s = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutO{});
    auto smem_copy = make_tiled_copy_C(typename EpiBase::SmemCopyAtomStore{}, tiled_mma_pv);
    auto thr_smem_copy = smem_copy.get_thread_slice(wg_tidx);
    cute::copy(smem_copy, thr_smem_copy.retile_S(r), thr_smem_copy.partition_D(s));
    cutlass::arch::NamedBarrier::sync(128, epi_barrier);

    // Shared -> global, 16 bytes per thread and copy.
    Element *o_ptr = reinterpret_cast<Element *>(params.o_ptr) +
                     binfo.q_offset(params.o_batch_stride, params.o_row_stride, bidb) + bidh * params.o_head_stride +
                     int64_t(row0) * params.o_row_stride;
    Tensor g = make_tensor(make_gmem_ptr(o_ptr), Shape<Int<kRows>, Int<kHeadDim>>{}, make_stride(params.o_row_stride, _1{}));
    typename EpiBase::GmemTiledCopyStore gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(wg_tidx);
    Tensor tS = thr_gmem_copy.partition_S(s);
    Tensor tG = thr_gmem_copy.partition_D(g);
    Tensor tR = make_tensor<Element>(shape(tG));
    cute::copy(gmem_copy, tS, tR);
    Tensor tC = thr_gmem_copy.partition_D(make_identity_tensor(Shape<Int<kRows>, Int<kHeadDim>>{}));
    Tensor pred = make_col_predicate(tC, params.d);
    copy_tile</*kClearOOB=*/false>(gmem_copy, tR, tG, tC, pred, rows_left);

    // LSE: the thread holding column 0 of a row writes it.
    Tensor coords_o = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kHeadDim>>{}));
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
