// The binding's shared pieces (binding.h): tensor checks, params setters, dropout state,
// deterministic-mode workspaces, the kernel overrides of set_debug_kernel.
#include "api/binding.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>  // not CUDAContext.h: that one wants cusparse.h
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "common/heuristics.h"

namespace flash::api {


// Whether the sm_90a (wgmma) kernels may run; tests and benchmarks switch them off to exercise
// and compare the SM80-class path on the same GPU.
bool g_sm90_enabled = true;

// Kernel overrides for tests (set_debug_kernel): each reaches a kernel that the heuristics choose
// for some calls, on shapes where they choose another. Never read from the environment.
struct DebugKernel {
    int fwd_ws_d64_rows = 0;        // 0: flash::fwd_ws_d64_m128 chooses; 128 or 192: that tile height
    int fwd_ws_persistent = 0;      // 0: flash::fwd_ws_use_persistent chooses; 1: always; 2: never
    bool fwd_tma_o_off = false;     // O by 16-byte stores of every thread, as on varlen calls
    bool fwd_zero_fill = false;     // the per-call zeroed rng_state / tile counter of graph capture
    bool bwd_lockstep = false;      // the lock-step sm_90a backward, as for the calls the WS one declines
    int bwd_ws_head_group = 0;      // 0: the binding chooses (BwdParams::bwd_ws_head_group); n: n heads
    int bwd_ws_d128_block_m = 0;    // 0: flash::bwd_ws_d128_block_m chooses; 64 or 80: those rows
} g_debug;

// Returns an empty string, or what is wrong with (name, value): a C++ exception leaving the
// extension can take the process down under some torch builds, so this entry reports instead.
std::string set_debug_kernel(const std::string &name, int64_t value) {
    const std::string what = "flash_attn: set_debug_kernel('" + name + "', " + std::to_string(value) + "): ";
    const auto flag = [&](bool &field) -> std::string {
        if (value != 0 && value != 1) return what + "value must be 0 or 1";
        field = value == 1;
        return "";
    };
    if (name == "fwd_ws_d64_rows") {
        if (value != 0 && value != 128 && value != 192) return what + "value must be 0 (heuristic), 128 or 192";
        g_debug.fwd_ws_d64_rows = static_cast<int>(value);
        return "";
    }
    if (name == "fwd_ws_persistent") {
        if (value < 0 || value > 2) return what + "value must be 0 (heuristic), 1 (always) or 2 (never)";
        g_debug.fwd_ws_persistent = static_cast<int>(value);
        return "";
    }
    if (name == "fwd_tma_o_off") return flag(g_debug.fwd_tma_o_off);
    if (name == "fwd_zero_fill") return flag(g_debug.fwd_zero_fill);
    if (name == "bwd_lockstep") return flag(g_debug.bwd_lockstep);
    if (name == "bwd_ws_head_group") {
        if (value < 0 || value > 1024) return what + "value must be 0 (heuristic) or a head count up to 1024";
        g_debug.bwd_ws_head_group = static_cast<int>(value);
        return "";
    }
    if (name == "bwd_ws_d128_block_m") {
        if (value != 0 && value != 64 && value != 80) return what + "value must be 0 (heuristic), 64 or 80";
        g_debug.bwd_ws_d128_block_m = static_cast<int>(value);
        return "";
    }
    return what + "unknown name; known: 'fwd_ws_d64_rows', 'fwd_ws_persistent', 'fwd_tma_o_off', 'fwd_zero_fill', "
                  "'bwd_lockstep', 'bwd_ws_head_group', 'bwd_ws_d128_block_m'";
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

const char *dtype_name(bool is_bf16) { return is_bf16 ? "bf16" : "fp16"; }

void check_tensor(const at::Tensor &t, const char *name, const at::Tensor &ref) {
    FLASH_CHECK(t.is_cuda(), "flash_attn: ", name, " must be a CUDA tensor, got device ", t.device());
    FLASH_CHECK(t.device() == ref.device(), "flash_attn: ", name, " is on ", t.device(), " but q is on ", ref.device());
    FLASH_CHECK(t.scalar_type() == ref.scalar_type(), "flash_attn: ", name, " has dtype ", t.scalar_type(),
                " but q has dtype ", ref.scalar_type());
    FLASH_CHECK(t.dim() == 4, "flash_attn: ", name, " must have shape (batch, seqlen, nheads, headdim), got ",
                t.sizes());
    FLASH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "flash_attn: ", name,
                " must have a contiguous last dimension, got strides ", t.strides());
}

// The kernels move 16-byte vectors: every stride must be a multiple of 8 elements and the base
// 16-byte aligned. Views that are not (rare: odd slices) are copied once.
bool is_aligned(const at::Tensor &t) {
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
    if (t.stride(-1) != 1) return false;
    for (int i = 0; i < t.dim() - 1; ++i) {
        if (t.stride(i) % 8 != 0 && t.size(i) > 1) return false;
    }
    return true;
}

at::Tensor aligned(const at::Tensor &t) { return is_aligned(t) ? t : t.contiguous(); }

// An output the caller supplied, or a fresh one; a supplied but unaligned one gets a temporary
// that is copied back with copy_back(). A fresh one has `like`'s layout where that is dense (as
// upstream's empty_like): SDPA's (batch, nheads, seqlen, headdim) tensors reach the kernels as
// transposed views, and an output in their layout needs no copy afterwards.
at::Tensor output_or_new(const std::optional<at::Tensor> &given, const char *name, at::IntArrayRef shape,
                         const at::Tensor &like) {
    if (given.has_value()) {
        const at::Tensor &t = given.value();
        FLASH_CHECK(t.sizes() == shape, "flash_attn: ", name, " must have shape ", shape, ", got ", t.sizes());
        FLASH_CHECK(t.scalar_type() == like.scalar_type() && t.device() == like.device(), "flash_attn: ", name,
                    " must have dtype ", like.scalar_type(), " on ", like.device());
        if (is_aligned(t)) return t;
    }
    if (like.sizes() == shape) {
        at::Tensor t = at::empty_like(like);
        if (is_aligned(t)) return t;
    }
    return at::empty(shape, like.options());
}

std::array<at::Tensor, 3> prepare_bwd(at::Tensor &q, at::Tensor &k, at::Tensor &v, at::Tensor &out, at::Tensor &dout,
                                      at::Tensor &softmax_lse, at::IntArrayRef lse_shape, const char *lse_dims,
                                      const std::optional<at::Tensor> &dq_, const std::optional<at::Tensor> &dk_,
                                      const std::optional<at::Tensor> &dv_) {
    FLASH_CHECK(softmax_lse.is_cuda() && softmax_lse.scalar_type() == at::kFloat && softmax_lse.sizes() == lse_shape,
                "flash_attn: softmax_lse must be a float32 CUDA tensor of shape ", lse_dims);
    q = aligned(q), k = aligned(k), v = aligned(v), out = aligned(out), dout = aligned(dout);
    softmax_lse = softmax_lse.contiguous();
    return {output_or_new(dq_, "dq", q.sizes(), q), output_or_new(dk_, "dk", k.sizes(), k),
            output_or_new(dv_, "dv", v.sizes(), v)};
}

void copy_back(const std::optional<at::Tensor> &given, const at::Tensor &computed) {
    if (given.has_value() && !given.value().is_same(computed)) given.value().copy_(computed);
}

void set_qkv(flash::FwdParams &p, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
             const at::Tensor &out, const at::Tensor &lse, double softmax_scale, bool is_causal) {
    p = {};
    p.q_ptr = q.data_ptr();
    p.k_ptr = k.data_ptr();
    p.v_ptr = v.data_ptr();
    p.q_batch_stride = q.stride(0), p.k_batch_stride = k.stride(0), p.v_batch_stride = v.stride(0);
    p.q_row_stride = q.stride(1), p.k_row_stride = k.stride(1), p.v_row_stride = v.stride(1);
    p.q_head_stride = q.stride(2), p.k_head_stride = k.stride(2), p.v_head_stride = v.stride(2);
    p.o_ptr = out.data_ptr();
    p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
    p.softmax_lse_ptr = lse.data_ptr<float>();
    p.lse_batch_stride = lse.stride(0), p.lse_head_stride = lse.stride(1);
    p.b = q.size(0);
    p.seqlen_q = q.size(1);
    p.seqlen_k = k.size(1);
    p.h = q.size(2);
    p.h_k = k.size(2);
    p.h_h_k_ratio = p.h / p.h_k;
    p.d = q.size(3);
    p.dv = v.size(3);
    p.head_dim_tile = flash::head_dim_tile(p.d);
    p.scale_softmax = static_cast<float>(softmax_scale);
    p.scale_softmax_log2 = static_cast<float>(softmax_scale * M_LOG2E);
    p.cu_seqlens_q = nullptr;
    p.cu_seqlens_k = nullptr;
    p.window_left = flash::kWindowUnbounded;
    p.window_right = is_causal ? 0 : flash::kWindowUnbounded;
    p.is_bf16 = q.scalar_type() == at::kBFloat16;
    p.use_sm90 = g_sm90_enabled && flash::device_sm(q.get_device()) == 90;
}

// A forward's rng_state and the persistent forward's tile counter, without a fill kernel per call
// (the zero fill and its launch gap cost ~2 us of a 140 us call at 512 tokens).
// rng_state: uninitialised here, written by the kernel (zeros without dropout, write_rng_state).
// The tile counter (flash.h: tile_count_ptr, two int32): one per (device, stream), zeroed once
// and zeroed again by each kernel's last CTA, so calls on one stream (ordered) share it and calls
// on different streams never do. Per-call zeroed buffers instead (rng_buffer, int64 (3,): rng_state
// and, in element 2, the counter) under CUDA graph capture (a graph's replays may run on another
// stream, next to eager calls on the capture stream) and for the paged varlen forward (the
// split-KV kernel leaves rng_state alone).
bool fwd_zero_fill(bool paged) {
    return paged || g_debug.fwd_zero_fill ||
           c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

at::Tensor new_rng_buffer(const at::Tensor &q, bool zero_fill) {
    return zero_fill ? at::zeros({3}, q.options().dtype(at::kLong)) : at::empty({2}, q.options().dtype(at::kLong));
}

// The current stream's tile counter on the device of `on_device`.
int *stream_tile_counter(const at::Tensor &on_device) {
    static std::mutex mutex;
    // Never freed (nor destroyed at exit, after the CUDA context may be gone): two int32 per stream.
    static auto *counters = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    std::lock_guard<std::mutex> lock(mutex);
    at::Tensor &counter = (*counters)[{static_cast<int>(on_device.get_device()), stream}];
    if (!counter.defined()) counter = at::zeros({2}, on_device.options().dtype(at::kInt));  // on this stream
    return counter.data_ptr<int>();
}

// The persistent forward's tile counter for the calls whose tiles differ in work (causal,
// sliding window, varlen), drawn from dynamically; the others walk the tiles in the static order.
void set_tile_counter(flash::FwdParams &p, const at::Tensor &rng_buffer, bool zero_fill, bool varlen) {
    const bool ws_tile = p.head_dim_tile == 64 || p.head_dim_tile == 128 || p.head_dim_tile == 256;
    if (!p.use_sm90 || !ws_tile || !flash::fwd_ws_use_persistent(p, p.head_dim_tile) ||
        flash::has_features(p)) {
        return;
    }
    const bool uneven = varlen || p.window_left < flash::kWindowUnbounded || p.window_right < flash::kWindowUnbounded;
    if (!uneven) return;
    p.tile_count_ptr = zero_fill ? reinterpret_cast<int *>(rng_buffer.data_ptr<int64_t>() + 2)
                                 : stream_tile_counter(rng_buffer);
}

// The warp-specialised forward (where it applies; flash_fwd_launch.h) with the persistent kernel
// where flash::fwd_ws_use_persistent says so and the TMA store of O, and the persistent kernel's
// tile counter, for the dense and the varlen forward alike (after the window and features are set).
void set_fwd_ws_switches(flash::FwdParams &p, const at::Tensor &rng_buffer, bool zero_fill, bool varlen) {
    p.fwd_ws_persistent = g_debug.fwd_ws_persistent == 1   ? flash::kFwdWsPersistentOn
                          : g_debug.fwd_ws_persistent == 2 ? flash::kFwdWsPersistentOff
                                                           : flash::kFwdWsPersistentAuto;
    p.fwd_ws_d64_rows = g_debug.fwd_ws_d64_rows;
    p.fwd_tma_o = !g_debug.fwd_tma_o_off;
    set_tile_counter(p, rng_buffer, zero_fill, varlen);
}

// The backward's kernel choice, for the dense and the varlen binding alike: the warp-specialised
// sm_90a backward where it applies (dispatch/flash_bwd_ws_launch_sm90.h; at head dim 256 its split-d
// exchange form, with the score-modifier / dropout / deterministic variant), dQ through shared
// memory and one bulk reduce-add per tile (swizzled), dS^T stored with stmatrix, 128-row query
// blocks at d64; the SM80-class backward computes dQ before dK. docs/perf-notes.md has the numbers.
// After make_dq_accum (which sets the deterministic calls' head group).
void set_backward_switches(flash::BwdParams &params) {
    params.bwd_ws = !g_debug.bwd_lockstep;
    if (!params.bwd_ws_det) {
        params.bwd_ws_head_group = params.window_right < flash::kWindowUnbounded
                                       ? flash::bwd_ws_causal_head_group(params.head_dim_tile, params.seqlen_q)
                                       : 1;
    }
    if (g_debug.bwd_ws_head_group > 0) params.bwd_ws_head_group = g_debug.bwd_ws_head_group;
    params.bwd_ws_d128_block_m = g_debug.bwd_ws_d128_block_m > 0
                                     ? g_debug.bwd_ws_d128_block_m
                                     : flash::bwd_ws_d128_block_m(params.window_left, params.window_right);
}

// Sliding window (left, right), -1 = unbounded, with upstream's conventions: a side at least
// seqlen_k long is unbounded, causal means right = 0.
static void set_window(flash::FwdParams &p, bool is_causal, int64_t window_left, int64_t window_right) {
    if (window_left >= p.seqlen_k) window_left = -1;
    if (window_right >= p.seqlen_k) window_right = -1;
    if (is_causal) window_right = 0;
    p.window_left = window_left < 0 ? flash::kWindowUnbounded : static_cast<int>(window_left);
    p.window_right = window_right < 0 ? flash::kWindowUnbounded : static_cast<int>(window_right);
}

// Softcap: the kernels compute tanh(s * softcap_scale) and scale it by softcap (upstream's scheme),
// so scale_softmax becomes softcap; the backward's dq / dk scaling follows.
static void set_softcap(flash::FwdParams &p, double softmax_scale, double softcap) {
    if (softcap <= 0.0) return;  // <= 0 means off (upstream)
    p.softcap_scale = static_cast<float>(softmax_scale / softcap);
    p.scale_softmax = static_cast<float>(softcap);
    p.scale_softmax_log2 = static_cast<float>(softcap * M_LOG2E);
}

static void set_alibi(flash::FwdParams &p, const std::optional<at::Tensor> &alibi_slopes, const at::Tensor &q,
                      int64_t b, int64_t h) {
    if (!alibi_slopes.has_value()) return;
    const at::Tensor &a = alibi_slopes.value();
    FLASH_CHECK(a.scalar_type() == at::kFloat, "flash_attn: alibi_slopes must have dtype float32, got ",
                a.scalar_type());
    FLASH_CHECK(a.device() == q.device(), "flash_attn: alibi_slopes is on ", a.device(), " but q is on ", q.device());
    FLASH_CHECK(a.stride(-1) == 1, "flash_attn: alibi_slopes must have a contiguous last dimension");
    FLASH_CHECK(a.sizes() == at::IntArrayRef({h}) || a.sizes() == at::IntArrayRef({b, h}),
                "flash_attn: alibi_slopes must have shape (nheads,) = (", h, ",) or (batch_size, nheads) = (", b,
                ", ", h, "), got ", a.sizes());
    p.alibi_slopes_ptr = a.data_ptr<float>();
    p.alibi_slopes_batch_stride = a.dim() == 2 ? a.stride(0) : 0;
}

void set_score_mods(flash::FwdParams &p, bool is_causal, int64_t window_left, int64_t window_right,
                    double softmax_scale, double softcap, const std::optional<at::Tensor> &alibi_slopes,
                    const at::Tensor &q, int64_t b, int64_t h) {
    set_window(p, is_causal, window_left, window_right);
    set_softcap(p, softmax_scale, softcap);
    set_alibi(p, alibi_slopes, q, b, h);
}

at::Tensor learnable_sink_f32(const std::optional<at::Tensor> &learnable_sink, const at::Tensor &q, int64_t h) {
    if (!learnable_sink.has_value()) return at::Tensor();
    const at::Tensor &s = learnable_sink.value();
    FLASH_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16 || s.scalar_type() == at::kHalf,
                "flash_attn: learnable_sink must have dtype float32, bfloat16 or float16, got ", s.scalar_type());
    FLASH_CHECK(s.device() == q.device(), "flash_attn: learnable_sink is on ", s.device(), " but q is on ",
                q.device());
    FLASH_CHECK(s.sizes() == at::IntArrayRef({h}), "flash_attn: learnable_sink must have shape (nheads,) = (", h,
                ",), got ", s.sizes());
    return s.to(at::kFloat).contiguous();
}

void set_learnable_sink(flash::FwdParams &p, const at::Tensor &sink) {
    p.learnable_sink = sink.defined() ? sink.data_ptr<float>() : nullptr;
}

void fill_empty_lse(at::Tensor &lse, const at::Tensor &sink, int64_t head_dim) {
    if (!sink.defined()) {
        lse.fill_(std::numeric_limits<float>::infinity());
        return;
    }
    std::vector<int64_t> shape(lse.dim(), 1);
    shape[head_dim] = sink.size(0);
    lse.copy_(sink.view(shape).expand_as(lse));
}

void check_dropout(double p_dropout, double softcap) {
    FLASH_CHECK(p_dropout >= 0.0 && p_dropout < 1.0, "flash_attn: dropout_p must be in [0, 1), got ", p_dropout);
    FLASH_CHECK(p_dropout == 0.0 || softcap <= 0.0,
                "flash_attn: softcapping (softcap > 0) does not support dropout (dropout_p > 0), as upstream");
}

void set_dropout_rates(flash::FwdParams &p, double p_dropout) {
    p.p_dropout = static_cast<float>(p_dropout);
    p.rp_dropout = static_cast<float>(1.0 / (1.0 - p_dropout));
    // At most 255: the sm_90a kernels compare whole bytes at once (dropout_sm90.h), and a keep
    // probability of 1 is no dropout.
    p.dropout_keep_threshold = static_cast<uint32_t>(std::min(255L, std::lround((1.0 - p_dropout) * 256.0)));
}

// Philox counters one dropout call uses per (row, head, batch) subsequence, in 32-bit values (the
// unit of the generator's offset): 4 counters of 4 words per 128 keys (flash::dropout_counter).
uint64_t philox_increment(int64_t seqlen_k) { return static_cast<uint64_t>((seqlen_k + 127) / 128) * 16; }

// Forward with dropout: rates, this call's Philox (seed, offset) from the default CUDA generator
// (graph-capture safe), where the kernel writes them back (rng_state), and S_dmask if requested.
// seqlen_k: the longest key sequence (the mask's column range).
void set_dropout_fwd(flash::FwdParams &p, double p_dropout, int64_t seqlen_k, const at::Tensor &q,
                     const at::Tensor &rng_state, const at::Tensor &s_dmask, bool return_softmax) {
    set_dropout_rates(p, p_dropout);
    auto *gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.get_device()));
    at::PhiloxCudaState state;
    {
        std::lock_guard<std::mutex> lock(gen->mutex_);
        state = gen->philox_cuda_state(philox_increment(seqlen_k));
    }
    p.philox.from_device = state.captured_;
    if (state.captured_) {  // CUDA graph capture: the values live on the device
        p.philox.seed_ptr = state.seed_.ptr;
        p.philox.offset_ptr = state.offset_.ptr;
        p.philox.offset_extra = state.offset_intragraph_;
    } else {
        p.philox.seed = state.seed_.val;
        p.philox.offset = state.offset_.val;
    }
    p.rng_state_ptr = rng_state.data_ptr<int64_t>();
    if (return_softmax) {
        p.s_dmask_ptr = s_dmask.data_ptr();
        p.s_dmask_batch_stride = s_dmask.stride(0);
        p.s_dmask_head_stride = s_dmask.stride(1);
        p.s_dmask_row_stride = s_dmask.stride(2);
    }
}

