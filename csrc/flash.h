// Plain parameter structs shared by the binding and the kernels. No torch types here, so
// kernel translation units compile independently of the Python and torch versions.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash {

struct QKVParams {
    using index_t = int64_t;
    void *__restrict__ q_ptr;
    void *__restrict__ k_ptr;
    void *__restrict__ v_ptr;
    // Strides in elements; the head dim is contiguous. Batch strides are unused for varlen.
    index_t q_batch_stride, k_batch_stride, v_batch_stride;
    index_t q_row_stride, k_row_stride, v_row_stride;
    index_t q_head_stride, k_head_stride, v_head_stride;
    int h, h_k;
    int h_h_k_ratio;  // h / h_k: query heads that share one K/V head (MQA/GQA)
};

// Philox seed and offset of one dropout call: plain values, or (inside a CUDA graph capture, and
// in the backward, which reads the forward's rng_state tensor) device pointers read by the kernel.
struct PhiloxParams {
    uint64_t seed, offset;
    const int64_t *seed_ptr, *offset_ptr;  // used when from_device
    uint64_t offset_extra;                 // added to *offset_ptr
    bool from_device;
};

struct FwdParams : QKVParams {
    void *__restrict__ o_ptr;
    index_t o_batch_stride, o_row_stride, o_head_stride;

    // softmax_lse: fp32, element (b, h, row) at b * lse_batch_stride + h * lse_head_stride + row.
    // Dense: (b, h, seqlen_q). Varlen: (h, total_q) with the batch offset taken from cu_seqlens_q.
    float *__restrict__ softmax_lse_ptr;
    index_t lse_batch_stride, lse_head_stride;

    int b, seqlen_q, seqlen_k, d;
    int head_dim_tile;  // the instantiated kernel head dim (>= d)

    float scale_softmax;
    float scale_softmax_log2;  // scale_softmax * log2(e): scores go through exp2

    // Variable-length batches: when non-null, sequence b spans rows [cu_seqlens[b], cu_seqlens[b+1]).
    const int *__restrict__ cu_seqlens_q;
    const int *__restrict__ cu_seqlens_k;

    // Visible keys for query row i: [i + seqlen_k - seqlen_q - window_left, i + seqlen_k - seqlen_q + window_right].
    // Unbounded sides hold kWindowUnbounded; causal is window_right = 0.
    int window_left, window_right;

    bool is_bf16;
    bool use_sm90;  // run the sm_90a (wgmma) kernels where this build and head dim have them

    // ---- Score modifiers and dropout: all off when zero. Any of them routes the call to the
    // "feature" variants of the kernels (a template flag), so the plain kernels stay as they are.
    // Softcap: score = softcap * tanh(s * scale / softcap). When on, the binding sets
    // softcap_scale = scale / softcap and scale_softmax = softcap (scale_softmax_log2 =
    // softcap * log2 e): the kernels replace s by tanh(s * softcap_scale) and go on as usual.
    float softcap_scale;
    // ALiBi: -slope * |row + seqlen_k - seqlen_q - col| added to the scaled score. The slope of
    // (b, h) is alibi_slopes_ptr[b * alibi_slopes_batch_stride + h] (fp32; stride 0 for (h,)).
    const float *__restrict__ alibi_slopes_ptr;
    index_t alibi_slopes_batch_stride;
    // Dropout of the attention probabilities: an element is kept iff its Philox byte is below
    // dropout_keep_threshold (round((1 - p) * 256)); kept ones are scaled by rp_dropout.
    float p_dropout;
    float rp_dropout;
    uint32_t dropout_keep_threshold;
    PhiloxParams philox;
    int64_t *rng_state_ptr;  // forward with dropout: receives (seed, offset)
    // return_softmax with dropout: (b, h, round128(seqlen_q), round128(seqlen_k)) in the input
    // dtype, exp(score - running max) with dropped elements negated (upstream's convention).
    void *s_dmask_ptr;
    index_t s_dmask_batch_stride, s_dmask_head_stride, s_dmask_row_stride;
};

inline bool has_features(const FwdParams &p) {
    return p.softcap_scale > 0.f || p.alibi_slopes_ptr != nullptr || p.p_dropout > 0.f;
}

// A window side that never masks anything (large, yet safe to add to row indices).
constexpr int kWindowUnbounded = 1 << 29;

struct BwdParams : FwdParams {
    void *__restrict__ do_ptr;
    index_t do_batch_stride, do_row_stride, do_head_stride;
    void *__restrict__ dq_ptr;
    void *__restrict__ dk_ptr;
    void *__restrict__ dv_ptr;
    index_t dq_batch_stride, dq_row_stride, dq_head_stride;
    index_t dk_batch_stride, dk_row_stride, dk_head_stride;
    index_t dv_batch_stride, dv_row_stride, dv_head_stride;

    // fp32 dQ accumulator (b, h, seqlen_q_rounded, head_dim_tile), zero-initialised.
    float *__restrict__ dq_accum_ptr;
    // rowsum(dO * O) (b, h, seqlen_q_rounded), fp32.
    float *__restrict__ softmax_d_ptr;
    int seqlen_q_rounded;

    // Deterministic dQ: the key-block CTAs that see a query block add their dQ in a fixed order
    // (descending key block), serialised by one zeroed int32 counter per (b, h, 64-row block).
    bool deterministic;
    int *__restrict__ dq_semaphore_ptr;  // (b, h, seqlen_q_rounded / 64)
};

inline bool has_features(const BwdParams &p) {
    return has_features(static_cast<const FwdParams &>(p)) || p.deterministic;
}

// Dispatch on (dtype, head-dim tile). Returns false when that configuration was not built.
bool run_mha_fwd(FwdParams &params, cudaStream_t stream);
bool run_mha_bwd(BwdParams &params, cudaStream_t stream);
// Whether a (dtype, head-dim tile) pair was compiled in.
bool is_built(bool is_bf16, int head_dim_tile);
// The kernel head-dim tile a head dim runs in, or -1 above 256.
int head_dim_tile(int d);
// Compute capability (major * 10 + minor) of a device, cached.
int device_sm(int device);
// The last CUDA error string seen by a launch in this thread ("" when none).
const char *last_launch_error();

}  // namespace flash
