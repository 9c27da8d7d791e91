// Masking of score tiles: keys past seqlen_k and keys outside the (causal / sliding) window.
// One function serves forward and backward: element coordinates come from the MMA's own
// partition of an identity tensor, so any warp arrangement of the tiled MMA is handled.
#pragma once

#include <cute/tensor.hpp>

#include "flash.h"

namespace flash {

using namespace cute;

struct Mask {
    int seqlen_k;
    int diag;          // seqlen_k - seqlen_q: bottom-right alignment of the causal diagonal
    int window_left;   // kWindowUnbounded when the side is open
    int window_right;

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
