// Tile helpers shared by the SM80-class and sm_90a kernels: an output tile written through shared
// memory with 16-byte global stores, and the barrier it uses.
#pragma once

#include <cute/tensor.hpp>

#include "common/kernel_traits.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// The barrier store_tile puts between its shared-memory writes and reads: the whole CTA.
struct CtaSync {
    __forceinline__ __device__ void operator()() const { __syncthreads(); }
};

// Writes an (rows, d) output tile through shared memory so the global stores are 16-byte wide.
// sync: a barrier over the threads taking part (the warp-specialised kernels pass their consumer
// warpgroups' named barrier).
template <typename Traits, typename TiledMma, typename TensorAcc, typename SmemLayout, typename Sync = CtaSync>
__forceinline__ __device__ void store_tile(TensorAcc const &acc, char *smem, SmemLayout smem_layout,
                                           typename Traits::Element *gmem_ptr, int64_t row_stride, int max_rows,
                                           int max_cols, int tidx, Sync sync = {}) {
    using Element = typename Traits::Element;
    constexpr int kRows = decltype(size<0>(smem_layout))::value;
    constexpr int kCols = decltype(size<1>(smem_layout))::value;
    Tensor r = convert_type<Element>(acc);
    Tensor s = make_tensor(make_smem_ptr(reinterpret_cast<Element *>(smem)), smem_layout);
    auto smem_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, TiledMma{});
    auto thr_smem_copy = smem_copy.get_thread_slice(tidx);
    cute::copy(smem_copy, thr_smem_copy.retile_S(r), thr_smem_copy.partition_D(s));
    sync();

    Tensor g = make_tensor(make_gmem_ptr(gmem_ptr), Shape<Int<kRows>, Int<kCols>>{}, make_stride(row_stride, _1{}));
    typename Traits::GmemTiledCopyStore gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tS = thr_gmem_copy.partition_S(s);
    Tensor tG = thr_gmem_copy.partition_D(g);
    Tensor tR = make_tensor<Element>(shape(tG));
    cute::copy(gmem_copy, tS, tR);
    Tensor tC = thr_gmem_copy.partition_D(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));
    Tensor pred = make_col_predicate(tC, max_cols);
    copy_tile</*kClearOOB=*/false>(gmem_copy, tR, tG, tC, pred, max_rows);
}

}  // namespace flash
