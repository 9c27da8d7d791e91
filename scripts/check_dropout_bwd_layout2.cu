// Build (host only, no GPU): cd csrc && nvcc -std=c++17 -I. -I$CUTLASS/include --expt-relaxed-constexpr -o /tmp/chk ../scripts/check_dropout_bwd_layout2.cu && /tmp/chk
// Host check of DropoutBwdLayout2: generator (dropout_bwd_generate2's mapping) + reader
// (dropout_bwd_for_each_word_pair2's mapping) against dropout_keep_ref for every element of the tile.
#include <cstdio>
#include <cstdint>
#include <vector>
#include "attn_mods.h"
#include "hopper/dropout_sm90.h"
using namespace flash;
int main() {
    int bad = 0, checked = 0;
    const uint64_t seeds[] = {0x123456789abcdefull, 42ull};
    const uint64_t offs[] = {0ull, 4ull * 12345678901ull, 0xfffffffffffffff0ull};
    for (uint64_t seed : seeds) for (uint64_t offset : offs) for (uint32_t thr : {1u, 77u, 230u, 255u})
    for (int m_block : {0, 1, 7, 130}) for (int n_block : {0, 3, 65}) for (uint32_t bh : {0u, 5u}) {
        std::vector<uint32_t> flags(2048, 0xdeadbeefu);
        std::vector<int> written(2048, 0);
        const uint64_t base = offset / 4;
        const uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
        for (int tidx = 0; tidx < 256; ++tidx) {
            const int r8 = tidx % 8, h = (tidx / 8) % 2, c32 = (tidx / 16) % 4, c4 = tidx / 64;
            const uint64_t x = base + uint64_t(4 * n_block + c32);
            const uint32_t z = uint32_t(m_block) * 128u + uint32_t(64 * h + 4 * r8 + c4);
            const uint4 r0 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z, bh), k0, k1);
            const uint4 r1 = philox4x32(make_uint4(uint32_t(x), uint32_t(x >> 32), z + 32u, bh), k0, k1);
            const int d = DropoutBwdLayout2::index(4 * c32 + c4, r8, 2 * h);
            for (int w = 0; w < 4; ++w) {
                flags[d + 512 * w] = pick_word(r0, w); flags[d + 512 * w + 1] = pick_word(r1, w);
                written[d + 512 * w]++; written[d + 512 * w + 1]++;
            }
        }
        for (int i = 0; i < 2048; ++i) if (written[i] != 1) { ++bad; }
        for (int tidx = 0; tidx < 256; ++tidx) {
            const int wg = tidx / 128, wi = (tidx % 128) / 32, l = tidx % 32;
            const int x0 = 64 * wg + 16 * wi + l / 4, m2 = 2 * (l % 4);
            const int src = DropoutBwdLayout2::index(x0 / 2, m2, 0);  // uint4 src[r2*32], src[r2*32+1]
            for (int r2 = 0; r2 < 2; ++r2) {
                const int x = x0 + 8 * r2;
                for (int rb = 0; rb < 4; ++rb) {
                    const uint32_t a = flags[src + r2 * 128 + rb], b = flags[src + r2 * 128 + 4 + rb];
                    for (int jj = 0; jj < 2; ++jj) {
                        const int j = 2 * rb + jj, e = x % 2 + 2 * jj;
                        for (int c2 = 0; c2 < 2; ++c2) {
                            const uint32_t word = c2 ? b : a;
                            const bool drop = ((word >> (8 * e)) & 0xffu) >= thr;
                            const int row = m_block * 64 + 8 * j + m2 + c2, col = n_block * 128 + x;
                            const bool keep = dropout_keep_ref(seed, offset, bh, row, col, thr);
                            ++checked;
                            if (drop == keep) { if (bad < 10) printf("mismatch t%d r2%d j%d c2%d\n", tidx, r2, j, c2); ++bad; }
                        }
                    }
                }
            }
        }
    }
    printf("checked %d elements, %d bad\n", checked, bad);
    return bad != 0;
}
