// The one file that includes torch: checks tensors, fills the plain params structs, allocates
// outputs and workspaces, and calls the dispatcher on the current CUDA stream.
#include <torch/extension.h>

#include <ATen/cuda/CUDAGeneratorImpl.h>  // not CUDAContext.h: that one wants cusparse.h
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/flash.h"

namespace {

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
    return what + "unknown name; known: 'fwd_ws_d64_rows', 'fwd_ws_persistent', 'fwd_tma_o_off', 'fwd_zero_fill', "
                  "'bwd_lockstep'";
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
// that is copied back with copy_back().
at::Tensor output_or_new(const std::optional<at::Tensor> &given, const char *name, at::IntArrayRef shape,
                         const at::Tensor &like) {
    if (given.has_value()) {
        const at::Tensor &t = given.value();
        FLASH_CHECK(t.sizes() == shape, "flash_attn: ", name, " must have shape ", shape, ", got ", t.sizes());
        FLASH_CHECK(t.scalar_type() == like.scalar_type() && t.device() == like.device(), "flash_attn: ", name,
                    " must have dtype ", like.scalar_type(), " on ", like.device());
        if (is_aligned(t)) return t;
    }
    return at::empty(shape, like.options());
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
void set_backward_switches(flash::BwdParams &params) { params.bwd_ws = !g_debug.bwd_lockstep; }

// Sliding window (left, right), -1 = unbounded, with upstream's conventions: a side at least
// seqlen_k long is unbounded, causal means right = 0.
void set_window(flash::FwdParams &p, bool is_causal, int64_t window_left, int64_t window_right) {
    if (window_left >= p.seqlen_k) window_left = -1;
    if (window_right >= p.seqlen_k) window_right = -1;
    if (is_causal) window_right = 0;
    p.window_left = window_left < 0 ? flash::kWindowUnbounded : static_cast<int>(window_left);
    p.window_right = window_right < 0 ? flash::kWindowUnbounded : static_cast<int>(window_right);
}

// Softcap: the kernels compute tanh(s * softcap_scale) and scale it by softcap (upstream's scheme),
// so scale_softmax becomes softcap; the backward's dq / dk scaling follows.
void set_softcap(flash::FwdParams &p, double softmax_scale, double softcap) {
    if (softcap <= 0.0) return;  // <= 0 means off (upstream)
    p.softcap_scale = static_cast<float>(softmax_scale / softcap);
    p.scale_softmax = static_cast<float>(softcap);
    p.scale_softmax_log2 = static_cast<float>(softcap * M_LOG2E);
}

// b, h: the batch size and number of query heads (dense q (b, s, h, d); varlen: cu_seqlens
// batch and q (total, h, d)).
void set_alibi(flash::FwdParams &p, const std::optional<at::Tensor> &alibi_slopes, const at::Tensor &q, int64_t b,
               int64_t h) {
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


int num_sms(int device);

// Per-CTA dq_accum slices per (b, h) for the sliced deterministic backward (one CTA per SM): at
// most 8, chosen to fill whole waves: cost = waves x key blocks per CTA.
int deterministic_splits(int64_t bh, int64_t n_blocks, int device) {
    const int64_t sms = num_sms(device);
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int64_t s = 1; s <= std::min<int64_t>(8, n_blocks); ++s) {
        const int64_t cost = ((bh * s + sms - 1) / sms) * ((n_blocks + s - 1) / s);
        if (cost < best_cost) best_cost = cost, best = static_cast<int>(s);
    }
    return best;
}

// Deterministic backward on the sm_90a kernel (128-key blocks): per-CTA dq_accum slices instead
// of counters. 0 when the sm_90a backward does not serve this call (the SM80-class kernel uses
// counters).
int sm90_deterministic_splits(const flash::BwdParams &p, int64_t bh, int64_t max_seqlen_k, int device) {
#ifdef FLASH_ATTN_SM90A
    if (!(p.use_sm90 && (p.head_dim_tile == 64 || p.head_dim_tile == 128))) return 0;
    return deterministic_splits(bh, (max_seqlen_k + 127) / 128, device);
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
    return deterministic_splits(bh, (max_seqlen_k + 63) / 64, device);
}

// Whether a deterministic backward call will run the warp-specialised sm_90a kernel (its launcher,
// dispatch/flash_bwd_ws_launch_sm90.h, applies the same conditions, plus stride / alignment checks
// under which it declines and the lock-step kernel's sliced mode runs instead): the WS kernel with
// the dQ bulk reduce-add, no dropout, no softcap at d64, dense, head dim a multiple of 8; at head
// dim 256 the split-d kernel's exchange form, whose writer warp
// adds the dQ tiles in order from the Q / dO stage (kDqStage).
bool ws_deterministic_serves(const flash::BwdParams &p, bool varlen) {
#ifdef FLASH_ATTN_SM90A
    const bool tile_ok = p.head_dim_tile == 64 || p.head_dim_tile == 128 || p.head_dim_tile == 256;
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
// bf16 8k, deterministic bwd / default bwd for 1 / 2 / 4 / 8 slices (docs/results/s9/det_splits.log):
// d64 1.05 / 1.05 / 1.07 / 1.10, causal 1.05 / 1.06 / 1.09 / 1.15; d128 1.08 / 1.05 / 1.06 / 1.14,
// causal 1.02 / 1.05 / 1.22 / 1.34. Causal and other bounded-right windows (descending order: a key
// block's first query block waits for nobody) take 1, the rest 2. Head dim 256 (the split-d kMod
// kernel, kDqStage: the writer warp's ordered bulk reduces): 1; bf16 8k, 1 / 2 slices:
// 7.72 / 7.69 ms, causal 4.13 / 4.31 ms (default 6.50 / 3.28; docs/results/s12/s2_bench_bwd_d256_mod.log).
// (Earlier consumer-ordered atomics, all ATOMG: 14.9 / 16.4 / 17.3 / 18.3 ms for 1 / 2 / 4 / 8.)
int ws_deterministic_splits(const flash::BwdParams &p, int64_t max_seqlen_k) {
    if (p.head_dim_tile == 256) return 1;
    const bool descending = p.window_right < flash::kWindowUnbounded;  // as bwd_ws_det_descending
    return descending || max_seqlen_k <= 128 ? 1 : 2;
}

// How many heads' key blocks the WS deterministic causal backward interleaves in its launch order
// (BwdParams::bwd_ws_det_head_group). H200 bf16 8k causal, deterministic backward /
// default for 1 / 2 / 4 heads (docs/results/s17/hg_det_head_group_ab.log): d64 1.014 / 1.011 /
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
        p.bwd_ws_det_head_group = ws_det_head_group(p);
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

void check_qkv_shapes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
    FLASH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "flash_attn: q must be float16 or bfloat16, got ", q.scalar_type());
    check_tensor(q, "q", q);
    check_tensor(k, "k", q);
    check_tensor(v, "v", q);
    const int64_t b = q.size(0), d = q.size(3);
    FLASH_CHECK(k.size(0) == b && v.size(0) == b, "flash_attn: q, k, v must have the same batch size, got ",
                q.sizes(), ", ", k.sizes(), ", ", v.sizes());
    FLASH_CHECK(k.sizes() == v.sizes(), "flash_attn: k and v must have the same shape, got ", k.sizes(), " and ",
                v.sizes());
    FLASH_CHECK(k.size(3) == d, "flash_attn: q and k must have the same head dim, got ", d, " and ", k.size(3));
    FLASH_CHECK(d % 8 == 0 && d <= kMaxHeadDim, "flash_attn: head dim must be a multiple of 8 and at most ",
                kMaxHeadDim, " here (the Python layer pads), got ", d);
    FLASH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "flash_attn: nheads (", q.size(2),
                ") must be divisible by nheads_k (", k.size(2), ")");
}

