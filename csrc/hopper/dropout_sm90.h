// Dropout for the sm_90a kernels: the same mask as the SM80-class kernels (attn_mods.h), a pure
// function of (seed, offset, b, h, row, col), generated in the layouts of the wgmma kernels.
//
// One Philox call yields the keep bytes of one group: rows {r, r + 8} (r % 16 < 8) x columns
// {c, c + 1, c + 32, c + 33, c + 64, c + 65, c + 96, c + 97} (c % 32 < 8, even) of a 128-column
// block. The forward's accumulator (query rows, key columns) gives each thread whole groups, as
// in the SM80 kernels. The backward's transposed tiles (key rows, query columns) do not, so its
// CTA generates the tile's groups cooperatively into a byte matrix in shared memory.
#pragma once

#include <cute/tensor.hpp>

#include "../attn_mods.h"

namespace flash {

using namespace cute;

// Forward: f(i, keep) for every element i of a wgmma accumulator ((2, 2, N/8), 1, 1) whose
// coordinates (query row, key column) are coords(i); col0 is the tile's first key (a multiple
// of the tile width, which divides 128 or is a multiple of it).
template <int kBlockN, typename TensorCoord, typename F>
__forceinline__ __device__ void dropout_for_each_sm90(Dropout const &dropout, TensorCoord const &coords, int row0,
                                                      int col0, F &&f) {
    constexpr int kAtomsN = kBlockN / 8;  // 8-column atoms along N; the thread owns each one's 2x2
    static_assert(kBlockN % 32 == 0);
    CUTE_UNROLL
    for (int blk = 0; blk < (kAtomsN + 15) / 16; ++blk) {  // 128-column blocks
        CUTE_UNROLL
        for (int g = 0; g < 4; ++g) {  // atom j with j % 4 == g: (col / 8) % 4 == g
            const int j_first = blk * 16 + g;
            const int i_first = 4 * j_first;  // element (c2 = 0, r2 = 0, j)
            const int row = row0 + get<0>(coords(i_first));
            const int col = col0 + get<1>(coords(i_first));
            const uint4 r = philox4x32_10(dropout_counter(dropout.base, dropout.bh, row, col), dropout.k0, dropout.k1);
            const int w0 = (col % 128) / 32;
            CUTE_UNROLL
            for (int t = 0; t < 4; ++t) {
                const int j = j_first + 4 * t;
                if (j < kAtomsN) {  // with 64-column tiles, w0 is 0 or 2 and t stops at 1
                    const uint32_t word = pick_word(r, w0 + t);
                    CUTE_UNROLL
                    for (int e = 0; e < 4; ++e) {  // e = c2 + 2 * r2 = (col % 2) + 2 * ((row % 16) / 8)
                        f(4 * j + e, ((word >> (8 * e)) & 0xffu) < dropout.threshold);
                    }
                }
            }
        }
    }
}

// Backward: writes keep[(col - col0) * kBlockM + (row - row0)] (1 = kept) for the
// (kBlockM x kBlockN) tile at (row0, col0), with kThreads threads sharing the work. col0 is a
// multiple of kBlockN; kBlockN divides 128 or is 128.
template <int kBlockM, int kBlockN, int kThreads>
__forceinline__ __device__ void dropout_tile_to_smem(Dropout const &dropout, uint8_t *keep, int row0, int col0,
                                                     int tidx) {
    static_assert(kBlockM % 16 == 0 && (128 % kBlockN == 0));
    // Groups: (row / 16, row % 8, (col % 8) / 2, (col / 8) % 4) over the tile's 128-column block.
    constexpr int kGroups = (kBlockM / 16) * 8 * 4 * 4;
    const int col_blk = col0 - col0 % 128;
    CUTE_UNROLL
    for (int gi = 0; gi < (kGroups + kThreads - 1) / kThreads; ++gi) {
        const int g = tidx + gi * kThreads;
        if (kGroups % kThreads != 0 && g >= kGroups) break;
        const int c32 = g % 4, c4 = (g / 4) % 4, r8 = (g / 16) % 8, rb = g / 128;
        const int row = row0 + rb * 16 + r8;
        const int col = col_blk + c32 * 8 + c4 * 2;
        const uint4 r = philox4x32_10(dropout_counter(dropout.base, dropout.bh, row, col), dropout.k0, dropout.k1);
        CUTE_UNROLL
        for (int w = 0; w < 4; ++w) {
            const int colw = col + 32 * w;
            if (colw < col0 || colw >= col0 + kBlockN) continue;
            const uint32_t word = pick_word(r, w);
            CUTE_UNROLL
            for (int e = 0; e < 4; ++e) {
                const int c = colw + (e & 1) - col0, rr = row + 8 * (e >> 1) - row0;
                keep[c * kBlockM + rr] = ((word >> (8 * e)) & 0xffu) < dropout.threshold;
            }
        }
    }
}

}  // namespace flash