void check_rng_state(double p_dropout, const std::optional<at::Tensor> &rng_state, const at::Tensor &q) {
    if (p_dropout <= 0.0) return;
    FLASH_CHECK(rng_state.has_value(), "flash_attn: the backward with dropout needs the forward's rng_state");
    const at::Tensor &r = rng_state.value();
    FLASH_CHECK(r.device() == q.device() && r.scalar_type() == at::kLong && r.numel() == 2 && r.is_contiguous(),
                "flash_attn: rng_state must be a contiguous int64 tensor of 2 elements (seed, offset) on q's "
                "device, got ", r.scalar_type(), " ", r.sizes(), " on ", r.device());
}

// Backward with dropout: the forward's (seed, offset), read on the device (graph-safe, no sync).
void set_dropout_bwd(flash::BwdParams &p, double p_dropout, const std::optional<at::Tensor> &rng_state) {
    if (p_dropout <= 0.0) return;
    set_dropout_rates(p, p_dropout);
    p.philox.from_device = true;
    p.philox.seed_ptr = rng_state.value().data_ptr<int64_t>();
    p.philox.offset_ptr = p.philox.seed_ptr + 1;
}




// Deterministic backward on the sm_90a kernel (128-key blocks): per-CTA dq_accum slices instead
// of counters. 0 when the sm_90a backward does not serve this call (the SM80-class kernel uses
// counters).
int sm90_deterministic_splits(const flash::BwdParams &p, int64_t bh, int64_t max_seqlen_k, int device) {
#ifdef FLASH_ATTN_SM90A
    if (!(p.use_sm90 && (p.head_dim_tile == 64 || p.head_dim_tile == 128))) return 0;
    return deterministic_splits(bh, (max_seqlen_k + 127) / 128, num_sms(device));
#else
    (void)p, (void)bh, (void)max_seqlen_k, (void)device;
    return 0;
#endif
}