// Returns {out, softmax_lse, S_dmask, rng_state}. S_dmask is empty unless return_softmax (which needs
// dropout); rng_state is (seed, offset) of the dropout mask, zeros without dropout.
std::vector<at::Tensor> mha_fwd(at::Tensor q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> out_,
                                double softmax_scale, bool is_causal, int64_t window_left, int64_t window_right,
                                double softcap, std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                bool return_softmax) {
    check_qkv_shapes(q, k, v);
    check_dropout(p_dropout, softcap);
    FLASH_CHECK(!return_softmax || p_dropout > 0.0,
                "flash_attn: return_softmax is only supported when dropout_p > 0 (as upstream)");
    c10::cuda::CUDAGuard device_guard(q.device());
    q = aligned(q), k = aligned(k), v = aligned(v);
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1);
    at::Tensor out = output_or_new(out_, "out", q.sizes(), q);
    at::Tensor lse = at::empty({b, h, sq}, q.options().dtype(at::kFloat));
    // Zeros without dropout (upstream leaves it uninitialised; zeros keep the op's outputs
    // deterministic, which torch.library.opcheck checks): the kernel writes them, or a per-call
    // zero fill (fwd_zero_fill).
    const bool zero_fill = fwd_zero_fill(/*paged=*/false);
    at::Tensor rng_buffer = new_rng_buffer(q, zero_fill);
    at::Tensor rng_state = rng_buffer.narrow(0, 0, 2);
    // Testing only: entries of blocks the kernel skips (outside the mask) stay 0.
    at::Tensor s_dmask = return_softmax ? at::zeros({b, h, round_up(sq, 128), round_up(sk, 128)}, q.options())
                                        : at::empty({0}, q.options());
    if (!zero_fill && (b == 0 || sq == 0 || h == 0 || sk == 0)) rng_state.zero_();  // no forward kernel below
    if (b == 0 || sq == 0 || h == 0) return {out, lse, s_dmask, rng_state};
    if (sk == 0) {  // nothing to attend to: out = 0, lse = +inf (as a fully masked row)
        out.zero_();
        lse.fill_(std::numeric_limits<float>::infinity());
        copy_back(out_, out);
        return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
    }

    flash::FwdParams params{};
    set_qkv(params, q, k, v, out, lse, softmax_scale, is_causal);
    set_window(params, is_causal, window_left, window_right);
    set_softcap(params, softmax_scale, softcap);
    set_alibi(params, alibi_slopes, q, q.size(0), q.size(2));
    params.rng_state_ptr = rng_state.data_ptr<int64_t>();
    if (p_dropout > 0.0) set_dropout_fwd(params, p_dropout, sk, q, rng_state, s_dmask, return_softmax);
    set_fwd_ws_switches(params, rng_buffer, zero_fill, /*varlen=*/false);
    const bool found = flash::run_mha_fwd(params, c10::cuda::getCurrentCUDAStream().stream());
    check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
    copy_back(out_, out);
    return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
}

