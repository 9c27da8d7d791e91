// Score modifiers (softcap, ALiBi) and dropout for the "feature" variants of the kernels.
// (Not named features.h: with -I csrc that would shadow glibc's <features.h>.)
//
// Dropout mask. Element (row, col) of head (b, h) is kept iff byte `byte_of(row, col)` of
//   Philox4x32-7(key = seed, counter = (offset / 4 + 4 * (col / 128) + (col / 8) % 4,    [x, y: 64-bit]
//                                       16-row block * 32 + lane(row, col),             [z]
//                                       b * nheads + h))                                [w]
// is below dropout_keep_threshold, where lane(row, col) = (row % 8) * 4 + (col % 8) / 2 and
// byte_of(row, col) = ((col % 128) / 32) * 4 + ((row % 16) / 8) * 2 + col % 2.
// It is a pure function of (seed, offset, b, h, row, col), so the forward and the backward agree
// whatever their tiles. The grouping follows the m16n8 MMA accumulator: one Philox call yields
// the 16 bytes that one thread needs for one 16-row block and four 8-column atoms 32 columns
// apart, which is exactly what a thread owns whenever its warp's atoms along N are 8, 16 or 32
// columns apart (1, 2 or 4 warps along N) inside a 128-column-aligned group. (Upstream's mask
// differs; only the convention "dropped = negative in S_dmask" is shared.)
// Seven Philox rounds, as upstream flash-attn's own Philox (csrc/flash_attn/src/philox.cuh: six
// rounds with key bumps, then one), not cuRAND's ten: Salmon et al. (SC'11) find Philox4x32
// Crush-resistant from 7 rounds and add three as a safety margin, and on the H200 the rounds'
// 32x32 -> 64-bit multiplies are what dropout costs (docs/perf-notes.md).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "common/flash.h"

namespace flash {

using namespace cute;

// ---- Philox4x32-R (Salmon et al., SC'11); R = kPhiloxRounds for the dropout mask -----------------

constexpr int kPhiloxRounds = 7;

__host__ __device__ __forceinline__ uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

template <int kRounds = kPhiloxRounds>
__host__ __device__ __forceinline__ uint4 philox4x32(uint4 ctr, uint32_t k0, uint32_t k1) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
        const uint32_t hi0 = mulhi32(kM0, ctr.x), lo0 = kM0 * ctr.x;
        const uint32_t hi1 = mulhi32(kM1, ctr.z), lo1 = kM1 * ctr.z;
        ctr = make_uint4(hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0);
        k0 += kW0;
        k1 += kW1;
    }
    return ctr;
}

// The counter of the Philox call that covers element (row, col) (see the top of the file).
__host__ __device__ __forceinline__ uint4 dropout_counter(uint64_t base, uint32_t bh, int row, int col) {
    const uint64_t x = base + uint64_t(4 * (col / 128) + (col / 8) % 4);
    const uint32_t z = uint32_t(row / 16) * 32u + uint32_t((row % 8) * 4 + (col % 8) / 2);
    return make_uint4(uint32_t(x), uint32_t(x >> 32), z, bh);
}

__host__ __device__ __forceinline__ int dropout_byte_of(int row, int col) {
    return ((col % 128) / 32) * 4 + ((row % 16) / 8) * 2 + col % 2;
}

// Reference form, one element at a time (host-side checks and documentation).
__host__ __device__ inline bool dropout_keep_ref(uint64_t seed, uint64_t offset, uint32_t bh, int row, int col,
                                                 uint32_t threshold) {
    const uint4 r = philox4x32(dropout_counter(offset / 4, bh, row, col), uint32_t(seed), uint32_t(seed >> 32));
    const int byte = dropout_byte_of(row, col);
    const uint32_t word = byte < 4 ? r.x : byte < 8 ? r.y : byte < 12 ? r.z : r.w;
    return ((word >> (8 * (byte % 4))) & 0xffu) < threshold;
}

__host__ __device__ __forceinline__ uint32_t pick_word(uint4 r, int j) {
    return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w;
}

// One thread of the grid writes rng_state for the backward: with dropout (seed, offset) (read from
// the device when the generator state was captured in a CUDA graph), zeros without. The binding
// allocates it uninitialised (a zero fill kernel per call cost ~2 us of ~140 at 512
// tokens), so every forward kernel run_mha_fwd launches calls this.
__device__ __forceinline__ void write_rng_state(const FwdParams &params) {
    if (params.rng_state_ptr != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
        threadIdx.x == 0) {
        const PhiloxParams &ph = params.philox;
        const bool dropout = params.p_dropout > 0.f;
        params.rng_state_ptr[0] = !dropout ? 0 : ph.from_device ? *ph.seed_ptr : int64_t(ph.seed);
        params.rng_state_ptr[1] = !dropout ? 0
                                  : ph.from_device ? *ph.offset_ptr + int64_t(ph.offset_extra)
                                                   : int64_t(ph.offset);
    }
}

struct Dropout {
    uint32_t k0, k1;
    uint64_t base;  // offset / 4
    uint32_t bh;
    uint32_t threshold;
    float rp;