// Deterministic backward on the SM80-class d = 256 kernels' fixed-feature-set variants
// (flash_bwd_launch.h, kBwdFeatSets): per-CTA dq_accum slices as on the sm_90a backward, with
// 64-key blocks. 0 where the generic variant (semaphores) serves the call.
int sm80_deterministic_splits(const flash::BwdParams &p, int64_t bh, int64_t max_seqlen_k, int device) {
    if (p.head_dim_tile != 256) return 0;
    return deterministic_splits(bh, (max_seqlen_k + 63) / 64, num_sms(device));
}

// Whether a deterministic backward call will run the warp-specialised sm_90a kernel (its launcher,
// dispatch/flash_bwd_ws_launch_sm90.h, applies the same conditions, plus stride / alignment checks
// under which it declines and the lock-step kernel's sliced mode runs instead): the WS kernel with
// the dQ bulk reduce-add, no dropout, no softcap at d64, dense, head dim a multiple of 8; at head
// dim 256 the split-d kernel's exchange form, whose writer warp
// adds the dQ tiles in order from the Q / dO stage (kDqStage).
bool ws_deterministic_serves(const flash::BwdParams &p, bool varlen) {
#ifdef FLASH_ATTN_SM90A
    // Tile 192 only with a V head dim of its own (the split-d 192 / 128 kernel,
    // run_mha_bwd_head_dim_v; the binding's padded fallback has dv == d and keeps the sliced mode).
    const bool tile_ok = p.head_dim_tile == 64 || p.head_dim_tile == 128 || p.head_dim_tile == 256 ||
                         (p.head_dim_tile == 192 && p.dv < p.d);
    return p.use_sm90 && tile_ok && p.p_dropout <= 0.f && !(p.head_dim_tile == 64 && p.softcap_scale > 0.f) && !varlen && p.d % 8 == 0;
#else
    (void)p, (void)varlen;
    return false;
#endif
}