std::vector<at::Tensor> mha_bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                at::Tensor softmax_lse, std::optional<at::Tensor> dq_, std::optional<at::Tensor> dk_,
                                std::optional<at::Tensor> dv_, double softmax_scale, bool is_causal,
                                bool deterministic, int64_t window_left, int64_t window_right, double softcap,
                                std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                std::optional<at::Tensor> rng_state) {
    check_qkv_shapes(q, k, v);
    check_dropout(p_dropout, softcap);
    check_rng_state(p_dropout, rng_state, q);
    check_tensor(out, "out", q);
    check_tensor(dout, "dout", q);
    FLASH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes(), "flash_attn: out and dout must have q's shape ",
                q.sizes());
    c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1), h_k = k.size(2);
    FLASH_CHECK(softmax_lse.is_cuda() && softmax_lse.scalar_type() == at::kFloat &&
                    softmax_lse.sizes() == at::IntArrayRef({b, h, sq}),
                "flash_attn: softmax_lse must be a float32 CUDA tensor of shape (batch, nheads, seqlen_q)");
    q = aligned(q), k = aligned(k), v = aligned(v), out = aligned(out), dout = aligned(dout);
    softmax_lse = softmax_lse.contiguous();

    at::Tensor dq = output_or_new(dq_, "dq", q.sizes(), q);
    at::Tensor dk = output_or_new(dk_, "dk", k.sizes(), k);
    at::Tensor dv = output_or_new(dv_, "dv", v.sizes(), v);
    const int seqlen_q_rounded = round_up(static_cast<int>(sq), 128);
    at::Tensor softmax_d = at::empty({b, h, seqlen_q_rounded}, q.options().dtype(at::kFloat));
    if (b == 0 || h == 0 || sq == 0 || sk == 0) {
        dq.zero_(), dk.zero_(), dv.zero_();
    } else {
        // MQA/GQA: per-query-head dK/dV, summed over each group afterwards.
        at::Tensor dk_expanded = h_k == h ? dk : at::empty({b, sk, h, d}, q.options());
        at::Tensor dv_expanded = h_k == h ? dv : at::empty({b, sk, h, d}, q.options());
        const int tile = flash::head_dim_tile(static_cast<int>(d));

        flash::BwdParams params{};
        set_qkv(params, q, k, v, out, softmax_lse, softmax_scale, is_causal);
        set_window(params, is_causal, window_left, window_right);
        set_softcap(params, softmax_scale, softcap);
        set_alibi(params, alibi_slopes, q, q.size(0), q.size(2));
        set_dropout_bwd(params, p_dropout, rng_state);
        at::Tensor dq_semaphore;
        const at::Tensor dq_accum = make_dq_accum(params, deterministic, {b, h, seqlen_q_rounded, tile}, b, h, sk,
                                                  seqlen_q_rounded, q, dq_semaphore, /*varlen=*/false);
        params.do_ptr = dout.data_ptr();
        params.do_batch_stride = dout.stride(0), params.do_row_stride = dout.stride(1);
        params.do_head_stride = dout.stride(2);
        params.dq_ptr = dq.data_ptr();
        params.dq_batch_stride = dq.stride(0), params.dq_row_stride = dq.stride(1), params.dq_head_stride = dq.stride(2);
        params.dk_ptr = dk_expanded.data_ptr();
        params.dk_batch_stride = dk_expanded.stride(0), params.dk_row_stride = dk_expanded.stride(1);
        params.dk_head_stride = dk_expanded.stride(2);
        params.dv_ptr = dv_expanded.data_ptr();
        params.dv_batch_stride = dv_expanded.stride(0), params.dv_row_stride = dv_expanded.stride(1);
        params.dv_head_stride = dv_expanded.stride(2);
        params.softmax_d_ptr = softmax_d.data_ptr<float>();
        params.seqlen_q_rounded = seqlen_q_rounded;
        set_backward_switches(params);
        const bool found = flash::run_mha_bwd(params, c10::cuda::getCurrentCUDAStream().stream());
        check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
        if (h_k != h) {
            at::sum_out(dk, dk_expanded.reshape({b, sk, h_k, h / h_k, d}), {3});
            at::sum_out(dv, dv_expanded.reshape({b, sk, h_k, h / h_k, d}), {3});
        }
    }
    copy_back(dq_, dq), copy_back(dk_, dk), copy_back(dv_, dv);
    return {dq_.has_value() ? dq_.value() : dq, dk_.has_value() ? dk_.value() : dk,
            dv_.has_value() ? dv_.value() : dv, softmax_d};
}

// ---------------------------------------------------------------------------------------------
// Variable-length batches: q (total_q, h, d), k/v (total_k, h_k, d) or paged
// (num_blocks, page_block_size, h_k, d), cu_seqlens int32 (b + 1). The grid uses the max lengths.
// ---------------------------------------------------------------------------------------------

void check_varlen_tensor(const at::Tensor &t, const char *name, const at::Tensor &ref, int dims, const char *shape) {
    FLASH_CHECK(t.is_cuda(), "flash_attn: ", name, " must be a CUDA tensor, got device ", t.device());
    FLASH_CHECK(t.device() == ref.device(), "flash_attn: ", name, " is on ", t.device(), " but q is on ", ref.device());
    FLASH_CHECK(t.scalar_type() == ref.scalar_type(), "flash_attn: ", name, " has dtype ", t.scalar_type(),
                " but q has dtype ", ref.scalar_type());
    FLASH_CHECK(t.dim() == dims, "flash_attn: ", name, " must have shape ", shape, ", got ", t.sizes());
    FLASH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "flash_attn: ", name,
                " must have a contiguous last dimension, got strides ", t.strides());
}

// An int32 CUDA vector of n elements on q's device (cu_seqlens, seqused_k, leftpad_k, ...).
at::Tensor checked_int_vector(const at::Tensor &t, const char *name, int64_t n, const at::Tensor &q) {
    FLASH_CHECK(t.is_cuda() && t.device() == q.device(), "flash_attn: ", name, " must be on q's device ", q.device(),
                ", got ", t.device());
    FLASH_CHECK(t.scalar_type() == at::kInt, "flash_attn: ", name, " must have dtype int32, got ", t.scalar_type());
    FLASH_CHECK(t.dim() == 1 && t.size(0) == n, "flash_attn: ", name, " must have shape (", n, "), got ", t.sizes());
    return t.contiguous();
}

void check_varlen_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool paged) {
    FLASH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "flash_attn: q must be float16 or bfloat16, got ", q.scalar_type());
    check_varlen_tensor(q, "q", q, 3, "(total_q, nheads, headdim)");
    const char *kv_shape = paged ? "(num_blocks, page_block_size, nheads_k, headdim)" : "(total_k, nheads_k, headdim)";
    check_varlen_tensor(k, "k", q, paged ? 4 : 3, kv_shape);
    check_varlen_tensor(v, "v", q, paged ? 4 : 3, kv_shape);
    FLASH_CHECK(k.sizes() == v.sizes(), "flash_attn: k and v must have the same shape, got ", k.sizes(), " and ",
                v.sizes());
    const int64_t d = q.size(2);
    FLASH_CHECK(k.size(-1) == d, "flash_attn: q and k must have the same head dim, got ", d, " and ", k.size(-1));
    FLASH_CHECK(d % 8 == 0 && d <= kMaxHeadDim, "flash_attn: head dim must be a multiple of 8 and at most ",
                kMaxHeadDim, " here (the Python layer pads), got ", d);
    const int64_t h_k = k.size(-2);
    FLASH_CHECK(h_k > 0 && q.size(1) % h_k == 0, "flash_attn: nheads (", q.size(1), ") must be divisible by nheads_k (",
                h_k, ")");
}

