// Masking of score tiles: keys past seqlen_k and keys outside the (causal / sliding) window.
// One function serves forward and backward: element coordinates come from the MMA's own
// partition of an identity tensor, so any warp arrangement of the tiled MMA is handled.
#pragma once

#include <cute/tensor.hpp>

#include "flash.h"
#include "utils.h"

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
    template <typename TensorAcc, typename TensorCoord>
    __device__ void apply(TensorAcc &acc, TensorCoord const &coords, int row0, int col0) const {
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            const int row = row0 + get<0>(coords(i));
            const int col = col0 + get<1>(coords(i));
            // Bitwise | and a select: short-circuit || here compiles to a branch per element.
            const bool masked = (col >= seqlen_k) | (col > row + diag + window_right) | (col < row + diag - window_left);
            acc(i) = masked ? -INFINITY : acc(i);
        }
    }
};

}  // namespace flash
