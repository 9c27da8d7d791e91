// Online softmax over score tiles held in registers (running row max and row sum).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/utils.h"

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

// The learnable attention sink of query head `head` (FwdParams::learnable_sink: fp32, one logit
// per query head), -inf without one.
template <typename Params>
__forceinline__ __device__ float learnable_sink_of(Params const &params, int head) {
    return params.learnable_sink == nullptr ? -INFINITY : params.learnable_sink[head];
}

// The LSE of a row with no visible key: the sink's logit, or +inf without a sink.
__forceinline__ __device__ float empty_row_lse(float sink) { return sink == -INFINITY ? INFINITY : sink; }

template <int kNRows>
struct OnlineSoftmax {
    using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
    RowTensor row_max, row_sum;

    // The state before the first tile: max -inf, sum 0.
    __forceinline__ __device__ void reset() {
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) { row_max(mi) = -INFINITY, row_sum(mi) = 0.f; }
    }

    // Folds one masked score tile (MMA accumulator layout) into the running statistics and
    // leaves exp(scores - max) in acc_s. Returns the factor each row of the output accumulator
    // must be multiplied by (all 1 on the first tile); the Hopper kernel applies it only once
    // the P V GEMM still in flight has finished.
    //
    // kLazyLog2 > 0 (FlashAttention-4's conditional rescaling): a row keeps its running max unless
    // the new one exceeds it by more than kLazyLog2 in the exp2 domain, so its exponentials may
    // reach 2^kLazyLog2 (256 for 8: exact in fp32, and bf16 / fp16 P keep their relative
    // precision), and its rescale factor stays exactly 1. Nothing else changes: the row sum and O
    // carry the same stale max, and finalize's lse = max * scale + log(sum) is the same value. After
    // the first tiles most rows keep their max, and the caller skips O's rescale when no row of
    // the warp moved (rescale_o_if_moved). A row seen -inf so far adopts any finite max (the
    // difference is +inf); -inf after -inf compares false (NaN) and keeps -inf.
    template <bool kFirst, int kLazyLog2 = 0, typename TensorS>
    __forceinline__ __device__ RowTensor update_scores(TensorS &acc_s, float scale_log2) {
        Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
        static_assert(decltype(size<0>(scores))::value == kNRows);
        RowTensor rescale;
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            float m = kFirst ? -INFINITY : row_max(mi);
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(scores); ++ni) { m = fmaxf(m, scores(mi, ni)); }
            m = quad_allreduce(m, MaxOp{});
            if constexpr (!kFirst && kLazyLog2 > 0) {
                const bool adopt = (m - row_max(mi)) * scale_log2 > float(kLazyLog2);
                rescale(mi) = adopt ? exp2f((row_max(mi) - m) * scale_log2) : 1.f;
                row_max(mi) = adopt ? m : row_max(mi);
                continue;
            }
            // exp2((prev - cur) * scale); a row with nothing visible so far (cur = -inf) keeps 1.
            rescale(mi) = kFirst || m == -INFINITY ? 1.f : exp2f((row_max(mi) - m) * scale_log2);
            row_max(mi) = m;
        }
        exp2_rows(scores, row_max, scale_log2, scale_log2);
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            // Per-thread partial sums: the quad reduction happens once, in finalize().
            float sum = kFirst ? 0.f : row_sum(mi) * rescale(mi);
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(scores); ++ni) { sum += scores(mi, ni); }
            row_sum(mi) = sum;
        }
        return rescale;
    }

    // rescale_o unless every row of the warp keeps factor 1 (a warp vote: the skip is warp-uniform,
    // and multiplying by 1 is exact, so the result is bitwise that of rescale_o).
    template <typename TensorO>
    __forceinline__ __device__ static void rescale_o_if_moved(TensorO &acc_o, RowTensor const &rescale) {
        bool moved = false;
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) { moved |= rescale(mi) != 1.f; }
        if (__any_sync(0xffffffffu, moved)) { rescale_o(acc_o, rescale); }
    }

    template <typename TensorO>
    __forceinline__ __device__ static void rescale_o(TensorO &acc_o, RowTensor const &rescale) {
        Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { acc_o_rc(mi, ni) *= rescale(mi); }
        }
    }

    template <bool kFirst, typename TensorS, typename TensorO>
    __forceinline__ __device__ void update(TensorS &acc_s, TensorO &acc_o, float scale_log2) {
        RowTensor rescale = update_scores<kFirst>(acc_s, scale_log2);
        if constexpr (!kFirst) { rescale_o(acc_o, rescale); }
    }

    // Divides acc_o by the row sums (and multiplies it by o_scale: 1 / (1 - p) with dropout) and
    // returns the natural-log LSE per row. A row with no visible key gets out = 0 and lse = +inf.
    //
    // sink: a learnable attention sink, one extra logit per row (natural-log units, the scores'
    // scale) that enters the denominator and carries no value; -inf is none. With m = max * scale
    // and M = max(m, sink), the denominator is sum exp(m - M) + exp(sink - M), where one term's
    // exponential is exp(0) = 1 and the other's exp(-|m - sink|): no exponential overflows whatever
    // the sink, and an empty row gets out = 0 and lse = sink. Without a sink, m wins every row
    // (kept = 1, exp(-inf) = 0): denom is sum, and lse and out are bitwise those of the plain
    // formulas (lse = fma(max, scale, log(sum)), out / sum).
    // Selects, not a branch on the sink: with a branch, ptxas scheduled each row's normalisation
    // as a block of its own after the last P V GEMM, and the persistent WS forward's store set-up
    // (the tile's coordinates, two integer divisions) after both, where one block overlaps them
    // with that GEMM (d64 epilogue, static stall cycles: 786 with the branch, 641 with the
    // selects, 626 with no sink code; 512-token WS forward A/B 0.975-0.987 with the branch).
    // The selects cost one exp per row.
    template <typename TensorO>
    __forceinline__ __device__ RowTensor finalize(TensorO &acc_o, float scale, float o_scale = 1.f,
                                                  float sink = -INFINITY) {
        RowTensor lse;
        Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
        CUTE_UNROLL
        for (int mi = 0; mi < kNRows; ++mi) {
            const float sum = quad_allreduce(row_sum(mi), SumOp{});
            const bool empty = sum == 0.f || sum != sum;
            const float m = empty ? -INFINITY : row_max(mi) * scale;
            const bool row_wins = m >= sink;  // M = m; every row without a sink
            // (NaN for an empty row without a sink: it reaches neither lse nor factor.)
            const float e = __expf(-fabsf(m - sink));
            const float kept = row_wins ? 1.f : e;  // exp(m - M)
            const float denom = sum * kept + (row_wins ? e : 1.f);
            // M + log(denom); where m wins, fma(max, scale, log(denom)) as in the plain formula.
            lse(mi) = empty ? empty_row_lse(sink)
                            : fmaf(row_wins ? row_max(mi) : sink, row_wins ? scale : 1.f, __logf(denom));
            // Empty rows: acc_o is 0 already (no P V term), and stays so.
            const float factor = empty ? 1.f : o_scale * kept / denom;
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { acc_o_rc(mi, ni) *= factor; }
        }
        return lse;
    }
};

}  // namespace flash