// Fills the varlen fields of params (the strides of (total, h, d) tensors: row = dim 0).
void set_varlen_qkv(flash::FwdParams &p, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                    const at::Tensor &out, const at::Tensor &lse, const at::Tensor &cu_q, const at::Tensor &cu_k,
                    int64_t b, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool is_causal) {
    p = {};
    p.q_ptr = q.data_ptr();
    p.k_ptr = k.data_ptr();
    p.v_ptr = v.data_ptr();
    p.q_batch_stride = 0, p.q_row_stride = q.stride(0), p.q_head_stride = q.stride(1);
    p.k_row_stride = k.stride(-3), p.k_head_stride = k.stride(-2);
    p.v_row_stride = v.stride(-3), p.v_head_stride = v.stride(-2);
    // Paged: the batch strides are the page strides.
    p.k_batch_stride = k.dim() == 4 ? k.stride(0) : 0;
    p.v_batch_stride = v.dim() == 4 ? v.stride(0) : 0;
    p.o_ptr = out.data_ptr();
    p.o_batch_stride = 0, p.o_row_stride = out.stride(0), p.o_head_stride = out.stride(1);
    p.softmax_lse_ptr = lse.data_ptr<float>();
    p.lse_batch_stride = 0, p.lse_head_stride = lse.stride(0);
    p.b = static_cast<int>(b);
    p.seqlen_q = static_cast<int>(max_seqlen_q);
    p.seqlen_k = static_cast<int>(max_seqlen_k);
    p.h = q.size(1);
    p.h_k = k.size(-2);
    p.h_h_k_ratio = p.h / p.h_k;
    p.d = q.size(2);
    p.head_dim_tile = flash::head_dim_tile(p.d);
    p.scale_softmax = static_cast<float>(softmax_scale);
    p.scale_softmax_log2 = static_cast<float>(softmax_scale * M_LOG2E);
    p.cu_seqlens_q = cu_q.data_ptr<int>();
    p.cu_seqlens_k = cu_k.data_ptr<int>();
    p.window_left = flash::kWindowUnbounded;
    p.window_right = is_causal ? 0 : flash::kWindowUnbounded;
    p.is_bf16 = q.scalar_type() == at::kBFloat16;
    p.use_sm90 = g_sm90_enabled && flash::device_sm(q.get_device()) == 90;
    p.num_splits = 1;
    p.total_q = static_cast<int>(q.size(0));
}

// Rows of a (total, h, d) tensor past cu_seqlens[b] get zeros (and +inf in lse, if given).
void zero_tail(const at::Tensor &t, const at::Tensor &cu_seqlens, int64_t b, float *lse = nullptr,
               int64_t lse_head_stride = 0) {
    flash::zero_varlen_tail(t.data_ptr(), t.stride(0), t.stride(1), t.size(1), t.size(2), t.element_size(),
                            t.size(0), cu_seqlens.data_ptr<int>(), b, lse, lse_head_stride,
                            c10::cuda::getCurrentCUDAStream().stream());
}

