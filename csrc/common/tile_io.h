// Tile helpers shared by the SM80-class and sm_90a kernels: global views of row blocks (of Q / dO,
// of K / V), a shared-memory tile's predicated 16-byte stores to global memory, and an output tile
// written through shared memory with them (store_tile) and the barrier it uses.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/kernel_traits.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

// Rows [block kRows, block kRows + kRows) of the (rows, kHeadDim) tensor at ptr + base, row_stride
// elements apart, as a global view.
template <int kRows, int kHeadDim, typename Element>
__forceinline__ __device__ auto block_rows_gmem(Element *ptr, int64_t base, int block, int64_t row_stride) {
    return make_tensor(make_gmem_ptr(ptr + base + int64_t(block) * kRows * row_stride),
                       Shape<Int<kRows>, Int<kHeadDim>>{}, make_stride(row_stride, _1{}));
}

// Key rows [col0, col0 + kBlockN) of KV head bidh_k, as (kBlockN, kHeadDim) global views of K and V
// (batch / varlen / cache offsets from binfo), returned as (gK, gV).
template <typename Element, int kBlockN, int kHeadDim, typename Params>
__forceinline__ __device__ auto kv_block_gmem(Params const &params, BlockInfo const &binfo, int bidb, int bidh_k,
                                              int col0) {
    using index_t = int64_t;
    Tensor gK = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.k_ptr) +
                                          binfo.k_offset(params.k_batch_stride, params.k_row_stride, bidb) +
                                          bidh_k * params.k_head_stride + index_t(col0) * params.k_row_stride),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(reinterpret_cast<Element *>(params.v_ptr) +
                                          binfo.k_offset(params.v_batch_stride, params.v_row_stride, bidb) +
                                          bidh_k * params.v_head_stride + index_t(col0) * params.v_row_stride),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(params.v_row_stride, _1{}));
    return cute::make_tuple(gK, gV);
}

// The barrier store_tile puts between its shared-memory writes and reads: the whole CTA.
struct CtaSync {
    __forceinline__ __device__ void operator()() const { __syncthreads(); }
};

// A (kRows, kCols) shared-memory tile s to the rows of gmem_ptr (row_stride apart) through
// registers, with GmemTiledCopy's 16-byte copies, predicated on rows < max_rows and columns <
// max_cols. tidx: the thread's index in the copy's thread layout.
template <typename GmemTiledCopy, int kRows, int kCols, typename TensorS, typename Element>
__forceinline__ __device__ void smem_tile_to_gmem(TensorS const &s, Element *gmem_ptr, int64_t row_stride, int max_rows,
                                                  int max_cols, int tidx) {
    Tensor g = make_tensor(make_gmem_ptr(gmem_ptr), Shape<Int<kRows>, Int<kCols>>{}, make_stride(row_stride, _1{}));
    GmemTiledCopy gmem_copy;
    auto thr_gmem_copy = gmem_copy.get_thread_slice(tidx);
    Tensor tS = thr_gmem_copy.partition_S(s);
    Tensor tG = thr_gmem_copy.partition_D(g);
    Tensor tR = make_tensor<Element>(shape(tG));
    cute::copy(gmem_copy, tS, tR);
    Tensor tC = thr_gmem_copy.partition_D(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));
    Tensor pred = make_col_predicate(tC, max_cols);
    copy_tile</*kClearOOB=*/false>(gmem_copy, tR, tG, tC, pred, max_rows);
}

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

    smem_tile_to_gmem<typename Traits::GmemTiledCopyStore, kRows, kCols>(s, gmem_ptr, row_stride, max_rows, max_cols,
                                                                         tidx);
}

// dK and dV of the key block at col0 (rows < keys_left, columns < d) to params.dk_ptr / dv_ptr
// through shared memory at smem (dK's tile, then dV's), after sync: a barrier telling that every
// reader of that shared memory is done (the whole CTA, or the warp-specialised consumers).
// dV: Traits::kHeadDimV columns (Traits::TiledMmadV, SmemLayoutdV; < params.dv where that
// differs from kHeadDim, < params.d otherwise).
template <typename Traits, typename TensorAcc, typename TensorAccV, typename Sync = CtaSync>
__forceinline__ __device__ void store_dk_dv(BwdParams const &params, BlockInfo const &binfo, TensorAcc const &acc_dk,
                                            TensorAccV const &acc_dv, char *smem, int bidb, int bidh, int col0,
                                            int keys_left, int tidx, Sync sync = {}) {
    using Element = typename Traits::Element;
    using index_t = int64_t;
    sync();
    Element *dk_ptr = reinterpret_cast<Element *>(params.dk_ptr) +
                      binfo.k_offset(params.dk_batch_stride, params.dk_row_stride, bidb) +
                      bidh * params.dk_head_stride + index_t(col0) * params.dk_row_stride;
    Element *dv_ptr = reinterpret_cast<Element *>(params.dv_ptr) +
                      binfo.k_offset(params.dv_batch_stride, params.dv_row_stride, bidb) +
                      bidh * params.dv_head_stride + index_t(col0) * params.dv_row_stride;
    constexpr int kdKVBytes = cosize(typename Traits::SmemLayoutdKV{}) * sizeof(Element);
    store_tile<Traits, typename Traits::TiledMmadKV>(acc_dk, smem, typename Traits::SmemLayoutdKV{}, dk_ptr,
                                                     params.dk_row_stride, keys_left, params.d, tidx, sync);
    store_tile<Traits, typename Traits::TiledMmadV>(acc_dv, smem + kdKVBytes, typename Traits::SmemLayoutdV{}, dv_ptr,
                                                    params.dv_row_stride, keys_left,
                                                    Traits::kHeadDimV == Traits::kHeadDim ? params.d : params.dv, tidx,
                                                    sync);
}

}  // namespace flash
