// Online softmax over score tiles held in registers (running row max and row sum).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "utils.h"

namespace flash {

using namespace cute;

// scores(r, c) <- exp2(scores(r, c) * scale_log2 - row_offset(r) * offset_scale).
// A row whose offset is -inf (nothing visible yet) uses 0 so that -inf scores give 0, not NaN.
template <typename TensorS, typename TensorR>
__forceinline__ __device__ void exp2_rows(TensorS &scores, TensorR const &row_offset, float scale_log2,
                                          float offset_scale) {
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(scores); ++mi) {
        const float offset = row_offset(mi) == -INFINITY ? 0.f : row_offset(mi) * offset_scale;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(scores); ++ni) {
            scores(mi, ni) = exp2f(scores(mi, ni) * scale_log2 - offset);
        }
    }
}

template <int kNRows>
struct OnlineSoftmax {
    using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
    RowTensor row_max, row_sum;

    // Folds one masked score tile (MMA accumulator layout) into the running statistics,
    // rescales the output accumulator, and leaves exp(scores - max) in acc_s.
    template <bool kFirst, typename TensorS, typename TensorO>
    __forceinline__ __device__ void update(TensorS &acc_s, TensorO &acc_o, float scale_log2) {
        Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
        static_assert(decltype(size<0>(scores))::value == kNRows);
        if constexpr (kFirst) {
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                float m = -INFINITY;
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(scores); ++ni) { m = fmaxf(m, scores(mi, ni)); }
                row_max(mi) = quad_allreduce(m, MaxOp{});
            }
            exp2_rows(scores, row_max, scale_log2, scale_log2);
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                float s = 0.f;
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(scores); ++ni) { s += scores(mi, ni); }
                row_sum(mi) = s;  // per-thread partial: the quad reduction happens once, at the end
            }
        } else {
            Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                float m = row_max(mi);
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(scores); ++ni) { m = fmaxf(m, scores(mi, ni)); }
                m = quad_allreduce(m, MaxOp{});
                const float prev = row_max(mi);
                row_max(mi) = m;
                // exp2((prev - cur) * scale); an all-masked row so far (cur = -inf) keeps scale 1.
                const float rescale = m == -INFINITY ? 1.f : exp2f((prev - m) * scale_log2);
                row_sum(mi) *= rescale;
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { acc_o_rc(mi, ni) *= rescale; }
            }
            exp2_rows(scores, row_max, scale_log2, scale_log2);
            CUTE_UNROLL
            for (int mi = 0; mi < kNRows; ++mi) {
                float s = row_sum(mi);
                CUTE_UNROLL
                for (int ni = 0; ni < size<1>(scores); ++ni) { s += scores(mi, ni); }
                row_sum(mi) = s;
            }
        }
    }

    // Divides acc_o by the row sums and returns the natural-log LSE per row.
    // A row with no visible key gets out = 0 and lse = +inf (as upstream).
    template <typename TensorO>
    __forceinline__ __device__ RowTensor finalize(TensorO &acc_o, float scale) {
        RowTensor lse;
        Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            const float sum = quad_allreduce(row_sum(mi), SumOp{});
            const bool empty = sum == 0.f || sum != sum;
            lse(mi) = empty ? INFINITY : row_max(mi) * scale + __logf(sum);
            const float inv_sum = empty ? 1.f : 1.f / sum;
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { acc_o_rc(mi, ni) *= inv_sum; }
        }
        return lse;
    }
};

}  // namespace flash
