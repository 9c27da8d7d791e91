// Dropout for the sm_90a kernels: the same mask as the SM80-class kernels (attn_mods.h), a pure
// function of (seed, offset, b, h, row, col), generated in the layouts of the wgmma kernels.
//
// One Philox call yields the keep bytes of one group: rows {r, r + 8} (r % 16 < 8) x columns
// {c, c + 1, c + 32, c + 33, c + 64, c + 65, c + 96, c + 97} (c % 32 < 8, even) of a 128-column
// block; word w holds columns {c, c + 1} + 32 w, byte e = (col % 2) + 2 * ((row % 16) / 8).
//
// Cost is what matters here (issue 3: dropout <= 15% of plain forward + backward), so:
//  - the bytes are compared with the threshold four at a time (drop_flags: three integer ops per
//    word, the flag lands in bit 7 of each byte), and dropped elements are cleared in the packed
//    16-bit P with one PRMT (sign-replicating those flags into 16-bit masks) and one AND per pair;
//  - the Philox work never waits on the scores: the forward generates a tile's flags while its
//    S GEMM runs and parks them in shared memory (no registers held across the softmax); the
//    backward generates the next query block's flags while GEMMs run (mode 0 / 2: the S / dP
//    window; mode 1, the default: the dV / dK / dQ window, see flash_bwd_kernel_sm90.h).
//  The forward's accumulator (query rows, key columns) gives each thread whole groups. The
//  backward's transposed tiles (key rows, query columns) do not, so its CTA generates groups
//  cooperatively and every thread then loads the 16 words it needs from shared memory.
#pragma once

#include <cute/tensor.hpp>

#include "common/attn_mods.h"

namespace flash {

using namespace cute;

__forceinline__ __device__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
    return r;
}

// Byte-parallel "byte >= threshold" (dropped) for threshold in [1, 255]: bit 7 of each result
// byte is the flag, the other bits are garbage. With a = 128 a7 + a_lo and t = 128 t7 + t_lo,
// (a | 0x80) - t_lo = 128 + a_lo - t_lo never borrows across bytes and has bit 7 = (a_lo >= t_lo);
// a >= t is then majority(a7, !t7, that bit).
struct DropFlags {
    uint32_t t_lo;   // (threshold & 0x7f) in every byte
    uint32_t not_t;  // ~threshold in every byte

    __device__ explicit DropFlags(uint32_t threshold)
        : t_lo((threshold & 0x7fu) * 0x01010101u), not_t(~(threshold * 0x01010101u)) {}

    __device__ __forceinline__ uint32_t operator()(uint32_t word) const {
        const uint32_t lo_ge = (word | 0x80808080u) - t_lo;
        return (word & not_t) | (word & lo_ge) | (not_t & lo_ge);
    }
};

// 16-bit masks (0xffff = dropped) of bytes e0 (low half) and e1 (high half) of `flags`.
__forceinline__ __device__ uint32_t pair_drop_mask(uint32_t flags, int e0, int e1) {
    return prmt(flags, 0u, uint32_t(0x88 | e0 * 0x11) | (uint32_t(0x88 | e1 * 0x11) << 8));
}

// ---- forward ----------------------------------------------------------------------------------

// Drop flags of the thread's elements in the 128-column block that contains the tile at col0:
// one Philox call (four words) per group g = (col / 8) % 4, stored at flags[g * kThreads + tidx]
// (16-byte stores, each thread reads back only its own). coords: the tile's wgmma accumulator
// coordinates ((2, 2, N/8), 1, 1) -> (query row, key column).
template <int kThreads, typename TensorCoord>
__forceinline__ __device__ void dropout_fwd_generate(Dropout const &dropout, TensorCoord const &coords, int row0,
                                                     int col0, uint4 *flags, int tidx) {
    const DropFlags drop_flags(dropout.threshold);
    CUTE_UNROLL
    for (int g = 0; g < 4; ++g) {
        const int row = row0 + get<0>(coords(4 * g));
        const int col = col0 - col0 % 128 + get<1>(coords(4 * g));  // (col / 8) % 4 == g
        uint4 r = philox4x32(dropout_counter(dropout.base, dropout.bh, row, col), dropout.k0, dropout.k1);
        r = make_uint4(drop_flags(r.x), drop_flags(r.y), drop_flags(r.z), drop_flags(r.w));
        flags[g * kThreads + tidx] = r;
    }
}

