// Host-only check (no GPU needed) of the warp-specialised forward's dropout (flash_fwd_ws_mainloop_sm90.h)
// against the reference mask function dropout_keep_ref: for every dropout tile shape of the WS
// kernel (per consumer warpgroup 64 x 128 at d64 / d128, 64 x 64 at d256), every warpgroup row
// offset, every thread and every key block of a downward walk (with the 64-key pairing rule), it
// emulates dropout_fwd_generate_group (the counters dropout_counter(base + 4 (col0 / 128), bh, row,
// c), c = the column inside the 128-key group, parked per thread as flags[g]) followed by
// dropout_fwd_apply (word t (+ 2 for the upper half of a 64-key tile) of group g for atom
// j = g + 4 t; bytes 0, 1 for elements 4 j, 4 j + 1 and bytes 2, 3 for 4 j + 2, 4 j + 3) and
// compares each element's keep bit with dropout_keep_ref at (row0 + row, col0 + col). It also
// checks the accumulator layout facts both functions rely on, and the counter identity
// dropout_counter(base, bh, row, 128 q + c) == dropout_counter(base + 4 q, bh, row, c).
// Build and run from the repository root:
//   nvcc -std=c++17 --expt-relaxed-constexpr -DFLASH_ATTN_SM90A -Icsrc -I.deps/cutlass_include \
//        scripts/check_dropout_ws_layout.cu -o /tmp/check_dropout_ws_layout && /tmp/check_dropout_ws_layout
#include <cstdio>
#include <vector>

#include <cutlass/numeric_types.h>

#include "attn_mods.h"
#include "hopper/kernel_traits_fwd_ws_sm90.h"

using namespace cute;
using namespace flash;

