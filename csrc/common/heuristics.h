// Kernel choices that depend on the call's sizes, in one place: pure functions of the params and
// the device's SM count, shared by the binding (api/) and the launchers (dispatch/). The tile shapes
// themselves are fixed per head dim in the launchers' traits (dispatch/*_launch*.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/flash.h"

namespace flash {

// The persistent WS forward (plain calls; compiled for head-dim tiles 64 and 128) where it was
// measured faster (H200, bf16, 16k tokens): tiles 64 / 128 up to 8k keys, +11-23% at 512, +3-7% at 1-2k, +-1% at 4-8k; 0.98-0.99x at
// 16k and at d256 (no room for O's own buffer there), which keep one CTA per tile.
inline bool fwd_ws_use_persistent(const FwdParams &p, int head_dim_tile) {
    if (p.fwd_ws_persistent == kFwdWsPersistentOn) return true;
    return p.fwd_ws_persistent == kFwdWsPersistentAuto && head_dim_tile <= 128 && p.seqlen_k <= 8192;
}

// The d64 WS forward on 128 x 128 tiles with 2 consumer warpgroups instead of 192 x 128 with 3:
// causal calls with at most 1024 queries and keys (varlen: the longest sequence), and sliding
// windows of at most 512 + 1 keys, whose 192-row tiles are mostly diagonal (masked) work. H200,
// bf16, 16k tokens: causal +8-9% at 512, +6-11% at 1k, -10% at 1.5k, -4..-6% at 2k;
// windows (256, 0) +7%, (512, 0) +2%, (256, 256) +1%, (1024, 0) -5%; without a mask -2..-5%.
inline bool fwd_ws_d64_m128(const FwdParams &p) {
    if (p.fwd_ws_d64_rows != 0) return p.fwd_ws_d64_rows == 128;
    const bool causal = p.window_right == 0 && p.window_left >= kWindowUnbounded;
    const bool narrow_window = p.window_left < kWindowUnbounded && p.window_right < kWindowUnbounded &&
                               p.window_left + p.window_right <= 512;
    return (causal && p.seqlen_q <= 1024 && p.seqlen_k <= 1024) || narrow_window;
}

// The heads whose key blocks the WS backward interleaves in its launch order on calls with a
// bounded right window (causal), not deterministic (BwdParams::bwd_ws_head_group). Key block n
// works on the query blocks from its diagonal on, so block 0 is the longest: launched one head
// after the other, the last heads' long CTAs run alone at the end; launched key block by key block
// over a group of heads, each group's long CTAs go first (longest first). The group's Q, dO and
// fp32 dQ rows (8 bytes per element of q) are kept within 32 MB of the 60 MB L2, at most 16 heads.
// Only the d128 tile from 1k queries: H200 bf16 causal 16k-token grid, group against one head after
// the other, d128 1k-8k 1.021-1.043 (512: 0.999); d64 0.969-1.022 and d256 0.983-1.020, mixed.
inline int bwd_ws_causal_head_group(int head_dim_tile, int64_t seqlen_q) {
    if (head_dim_tile != 128 || seqlen_q < 1024) return 1;
    const int64_t bytes_per_head = std::max<int64_t>(seqlen_q * head_dim_tile * 8, 1);
    return static_cast<int>(std::clamp<int64_t>((int64_t(32) << 20) / bytes_per_head, 1, 16));
}

// Query rows per step of the plain d128 WS backward (BwdParams::bwd_ws_d128_block_m): FA3's 80-row
// blocks (S^T 64 keys x 80 queries per warpgroup, dQ^T = K^T dS^T swapped, one dQ buffer) on calls
// without a window, whose cost per block (the dS barrier, the stage wait, the dQ tile) they spread
// over 25% more MMA work; 64 where a causal or local mask makes the diagonal blocks partly wasted.
inline int bwd_ws_d128_block_m(int window_left, int window_right) {
    const bool windowed = window_left < kWindowUnbounded || window_right < kWindowUnbounded;
    return windowed ? 64 : 80;
}

// Per-CTA dq_accum slices per (b, h) for the sliced deterministic backward (one CTA per SM): at
// most 8, chosen to fill whole waves: cost = waves x key blocks per CTA.
inline int deterministic_splits(int64_t bh, int64_t n_blocks, int64_t sms) {
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int64_t s = 1; s <= std::min<int64_t>(8, n_blocks); ++s) {
        const int64_t cost = ((bh * s + sms - 1) / sms) * ((n_blocks + s - 1) / s);
        if (cost < best_cost) best_cost = cost, best = static_cast<int>(s);
    }
    return best;
}

