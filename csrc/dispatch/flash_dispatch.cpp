// Dispatch from runtime (dtype, head dim) to the compiled instantiations. setup.py defines
// FLASH_ATTN_BUILT_<dtype>_<hdim> for each configuration it builds; the rest report "not built".
#include <cstdio>
#include <string>

#include "common/flash.h"

namespace flash {

#define FLASH_FOR_EACH_CONFIG(X) \
    X(fp16, 32) X(fp16, 64) X(fp16, 96) X(fp16, 128) X(fp16, 192) X(fp16, 256) \
    X(bf16, 32) X(bf16, 64) X(bf16, 96) X(bf16, 128) X(bf16, 192) X(bf16, 256)

#define FLASH_DECLARE(dtype, d)                                                      \
    void run_mha_fwd_##dtype##_hdim##d(FwdParams &params, cudaStream_t stream);      \
    void run_mha_bwd_##dtype##_hdim##d(BwdParams &params, cudaStream_t stream);      \
    void run_mha_fwd_feat_##dtype##_hdim##d(FwdParams &params, cudaStream_t stream); \
    void run_mha_bwd_feat_##dtype##_hdim##d(BwdParams &params, cudaStream_t stream);
FLASH_FOR_EACH_CONFIG(FLASH_DECLARE)
#undef FLASH_DECLARE
// Head dim 512: a forward only (sm_90a; instantiations/flash_fwd_ws_sm90_hdim512_*.cu).
void run_mha_fwd_fp16_hdim512(FwdParams &params, cudaStream_t stream);
void run_mha_fwd_bf16_hdim512(FwdParams &params, cudaStream_t stream);

namespace {
thread_local std::string g_last_error;

template <typename Params>
using Runner = void (*)(Params &, cudaStream_t);

struct Entry {
    bool is_bf16;
    int d;
    Runner<FwdParams> fwd;
    Runner<BwdParams> bwd;
    // Softcap / ALiBi / dropout (/ deterministic backward) variants.
    Runner<FwdParams> fwd_feat;
    Runner<BwdParams> bwd_feat;
};

#define FLASH_IS_BF16_fp16 false
#define FLASH_IS_BF16_bf16 true
#define FLASH_ENTRY(dtype, d)                                                                  \
    {FLASH_IS_BF16_##dtype, d, &run_mha_fwd_##dtype##_hdim##d, &run_mha_bwd_##dtype##_hdim##d, \
     &run_mha_fwd_feat_##dtype##_hdim##d, &run_mha_bwd_feat_##dtype##_hdim##d},
// A plain forward and nothing else (no backward, no feature kernels).
#define FLASH_ENTRY_FWD_ONLY(dtype, d) {FLASH_IS_BF16_##dtype, d, &run_mha_fwd_##dtype##_hdim##d, nullptr, nullptr, nullptr},

const Entry kEntries[] = {
#ifdef FLASH_ATTN_BUILT_fp16_32
    FLASH_ENTRY(fp16, 32)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_64
    FLASH_ENTRY(fp16, 64)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_96
    FLASH_ENTRY(fp16, 96)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_128
    FLASH_ENTRY(fp16, 128)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_192
    FLASH_ENTRY(fp16, 192)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_256
    FLASH_ENTRY(fp16, 256)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_32
    FLASH_ENTRY(bf16, 32)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_64
    FLASH_ENTRY(bf16, 64)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_96
    FLASH_ENTRY(bf16, 96)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_128
    FLASH_ENTRY(bf16, 128)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_192
    FLASH_ENTRY(bf16, 192)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_256
    FLASH_ENTRY(bf16, 256)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_512
    FLASH_ENTRY_FWD_ONLY(fp16, 512)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_512
    FLASH_ENTRY_FWD_ONLY(bf16, 512)
#endif
    {false, 0, nullptr, nullptr, nullptr, nullptr},  // sentinel: keeps the array non-empty in a reduced build
};

const Entry *find(bool is_bf16, int tile) {
    for (const Entry &e : kEntries) {
        if (e.fwd != nullptr && e.is_bf16 == is_bf16 && e.d == tile) return &e;
    }
    return nullptr;
}
}  // namespace

void record_launch_error(cudaError_t err, const char *what, const char *file, int line) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%s failed: %s (%s:%d)", what, cudaGetErrorString(err), file, line);
    g_last_error = buf;
}

const char *last_launch_error() { return g_last_error.c_str(); }

void clear_launch_error() { g_last_error.clear(); }

int device_sm(int device) {
    static int cache[64] = {0};
    if (device < 0 || device >= 64) return 0;
    if (cache[device] == 0) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        cache[device] = major * 10 + minor;
    }
    return cache[device];
}

int head_dim_tile(int d) {
    for (int tile : {32, 64, 96, 128, 192, 256, 512}) {
        if (d <= tile) return tile;
    }
    return -1;
}

bool is_built(bool is_bf16, int tile) { return find(is_bf16, tile) != nullptr; }

namespace {
// Runs the built entry's plain or feature launcher (false: no such build, or none for this
// direction / feature set: head dim 512 has a plain forward only).
template <typename Params>
bool run_entry(Params &params, cudaStream_t stream, Runner<Params> Entry::*plain, Runner<Params> Entry::*feat) {
    const Entry *e = find(params.is_bf16, params.head_dim_tile);
    if (e == nullptr) return false;
    const Runner<Params> run = e->*(has_features(params) ? feat : plain);
    if (run == nullptr) return false;
    g_last_error.clear();
    run(params, stream);
    return true;
}
}  // namespace

