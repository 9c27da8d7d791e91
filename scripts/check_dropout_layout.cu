// Host-only check (no GPU needed) that Dropout::for_each hands every element of every thread's
// score fragment the keep bit of the reference mask function dropout_keep_ref, for the MMA
// layouts of all forward and backward configurations, and that each element of a tile is
// visited exactly once. Build and run from the repository root:
//   nvcc -std=c++17 --expt-relaxed-constexpr -Icsrc -I.deps/cutlass_include \
//        scripts/check_dropout_layout.cu -o /tmp/check_dropout_layout && /tmp/check_dropout_layout
#include <cstdio>
#include <vector>

#include <cutlass/numeric_types.h>

#include "attn_mods.h"
#include "kernel_traits.h"

using namespace cute;
using namespace flash;

template <typename TiledMma, int kBlockM, int kBlockN, int kWarpsN>
bool check(const char *name, int row0, int col0) {
    Dropout dropout;
    const uint64_t seed = 0x123456789abcdefull, offset = 4 * 1000003ull;
    dropout.k0 = uint32_t(seed), dropout.k1 = uint32_t(seed >> 32);
    dropout.base = offset / 4;
    dropout.bh = 7;
    dropout.threshold = 200;
    dropout.rp = 1.f;
    std::vector<int> seen(kBlockM * kBlockN, 0);
    int bad = 0;
    TiledMma tiled_mma;
    for (int tid = 0; tid < int(size(tiled_mma)); ++tid) {
        auto thr_mma = tiled_mma.get_thread_slice(tid);
        Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
        Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        dropout.template for_each<kWarpsN>(acc, coords, row0, col0, [&](int e, int m, int n, bool keep) {
            const int r = get<0>(coords(e, m, n)), c = get<1>(coords(e, m, n));
            seen[r * kBlockN + c] += 1;
            const bool ref = dropout_keep_ref(seed, offset, 7, row0 + r, col0 + c, 200);
            if (keep != ref && bad++ < 5) {
                std::printf("  %s: thread %d element (%d, %d, %d) = (%d, %d): %d, reference %d\n", name, tid, e, m, n,
                            row0 + r, col0 + c, int(keep), int(ref));
            }
        });
    }
    for (int i = 0; i < kBlockM * kBlockN; ++i) {
        if (seen[i] != 1 && bad++ < 10) std::printf("  %s: element %d visited %d times\n", name, i, seen[i]);
    }
    std::printf("%s %s (tile at %d, %d)\n", bad ? "FAIL" : "ok  ", name, row0, col0);
    return bad == 0;
}

template <typename Traits>
bool check_fwd(const char *name) {
    bool ok = true;
    for (int m = 0; m < 2; ++m)
        for (int n = 0; n < 3; ++n)
            ok &= check<typename Traits::TiledMma, Traits::kBlockM, Traits::kBlockN, 1>(name, m * Traits::kBlockM,
                                                                                        n * Traits::kBlockN);
    return ok;
}

template <typename Traits>
bool check_bwd(const char *name) {
    bool ok = true;
    for (int m = 0; m < 2; ++m)
        for (int n = 0; n < 3; ++n)
            ok &= check<typename Traits::TiledMmaSdP, Traits::kBlockM, Traits::kBlockN, Traits::kWarpsNSdP>(
                name, m * Traits::kBlockM, n * Traits::kBlockN);
    return ok;
}

int main() {
    using T = cutlass::bfloat16_t;
    // Reference Philox4x32-10 known-answer tests (Random123 kat_vectors): the round function that
    // the mask's 7-round Philox (kPhiloxRounds) iterates.
    const uint4 z = philox4x32<10>(make_uint4(0, 0, 0, 0), 0, 0);
    const uint4 f = philox4x32<10>(make_uint4(~0u, ~0u, ~0u, ~0u), ~0u, ~0u);
    const uint4 p = philox4x32<10>(make_uint4(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u), 0xa4093822u,
                                  0x299f31d0u);
    bool ok = z.x == 0x6627e8d5u && z.y == 0xe169c58du && z.z == 0xbc57ac4cu && z.w == 0x9b00dbd8u;
    ok &= f.x == 0x408f276du && f.y == 0x41c83b0eu && f.z == 0xa20bc7c6u && f.w == 0x6d5451fdu;
    ok &= p.x == 0xd16cfe09u && p.y == 0x94fdccebu && p.z == 0x5001e420u && p.w == 0x24126ea1u;
    std::printf("%s Philox4x32-10 known answers (%08x %08x %08x %08x)\n", ok ? "ok  " : "FAIL", z.x, z.y, z.z, z.w);
    // The forward and backward configurations of flash_fwd_launch.h / flash_bwd_launch.h.
    ok &= check_fwd<FwdKernelTraits<64, 128, 128, 4, T>>("fwd d<=64");
    ok &= check_fwd<FwdKernelTraits<128, 128, 64, 4, T>>("fwd d<=128");
    ok &= check_fwd<FwdKernelTraits<256, 128, 64, 8, T>>("fwd d>128");
    ok &= check_bwd<BwdKernelTraits<64, 128, 128, 8, 4, 4, 4, T>>("bwd d<=64");
    ok &= check_bwd<BwdKernelTraits<96, 64, 128, 8, 2, 4, 4, T>>("bwd d<=96");
    ok &= check_bwd<BwdKernelTraits<128, 64, 128, 8, 2, 4, 2, T>>("bwd d<=128");
    ok &= check_bwd<BwdKernelTraits<256, 64, 64, 8, 4, 2, 2, T>>("bwd d>128");
    std::printf("%s\n", ok ? "ALL OK" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