// dq_accum slices of the WS deterministic mode. Key block n adds into slice n % splits, in an order
// per (slice, query block): more slices mean shorter ordered chains, but each slice is one more
// zeroed dq_accum to clear and to read in the conversion. The chains cost little (each link is one
// reduce-add round trip, overlapped with the next query block's GEMMs), so few slices win. H200
// bf16 8k, deterministic bwd / default bwd for 1 / 2 / 4 / 8 slices:
// d64 1.05 / 1.05 / 1.07 / 1.10, causal 1.05 / 1.06 / 1.09 / 1.15; d128 1.08 / 1.05 / 1.06 / 1.14,
// causal 1.02 / 1.05 / 1.22 / 1.34. Causal and other bounded-right windows (descending order: a key
// block's first query block waits for nobody) take 1, the rest 2. Head dim 256 (the split-d kMod
// kernel, kDqStage: the writer warp's ordered bulk reduces): 1; bf16 8k, 1 / 2 slices:
// 7.72 / 7.69 ms, causal 4.13 / 4.31 ms (default 6.50 / 3.28).
// (Earlier consumer-ordered atomics, all ATOMG: 14.9 / 16.4 / 17.3 / 18.3 ms for 1 / 2 / 4 / 8.)
int ws_deterministic_splits(const flash::BwdParams &p, int64_t max_seqlen_k) {
    if (p.head_dim_tile == 256 || p.head_dim_tile == 192) return 1;  // the split-d kernels (192: dv < d only)
    const bool descending = p.window_right < flash::kWindowUnbounded;  // as bwd_ws_det_descending
    return descending || max_seqlen_k <= 128 ? 1 : 2;
}

