// Plain parameter structs shared by the binding and the kernels. No torch types here, so
// kernel translation units compile independently of the Python and torch versions.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flash {

struct IndexErrorRecord;  // common/index_error.h

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
    // V's (and O's) head dim: d, except on a kernel with a V width of its own (DeepSeek MLA's 192 / 128:
    // run_mha_fwd_head_dim_v).
    int dv;
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
    // Learnable attention sink (not a feature: every forward kernel applies it where it
    // normalises the output): one fp32 logit per query head, in the units of the scaled scores,
    // added to each row's softmax denominator as exp(sink[h]) with no value. nullptr = none.
    const float *__restrict__ learnable_sink;
    // Dropout of the attention probabilities: an element is kept iff its Philox byte is below
    // dropout_keep_threshold (min(255, round((1 - p) * 256))); kept ones are scaled by rp_dropout.
    float p_dropout;
    float rp_dropout;
    uint32_t dropout_keep_threshold;
    PhiloxParams philox;
    int64_t *rng_state_ptr;  // forward: receives (seed, offset) with dropout, zeros without
    // return_softmax with dropout: (b, h, round128(seqlen_q), round128(seqlen_k)) in the input
    // dtype, exp(score - running max) with dropped elements negated (upstream's convention).
    void *s_dmask_ptr;
    index_t s_dmask_batch_stride, s_dmask_head_stride, s_dmask_row_stride;

    // ---- Variable-length batches and KV caches (all optional; nullptr / 0 when unused) ----
    // Sequence b uses only the keys [leftpad_k[b], seqused_k[b]) of its K/V rows (seqused_k
    // counts from row 0 of the sequence, leftpad included); without seqused_k the end is the
    // sequence's cu_seqlens_k length, or seqlen_k when dense.
    const int *__restrict__ seqused_k;
    const int *__restrict__ leftpad_k;
    // Dense K/V only: batch element b reads K/V batch kv_batch_idx[b] (KV-cache batch index).
    const int *__restrict__ kv_batch_idx;
    // Paged K/V: key row r of sequence b lives in page block_table[b * block_table_batch_stride
    // + r / page_block_size], row r % page_block_size; k/v_batch_stride are then page strides.
    const int *__restrict__ block_table;
    index_t block_table_batch_stride;
    int page_block_size;

    // Split-KV (the decode kernel): the keys of a sequence are cut into num_splits chunks whose
    // partial results go to fp32 oaccum (num_splits, b, h, seqlen_q, head_dim_tile) and
    // lse_accum (num_splits, b, h, seqlen_q), merged by the combine kernel. num_splits == 1
    // writes out / softmax_lse directly.
    int num_splits;
    // Split-KV on sm_90a: run the bulk-copy decode kernel (sm90/flash_fwd_decode_sm90.h) instead
    // of the SM80-class one; set by the binding where it applies.
    bool decode_sm90;
    // Split-KV at d = 128: the 8-warp, one-CTA-per-SM shape (SplitKVWideTraits); set by the
    // binding when the device has kSplitKVWideSmemBytes of shared memory per block.
    bool splitkv_wide;
    // Entries of the KV cache (k_cache.shape[0]: batch entries, or pages when paged; the TMA
    // decode variant's batch extent).
    int kv_cache_batch;
    // KV-cache values the host did not check, on the split-KV kernels (calls without new keys):
    // each CTA checks its sequence's seqused_k, kv_batch_idx and leftpad_k against kv_cache_rows
    // and kv_cache_batch, and the block-table entries of its keys against kv_cache_batch, and runs
    // a sequence (or split) with a bad one as one without keys. The first bad value (in the host
    // checks' order) goes to this pinned record (common/kv_index_check.h). nullptr: the values are
    // trusted.
    IndexErrorRecord *kv_index_record;
    int kv_cache_rows;
    // Paged d128 caches (power-of-two pages, no cache_leftpad, no softcap / ALiBi) through the
    // CTA-schedule kernel instead of the sm_90a one (set by the binding).
    bool decode_paged_cta;
    // Warp-specialised forward, plain variant: one CTA per SM walking the tiles: kFwdWsPersistentOff
    // / On (wherever the kernel is compiled) / Auto (the default, fwd_ws_use_persistent in heuristics.h; the
    // others through set_debug_kernel, for tests).
    int fwd_ws_persistent;
    // Warp-specialised forward at head-dim tile 64, plain calls: query rows per tile, 0 = auto
    // (fwd_ws_d64_m128 in heuristics.h), 128 or 192 (set_debug_kernel, for tests).
    int fwd_ws_d64_rows;
    // Warp-specialised forward, dense calls: each consumer warpgroup writes its O tile with one
    // TMA store from shared memory (off only through set_debug_kernel: the 16-byte per-thread
    // stores, which varlen calls always use).
    bool fwd_tma_o;
    // Persistent forward with a dynamic tile order (causal, sliding window or varlen calls, whose
    // tiles differ in work): two zeroed int32, the counter the CTAs draw their next tiles from with
    // atomicAdd and the count of CTAs done drawing; the last CTA done zeroes both again.
    // nullptr = the static order (tile blockIdx.x + k gridDim.x).
    int *tile_count_ptr;
    // Split-KV with num_splits > 1: launch the combine kernel as a programmatic dependent launch
    // (sm_90+; set by the binding; flash_fwd_splitkv_kernel.h).
    bool decode_pdl;
    float *__restrict__ oaccum_ptr;
    float *__restrict__ lse_accum_ptr;
    // Varlen: total number of query rows (the zero-filled tail starts at cu_seqlens_q[b]).
    int total_q;
    // Varlen: rows of the packed K/V tensors (the TMA bound of the warp-specialised forward).
    // (Sits in the struct's tail padding: sizeof(FwdParams) and BwdParams' layout are unchanged.)
    int total_k;
};

