// The binding's shared pieces: error macros, tensor checks, the params setters and workspace
// allocation used by the dense, varlen and KV-cache entry points (dense.cpp, varlen.cpp, kvcache.cpp),
// and the test-only kernel overrides. The one part of csrc that includes torch.
#pragma once

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/flash.h"

namespace flash::api {

// User-facing errors are std::invalid_argument / std::runtime_error (pybind11 turns them into
// ValueError / RuntimeError). TORCH_CHECK's c10::Error was seen to crash the process when thrown
// from this extension under torch 2.11 on the H200 machine (after the first one), so it is avoided.
template <typename... Args>
std::string concat(const Args &...args) {
    std::ostringstream ss;
    (ss << ... << args);
    return ss.str();
}
#define FLASH_CHECK(cond, ...) \
    do { if (!(cond)) throw std::invalid_argument(concat(__VA_ARGS__)); } while (0)
#define FLASH_CHECK_RUNTIME(cond, ...) \
    do { if (!(cond)) throw std::runtime_error(concat(__VA_ARGS__)); } while (0)

constexpr int kMaxHeadDim = 256;
// The dense and varlen forwards' (head dims 257-512: the sm_90a forward alone, see
// run_mha_fwd_ws_sm90_d512).
constexpr int kMaxHeadDimFwd = 512;
// Whether the sm_90a (wgmma) kernels may run; tests and benchmarks switch them off to exercise
// and compare the SM80-class path on the same GPU.
extern bool g_sm90_enabled;

// A device attribute, read once per (attribute slot, device); `fallback` when the query fails.
template <cudaDeviceAttr kAttr>
inline int cached_device_attribute(int device, int fallback) {
    static int cache[64] = {0};
    if (device < 0 || device >= 64) return fallback;
    if (cache[device] == 0) {
        int n = 0;
        cudaDeviceGetAttribute(&n, kAttr, device);
        cache[device] = n > 0 ? n : fallback;
    }
    return cache[device];
}

inline int num_sms(int device) { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, 132); }

// Opt-in shared memory per block (227 KB on H100 / H200, 163 KB on A100); 1 when unknown.
inline int max_smem_per_block(int device) {
    return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, 1);
}

std::string set_debug_kernel(const std::string &name, int64_t value);
int round_up(int x, int m);
const char *dtype_name(bool is_bf16);
void check_tensor(const at::Tensor &t, const char *name, const at::Tensor &ref);
bool is_aligned(const at::Tensor &t);
at::Tensor aligned(const at::Tensor &t);
at::Tensor output_or_new(const std::optional<at::Tensor> &given, const char *name, at::IntArrayRef shape,
                         const at::Tensor &like);
// The backward's inputs in the layout the kernels read (q, k, v, out, dout 16-byte aligned; softmax_lse
// float32 of lse_shape, contiguous) and its gradients: the caller's dq / dk / dv where given, else new.
std::array<at::Tensor, 3> prepare_bwd(at::Tensor &q, at::Tensor &k, at::Tensor &v, at::Tensor &out, at::Tensor &dout,
                                      at::Tensor &softmax_lse, at::IntArrayRef lse_shape, const char *lse_dims,
                                      const std::optional<at::Tensor> &dq_, const std::optional<at::Tensor> &dk_,
                                      const std::optional<at::Tensor> &dv_);
void copy_back(const std::optional<at::Tensor> &given, const at::Tensor &computed);
void set_qkv(flash::FwdParams &p, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
             const at::Tensor &out, const at::Tensor &lse, double softmax_scale, bool is_causal);
bool fwd_zero_fill(bool paged);
at::Tensor new_rng_buffer(const at::Tensor &q, bool zero_fill);
int *stream_tile_counter(const at::Tensor &on_device);
void set_tile_counter(flash::FwdParams &p, const at::Tensor &rng_buffer, bool zero_fill, bool varlen);
void set_fwd_ws_switches(flash::FwdParams &p, const at::Tensor &rng_buffer, bool zero_fill, bool varlen);
void set_backward_switches(flash::BwdParams &params);
// The score modifiers of every entry point: window (causal included), softcap and ALiBi. b, h: the
// batch size and number of query heads (dense q (b, s, h, d); varlen: cu_seqlens' batch).
void set_score_mods(flash::FwdParams &p, bool is_causal, int64_t window_left, int64_t window_right,
                    double softmax_scale, double softcap, const std::optional<at::Tensor> &alibi_slopes,
                    const at::Tensor &q, int64_t b, int64_t h);
// The learnable attention sink (nheads,) of a forward call (fp32, bf16 or fp16 on q's device) as
// a contiguous fp32 tensor, which the caller keeps alive for the launch; undefined without one.
at::Tensor learnable_sink_f32(const std::optional<at::Tensor> &learnable_sink, const at::Tensor &q, int64_t h);
// p.learnable_sink from learnable_sink_f32's tensor (after set_qkv / set_varlen_qkv, which reset p).
void set_learnable_sink(flash::FwdParams &p, const at::Tensor &sink);
// lse of rows that see no key, written without a kernel: +inf, or with a sink (learnable_sink_f32's
// tensor) the head's sink logit; head_dim: lse's head dimension.
void fill_empty_lse(at::Tensor &lse, const at::Tensor &sink, int64_t head_dim);
void check_dropout(double p_dropout, double softcap);
void set_dropout_rates(flash::FwdParams &p, double p_dropout);
uint64_t philox_increment(int64_t seqlen_k);
void set_dropout_fwd(flash::FwdParams &p, double p_dropout, int64_t seqlen_k, const at::Tensor &q,
                     const at::Tensor &rng_state, const at::Tensor &s_dmask, bool return_softmax);