std::vector<at::Tensor> mha_varlen_fwd(at::Tensor q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> out_,
                                       at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                       std::optional<at::Tensor> seqused_k_, std::optional<at::Tensor> leftpad_k_,
                                       std::optional<at::Tensor> block_table_, int64_t max_seqlen_q,
                                       int64_t max_seqlen_k, double softmax_scale, bool zero_tensors, bool is_causal,
                                       int64_t window_left, int64_t window_right, double softcap,
                                       std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                       bool return_softmax) {
    const bool paged = block_table_.has_value();
    check_varlen_qkv(q, k, v, paged);
    check_dropout(p_dropout, softcap);
    FLASH_CHECK(!return_softmax || p_dropout > 0.0,
                "flash_attn: return_softmax is only supported when dropout_p > 0 (as upstream)");
    FLASH_CHECK(!paged || p_dropout == 0.0,
                "flash_attn: dropout (dropout_p > 0) is not supported with block_table (paged KV)");
    FLASH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) >= 1,
                "flash_attn: cu_seqlens_q must have shape (batch_size + 1,), got ", cu_seqlens_q.sizes());
    const int64_t b = cu_seqlens_q.size(0) - 1;
    cu_seqlens_q = checked_int_vector(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    cu_seqlens_k = checked_int_vector(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
    // Narrowed to int below, and rounded up to a multiple of 128 there.
    const int64_t max_seqlen_limit = std::numeric_limits<int>::max() - 127;
    FLASH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= max_seqlen_limit &&
                    max_seqlen_k <= max_seqlen_limit,
                "flash_attn: max_seqlen_q and max_seqlen_k must be in [0, ", max_seqlen_limit, "], got ", max_seqlen_q,
                " and ", max_seqlen_k);
    c10::cuda::CUDAGuard device_guard(q.device());
    q = aligned(q), k = aligned(k), v = aligned(v);
    const int64_t total_q = q.size(0), h = q.size(1), d = q.size(2);
    at::Tensor out = output_or_new(out_, "out", q.sizes(), q);
    at::Tensor lse = at::empty({h, total_q}, q.options().dtype(at::kFloat));
    // Zeros without dropout, as in mha_fwd.
    const bool zero_fill = fwd_zero_fill(paged);
    at::Tensor rng_buffer = new_rng_buffer(q, zero_fill);
    at::Tensor rng_state = rng_buffer.narrow(0, 0, 2);
    // Testing only: (b, h, round128(max_seqlen_q), round128(max_seqlen_k)); row i / column j of
    // sequence b's own block; entries the kernel skips stay 0.
    at::Tensor s_dmask = return_softmax
        ? at::zeros({b, h, round_up(static_cast<int>(max_seqlen_q), 128), round_up(static_cast<int>(max_seqlen_k), 128)},
                    q.options())
        : at::empty({0}, q.options());
    if (zero_tensors) {
        out.zero_();
        lse.fill_(-std::numeric_limits<float>::infinity());
    }
    if (b == 0 || total_q == 0 || h == 0 || max_seqlen_q == 0 || max_seqlen_k == 0) {
        // Nothing to attend to (also keeps every grid dimension non-zero below).
        out.zero_();
        lse.fill_(std::numeric_limits<float>::infinity());
        if (!zero_fill) rng_state.zero_();  // no forward kernel below
        copy_back(out_, out);
        return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
    }

    flash::FwdParams params{};
    set_varlen_qkv(params, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, b, max_seqlen_q, max_seqlen_k,
                   softmax_scale, is_causal);
    set_window(params, is_causal, window_left, window_right);
    set_softcap(params, softmax_scale, softcap);
    set_alibi(params, alibi_slopes, q, b, h);
    params.rng_state_ptr = rng_state.data_ptr<int64_t>();
    if (p_dropout > 0.0) set_dropout_fwd(params, p_dropout, max_seqlen_k, q, rng_state, s_dmask, return_softmax);
    at::Tensor seqused_k, leftpad_k, block_table;
    if (seqused_k_.has_value()) {
        seqused_k = checked_int_vector(seqused_k_.value(), "seqused_k", b, q);
        params.seqused_k = seqused_k.data_ptr<int>();
    }
    if (leftpad_k_.has_value()) {
        leftpad_k = checked_int_vector(leftpad_k_.value(), "leftpad_k", b, q);
        params.leftpad_k = leftpad_k.data_ptr<int>();
    }
    bool found;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    if (paged) {
        block_table = block_table_.value();
        FLASH_CHECK(block_table.is_cuda() && block_table.device() == q.device() &&
                        block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) == b,
                    "flash_attn: block_table must be an int32 CUDA tensor of shape (batch_size, max_num_blocks_per_seq)"
                    " on q's device, got ", block_table.scalar_type(), " ", block_table.sizes());
        FLASH_CHECK(block_table.stride(-1) == 1, "flash_attn: block_table must have a contiguous last dimension");
        const int64_t page = k.size(1);
        FLASH_CHECK(page % 16 == 0, "flash_attn: paged KV needs page_block_size (k.shape[1]) to be a multiple of 16, got ",
                    page);
        // The key range of a sequence is addressed through its pages, not through cu_seqlens_k.
        params.block_table = block_table.data_ptr<int>();
        params.block_table_batch_stride = block_table.stride(0);
        params.page_block_size = static_cast<int>(page);
        params.num_splits = 1;
        found = flash::run_mha_fwd_splitkv(params, stream);
    } else {
        params.total_k = static_cast<int>(k.size(0));
        set_fwd_ws_switches(params, rng_buffer, zero_fill, /*varlen=*/true);
        found = flash::run_mha_fwd(params, stream);
    }
    check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
    zero_tail(out, cu_seqlens_q, b, lse.data_ptr<float>(), lse.stride(0));
    check_built_and_launched(true, params.is_bf16, d, params.head_dim_tile);
    copy_back(out_, out);
    return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
}

std::vector<at::Tensor> mha_varlen_bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                       at::Tensor softmax_lse, std::optional<at::Tensor> dq_,
                                       std::optional<at::Tensor> dk_, std::optional<at::Tensor> dv_,
                                       at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k, int64_t max_seqlen_q,
                                       int64_t max_seqlen_k, double softmax_scale, bool zero_tensors, bool is_causal,
                                       bool deterministic, int64_t window_left, int64_t window_right,
                                       double softcap, std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                       std::optional<at::Tensor> rng_state) {
    check_varlen_qkv(q, k, v, false);
    check_dropout(p_dropout, softcap);
    check_rng_state(p_dropout, rng_state, q);
    check_varlen_tensor(out, "out", q, 3, "(total_q, nheads, headdim)");
    check_varlen_tensor(dout, "dout", q, 3, "(total_q, nheads, headdim)");
    FLASH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes(), "flash_attn: out and dout must have q's shape ",
                q.sizes());
    FLASH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) >= 1,
                "flash_attn: cu_seqlens_q must have shape (batch_size + 1,), got ", cu_seqlens_q.sizes());
    const int64_t b = cu_seqlens_q.size(0) - 1;
    cu_seqlens_q = checked_int_vector(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    cu_seqlens_k = checked_int_vector(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
    // Narrowed to int below, and rounded up to a multiple of 128 there.
    const int64_t max_seqlen_limit = std::numeric_limits<int>::max() - 127;
    FLASH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= max_seqlen_limit &&
                    max_seqlen_k <= max_seqlen_limit,
                "flash_attn: max_seqlen_q and max_seqlen_k must be in [0, ", max_seqlen_limit, "], got ", max_seqlen_q,
                " and ", max_seqlen_k);
    c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t total_q = q.size(0), h = q.size(1), d = q.size(2), total_k = k.size(0), h_k = k.size(1);
    FLASH_CHECK(softmax_lse.is_cuda() && softmax_lse.scalar_type() == at::kFloat &&
                    softmax_lse.sizes() == at::IntArrayRef({h, total_q}),
                "flash_attn: softmax_lse must be a float32 CUDA tensor of shape (nheads, total_q)");
    q = aligned(q), k = aligned(k), v = aligned(v), out = aligned(out), dout = aligned(dout);
    softmax_lse = softmax_lse.contiguous();

    at::Tensor dq = output_or_new(dq_, "dq", q.sizes(), q);
    at::Tensor dk = output_or_new(dk_, "dk", k.sizes(), k);
    at::Tensor dv = output_or_new(dv_, "dv", v.sizes(), v);
    if (zero_tensors) dq.zero_(), dk.zero_(), dv.zero_();
    const int accum_rows = static_cast<int>(total_q + 128 * b);
    at::Tensor softmax_d = at::empty({h, accum_rows}, q.options().dtype(at::kFloat));
    if (b == 0 || h == 0 || total_q == 0 || total_k == 0 || max_seqlen_q == 0 || max_seqlen_k == 0) {
        dq.zero_(), dk.zero_(), dv.zero_();
    } else {
        at::Tensor dk_expanded = h_k == h ? dk : at::empty({total_k, h, d}, q.options());
        at::Tensor dv_expanded = h_k == h ? dv : at::empty({total_k, h, d}, q.options());
        const int tile = flash::head_dim_tile(static_cast<int>(d));

        flash::BwdParams params{};
        set_varlen_qkv(params, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, b, max_seqlen_q, max_seqlen_k,
                       softmax_scale, is_causal);
        set_window(params, is_causal, window_left, window_right);
        set_softcap(params, softmax_scale, softcap);
        set_alibi(params, alibi_slopes, q, b, h);
        set_dropout_bwd(params, p_dropout, rng_state);
        // The kernels index the semaphores by (bidb, bidh, 64-row block) with seqlen_q_rounded.
        const int seqlen_q_rounded = round_up(static_cast<int>(max_seqlen_q), 128);
        at::Tensor dq_semaphore;
        const at::Tensor dq_accum = make_dq_accum(params, deterministic, {h, accum_rows, tile}, b, h, max_seqlen_k,
                                                  seqlen_q_rounded, q, dq_semaphore, /*varlen=*/true);
        params.do_ptr = dout.data_ptr();
        params.do_batch_stride = 0, params.do_row_stride = dout.stride(0), params.do_head_stride = dout.stride(1);
        params.dq_ptr = dq.data_ptr();
        params.dq_batch_stride = 0, params.dq_row_stride = dq.stride(0), params.dq_head_stride = dq.stride(1);
        params.dk_ptr = dk_expanded.data_ptr();
        params.dk_batch_stride = 0, params.dk_row_stride = dk_expanded.stride(0);
        params.dk_head_stride = dk_expanded.stride(1);
        params.dv_ptr = dv_expanded.data_ptr();
        params.dv_batch_stride = 0, params.dv_row_stride = dv_expanded.stride(0);
        params.dv_head_stride = dv_expanded.stride(1);
        params.softmax_d_ptr = softmax_d.data_ptr<float>();
        params.seqlen_q_rounded = seqlen_q_rounded;
        params.accum_rows = accum_rows;
        set_backward_switches(params);
        const bool found = flash::run_mha_bwd(params, c10::cuda::getCurrentCUDAStream().stream());
        check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
        zero_tail(dq, cu_seqlens_q, b);
        zero_tail(dk_expanded, cu_seqlens_k, b);
        zero_tail(dv_expanded, cu_seqlens_k, b);
        check_built_and_launched(true, params.is_bf16, d, params.head_dim_tile);
        if (h_k != h) {
            at::sum_out(dk, dk_expanded.reshape({total_k, h_k, h / h_k, d}), {2});
            at::sum_out(dv, dv_expanded.reshape({total_k, h_k, h / h_k, d}), {2});
        }
    }
    copy_back(dq_, dq), copy_back(dk_, dk), copy_back(dv_, dv);
    return {dq_.has_value() ? dq_.value() : dq, dk_.has_value() ? dk_.value() : dk,
            dv_.has_value() ? dv_.value() : dv, softmax_d};
}