    Dropout() = default;
    template <typename Params>
    __device__ Dropout(const Params &params, int bidb, int bidh) {
        const PhiloxParams &ph = params.philox;
        const uint64_t seed = ph.from_device ? uint64_t(*ph.seed_ptr) : ph.seed;
        const uint64_t offset = ph.from_device ? uint64_t(*ph.offset_ptr) + ph.offset_extra : ph.offset;
        k0 = uint32_t(seed);
        k1 = uint32_t(seed >> 32);
        base = offset / 4;
        bh = uint32_t(bidb * params.h + bidh);
        threshold = params.dropout_keep_threshold;
        rp = params.rp_dropout;
    }

    // Calls f(e, m, n, keep) for every element (e, m, n) of an SM80 m16n8 accumulator fragment
    // ((2, 2), MMA_M, MMA_N) whose atoms along N are 8 * kWarpsN columns apart; coords is the
    // MMA's partition of the tile's identity tensor, (row0, col0) the tile origin. col0 must be a
    // multiple of the tile width, the tile width a divisor of 128 and at least 32 * kWarpsN.
    // Host-callable too: scripts/check_dropout_layout.cu checks it against dropout_keep_ref for
    // every thread of every kernel configuration.
#pragma nv_exec_check_disable
    template <int kWarpsN, typename Fragment, typename TensorCoord, typename F>
    __host__ __device__ __forceinline__ void for_each(Fragment const &, TensorCoord const &coords, int row0, int col0,
                                             F &&f) const {
        static_assert(kWarpsN == 1 || kWarpsN == 2 || kWarpsN == 4);
        static_assert(decltype(size<0>(Fragment{}))::value == 4);
        constexpr int kMmaM = decltype(size<1>(Fragment{}))::value;
        constexpr int kMmaN = decltype(size<2>(Fragment{}))::value;
        constexpr int kGroups = 4 / kWarpsN;  // atoms n and n + kGroups are 32 columns apart
        static_assert(kMmaN % kGroups == 0 && kMmaN / kGroups <= 4);
        CUTE_UNROLL
        for (int m = 0; m < kMmaM; ++m) {
            CUTE_UNROLL
            for (int g = 0; g < kGroups; ++g) {
                const int row = row0 + get<0>(coords(0, m, g));
                const int col = col0 + get<1>(coords(0, m, g));
                const uint4 r = philox4x32(dropout_counter(base, bh, row, col), k0, k1);
                const int j0 = (col % 128) / 32;
                CUTE_UNROLL
                for (int t = 0; t < kMmaN / kGroups; ++t) {
                    const uint32_t word = pick_word(r, j0 + t);
                    CUTE_UNROLL
                    for (int e = 0; e < 4; ++e) {
                        // e = (col % 2) + 2 * ((row % 16) / 8) in the m16n8 accumulator.
                        f(e, m, g + kGroups * t, ((word >> (8 * e)) & 0xffu) < threshold);
                    }
                }
            }
        }
    }
};

// ---- compile-time feature sets ---------------------------------------------------------------------
// The SM80-class feature kernels take an int kStatic: 0 is the generic variant (every feature a
// run-time branch on its parameter); otherwise kModStatic | the features that are on, known at
// compile time: features outside the set are compiled out and those inside run unconditionally.
// At d = 256 the generic variant's run-time branches are if-converted into one long predicated
// block that every call pays for (docs: the d256 feature analysis), hence the fixed sets.
constexpr int kModSoftcap = 1, kModAlibi = 2, kModDropout = 4, kModStatic = 8;

// ---- softcap and ALiBi -----------------------------------------------------------------------------

struct ScoreMod {
    float softcap_scale;  // 0: no softcap
    float alibi_slope;    // -slope / scale_softmax (0: no ALiBi)
    int diag;             // seqlen_k - seqlen_q

    ScoreMod() = default;
    template <typename Params>
    __device__ ScoreMod(const Params &params, int bidb, int bidh, int diag_)
        : softcap_scale(params.softcap_scale),
          alibi_slope(params.alibi_slopes_ptr == nullptr
                          ? 0.f
                          : -params.alibi_slopes_ptr[bidb * params.alibi_slopes_batch_stride + bidh] /
                                params.scale_softmax),
          diag(diag_) {}

    __device__ __forceinline__ bool has_softcap() const { return softcap_scale > 0.f; }