void check_rng_state(double p_dropout, const std::optional<at::Tensor> &rng_state, const at::Tensor &q);
void set_dropout_bwd(flash::BwdParams &p, double p_dropout, const std::optional<at::Tensor> &rng_state);
int sm90_deterministic_splits(const flash::BwdParams &p, int64_t bh, int64_t max_seqlen_k, int device);
int sm80_deterministic_splits(const flash::BwdParams &p, int64_t bh, int64_t max_seqlen_k, int device);
bool ws_deterministic_serves(const flash::BwdParams &p, bool varlen);
int ws_deterministic_splits(const flash::BwdParams &p, int64_t max_seqlen_k);
int ws_det_head_group(const flash::BwdParams &p);
at::Tensor make_dq_accum(flash::BwdParams &p, bool deterministic, std::vector<int64_t> shape, int64_t b, int64_t h,
                         int64_t max_seqlen_k, int seqlen_q_rounded, const at::Tensor &q, at::Tensor &semaphore,
                         bool varlen);
void check_built_and_launched(bool found, bool is_bf16, int d, int tile);
// The backward with V narrower than Q / K (MLA; v, out, dout and dv at v's head dim, d Q's):
// run(v, out, dout, dv, /*own_v=*/true) on the kernel with a V head dim of its own where one serves
// the call, else run(..., false) on V, O and dO zero-padded to d (zero columns), with dV's padding
// columns cut off afterwards. Returns whether a kernel ran.
template <typename Run>
bool run_bwd_narrow_v(Run &&run, const at::Tensor &v, const at::Tensor &out, const at::Tensor &dout,
                      const at::Tensor &dv, int64_t d) {
    if (run(v, out, dout, dv, /*own_v=*/true)) return true;
    const int64_t head_dim_v = v.size(-1);
    const auto padded = [&](const at::Tensor &t) { return at::constant_pad_nd(t, {0, d - head_dim_v}); };
    std::vector<int64_t> sizes = dv.sizes().vec();
    sizes.back() = d;
    const at::Tensor dv_padded = at::empty(sizes, dv.options());
    if (!run(padded(v), padded(out), padded(dout), dv_padded, /*own_v=*/false)) return false;
    dv.copy_(dv_padded.narrow(-1, 0, head_dim_v));
    return true;
}
// head_dim_v: v's head dim may be below q's and k's (the forward; see mha_fwd).
void check_qkv_shapes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool head_dim_v = false,
                      int64_t max_head_dim = kMaxHeadDim);
at::Tensor checked_int_vector(const at::Tensor &t, const char *name, int64_t n, const at::Tensor &q);
const int *optional_ints(const std::optional<at::Tensor> &t, const char *name, int64_t n, const at::Tensor &q,
                         at::Tensor &holder);
void check_block_table(const at::Tensor &block_table, int64_t b, const at::Tensor &q);
// The device-side KV-cache guard (api/index_guard.h) on the current stream: its int32 buffer
// [skip flag, cache_seqlens (b), seqused (b), batch_idx (b), leftpad (b)], the values or zeros when
// one is out of range (api/index_checks.cpp).
at::Tensor run_kvcache_guard(const at::Tensor &q, const std::optional<at::Tensor> &cache_seqlens,
                             const std::optional<at::Tensor> &batch_idx, const std::optional<at::Tensor> &leftpad,
                             const std::optional<at::Tensor> &block_table, int64_t default_seqlen, int64_t seqlen_new,
                             int64_t seqlen_cache, int64_t batch_cache, int64_t page_block_size, int64_t num_blocks);

// The dense forward and backward (dense.cpp), which the SDPA kernels (sdpa.cpp) call too:
// {out, softmax_lse, S_dmask, rng_state} and {dq, dk, dv, softmax_d}.
std::vector<at::Tensor> mha_fwd(at::Tensor q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> out_,
                                double softmax_scale, bool is_causal, int64_t window_left, int64_t window_right,
                                double softcap, std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                bool return_softmax, std::optional<at::Tensor> learnable_sink);
std::vector<at::Tensor> mha_bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                at::Tensor softmax_lse, std::optional<at::Tensor> dq_, std::optional<at::Tensor> dk_,
                                std::optional<at::Tensor> dv_, double softmax_scale, bool is_causal, bool deterministic,
                                int64_t window_left, int64_t window_right, double softcap,
                                std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                std::optional<at::Tensor> rng_state);

// The entry points' pybind11 definitions, one per file (dense.cpp, varlen.cpp, kvcache.cpp,
// index_checks.cpp, sdpa.cpp); module.cpp calls them. Python wraps them in
// flash_attn/flash_attn_interface.py (sdpa.cpp: flash_attn/sdpa.py).
void bind_dense(py::module_ &m);
void bind_varlen(py::module_ &m);
void bind_kvcache(py::module_ &m);
void bind_index_checks(py::module_ &m);
void bind_sdpa(py::module_ &m);

}  // namespace flash::api