bool run_mha_fwd(FwdParams &params, cudaStream_t stream) {
    return run_entry(params, stream, &Entry::fwd, &Entry::fwd_feat);
}

bool run_mha_bwd(BwdParams &params, cudaStream_t stream) {
    return run_entry(params, stream, &Entry::bwd, &Entry::bwd_feat);
}

// ---- split-KV forward (its own instantiations: flash_fwd_split_hdim*_*.cu) ----
#define FLASH_DECLARE_SPLIT(dtype, d) void run_mha_fwd_split_##dtype##_hdim##d(FwdParams &params, cudaStream_t stream);
FLASH_FOR_EACH_CONFIG(FLASH_DECLARE_SPLIT)
#undef FLASH_DECLARE_SPLIT

namespace {
struct SplitEntry {
    bool is_bf16;
    int d;
    Runner<FwdParams> fwd;
};
#define FLASH_SPLIT_ENTRY(dtype, d) {FLASH_IS_BF16_##dtype, d, &run_mha_fwd_split_##dtype##_hdim##d},
const SplitEntry kSplitEntries[] = {
#ifdef FLASH_ATTN_BUILT_fp16_32
    FLASH_SPLIT_ENTRY(fp16, 32)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_64
    FLASH_SPLIT_ENTRY(fp16, 64)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_96
    FLASH_SPLIT_ENTRY(fp16, 96)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_128
    FLASH_SPLIT_ENTRY(fp16, 128)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_192
    FLASH_SPLIT_ENTRY(fp16, 192)
#endif
#ifdef FLASH_ATTN_BUILT_fp16_256
    FLASH_SPLIT_ENTRY(fp16, 256)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_32
    FLASH_SPLIT_ENTRY(bf16, 32)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_64
    FLASH_SPLIT_ENTRY(bf16, 64)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_96
    FLASH_SPLIT_ENTRY(bf16, 96)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_128
    FLASH_SPLIT_ENTRY(bf16, 128)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_192
    FLASH_SPLIT_ENTRY(bf16, 192)
#endif
#ifdef FLASH_ATTN_BUILT_bf16_256
    FLASH_SPLIT_ENTRY(bf16, 256)
#endif
    {false, 0, nullptr},
};
}  // namespace

bool run_mha_fwd_splitkv(FwdParams &params, cudaStream_t stream) {
    for (const SplitEntry &e : kSplitEntries) {
        if (e.fwd != nullptr && e.is_bf16 == params.is_bf16 && e.d == params.head_dim_tile) {
            g_last_error.clear();
            e.fwd(params, stream);
            return true;
        }
    }
    return false;
}

// ---- a V head dim of its own (FwdParams::dv < d) on the sm_90a warp-specialised forward: Q / K
// up to 192 with V up to 128 (DeepSeek MLA), Q / K up to 128 with V up to 64;
// instantiations/flash_fwd_ws_sm90_hdim{d}x{dv}_*.cu ----
bool run_mha_fwd_hdim192x128_fp16(FwdParams &params, cudaStream_t stream);
bool run_mha_fwd_hdim192x128_bf16(FwdParams &params, cudaStream_t stream);
bool run_mha_fwd_hdim128x64_fp16(FwdParams &params, cudaStream_t stream);
bool run_mha_fwd_hdim128x64_bf16(FwdParams &params, cudaStream_t stream);

bool run_mha_fwd_head_dim_v(FwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    if (!params.use_sm90 || has_features(params)) return false;
    g_last_error.clear();
    if (params.d > 128 && params.d <= 192 && params.dv <= 128) {
#ifdef FLASH_ATTN_BUILT_bf16_192
        if (params.is_bf16) return run_mha_fwd_hdim192x128_bf16(params, stream);
#endif
#ifdef FLASH_ATTN_BUILT_fp16_192
        if (!params.is_bf16) return run_mha_fwd_hdim192x128_fp16(params, stream);
#endif
    } else if (params.d > 64 && params.d <= 128 && params.dv <= 64) {
#ifdef FLASH_ATTN_BUILT_bf16_128
        if (params.is_bf16) return run_mha_fwd_hdim128x64_bf16(params, stream);
#endif
#ifdef FLASH_ATTN_BUILT_fp16_128
        if (!params.is_bf16) return run_mha_fwd_hdim128x64_fp16(params, stream);
#endif
    }
#endif
    (void)params, (void)stream;
    return false;
}

// ---- the backward with a V head dim of its own (BwdParams::dv < d) on the sm_90a warp-specialised
// split-d kernel: Q / K 129-192 (head-dim tile 192) with V up to 128 (DeepSeek MLA), plain and
// softcap / ALiBi / deterministic calls, no dropout; instantiations/flash_bwd_ws_sm90_hdim192x128_*.cu ----
bool run_mha_bwd_hdim192x128_fp16(BwdParams &params, cudaStream_t stream);
bool run_mha_bwd_hdim192x128_bf16(BwdParams &params, cudaStream_t stream);

bool run_mha_bwd_head_dim_v(BwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    if (!params.use_sm90 || !params.bwd_ws || params.p_dropout > 0.f) return false;
    g_last_error.clear();
    if (params.d > 128 && params.d <= 192 && params.dv < params.d && params.dv <= 128) {
#ifdef FLASH_ATTN_BUILT_bf16_192
        if (params.is_bf16) return run_mha_bwd_hdim192x128_bf16(params, stream);
#endif
#ifdef FLASH_ATTN_BUILT_fp16_192
        if (!params.is_bf16) return run_mha_bwd_hdim192x128_fp16(params, stream);
#endif
    }
#endif
    (void)params, (void)stream;
    return false;
}
}  // namespace flash