// The same flags as dropout_fwd_generate, for the warp-specialised forward: kUnroll Philox calls
// in flight at a time (register pressure at 160 / 240 registers), and counters computed from the
// column inside the 128-key group: for col = 128 q + c (0 <= c < 128), dropout_counter(base, bh,
// row, col) == dropout_counter(base + 4 q, bh, row, c) (x = base + 4 q + (c / 8) % 4, z uses c % 8).
template <int kThreads, int kUnroll, typename TensorCoord>
__forceinline__ __device__ void dropout_fwd_generate_group(Dropout const &dropout, TensorCoord const &coords, int row0,
                                                           int col0, uint4 *flags, int tidx) {
    static_assert(4 % kUnroll == 0);
    const DropFlags drop_flags(dropout.threshold);
    const uint64_t base = dropout.base + uint64_t(4 * (col0 / 128));
#pragma unroll kUnroll
    for (int g = 0; g < 4; ++g) {
        const int row = row0 + get<0>(coords(4 * g));
        const int c = get<1>(coords(4 * g));  // 8 g + 2 (lane % 4): (c / 8) % 4 == g
        uint4 r = philox4x32(dropout_counter(base, dropout.bh, row, c), dropout.k0, dropout.k1);
        r = make_uint4(drop_flags(r.x), drop_flags(r.y), drop_flags(r.z), drop_flags(r.w));
        flags[g * kThreads + tidx] = r;
    }
}

// Clears the dropped elements of the packed P of the tile at col0 (kBlockN = 64 or 128 columns;
// a 64-column tile uses words 0-1 or 2-3 of each group).
template <int kBlockN, int kThreads, typename TensorP>
__forceinline__ __device__ void dropout_fwd_apply(TensorP &rP, uint4 const *flags, int col0, int tidx) {
    static_assert(kBlockN == 64 || kBlockN == 128);
    static_assert(sizeof(typename TensorP::value_type) == 2);
    Tensor rP32 = recast<uint32_t>(rP);  // pair 2j: (row r, cols c, c+1) of atom j; 2j+1: row r+8
    const bool upper_half = kBlockN == 64 && col0 % 128 != 0;
    CUTE_UNROLL
    for (int g = 0; g < 4; ++g) {
        const uint4 r = flags[g * kThreads + tidx];
        CUTE_UNROLL
        for (int t = 0; t < kBlockN / 32; ++t) {
            const int j = g + 4 * t;  // atom j covers columns 8j..8j+7 of the tile: word t (+2)
            const uint32_t word = kBlockN == 128 ? pick_word(r, t) : (upper_half ? pick_word(r, 2 + t) : pick_word(r, t));
            rP32(2 * j) &= ~pair_drop_mask(word, 0, 1);
            rP32(2 * j + 1) &= ~pair_drop_mask(word, 2, 3);
        }
    }
}

// ---- backward ---------------------------------------------------------------------------------

// The backward's (kBlockM = 64 queries x kBlockN = 128 keys) tile has 512 groups, (c32, c4) =
// ((col / 8) % 4, (col % 8) / 2), (r8, rb) = (row % 8, row / 16) (flash_bwd_kernel_sm90.h).
//
// Layout 2 (the first layout, 16 LDS.32 with run-time swizzled addresses per reader, was removed
//): the reader's 16 words are 4 LDS.128 and the writer's 8 words are 4 STS.64.
// Word w of group (c32, c4, r8, rb) serves keys 32 w + 8 c32 + 2 c4 + {0, 1}, i.e. key pair
// kp = 16 w + 4 c32 + c4, and query rows 16 rb + r8 + {0, 8}; it lives at word
// kp * 32 + r8 * 4 + rb. A reader (key x, query 2m of element 0) wants groups r8 = 2m + jb
// (jb = 0: word a, 1: word b) of all four rb: words (x / 2) * 32 + 8 m + 4 jb + rb, two 16-byte
// loads (conflict-free: a load's 8-lane phase touches 4 distinct 16-byte chunks, 8 m apart).
// The writer (thread t: r8 = t % 8, h = (t / 8) % 2, c = c32 + 4 c4 = t / 16) computes groups
// rb = 2 h, 2 h + 1 and stores each word pair with one 8-byte store (a 16-lane phase covers
// 32 distinct banks).
struct DropoutBwdLayout2 {
    __host__ __device__ static constexpr int index(int kp, int r8, int rb) { return kp * 32 + r8 * 4 + rb; }
};

