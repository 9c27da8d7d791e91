// Small CuTe helpers shared by the forward and backward kernels: register-fragment layout
// views, smem->register GEMM loops, predicated gmem<->smem tile copies and row reductions.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace flash {

using namespace cute;

// ---- fragment layouts -------------------------------------------------------------------------

// An MMA accumulator fragment viewed as (rows, cols).
//  SM80 (mma.sync): ((2, 2), MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)); mode 0 is
//    (2 adjacent cols) x (rows r, r+8).
//  SM90 (wgmma):    ((2, 2, N/8), MMA_M, MMA_N) -> ((2, MMA_M), (2, N/8, MMA_N)).
template <typename Layout>
__forceinline__ __device__ auto acc_layout_rowcol(Layout acc_layout) {
    static_assert(decltype(rank(acc_layout))::value == 3);
    if constexpr (decltype(rank<0>(acc_layout))::value == 3) {
        auto l = acc_layout;
        return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
    } else {
        static_assert(decltype(size<0>(acc_layout))::value == 4);
        auto l = logical_divide(acc_layout, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
        return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
    }
}

// An accumulator fragment reused as the 16-bit A operand of the next MMA (P stays in registers
// for P @ V):
//  SM80 m16n8k16: (4, MMA_M, MMA_N) -> ((4, 2), MMA_M, MMA_N / 2)
//  SM90 wgmma RS: ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, N/16 * MMA_N)
template <typename Layout>
__forceinline__ __device__ auto acc_layout_as_A(Layout acc_layout) {
    static_assert(decltype(rank(acc_layout))::value == 3);
    if constexpr (decltype(rank<0>(acc_layout))::value == 3) {
        auto l = logical_divide(get<0, 2>(acc_layout), Tile<_2>{});  // ((2, N / 16))
        return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout), get<0, 0>(l)),
                           get<1>(acc_layout), coalesce(make_layout(get<0, 1>(l), get<2>(acc_layout))));
    } else {
        static_assert(decltype(size<0>(acc_layout))::value == 4);
        auto l = logical_divide(acc_layout, Shape<Underscore, Underscore, _2>{});
        return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
    }
}

template <typename To, typename Engine, typename Layout>
__forceinline__ __device__ auto convert_type(Tensor<Engine, Layout> const &tensor) {
    using From = typename Engine::value_type;
    constexpr int numel = decltype(size(tensor))::value;
    cutlass::NumericArrayConverter<To, From, numel> convert_op;
    auto frag = convert_op(*reinterpret_cast<const cutlass::Array<From, numel> *>(tensor.data()));
    return make_tensor(make_rmem_ptr<To>(&frag), tensor.layout());
}

// tensor converted element-wise into dst, a register tensor of the target type and tensor's size:
// convert_type's result points into its converter's fragment, so it is copied out at once.
template <typename Engine, typename Layout, typename TensorDst>
__forceinline__ __device__ void convert_into(Tensor<Engine, Layout> const &tensor, TensorDst &dst) {
    Tensor converted = convert_type<typename TensorDst::value_type>(tensor);
    cute::copy(converted, dst);
}

// ---- GEMM loops over the K dimension (ldmatrix of slice k+1 overlaps the MMA of slice k) ------

template <typename TensorAcc, typename TensorA, typename TensorB, typename TensorSA, typename TensorSB,
          typename TiledMma, typename CopyA, typename CopyB, typename ThrCopyA, typename ThrCopyB>
__forceinline__ __device__ void gemm_ss(TensorAcc &acc, TensorA &tCrA, TensorB &tCrB, TensorSA const &tCsA,
                                        TensorSB const &tCsB, TiledMma tiled_mma, CopyA copy_a, CopyB copy_b,
                                        ThrCopyA thr_copy_a, ThrCopyB thr_copy_b) {
    Tensor tCrA_view = thr_copy_a.retile_D(tCrA);
    Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
    cute::copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
    cute::copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
        if (k < size<2>(tCrA) - 1) {
            cute::copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
            cute::copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
        }
        cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    }
}

// A already in registers (e.g. P), B streamed from shared memory.
template <typename TensorAcc, typename TensorA, typename TensorB, typename TensorSB, typename TiledMma,
          typename CopyB, typename ThrCopyB>
__forceinline__ __device__ void gemm_rs(TensorAcc &acc, TensorA &tCrA, TensorB &tCrB, TensorSB const &tCsB,
                                        TiledMma tiled_mma, CopyB copy_b, ThrCopyB thr_copy_b) {
    Tensor tCrB_view = thr_copy_b.retile_D(tCrB);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
        cute::copy(copy_b, tCsB(_, _, k), tCrB_view(_, _, k));
        cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    }
}

// ---- predicated tile copies --------------------------------------------------------------------

// Copy a (CPY, CPY_M, CPY_K) partition, skipping rows at or past max_rows and columns whose
// predicate is false. Skipped destination elements are zeroed, so stale shared memory can
// never leak NaN/Inf into a masked product (0 * NaN = NaN).
template <bool kClearOOB = true, typename TiledCopy, typename TensorS, typename TensorD, typename TensorC,
          typename TensorP>
__forceinline__ __device__ void copy_tile(TiledCopy tiled_copy, TensorS const &S, TensorD &D,
                                          TensorC const &identity, TensorP const &pred_k, int max_rows) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(S); ++m) {
        if (get<0>(identity(0, m, 0)) < max_rows) {
            CUTE_UNROLL
            for (int k = 0; k < size<2>(S); ++k) {
                if (pred_k(k)) {
                    cute::copy(tiled_copy, S(_, m, k), D(_, m, k));
                } else if (kClearOOB) {
                    cute::clear(D(_, m, k));
                }
            }
        } else if (kClearOOB) {
            cute::clear(D(_, m, _));
        }
    }
}

// cp.async loads of a (CPY, CPY_M, CPY_K) partition with zero-fill: rows at or past max_rows and
// columns whose predicate is false read nothing and write zeros (src-size 0), without branches.
template <typename TiledCopy, typename TensorS, typename TensorD, typename TensorC, typename TensorP>
__forceinline__ __device__ void load_tile_zfill(TiledCopy tiled_copy, TensorS const &S, TensorD &D,
                                                TensorC const &identity, TensorP const &pred_k, int max_rows) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(S); ++m) {
        const bool row_ok = get<0>(identity(0, m, 0)) < max_rows;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(S); ++k) { cute::copy(tiled_copy.with(row_ok && pred_k(k)), S(_, m, k), D(_, m, k)); }
    }
}

// Column predicates (head-dim bound) for a partitioned identity tensor.
template <typename TensorC>
__forceinline__ __device__ auto make_col_predicate(TensorC const &identity, int max_cols) {
    Tensor pred = make_tensor<bool>(make_shape(size<2>(identity)));
    CUTE_UNROLL
    for (int k = 0; k < size(pred); ++k) { pred(k) = get<1>(identity(0, 0, k)) < max_cols; }
    return pred;
}

__forceinline__ __device__ void cp_async_fence() { cute::cp_async_fence(); }
template <int N>
__forceinline__ __device__ void cp_async_wait() { cute::cp_async_wait<N>(); }

// ---- reductions across the 4 threads of an MMA quad that share a row --------------------------

template <typename Op>
__forceinline__ __device__ float quad_allreduce(float x, Op op) {
    x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
    x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
    return x;
}

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
};
struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace flash
