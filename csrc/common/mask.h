// Masking of score tiles: keys past seqlen_k and keys outside the (causal / sliding) window.
// One function serves forward and backward: element coordinates come from the MMA's own
// partition of an identity tensor, so any warp arrangement of the tiled MMA is handled.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "common/utils.h"

namespace flash {

using namespace cute;

struct Mask {
    int seqlen_k;
    int diag;          // seqlen_k - seqlen_q: bottom-right alignment of the causal diagonal
    int window_left;   // kWindowUnbounded when the side is open
    int window_right;

    // Key blocks [n_min, n_max) that query rows [row0, row0 + M) can see (n_max <= n_min: none).
    __device__ void n_block_range(int row0, int M, int N, int &n_min, int &n_max) const {
        n_max = ceil_div(seqlen_k, N);
        if (window_right < kWindowUnbounded) n_max = min(n_max, ceil_div(row0 + M + diag + window_right, N));
        n_min = window_left < kWindowUnbounded ? max(0, (row0 + diag - window_left) / N) : 0;
    }

    // Query blocks [m_min, m_max) that can see some key of [col0, col0 + N).
    __device__ void m_block_range(int col0, int N, int M, int &m_min, int &m_max) const {
        m_max = ceil_div(seqlen_k - diag, M);  // seqlen_q
        if (window_left < kWindowUnbounded) m_max = min(m_max, ceil_div(col0 + N + window_left - diag, M));
        m_min = window_right < kWindowUnbounded ? max(0, (col0 - diag - window_right) / M) : 0;
    }

    // The highest key block whose m_block_range contains m_block (for a block that some key block
    // sees): the key blocks seeing a query block form an interval, as both ends of m_block_range
    // grow with the key block.
    __device__ int last_n_block_seeing(int m_block, int M, int N) const {
        int n_last = ceil_div(seqlen_k, N) - 1;
        if (window_right < kWindowUnbounded) {
            // m_min(n) <= m_block  <=>  n * N < (m_block + 1) * M + diag + window_right
            const int lim = (m_block + 1) * M + diag + window_right;
            n_last = min(n_last, lim > 0 ? (lim - 1) / N : -1);
        }
        return n_last;
    }

    // The lowest key block whose m_block_range contains m_block (for a block that some key block
    // sees): m_max(n) > m_block  <=>  n * N > m_block * M + diag - window_left - N.
    __device__ int first_n_block_seeing(int m_block, int M, int N) const {
        if (window_left >= kWindowUnbounded) return 0;
        const int t = m_block * M + diag - window_left - N;
        return t < 0 ? 0 : t / N + 1;
    }

    // Whether any element of the (row0.., col0..) tile of size (M, N) needs masking.
    __device__ bool tile_needs_mask(int row0, int col0, int M, int N) const {
        const bool past_end = col0 + N > seqlen_k;
        const bool right = col0 + N - 1 > row0 + diag + window_right;
        const bool left = col0 < row0 + M - 1 + diag - window_left;
        return past_end || right || left;
    }

    // acc: an MMA accumulator fragment; coords: thr_mma.partition_C(identity(M, N)).
    // Element i of a thread sits at the thread's first coordinate coords(0) plus a compile-time
    // offset (a CuTe layout maps coordinate 0 to 0, and the MMA partitions' thread and value parts
    // add without carries). So the bounds are computed per row relative to the thread's first
    // column, and each element costs one compare of its constant column offset (an immediate)
    // per bound and a select: 2 instructions per element for causal calls, where comparing the
    // absolute column against the sequence end and both window sides took 3 compares, the column
    // add and the select (ncu: ISETP / FSEL / VIADD ~10% of the stall samples of a
    // 512-token causal d64 forward).
    template <typename TensorAcc, typename TensorCoord>
    __device__ void apply(TensorAcc &acc, TensorCoord const &coords, int row0, int col0) const {
        if (window_left >= kWindowUnbounded) {
            apply_bounds<false>(acc, coords, row0, col0);
        } else {
            apply_bounds<true>(acc, coords, row0, col0);
        }
    }

    template <bool kLeft, typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply_bounds(TensorAcc &acc, TensorCoord const &coords, int row0, int col0) const {
        const int row_t = row0 + get<0>(coords(0));
        const int col_t = col0 + get<1>(coords(0));
        // Element (row_t + dr, col_t + dc) is visible iff dc < seqlen_k - col_t, dc < right_t + dr
        // (window_right <= 2^29: no overflow) and, with a left window, dc >= left_t + dr.
        const int end_t = seqlen_k - col_t;
        const int right_t = row_t + diag + window_right + 1 - col_t;
        const int left_t = row_t + diag - window_left - col_t;
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            const int dr = get<0>(coords(i)) - get<0>(coords(0));  // compile-time after folding
            const int dc = get<1>(coords(i)) - get<1>(coords(0));
            const int hi = min(end_t, right_t + dr);  // one per row of the thread (CSE)
            // Bitwise | and a select: short-circuit || here compiles to a branch per element.
            const bool masked = kLeft ? (dc >= hi) | (dc < left_t + dr) : dc >= hi;
            acc(i) = masked ? -INFINITY : acc(i);
        }
    }

    // The backward's transposed tile S^T: coords_st(i) = (key, query) offsets from (col0, row0);
    // query rows at or past seqlen_q are masked too (their LSE box holds another row's value).
    // As in apply, per-element compile-time offsets (dk, dq): the window's right side is a bound
    // on dk per query column, its left side a bound on the constant dk - dq.
    template <typename TensorAcc, typename TensorCoord>
    __device__ void apply_t(TensorAcc &acc, TensorCoord const &coords_st, int row0, int col0, int seqlen_q) const {
        if (window_left >= kWindowUnbounded) {
            apply_t_bounds<false>(acc, coords_st, row0, col0, seqlen_q);
        } else {
            apply_t_bounds<true>(acc, coords_st, row0, col0, seqlen_q);
        }
    }

    template <bool kLeft, typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply_t_bounds(TensorAcc &acc, TensorCoord const &coords_st, int row0, int col0,
                                                   int seqlen_q) const {
        const int key_t = col0 + get<0>(coords_st(0));
        const int row_t = row0 + get<1>(coords_st(0));
        // Element (key_t + dk, row_t + dq) is visible iff dk < seqlen_k - key_t, dq < seqlen_q - row_t,
        // dk < right_t + dq (key <= row + diag + window_right) and, with a left window,
        // dk - dq >= left_t (key >= row + diag - window_left).
        const int end_k = seqlen_k - key_t;
        const int end_q = seqlen_q - row_t;
        const int right_t = row_t + diag + window_right + 1 - key_t;
        const int left_t = row_t + diag - window_left - key_t;
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            const int dk = get<0>(coords_st(i)) - get<0>(coords_st(0));  // compile-time after folding
            const int dq = get<1>(coords_st(i)) - get<1>(coords_st(0));
            const int hi = min(end_k, right_t + dq);  // one per query column of the thread (CSE)
            const bool masked = kLeft ? (dk >= hi) | (dq >= end_q) | (dk - dq < left_t) : (dk >= hi) | (dq >= end_q);
            acc(i) = masked ? -INFINITY : acc(i);
        }
    }
};

}  // namespace flash