    // acc: raw scores Q K^T of a tile -> tanh(s * softcap_scale).
    template <typename TensorAcc>
    __device__ __forceinline__ void apply_softcap(TensorAcc &acc) const {
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) { acc(i) = tanhf(acc(i) * softcap_scale); }
    }

    // Adds alibi_slope * |row + diag - col| to the tile at (row0, col0) when ALiBi is on.
    template <typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply_alibi(TensorAcc &acc, TensorCoord const &coords, int row0, int col0) const {
        if (alibi_slope == 0.f) return;
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            const int dist = row0 + get<0>(coords(i)) + diag - col0 - get<1>(coords(i));
            acc(i) += alibi_slope * float(dist < 0 ? -dist : dist);
        }
    }

    // The sm_90a backwards' transposed tiles (S^T, dP^T: mode 0 = key, mode 1 = query row of
    // coords_t, their partition of identity(keys, queries)), at query row0 and key col0 of the
    // sequence: the ALiBi bias of element i, softcap then ALiBi on S^T (before the mask), and the
    // softcap derivative on dS^T.
    template <typename TensorCoord>
    __device__ __forceinline__ float alibi_bias_t(TensorCoord const &coords_t, int i, int row0, int col0) const {
        const int dist = row0 + get<1>(coords_t(i)) + diag - col0 - get<0>(coords_t(i));
        return alibi_slope * float(dist < 0 ? -dist : dist);
    }
    template <typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply_alibi_t(TensorAcc &acc_s, TensorCoord const &coords_t, int row0,
                                                  int col0) const {
        if (alibi_slope != 0.f) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) { acc_s(i) += alibi_bias_t(coords_t, i, row0, col0); }
        }
    }
    template <typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply_t(TensorAcc &acc_s, TensorCoord const &coords_t, int row0, int col0) const {
        if (has_softcap()) { apply_softcap(acc_s); }
        apply_alibi_t(acc_s, coords_t, row0, col0);
    }
    // acc_ds *= d tanh(s * softcap_scale) / ds. tanh is recovered from P (acc_p) instead of being
    // kept in registers: P = exp2((t + alibi) * scale_softmax_log2 - LSE log2e); where it matters
    // (P not tiny) the recovery is accurate, elsewhere dS ~ P is ~0 anyway, and where P is 0
    // (masked) t = 1 and the factor is 0. lse_log2(i): LSE * log2(e) of element i's query row.
    template <typename TensorDS, typename TensorP, typename TensorCoord, typename LseLog2>
    __device__ __forceinline__ void softcap_grad_t(TensorDS &acc_ds, TensorP const &acc_p, TensorCoord const &coords_t,
                                                   int row0, int col0, float scale_softmax_log2,
                                                   LseLog2 &&lse_log2) const {
        if (!has_softcap()) return;
        const bool has_alibi = alibi_slope != 0.f;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_ds); ++i) {
            const float lse = lse_log2(i);
            const float p = acc_p(i);
            float t = p > 0.f ? (__log2f(p) + lse) / scale_softmax_log2 : 1.f;
            if (has_alibi) { t -= alibi_bias_t(coords_t, i, row0, col0); }
            t = fminf(fmaxf(t, -1.f), 1.f);
            acc_ds(i) *= (1.f - t * t) * softcap_scale;
        }
    }

    // The ALiBi bias slope * |row + diag - col| of every element, in fp32: the distance is an
    // integer below 2^24, exact in fp32, so this equals the integer form bit for bit. The thread's
    // part of the distance is converted once; each element adds a compile-time constant (its
    // offset in the fragment, read off coords0, the partition of thread 0, whose coordinates fold
    // to constants) and takes |.|: two FP ops instead of IADD, IABS, I2F, FFMA.
    template <typename TensorCoord, typename TensorCoord0>
    __device__ __forceinline__ float alibi_base(TensorCoord const &coords, TensorCoord0 const &coords0, int row0,
                                                int col0) const {
        return float(row0 + diag - col0 + (get<0>(coords(0)) - get<1>(coords(0))) -
                     (get<0>(coords0(0)) - get<1>(coords0(0))));
    }
    template <typename TensorCoord0>
    __device__ __forceinline__ static float alibi_offset(TensorCoord0 const &coords0, int i) {
        return float(get<0>(coords0(i)) - get<1>(coords0(i)));
    }
    template <typename TensorAcc, typename TensorCoord, typename TensorCoord0>
    __device__ __forceinline__ void add_alibi_fast(TensorAcc &acc, TensorCoord const &coords,
                                                   TensorCoord0 const &coords0, int row0, int col0) const {
        const float base = alibi_base(coords, coords0, row0, col0);
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            acc(i) = fmaf(alibi_slope, fabsf(base + alibi_offset(coords0, i)), acc(i));
        }
    }

    // Both, in the forward's order: the score to be multiplied by scale_softmax.
    template <typename TensorAcc, typename TensorCoord>
    __device__ __forceinline__ void apply(TensorAcc &acc, TensorCoord const &coords, int row0, int col0) const {
        if (has_softcap()) apply_softcap(acc);
        apply_alibi(acc, coords, row0, col0);
    }

    // apply() for a feature set (see kModStatic): kStatic == 0 is the run-time form above.
    template <int kStatic, typename TensorAcc, typename TensorCoord, typename TensorCoord0>
    __device__ __forceinline__ void apply_set(TensorAcc &acc, TensorCoord const &coords, TensorCoord0 const &coords0,
                                              int row0, int col0) const {
        if constexpr (kStatic == 0) {
            apply(acc, coords, row0, col0);
        } else {
            if constexpr ((kStatic & kModSoftcap) != 0) { apply_softcap(acc); }
            if constexpr ((kStatic & kModAlibi) != 0) { add_alibi_fast(acc, coords, coords0, row0, col0); }
        }
    }
};

}  // namespace flash