// How many heads' key blocks the WS deterministic causal backward interleaves in its launch order
// (BwdParams::bwd_ws_head_group). H200 bf16 8k causal, deterministic backward /
// default for 1 / 2 / 4 heads: d64 1.014 / 1.011 /
// 1.005, d128 1.037 / 1.045 / 1.055, d256 1.214 / **1.191** / 1.385 (4 heads' Q, dO and fp32 dQ
// slices, 64 MB, no longer fit in L2). Default: 2 at head dim 256, else 1 (one head after the
// other).
int ws_det_head_group(const flash::BwdParams &p) { return p.head_dim_tile == 256 ? 2 : 1; }

// The zeroed fp32 dQ accumulator (`shape` per slice) and the deterministic mode: per-CTA slices on
// the sm_90a backward and the d = 256 fixed-feature-set kernels, else one int32 counter per (b, h,
// 64-row block of seqlen_q_rounded rows), returned in `semaphore` (it must outlive the launch).
at::Tensor make_dq_accum(flash::BwdParams &p, bool deterministic, std::vector<int64_t> shape, int64_t b, int64_t h,
                         int64_t max_seqlen_k, int seqlen_q_rounded, const at::Tensor &q, at::Tensor &semaphore,
                         bool varlen) {
    p.deterministic = deterministic;
    if (deterministic && ws_deterministic_serves(p, varlen)) {
        // Warp-specialised backward: zeroed slices (the bulk reduce-add adds into them) and one
        // counter per (slice, b, h, 64-row query block); see BwdParams::bwd_ws_det.
        const int splits = ws_deterministic_splits(p, max_seqlen_k);
        shape.insert(shape.begin(), splits);
        at::Tensor dq_accum = at::zeros(shape, q.options().dtype(at::kFloat));
        p.dq_accum_ptr = dq_accum.data_ptr<float>();
        p.dq_accum_splits = splits;
        p.dq_accum_split_stride = dq_accum.stride(0);
        p.dq_store_first = false;
        semaphore = at::zeros({splits, b, h, seqlen_q_rounded / 64}, q.options().dtype(at::kInt));
        p.dq_semaphore_ptr = semaphore.data_ptr<int>();
        p.bwd_ws_det = true;
        // The head group orders only the downward walk (causal); upward, one head after the other.
        p.bwd_ws_head_group = p.window_right < flash::kWindowUnbounded ? ws_det_head_group(p) : 1;
        return dq_accum;
    }
    const int sm90_splits = deterministic ? sm90_deterministic_splits(p, b * h, max_seqlen_k, q.get_device()) : 0;
    int splits = sm90_splits;
    if (deterministic && splits == 0) splits = sm80_deterministic_splits(p, b * h, max_seqlen_k, q.get_device());
    shape.insert(shape.begin(), std::max(splits, 1));
    // Sliced sm_90a backward without a left window: the slices are not zeroed; each CTA stores its
    // first key block's dQ (a superset of its later blocks' rows) and the conversion reads only
    // the rows a slice holds (BwdParams::dq_store_first). H200 bf16 8k, deterministic + causal bwd
    // / default: d64 1.16x -> 1.09x, d128 1.24x -> 1.22x. Not on the SM80-class d = 256 kernels: the
    // store branch in their dQ loop cost 7-13% on every feature backward (ptxas spills).
    p.dq_store_first = sm90_splits > 0 && p.window_left >= flash::kWindowUnbounded;
    // The default (not deterministic) mode: one slice, zeroed row by row by the backward's
    // preprocess kernel (BwdParams::dq_accum_zero_in_preprocess) instead of a fill kernel.
    p.dq_accum_zero_in_preprocess = !deterministic;
    at::Tensor dq_accum = p.dq_store_first || p.dq_accum_zero_in_preprocess
                              ? at::empty(shape, q.options().dtype(at::kFloat))
                              : at::zeros(shape, q.options().dtype(at::kFloat));
    p.dq_accum_ptr = dq_accum.data_ptr<float>();
    p.deterministic = deterministic;
    if (splits > 0) {
        p.dq_accum_splits = splits;
        p.dq_accum_split_stride = dq_accum.stride(0);
    } else if (deterministic) {
        semaphore = at::zeros({b, h, seqlen_q_rounded / 64}, q.options().dtype(at::kInt));
        p.dq_semaphore_ptr = semaphore.data_ptr<int>();
    }
    return dq_accum;
}