namespace {

constexpr uint64_t kSeed = 0x0123456789abcdefull, kOffset = 4 * 777773ull;
constexpr uint32_t kBh = 11, kThreshold = 170;

uint32_t word_of(uint4 r, int w) { return w == 0 ? r.x : w == 1 ? r.y : w == 2 ? r.z : r.w; }

template <typename Traits>
bool check(const char *name, int n_block_min, int n_block_max) {
    constexpr int kBlockN = Traits::kBlockN;
    static_assert(Traits::kDropoutTiles);
    typename Traits::TiledMmaQK tiled_mma;
    int bad = 0;
    std::vector<int> seen;
    for (int m_block = 0; m_block < 2; ++m_block) {
        for (int wg = 0; wg < Traits::kNConsumerWG; ++wg) {
            const int row0 = m_block * Traits::kBlockM + wg * Traits::kRowsPerWG;
            for (int tid = 0; tid < 128; ++tid) {
                auto thr = tiled_mma.get_thread_slice(tid);
                Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<64>, Int<kBlockN>>{}));
                static_assert(decltype(size(coords))::value == kBlockN / 2);
                // Layout facts: element 4 j + 2 r2 + c2 is (r + 8 r2, 8 j + 2 q + c2).
                const int r = get<0>(coords(0)), q2 = get<1>(coords(0));
                for (int j = 0; j < kBlockN / 8; ++j)
                    for (int r2 = 0; r2 < 2; ++r2)
                        for (int c2 = 0; c2 < 2; ++c2) {
                            const auto c = coords(4 * j + 2 * r2 + c2);
                            if ((get<0>(c) != r + 8 * r2 || get<1>(c) != 8 * j + q2 + c2) && bad++ < 5)
                                std::printf("  %s: thread %d element %d at (%d, %d)\n", name, tid, 4 * j + 2 * r2 + c2,
                                            int(get<0>(c)), int(get<1>(c)));
                        }
                // The walk: key blocks n_block_max - 1 down to n_block_min; flags[g] per thread.
                uint4 flags[4] = {};
                for (int n_blk = n_block_max - 1; n_blk >= n_block_min; --n_blk) {
                    const int col0 = n_blk * kBlockN;
                    if (kBlockN == 128 || n_blk % 2 == 1 || n_blk == n_block_max - 1) {  // generate
                        const uint64_t base = kOffset / 4 + uint64_t(4 * (col0 / 128));
                        for (int g = 0; g < 4; ++g) {
                            const int row = row0 + get<0>(coords(4 * g));
                            const int c = get<1>(coords(4 * g));
                            const uint4 ctr = dropout_counter(base, kBh, row, c);
                            const uint4 ref_ctr = dropout_counter(kOffset / 4, kBh, row, col0 - col0 % 128 + c);
                            if ((ctr.x != ref_ctr.x || ctr.y != ref_ctr.y || ctr.z != ref_ctr.z || ctr.w != ref_ctr.w) &&
                                bad++ < 5)
                                std::printf("  %s: counter mismatch thread %d g %d\n", name, tid, g);
                            flags[g] = philox4x32(ctr, uint32_t(kSeed), uint32_t(kSeed >> 32));
                        }
                    }
                    const bool upper_half = kBlockN == 64 && col0 % 128 != 0;
                    for (int g = 0; g < 4; ++g)
                        for (int t = 0; t < kBlockN / 32; ++t) {
                            const int j = g + 4 * t;
                            const uint32_t word = word_of(flags[g], kBlockN == 128 ? t : (upper_half ? 2 + t : t));
                            for (int e = 0; e < 4; ++e) {  // element 4 j + e <-> byte e
                                const auto c = coords(4 * j + e);
                                const int row = row0 + get<0>(c), col = col0 + get<1>(c);
                                const bool keep = ((word >> (8 * e)) & 0xffu) < kThreshold;
                                const bool ref = dropout_keep_ref(kSeed, kOffset, kBh, row, col, kThreshold);
                                if (keep != ref && bad++ < 5)
                                    std::printf("  %s: wg %d thread %d tile %d element %d (%d, %d): %d, reference %d\n",
                                                name, wg, tid, n_blk, 4 * j + e, row, col, int(keep), int(ref));
                            }
                        }
                }
            }
        }
    }
    // Every element of a (64, kBlockN) tile is owned by exactly one thread.
    seen.assign(64 * kBlockN, 0);
    for (int tid = 0; tid < 128; ++tid) {
        Tensor coords = tiled_mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<64>, Int<kBlockN>>{}));
        for (int i = 0; i < int(size(coords)); ++i) seen[get<0>(coords(i)) * kBlockN + get<1>(coords(i))] += 1;
    }
    for (int i = 0; i < 64 * kBlockN; ++i)
        if (seen[i] != 1 && bad++ < 10) std::printf("  %s: element %d owned %d times\n", name, i, seen[i]);
    std::printf("%s %s (key blocks %d..%d)\n", bad ? "FAIL" : "ok  ", name, n_block_min, n_block_max - 1);
    return bad == 0;
}

}  // namespace

int main() {
    using T = cutlass::bfloat16_t;
    bool ok = true;
    // The tiles of flash_fwd_ws_launch_sm90.h (FwdWsTraitsFor: all of them serve dropout).
    using D64 = FwdWsTraitsSm90<64, 128, 4, T, 3>;
    using D128 = FwdWsTraitsSm90<128, 128, 2, T>;
    using D256 = FwdWsTraitsSm90<256, 64, 2, T>;
    ok &= check<D64>("ws d64 192x128 (3 WGs)", 0, 5);
    ok &= check<D64>("ws d64 192x128 (3 WGs)", 2, 4);
    ok &= check<D128>("ws d128 128x128", 0, 5);
    ok &= check<D128>("ws d128 128x128", 3, 6);
    ok &= check<D256>("ws d256 128x64", 0, 7);  // walk starts on an even block (generates itself)
    ok &= check<D256>("ws d256 128x64", 1, 6);  // starts odd, ends odd
    ok &= check<D256>("ws d256 128x64", 3, 4);  // a single odd block
    ok &= check<D256>("ws d256 128x64", 2, 3);  // a single even block
    // The counter identity for every column of a few groups.
    int bad = 0;
    for (int row = 0; row < 40; ++row)
        for (int col = 0; col < 4 * 128; ++col) {
            const uint4 a = dropout_counter(12345, kBh, row, col);
            const uint4 b = dropout_counter(12345 + 4 * (col / 128), kBh, row, col % 128);
            bad += a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
        }
    std::printf("%s counter identity\n", bad ? "FAIL" : "ok  ");
    ok &= bad == 0;
    std::printf("%s\n", ok ? "ALL OK" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