inline bool has_features(const FwdParams &p) {
    return p.softcap_scale > 0.f || p.alibi_slopes_ptr != nullptr || p.p_dropout > 0.f;
}

constexpr int kFwdWsPersistentOff = 0, kFwdWsPersistentOn = 1, kFwdWsPersistentAuto = 2;

// A window side that never masks anything (large, yet safe to add to row indices).
constexpr int kWindowUnbounded = 1 << 29;


// Shared memory of the d = 128 split-KV kernel's wide shape (SplitKVWideTraits): Q (16 x 128) and
// 8 warps x 3 stages x 16 keys of K and V, 16-bit elements.
constexpr int kSplitKVWideSmemBytes = (16 + 8 * 3 * 2 * 16) * 128 * 2;

struct BwdParams : FwdParams {
    void *__restrict__ do_ptr;
    index_t do_batch_stride, do_row_stride, do_head_stride;
    void *__restrict__ dq_ptr;
    void *__restrict__ dk_ptr;
    void *__restrict__ dv_ptr;
    index_t dq_batch_stride, dq_row_stride, dq_head_stride;
    index_t dk_batch_stride, dk_row_stride, dk_head_stride;
    index_t dv_batch_stride, dv_row_stride, dv_head_stride;

    // fp32 dQ accumulator (b, h, seqlen_q_rounded, head_dim_tile), zero-initialised (by the binding,
    // or by the preprocess kernel: dq_accum_zero_in_preprocess).
    float *__restrict__ dq_accum_ptr;
    // rowsum(dO * O) (b, h, seqlen_q_rounded), fp32.
    float *__restrict__ softmax_d_ptr;
    int seqlen_q_rounded;

    // Deterministic dQ: the key-block CTAs that see a query block add their dQ in a fixed order
    // (descending key block), serialised by one zeroed int32 counter per (b, h, 64-row block).
    bool deterministic;
    int *__restrict__ dq_semaphore_ptr;  // (b, h, seqlen_q_rounded / 64); SM80-class kernels
    // The sm_90a backward makes dQ deterministic differently: dq_accum holds dq_accum_splits
    // slices dq_accum_split_stride elements apart, slice s written only by CTA s of each (b, h)
    // (key blocks s, s + splits, ...); the conversion sums them in order. 1 slice otherwise.
    int dq_accum_splits;
    index_t dq_accum_split_stride;
    // Sliced sm_90a mode without a left window (flash_api.cpp make_dq_accum): dq_accum is not
    // zeroed; each CTA *stores* its first key block's dQ (round 0: key block s covers a superset
    // of the query rows of its later blocks) and adds the rest, and the conversion reads slice s
    // only in the rows of key block s's m_block_range (blocks of dq_slice_block_m rows /
    // dq_slice_block_n keys, set by the launcher). Saves the memset of all slices.
    bool dq_store_first;
    // Run the warp-specialised sm_90a backward (sm90/flash_bwd_ws_*_sm90.h) where it applies;
    // off only through set_debug_kernel('bwd_lockstep'), for tests.
    bool bwd_ws;
    // Deterministic dQ on the warp-specialised sm_90a backward (set by the binding, make_dq_accum,
    // for the calls that kernel will serve): dq_accum holds dq_accum_splits zeroed slices, key
    // block n adds into slice n % splits with a bulk reduce-add, and the CTAs sharing a slice add
    // each query block's tile in a fixed order, serialised by the zeroed int32 counters
    // dq_semaphore_ptr (splits, b, h, seqlen_q_rounded / 64) (sm90/flash_bwd_ws_kernel_sm90.h).
    // If the WS kernel declines the call after all, the lock-step kernel's sliced mode runs on the
    // same zeroed slices.
    bool bwd_ws_det;
    int dq_slice_block_m, dq_slice_block_n;
    // WS calls with a bounded right window (causal): the heads whose CTAs are interleaved in the
    // launch order, key block by key block (1 = one head after the other, 0 reads as 1), key block
    // 0 (the longest) first, or last for deterministic calls. Set by the binding:
    // flash::bwd_ws_causal_head_group, deterministic ws_det_head_group (2 at head dim 256, else 1).
    // See bwd_ws_tile_coords (sm90/flash_bwd_ws_epilogue_sm90.h).
    int bwd_ws_head_group;
    // Query rows per step of the plain d128 WS backward: 64, or FA3's 80 (swapped dQ) on calls
    // without a window (flash::bwd_ws_d128_block_m; 64 / 80 through set_debug_kernel, for tests).
    int bwd_ws_d128_block_m;