void check_built_and_launched(bool found, bool is_bf16, int d, int tile) {
    FLASH_CHECK_RUNTIME(found, "flash_attn: this build has no kernels for dtype ", dtype_name(is_bf16), " with head dim ", d,
                " (tile ", tile, "). Rebuild with FLASH_ATTN_HEAD_DIMS including ", tile,
                " and FLASH_ATTN_DTYPES including ", dtype_name(is_bf16), ".");
    const std::string err = flash::last_launch_error();
    FLASH_CHECK_RUNTIME(err.empty(), "flash_attn: CUDA error: ", err);
}

void check_qkv_shapes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool head_dim_v,
                      int64_t max_head_dim) {
    FLASH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "flash_attn: q must be float16 or bfloat16, got ", q.scalar_type());
    check_tensor(q, "q", q);
    check_tensor(k, "k", q);
    check_tensor(v, "v", q);
    const int64_t b = q.size(0), d = q.size(3);
    FLASH_CHECK(k.size(0) == b && v.size(0) == b, "flash_attn: q, k, v must have the same batch size, got ",
                q.sizes(), ", ", k.sizes(), ", ", v.sizes());
    const bool same_but_head_dim = k.size(1) == v.size(1) && k.size(2) == v.size(2) && v.size(3) < k.size(3) &&
                                   v.size(3) % 8 == 0 && v.size(3) > 0;
    FLASH_CHECK(k.sizes() == v.sizes() || (head_dim_v && same_but_head_dim), "flash_attn: k and v must have the same shape",
                head_dim_v ? " (v's head dim may be a smaller multiple of 8)" : "", ", got ", k.sizes(), " and ", v.sizes());
    FLASH_CHECK(k.size(3) == d, "flash_attn: q and k must have the same head dim, got ", d, " and ", k.size(3));
    FLASH_CHECK(d % 8 == 0 && d <= max_head_dim, "flash_attn: head dim must be a multiple of 8 and at most ",
                max_head_dim, " here (the Python layer pads), got ", d);
    FLASH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "flash_attn: nheads (", q.size(2),
                ") must be divisible by nheads_k (", k.size(2), ")");
}