template <int kBlockM, int kBlockN, int kThreads>
__forceinline__ __device__ void dropout_bwd_generate2(Dropout const &dropout, uint32_t *flags, int m_block,
                                                      int n_block, int tidx) {
    static_assert(kBlockM == 64 && kBlockN == 128 && kThreads == 256);
    const DropFlags drop_flags(dropout.threshold);
    const int r8 = tidx % 8, h = (tidx / 8) % 2, c32 = (tidx / 16) % 4, c4 = tidx / 64;
    // dropout_counter(base, bh, row, col) at row = 64 m_block + 16 (2 h + hh) + r8,
    // col = 128 n_block + 8 c32 + 2 c4: x = base + 4 n_block + c32, z = 128 m_block + 32 (2 h + hh)
    // + 4 r8 + c4.
    const uint64_t x = dropout.base + uint64_t(4 * n_block + c32);
    const uint32_t z = uint32_t(m_block) * 128u + uint32_t(64 * h + 4 * r8 + c4);
    const uint4 r0 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z, dropout.bh), dropout.k0, dropout.k1);
    const uint4 r1 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z + 32u, dropout.bh), dropout.k0,
                                dropout.k1);
    uint2 *dst = reinterpret_cast<uint2 *>(flags + DropoutBwdLayout2::index(4 * c32 + c4, r8, 2 * h));
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) {  // kp + 16 w: + 512 words
        dst[w * 256] = make_uint2(drop_flags(pick_word(r0, w)), drop_flags(pick_word(r1, w)));
    }
}

// The transposed accumulators S^T / dP^T ((2, 2, kBlockM / 8), 1, 1): element 4j + 2 r2 + c2 is
// (key x0 + 8 r2, query 8j + 2m + c2), x0 and 2m = the coordinates of element 0. Its flag is
// byte (x % 2) + 2 (j % 2) of word x / 32 of group (c32, c4) of key x, r8 = 2m + c2, rb = j / 2:
// two loaded words (c2 = 0, 1) serve the four elements of atoms 2 rb and 2 rb + 1 of a key.
template <int kBlockM, typename TensorCoord, typename F>
__forceinline__ __device__ void dropout_bwd_for_each_word_pair2(uint32_t const *flags, TensorCoord const &coords,
                                                                F &&f) {
    static_assert(kBlockM == 64);
    const int x0 = get<0>(coords(0)), m2 = get<1>(coords(0));
    const uint4 *src = reinterpret_cast<const uint4 *>(flags + DropoutBwdLayout2::index(x0 / 2, m2, 0));
    CUTE_UNROLL
    for (int r2 = 0; r2 < 2; ++r2) {
        const int x = x0 + 8 * r2;                // (x / 2) * 32 = (x0 / 2) * 32 + 128 r2 words
        const uint4 wa = src[r2 * 32], wb = src[r2 * 32 + 1];
        CUTE_UNROLL
        for (int rb = 0; rb < 4; ++rb) {
            const uint32_t a = pick_word(wa, rb), b = pick_word(wb, rb);
            CUTE_UNROLL
            for (int jj = 0; jj < 2; ++jj) { f(r2, 2 * rb + jj, x % 2 + 2 * jj, a, b); }
        }
    }
}

template <int kBlockM, typename TensorP, typename TensorCoord>
__forceinline__ __device__ void dropout_bwd_apply_p2(TensorP &rP, uint32_t const *flags, TensorCoord const &coords) {
    static_assert(sizeof(typename TensorP::value_type) == 2);
    Tensor rP32 = recast<uint32_t>(rP);
    dropout_bwd_for_each_word_pair2<kBlockM>(flags, coords, [&](int r2, int j, int e, uint32_t a, uint32_t b) {
        const uint32_t selector = uint32_t(0x88 | e * 0x11) | (uint32_t(0xcc | e * 0x11) << 8);
        rP32(2 * j + r2) &= ~prmt(a, b, selector);
    });
}

template <int kBlockM, typename TensorAcc, typename TensorCoord>
__forceinline__ __device__ void dropout_bwd_apply_dp2(TensorAcc &acc, uint32_t const *flags, TensorCoord const &coords) {
    dropout_bwd_for_each_word_pair2<kBlockM>(flags, coords, [&](int r2, int j, int e, uint32_t a, uint32_t b) {
        const uint32_t selector = (0x8u | uint32_t(e)) * 0x1111u;
        const int i = 4 * j + 2 * r2;
        acc(i) = __uint_as_float(__float_as_uint(acc(i)) & ~prmt(a, 0u, selector));
        acc(i + 1) = __uint_as_float(__float_as_uint(acc(i + 1)) & ~prmt(b, 0u, selector));
    });
}