    // Varlen: dq_accum is (h, accum_rows, head_dim_tile) and softmax_d (h, accum_rows) with
    // accum_rows = total_q + 128 * b; sequence b starts at row cu_seqlens_q[b] + 128 * b, so each
    // sequence has up to 128 rows of padding that the kernels may touch without a predicate.
    int accum_rows;
    // dq_accum's 8-float groups are XOR-swizzled within each row (float c of row r at
    // c ^ flash::dq_accum_swizzle(r), common/bwd_passes.h): set by the launcher of the WS kernels whose dQ tiles are bulk-copied from
    // a conflict-free shared-memory layout (d256 split-d; d64 / d128); the conversion undoes it.
    bool dq_accum_swizzled;
    // dq_accum is not zeroed by the binding (at::empty): the preprocess kernel zeroes each row it
    // visits, i.e. every row the main kernel adds into (the default mode, one slice).
    bool dq_accum_zero_in_preprocess;
};

inline bool has_features(const BwdParams &p) {
    return has_features(static_cast<const FwdParams &>(p)) || p.deterministic;
}

// Dispatch on (dtype, head-dim tile). Returns false when that configuration was not built.
bool run_mha_fwd(FwdParams &params, cudaStream_t stream);
// A forward with params.dv < params.d on a kernel with a V width of its own; false (nothing launched)
// where none serves the call (the binding then runs V zero-padded to d).
bool run_mha_fwd_head_dim_v(FwdParams &params, cudaStream_t stream);
bool run_mha_bwd(BwdParams &params, cudaStream_t stream);
// A backward with params.dv < params.d (V, dO, O and dV at dv) on a kernel with a V width of its own;
// false (nothing launched) where none serves the call (the binding then runs V / dO / O zero-padded
// to d and cuts dV back to dv).
bool run_mha_bwd_head_dim_v(BwdParams &params, cudaStream_t stream);
// The split-KV / paged / GQA-packed forward (decode and KV-cache attention) and, for
// num_splits > 1, its combine step. Returns false when that configuration was not built.
bool run_mha_fwd_splitkv(FwdParams &params, cudaStream_t stream);
// Zero rows [cu_seqlens[b], total_rows) of a (total_rows, h, d) tensor with the given strides
// (elements of elem_bytes bytes; d * elem_bytes a multiple of 16), and optionally set the same
// rows of an fp32 (h, total_rows) LSE to +inf. Rows past the last sequence of a varlen batch.
void zero_varlen_tail(void *ptr, int64_t row_stride, int64_t head_stride, int h, int d, int elem_bytes,
                      int total_rows, const int *cu_seqlens, int b, float *lse, int64_t lse_head_stride,
                      cudaStream_t stream);
// Whether a (dtype, head-dim tile) pair was compiled in.
bool is_built(bool is_bf16, int head_dim_tile);
// The kernel head-dim tile a head dim runs in, or -1 above 256.
int head_dim_tile(int d);
// Compute capability (major * 10 + minor) of a device, cached.
int device_sm(int device);
// The last CUDA error string seen by a launch in this thread ("" when none).
const char *last_launch_error();
void clear_launch_error();

}  // namespace flash