// A 1-D int32 index tensor of n entries on q's device (cu_seqlens, cache_seqlens, ...), contiguous.
at::Tensor checked_int_vector(const at::Tensor &t, const char *name, int64_t n, const at::Tensor &q) {
    FLASH_CHECK(t.is_cuda() && t.device() == q.device(), "flash_attn: ", name, " must be on q's device ", q.device(),
                ", got ", t.device());
    FLASH_CHECK(t.scalar_type() == at::kInt, "flash_attn: ", name, " must have dtype int32, got ", t.scalar_type());
    FLASH_CHECK(t.dim() == 1 && t.size(0) == n, "flash_attn: ", name, " must have shape (", n, "), got ", t.sizes());
    return t.contiguous();
}

// checked_int_vector of an optional argument, kept alive in `holder`: its data, or nullptr if absent.
const int *optional_ints(const std::optional<at::Tensor> &t, const char *name, int64_t n, const at::Tensor &q,
                         at::Tensor &holder) {
    if (!t.has_value()) return nullptr;
    holder = checked_int_vector(t.value(), name, n, q);
    return holder.data_ptr<int>();
}

// (b, max_num_blocks_per_seq) int32 on q's device with a contiguous last dimension.
void check_block_table(const at::Tensor &block_table, int64_t b, const at::Tensor &q) {
    FLASH_CHECK(block_table.is_cuda() && block_table.device() == q.device() &&
                    block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) == b &&
                    block_table.stride(-1) == 1,
                "flash_attn: block_table must be an int32 CUDA tensor of shape (batch_size, max_num_blocks_per_seq) "
                "with a contiguous last dimension on q's device, got ", block_table.scalar_type(), " ",
                block_table.sizes());
}

}  // namespace flash::api
