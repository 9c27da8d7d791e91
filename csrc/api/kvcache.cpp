// KV-cache entry point: mha_fwd_kvcache (split-KV decoding, paged caches).
#include "api/binding.h"

#include <algorithm>

#include "api/index_guard.h"
#include "common/heuristics.h"

namespace flash::api {

// ---------------------------------------------------------------------------------------------
// KV-cache attention (the kernel part of flash_attn_with_kvcache; the append of new keys and the
// rotary embedding happen before, in Python). guard_indices: the index values are unchecked (calls
// without new keys; with new keys Python runs the guard before the append). q (b, seqlen_q, h, d);
// k_cache / v_cache (b_cache, seqlen_cache, h_k, d) or paged (num_blocks, page_block_size, h_k, d) with
// block_table (b, max_blocks_per_seq). Sequence b sees cache rows [leftpad[b], seqused_k[b]).
// ---------------------------------------------------------------------------------------------

// Whether a split-KV call runs the sm_90a bulk-copy decode kernel (see run_mha_fwd_splitkv_): the
// paged calls at head dims 64 and 128 that the CTA-schedule kernel does not take. Contiguous caches
// run the SM80-class kernels. H200, bf16 d128, 32 q / 8 kv heads, 1 token, b16 4k / b16 32k / b4 128k,
// GB/s: contiguous SM80-class 3416 / 4339 / 4296, bulk-copy 3376 / 4193 / 4140; page 16 SM80-class
// 2837 / 3321 / 3297, bulk-copy 3290 / 4204 / 4158 (a row costs the same paged or not when one bulk
// copy moves it).
static bool use_sm90_decode(const flash::FwdParams &p, bool paged) {
#ifdef FLASH_ATTN_SM90A
    if (paged && p.decode_paged_cta) return false;  // the CTA-schedule kernel
    return p.use_sm90 && (p.d == 64 || p.d == 128) && paged;
#else
    (void)p;
    (void)paged;
    return false;
#endif
}

static std::vector<at::Tensor> mha_fwd_kvcache(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                               std::optional<at::Tensor> seqused_k_, std::optional<at::Tensor> leftpad_k_,
                                               std::optional<at::Tensor> batch_idx_, std::optional<at::Tensor> block_table_,
                                               double softmax_scale, bool is_causal, int64_t window_left,
                                               int64_t window_right, int64_t num_splits, double softcap,
                                               std::optional<at::Tensor> alibi_slopes,
                                               std::optional<at::Tensor> learnable_sink, bool guard_indices) {
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
    const at::Tensor sink = learnable_sink_f32(learnable_sink, q, h);
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({b, h, sq}, q.options().dtype(at::kFloat));
    if (b == 0 || sq == 0 || h == 0) return {out, lse};

    at::Tensor block_table, seqused_k, leftpad_k, batch_idx;
    int64_t seqlen_k = k_cache.size(1);
    if (paged) {
        block_table = block_table_.value();
        check_block_table(block_table, b, q);
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
    set_score_mods(params, is_causal, window_left, window_right, softmax_scale, softcap, alibi_slopes, q, b, h);
    set_learnable_sink(params, sink);
    params.num_splits = 1;
    params.seqused_k = optional_ints(seqused_k_, "cache_seqlens", b, q, seqused_k);
    params.leftpad_k = optional_ints(leftpad_k_, "cache_leftpad", b, q, leftpad_k);
    params.kv_batch_idx = optional_ints(batch_idx_, "cache_batch_idx", b, q, batch_idx);
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
    // Values the host did not check (guard_indices). The split-KV kernels check them themselves,
    // each CTA its own sequence's values and its split's block-table entries, so a decoding step
    // pays no guard launch (common/kv_index_check.h); otherwise the device-side guard runs here
    // first and the kernel reads its copies, all zeros (no key rows) when one is out of range.
    at::Tensor guarded;
    flash::IndexErrorRecord *record = guard_indices && use_split ? flash::index_error_record() : nullptr;
    if (record != nullptr) {
        params.kv_index_record = record;
        params.kv_cache_rows = static_cast<int>(seqlen_k);
    } else if (guard_indices) {
        guarded = run_kvcache_guard(q, seqused_k_, batch_idx_, leftpad_k_, block_table_, seqlen_k, /*seqlen_new=*/0,
                                    seqlen_k, k_cache.size(0), paged ? k_cache.size(1) : 0,
                                    paged ? k_cache.size(0) : 0);
        const int *safe = guarded.data_ptr<int>();
        if (seqused_k_.has_value() || paged) params.seqused_k = safe + 1 + b;
        if (batch_idx_.has_value()) params.kv_batch_idx = safe + 1 + 2 * b;
        if (leftpad_k_.has_value()) params.leftpad_k = safe + 1 + 3 * b;
    }
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

void bind_kvcache(py::module_ &m) {
    m.def("fwd_kvcache", &mha_fwd_kvcache, "Attention over a (paged) KV cache, split-KV for decoding", py::arg("q"),
          py::arg("k_cache"), py::arg("v_cache"), py::arg("seqused_k"), py::arg("leftpad_k"), py::arg("batch_idx"),
          py::arg("block_table"), py::arg("softmax_scale"), py::arg("is_causal"), py::arg("window_size_left"),
          py::arg("window_size_right"), py::arg("num_splits"), py::arg("softcap") = 0.0,
          py::arg("alibi_slopes") = py::none(), py::arg("learnable_sink") = py::none(),
          py::arg("guard_indices") = false);
}

}  // namespace flash::api