// ---------------------------------------------------------------------------------------------
// KV-cache attention (the kernel part of flash_attn_with_kvcache; the append of new keys and the
// rotary embedding happen before, in Python). q (b, seqlen_q, h, d); k_cache / v_cache
// (b_cache, seqlen_cache, h_k, d) or paged (num_blocks, page_block_size, h_k, d) with
// block_table (b, max_blocks_per_seq). Sequence b sees cache rows [leftpad[b], seqused_k[b]).
// ---------------------------------------------------------------------------------------------

// A device attribute, read once per (attribute slot, device); `fallback` when the query fails.
template <cudaDeviceAttr kAttr>
int cached_device_attribute(int device, int fallback) {
    static int cache[64] = {0};
    if (device < 0 || device >= 64) return fallback;
    if (cache[device] == 0) {
        int n = 0;
        cudaDeviceGetAttribute(&n, kAttr, device);
        cache[device] = n > 0 ? n : fallback;
    }
    return cache[device];
}

int num_sms(int device) { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, 132); }

// Opt-in shared memory per block (227 KB on H100 / H200, 163 KB on A100); 1 when unknown.
int max_smem_per_block(int device) {
    return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, 1);
}

// Number of key splits for the split-KV kernel. Decoding is bandwidth bound, so the time goes
// as waves * keys per split: cost(s) = ceil(ctas * s / slots) / s (two CTAs fit an SM). The
// smallest s within 5% of the lowest cost (fewer splits: less combine work); each split at
// least 128 keys, at most 128 splits. One split when the batch already fills the GPU.
// Split count for the split-KV kernel. Decode is bandwidth-bound: splits are for covering the SMs
// (one CTA each; two if a split keeps >= 4k keys) and for keeping long contexts at
// about 8k keys per CTA; each extra split costs a partial write and the combine. Measured on the
// H200 (bf16 d128, 32 q / 8 kv heads, 1 token; docs/results/decode_splits_h200.log), this picks
// the best count of 1/2/4/8/16 in each case: b16 4k -> 1 (3399 GB/s; 2 splits: 3267),
// b16 32k -> 4 (4257; 2: 4236, 1: 4115), b4 128k -> 16 (4213; 4: 4054).
int splitkv_heuristic(int ctas, int sms, int64_t max_seqlen_k, bool paged) {
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
// 2 splits 4363; the 4-warp shape's best, 4 splits, 4347; docs/results/decode_probe_variants_h200.log).
// Bandwidth-bound cost model: time ~ waves(s) * (keys per split + kCtaCostKeys), the fixed
// cost of a CTA (filling its copy ring, merge, store) counted in keys; the smallest s within 3% of
// the best wins (fewer partials to write and combine). At most 128 splits, each >= 128 keys.
// bf16 d128, 8 KV heads: b16 4k and 32k -> 1 split (128 CTAs: one wave), b4 128k -> 4.
int splitkv_heuristic_sm90(int ctas, int sms, int64_t max_seqlen_k) {
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

// Whether a split-KV call runs the sm_90a bulk-copy decode kernel (see run_mha_fwd_splitkv_): the
// paged calls at head dims 64 and 128 that the CTA-schedule kernel does not take. Contiguous caches
// run the SM80-class kernels. H200, bf16 d128, 32 q / 8 kv heads, 1 token, b16 4k / b16 32k / b4 128k,
// GB/s: contiguous SM80-class 3416 / 4339 / 4296, bulk-copy 3376 / 4193 / 4140; page 16 SM80-class
// 2837 / 3321 / 3297, bulk-copy 3290 / 4204 / 4158 (a row costs the same paged or not when one bulk
// copy moves it).
bool use_sm90_decode(const flash::FwdParams &p, bool paged) {
#ifdef FLASH_ATTN_SM90A
    if (paged && p.decode_paged_cta) return false;  // the CTA-schedule kernel
    return p.use_sm90 && (p.d == 64 || p.d == 128) && paged;
#else
    (void)p;
    (void)paged;
    return false;
#endif
}

std::vector<at::Tensor> mha_fwd_kvcache(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                        std::optional<at::Tensor> seqused_k_, std::optional<at::Tensor> leftpad_k_,
                                        std::optional<at::Tensor> batch_idx_, std::optional<at::Tensor> block_table_,
                                        double softmax_scale, bool is_causal, int64_t window_left,
                                        int64_t window_right, int64_t num_splits, double softcap,
                                        std::optional<at::Tensor> alibi_slopes) {
    const bool paged = block_table_.has_value();
    FLASH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "flash_attn: q must be float16 or bfloat16, got ", q.scalar_type());
    check_tensor(q, "q", q);
    check_tensor(k_cache, "k_cache", q);
    check_tensor(v_cache, "v_cache", q);
    FLASH_CHECK(k_cache.sizes() == v_cache.sizes(), "flash_attn: k_cache and v_cache must have the same shape, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), h_k = k_cache.size(2);
    FLASH_CHECK(k_cache.size(3) == d, "flash_attn: q and k_cache must have the same head dim, got ", d, " and ",
                k_cache.size(3));
    FLASH_CHECK(d % 8 == 0 && d <= kMaxHeadDim, "flash_attn: head dim must be a multiple of 8 and at most ",
                kMaxHeadDim, " here (the Python layer pads), got ", d);
    FLASH_CHECK(h_k > 0 && h % h_k == 0, "flash_attn: nheads (", h, ") must be divisible by nheads_k (", h_k, ")");
    FLASH_CHECK(num_splits >= 0 && num_splits <= std::numeric_limits<int>::max(),
                "flash_attn: num_splits must be in [0, ", std::numeric_limits<int>::max(), "], got ", num_splits);
    c10::cuda::CUDAGuard device_guard(q.device());
    q = aligned(q);
    FLASH_CHECK(is_aligned(k_cache) && is_aligned(v_cache),
                "flash_attn: k_cache and v_cache need 16-byte aligned rows (strides multiples of 8 elements); they are "
                "updated in place, so they are not copied");
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({b, h, sq}, q.options().dtype(at::kFloat));
    if (b == 0 || sq == 0 || h == 0) return {out, lse};

    at::Tensor block_table, seqused_k, leftpad_k, batch_idx;
    int64_t seqlen_k = k_cache.size(1);
    if (paged) {
        block_table = block_table_.value();
        FLASH_CHECK(block_table.is_cuda() && block_table.device() == q.device() &&
                        block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) == b,
                    "flash_attn: block_table must be an int32 CUDA tensor of shape (batch_size, max_num_blocks_per_seq)"
                    " on q's device, got ", block_table.scalar_type(), " ", block_table.sizes());
        FLASH_CHECK(block_table.stride(-1) == 1, "flash_attn: block_table must have a contiguous last dimension");
        FLASH_CHECK(k_cache.size(1) % 16 == 0,
                    "flash_attn: paged KV needs page_block_size (k_cache.shape[1]) to be a multiple of 16, got ",
                    k_cache.size(1));
        FLASH_CHECK(!batch_idx_.has_value(), "flash_attn: cache_batch_idx cannot be used with a paged KV cache "
                    "(block_table already maps each sequence to its pages)");
        seqlen_k = block_table.size(1) * k_cache.size(1);
    } else {
        FLASH_CHECK(batch_idx_.has_value() || k_cache.size(0) >= b, "flash_attn: k_cache has batch size ",
                    k_cache.size(0), " but q has ", b, "; pass cache_batch_idx to select cache entries");
    }

    flash::FwdParams params{};
    set_qkv(params, q, k_cache, v_cache, out, lse, softmax_scale, is_causal);
    params.seqlen_k = static_cast<int>(seqlen_k);
    set_window(params, is_causal, window_left, window_right);
    set_softcap(params, softmax_scale, softcap);
    set_alibi(params, alibi_slopes, q, b, h);
    params.num_splits = 1;
    if (seqused_k_.has_value()) {
        seqused_k = checked_int_vector(seqused_k_.value(), "cache_seqlens", b, q);
        params.seqused_k = seqused_k.data_ptr<int>();
    }
    if (leftpad_k_.has_value()) {
        leftpad_k = checked_int_vector(leftpad_k_.value(), "cache_leftpad", b, q);
        params.leftpad_k = leftpad_k.data_ptr<int>();
    }
    if (batch_idx_.has_value()) {
        batch_idx = checked_int_vector(batch_idx_.value(), "cache_batch_idx", b, q);
        params.kv_batch_idx = batch_idx.data_ptr<int>();
    }
    if (paged) {
        params.block_table = block_table.data_ptr<int>();
        params.block_table_batch_stride = block_table.stride(0);
        params.page_block_size = static_cast<int>(k_cache.size(1));
    }
    params.kv_cache_batch = static_cast<int>(k_cache.size(0));

    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    const int64_t packed_rows = sq * (h / h_k);
    // The split-KV kernel reads each K/V tile once for all packed rows of a 16-row block: it wins
    // for decoding (few rows) and is the one that reads paged caches and splits the keys.
    const bool use_split = paged || num_splits > 1 || packed_rows <= 64;
    bool found;
    at::Tensor oaccum, lse_accum;
    if (use_split) {
        const int m_blocks = static_cast<int>((packed_rows + 15) / 16);
        // Paged d128 caches with power-of-two pages and no cache_leftpad run the CTA-schedule kernel
        // (0.96-0.97 of contiguous against the sm_90a bulk-copy kernel's 0.91); the sm_90a kernel
        // takes the other paged calls.
        const int page = paged ? static_cast<int>(k_cache.size(1)) : 0;
        params.decode_paged_cta = paged && d == 128 && (page & (page - 1)) == 0 &&
                                  !leftpad_k_.has_value() &&
                                  params.softcap_scale <= 0.f && params.alibi_slopes_ptr == nullptr;
        params.decode_sm90 = use_sm90_decode(params, paged);
        params.splitkv_wide = !params.decode_sm90 && flash::head_dim_tile(static_cast<int>(d)) == 128 &&
                              max_smem_per_block(q.get_device()) >= flash::kSplitKVWideSmemBytes;
        params.decode_pdl = cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(q.get_device(), 0) >= 9;
        const int ctas = static_cast<int>(b * h_k) * m_blocks;
        int splits = static_cast<int>(num_splits);
        if (splits == 0) {
            // Both the sm_90a kernel and the wide shape run one CTA per SM.
            splits = params.decode_sm90 || params.splitkv_wide
                         ? splitkv_heuristic_sm90(ctas, num_sms(q.get_device()), seqlen_k)
                         : splitkv_heuristic(ctas, num_sms(q.get_device()), seqlen_k, paged);
        }
        splits = std::min(splits, 128);
        params.num_splits = splits;
        if (splits > 1) {
            const int tile = flash::head_dim_tile(static_cast<int>(d));
            oaccum = at::empty({splits, b, h, sq, tile}, q.options().dtype(at::kFloat));
            lse_accum = at::empty({splits, b, h, sq}, q.options().dtype(at::kFloat));
            params.oaccum_ptr = oaccum.data_ptr<float>();
            params.lse_accum_ptr = lse_accum.data_ptr<float>();
            // The combine kernel indexes out / lse densely from (b, h, seqlen_q).
        }
        found = flash::run_mha_fwd_splitkv(params, stream);
    } else {
        found = flash::run_mha_fwd(params, stream);
    }
    check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
    return {out, lse};
}

std::vector<std::tuple<std::string, int>> built_configs() {
    std::vector<std::tuple<std::string, int>> configs;
    for (bool is_bf16 : {false, true}) {
        for (int tile : {32, 64, 96, 128, 192, 256}) {
            if (flash::is_built(is_bf16, tile)) configs.emplace_back(dtype_name(is_bf16), tile);
        }
    }
    return configs;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "flash_attn CUDA kernels";
    m.def("fwd", &mha_fwd, "Attention forward", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
          py::arg("softmax_scale"), py::arg("is_causal"), py::arg("window_size_left") = -1,
          py::arg("window_size_right") = -1, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false);
    m.def("bwd", &mha_bwd, "Attention backward", py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("out"), py::arg("softmax_lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
          py::arg("softmax_scale"), py::arg("is_causal"), py::arg("deterministic"),
          py::arg("window_size_left") = -1, py::arg("window_size_right") = -1, py::arg("softcap") = 0.0,
          py::arg("alibi_slopes") = py::none(), py::arg("dropout_p") = 0.0, py::arg("rng_state") = py::none());
    m.def("varlen_fwd", &mha_varlen_fwd, "Attention forward, variable-length batch", py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("out"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("seqused_k"),
          py::arg("leftpad_k"), py::arg("block_table"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
          py::arg("softmax_scale"), py::arg("zero_tensors"), py::arg("is_causal"), py::arg("window_size_left") = -1,
          py::arg("window_size_right") = -1, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false);
    m.def("varlen_bwd", &mha_varlen_bwd, "Attention backward, variable-length batch", py::arg("dout"), py::arg("q"),
          py::arg("k"), py::arg("v"), py::arg("out"), py::arg("softmax_lse"), py::arg("dq"), py::arg("dk"),
          py::arg("dv"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"),
          py::arg("max_seqlen_k"), py::arg("softmax_scale"), py::arg("zero_tensors"), py::arg("is_causal"),
          py::arg("deterministic"), py::arg("window_size_left") = -1, py::arg("window_size_right") = -1,
          py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(), py::arg("dropout_p") = 0.0,
          py::arg("rng_state") = py::none());
    m.def("fwd_kvcache", &mha_fwd_kvcache, "Attention over a (paged) KV cache, split-KV for decoding", py::arg("q"),
          py::arg("k_cache"), py::arg("v_cache"), py::arg("seqused_k"), py::arg("leftpad_k"), py::arg("batch_idx"),
          py::arg("block_table"), py::arg("softmax_scale"), py::arg("is_causal"), py::arg("window_size_left"),
          py::arg("window_size_right"), py::arg("num_splits"), py::arg("softcap") = 0.0,
          py::arg("alibi_slopes") = py::none());
    m.def("built_configs", &built_configs, "(dtype, head-dim tile) pairs compiled into this build");
    m.def("set_debug_kernel", &set_debug_kernel,
          "Testing only: force a kernel choice that the heuristics make for other calls; value 0 restores "
          "the heuristics. 'fwd_ws_d64_rows': 128 or 192; 'fwd_ws_persistent': 1 always, 2 never; "
          "'fwd_tma_o_off', 'fwd_zero_fill', 'bwd_lockstep': 1. Returns '' or what is wrong.",
          py::arg("name"), py::arg("value"));
    m.def("set_sm90_kernels", [](bool enabled) { g_sm90_enabled = enabled; },
          "Allow (True, the default) or forbid the sm_90a wgmma kernels");
    m.def("sm90_kernels_built", []() {
#ifdef FLASH_ATTN_SM90A
        return true;
#else
        return false;
#endif
    }, "Whether this build contains sm_90a kernels");
    m.def("head_dim_tile", &flash::head_dim_tile, "The kernel head-dim tile a head dim runs in (-1 above 256)");
}