// Split count for the split-KV kernel. Decode is bandwidth-bound: splits are for covering the SMs
// (one CTA each; two if a split keeps >= 4k keys) and for keeping long contexts at
// about 8k keys per CTA; each extra split costs a partial write and the combine. Measured on the
// H200 (bf16 d128, 32 q / 8 kv heads, 1 token), this picks
// the best count of 1/2/4/8/16 in each case: b16 4k -> 1 (3399 GB/s; 2 splits: 3267),
// b16 32k -> 4 (4257; 2: 4236, 1: 4115), b4 128k -> 16 (4213; 4: 4054).
inline int splitkv_heuristic(int ctas, int sms, int64_t max_seqlen_k, bool paged) {
    if (ctas >= (2 * sms * 8) / 10) return 1;  // already a full wave of CTAs: no split
    const int64_t max_splits = std::min<int64_t>(128, std::max<int64_t>(1, max_seqlen_k / 128));
    const int64_t by_length = (max_seqlen_k + 4096) / 8192;
    const int64_t cover_once = ((int64_t(sms) * 9) / 10 + ctas - 1) / ctas;     // ~1 CTA per SM
    const int64_t cover_twice = ((2 * int64_t(sms) * 9) / 10 + ctas - 1) / ctas;  // ~2, if >= 4k keys each
    // Paged loads gather row by row and need the second CTA per SM whatever the split length
    // (b16 4k, 16-token pages: 1801 GB/s with 1 split, 2836 with 2).
    const int64_t twice_cap = paged ? max_splits : std::max<int64_t>(1, max_seqlen_k / 4096);
    const int64_t splits = std::max({by_length, cover_once, std::min(cover_twice, twice_cap)});
    return static_cast<int>(std::min(max_splits, std::max<int64_t>(1, splits)));
}

// Split count for the kernels that run one 8-warp CTA per SM (a wave is `sms` CTAs): the sm_90a
// decode kernel and the d = 128 wide shape of the split-KV kernel (b16 32k: 1 split, 4449 GB/s;
// 2 splits 4363; the 4-warp shape's best, 4 splits, 4347).
// Bandwidth-bound cost model: time ~ waves(s) * (keys per split + kCtaCostKeys), the fixed
// cost of a CTA (filling its copy ring, merge, store) counted in keys; the smallest s within 3% of
// the best wins (fewer partials to write and combine). At most 128 splits, each >= 128 keys.
// bf16 d128, 8 KV heads: b16 4k and 32k -> 1 split (128 CTAs: one wave), b4 128k -> 4.
inline int splitkv_heuristic_sm90(int ctas, int sms, int64_t max_seqlen_k) {
    constexpr int64_t kCtaCostKeys = 256;
    const int64_t max_splits = std::min<int64_t>(128, std::max<int64_t>(1, max_seqlen_k / 128));
    auto cost = [&](int64_t s) {
        const int64_t waves = (int64_t(ctas) * s + sms - 1) / sms;
        return waves * ((max_seqlen_k + s - 1) / s + kCtaCostKeys);
    };
    int64_t best = cost(1);
    for (int64_t s = 2; s <= max_splits; ++s) best = std::min(best, cost(s));
    for (int64_t s = 1; s < max_splits; ++s) {
        if (cost(s) * 100 <= best * 103) return static_cast<int>(s);
    }
    return static_cast<int>(max_splits);
}

}  // namespace flash