// ---- backward, head dim 256 (the split-d kernel's exchange form) ----------------------------
// 64-key CTAs: a key block n is half (n % 2) of the 128-key block n / 2 whose Philox groups the
// mask is defined on, i.e. words 2 (n % 2) and 2 (n % 2) + 1 of each call. The flags of the
// 64 x 64 tile sit in layout 2 restricted to those words: key pair kp = key / 2 in [0, 32),
// 1024 words per buffer. Each thread makes the same two Philox calls as dropout_bwd_generate2
// (rows 16 (2 h + hh) + r8, the 128-key block's columns 8 c32 + 2 c4 + 32 w) and stores the
// two words of its half: the other half's are computed and dropped (the d256 forward's 64-key
// tiles do the same).
template <int kThreads>
__forceinline__ __device__ void dropout_bwd_generate2_half(Dropout const &dropout, uint32_t *flags, int m_block,
                                                           int n_block, int tidx) {
    static_assert(kThreads == 256);
    const DropFlags drop_flags(dropout.threshold);
    const int r8 = tidx % 8, h = (tidx / 8) % 2, c32 = (tidx / 16) % 4, c4 = tidx / 64;
    const uint64_t x = dropout.base + uint64_t(4 * (n_block / 2) + c32);
    const uint32_t z = uint32_t(m_block) * 128u + uint32_t(64 * h + 4 * r8 + c4);
    const uint4 r0 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z, dropout.bh), dropout.k0, dropout.k1);
    const uint4 r1 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z + 32u, dropout.bh), dropout.k0,
                                dropout.k1);
    const bool upper = (n_block % 2) != 0;  // CTA-uniform
    uint2 *dst = reinterpret_cast<uint2 *>(flags + DropoutBwdLayout2::index(4 * c32 + c4, r8, 2 * h));
    dst[0] = make_uint2(drop_flags(upper ? r0.z : r0.x), drop_flags(upper ? r1.z : r1.x));    // kp: word 2 upper
    dst[256] = make_uint2(drop_flags(upper ? r0.w : r0.y), drop_flags(upper ? r1.w : r1.y));  // kp + 16: + 512 words
}

// The exchange form's S^T / dP^T accumulators ((2, 2, 4), 1, 1) of a 256-thread MMA whose
// warpgroup w holds queries [32 w, 32 w + 32): element 4 j + 2 r2 + c2 is (key x0 + 8 r2, query
// 32 w + 8 j + 2 m + c2), x0 and 32 w + 2 m the coordinates of element 0. Its flag is byte
// (x % 2) + 2 (j % 2) of the word at (kp = x / 2, r8 = 2 m + c2, rb = 2 w + j / 2): per key, two
// 8-byte loads (r8 = 2 m, 2 m + 1) of the words rb = 2 w, 2 w + 1.
template <typename TensorCoord, typename F>
__forceinline__ __device__ void dropout_bwd_for_each_word_pair_half(uint32_t const *flags, TensorCoord const &coords,
                                                                    F &&f) {
    const int x0 = get<0>(coords(0)), q0 = get<1>(coords(0));
    const int m2 = q0 % 8, rb0 = q0 / 16;  // 2 m, 2 w
    const uint2 *src = reinterpret_cast<const uint2 *>(flags + DropoutBwdLayout2::index(x0 / 2, m2, rb0));
    CUTE_UNROLL
    for (int r2 = 0; r2 < 2; ++r2) {
        const int x = x0 + 8 * r2;  // kp + 4: + 128 words
        const uint2 wa = src[r2 * 64], wb = src[r2 * 64 + 2];  // r8 = 2 m, 2 m + 1 (+ 4 words)
        CUTE_UNROLL
        for (int rbl = 0; rbl < 2; ++rbl) {
            const uint32_t a = rbl == 0 ? wa.x : wa.y, b = rbl == 0 ? wb.x : wb.y;
            CUTE_UNROLL
            for (int jj = 0; jj < 2; ++jj) { f(r2, 2 * rbl + jj, x % 2 + 2 * jj, a, b); }
        }
    }
}

template <typename TensorP, typename TensorCoord>
__forceinline__ __device__ void dropout_bwd_apply_p_half(TensorP &rP, uint32_t const *flags, TensorCoord const &coords) {
    static_assert(sizeof(typename TensorP::value_type) == 2);
    static_assert(decltype(size(rP))::value == 16);
    Tensor rP32 = recast<uint32_t>(rP);
    dropout_bwd_for_each_word_pair_half(flags, coords, [&](int r2, int j, int e, uint32_t a, uint32_t b) {
        const uint32_t selector = uint32_t(0x88 | e * 0x11) | (uint32_t(0xcc | e * 0x11) << 8);
        rP32(2 * j + r2) &= ~prmt(a, b, selector);
    });
}

template <typename TensorAcc, typename TensorCoord>
__forceinline__ __device__ void dropout_bwd_apply_dp_half(TensorAcc &acc, uint32_t const *flags,
                                                          TensorCoord const &coords) {
    static_assert(decltype(size(acc))::value == 16);
    dropout_bwd_for_each_word_pair_half(flags, coords, [&](int r2, int j, int e, uint32_t a, uint32_t b) {
        const uint32_t selector = (0x8u | uint32_t(e)) * 0x1111u;
        const int i = 4 * j + 2 * r2;
        acc(i) = __uint_as_float(__float_as_uint(acc(i)) & ~prmt(a, 0u, selector));
        acc(i + 1) = __uint_as_float(__float_as_uint(acc(i + 1)) & ~prmt(b, 0u, selector));
    });
}

}  // namespace flash
