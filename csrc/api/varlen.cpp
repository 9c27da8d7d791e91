// Variable-length entry points: mha_varlen_fwd / mha_varlen_bwd.
#include "api/binding.h"

#include <limits>

namespace flash::api {

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

// head_dim_v: v's head dim may be a smaller multiple of 8 than q's (the forward without pages).
void check_varlen_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool paged,
                      bool head_dim_v = false, int64_t max_head_dim = kMaxHeadDim) {
    FLASH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "flash_attn: q must be float16 or bfloat16, got ", q.scalar_type());
    check_varlen_tensor(q, "q", q, 3, "(total_q, nheads, headdim)");
    const char *kv_shape = paged ? "(num_blocks, page_block_size, nheads_k, headdim)" : "(total_k, nheads_k, headdim)";
    check_varlen_tensor(k, "k", q, paged ? 4 : 3, kv_shape);
    check_varlen_tensor(v, "v", q, paged ? 4 : 3, kv_shape);
    const bool narrower_v = head_dim_v && !paged && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
                            v.size(2) < k.size(2) && v.size(2) > 0 && v.size(2) % 8 == 0;
    FLASH_CHECK(k.sizes() == v.sizes() || narrower_v, "flash_attn: k and v must have the same shape",
                head_dim_v && !paged ? " (v's head dim may be a smaller multiple of 8)" : "", ", got ", k.sizes(),
                " and ", v.sizes());
    const int64_t d = q.size(2);
    FLASH_CHECK(k.size(-1) == d, "flash_attn: q and k must have the same head dim, got ", d, " and ", k.size(-1));
    FLASH_CHECK(d % 8 == 0 && d <= max_head_dim, "flash_attn: head dim must be a multiple of 8 and at most ",
                max_head_dim, " here (the Python layer pads), got ", d);
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
    p.dv = v.size(-1);
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
static void zero_tail(const at::Tensor &t, const at::Tensor &cu_seqlens, int64_t b, float *lse = nullptr,
               int64_t lse_head_stride = 0) {
    flash::zero_varlen_tail(t.data_ptr(), t.stride(0), t.stride(1), t.size(1), t.size(2), t.element_size(),
                            t.size(0), cu_seqlens.data_ptr<int>(), b, lse, lse_head_stride,
                            c10::cuda::getCurrentCUDAStream().stream());
}

// The batch size of a varlen call, after checking cu_seqlens_q / cu_seqlens_k (made contiguous in
// place) and the max lengths, which are narrowed to int and rounded up to a multiple of 128 later.
static int64_t check_varlen_batch(at::Tensor &cu_seqlens_q, at::Tensor &cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, const at::Tensor &q) {
    FLASH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) >= 1,
                "flash_attn: cu_seqlens_q must have shape (batch_size + 1,), got ", cu_seqlens_q.sizes());
    const int64_t b = cu_seqlens_q.size(0) - 1;
    cu_seqlens_q = checked_int_vector(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    cu_seqlens_k = checked_int_vector(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
    const int64_t max_seqlen_limit = std::numeric_limits<int>::max() - 127;
    FLASH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= max_seqlen_limit &&
                    max_seqlen_k <= max_seqlen_limit,
                "flash_attn: max_seqlen_q and max_seqlen_k must be in [0, ", max_seqlen_limit, "], got ", max_seqlen_q,
                " and ", max_seqlen_k);
    return b;
}

static std::vector<at::Tensor> mha_varlen_fwd(at::Tensor q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> out_,
                                              at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                              std::optional<at::Tensor> seqused_k_, std::optional<at::Tensor> leftpad_k_,
                                              std::optional<at::Tensor> block_table_, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, double softmax_scale, bool zero_tensors, bool is_causal,
                                              int64_t window_left, int64_t window_right, double softcap,
                                              std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                              bool return_softmax, std::optional<at::Tensor> learnable_sink) {
    const bool paged = block_table_.has_value();
    check_varlen_qkv(q, k, v, paged, /*head_dim_v=*/true, paged ? kMaxHeadDim : kMaxHeadDimFwd);
    check_dropout(p_dropout, softcap);
    FLASH_CHECK(!return_softmax || p_dropout > 0.0,
                "flash_attn: return_softmax is only supported when dropout_p > 0 (as upstream)");
    FLASH_CHECK(!paged || p_dropout == 0.0,
                "flash_attn: dropout (dropout_p > 0) is not supported with block_table (paged KV)");
    const int64_t b = check_varlen_batch(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q);
    c10::cuda::CUDAGuard device_guard(q.device());
    q = aligned(q), k = aligned(k), v = aligned(v);
    const int64_t total_q = q.size(0), h = q.size(1), d = q.size(2), dv = v.size(-1);
    const at::Tensor sink = learnable_sink_f32(learnable_sink, q, h);
    at::Tensor out = output_or_new(out_, "out", {total_q, h, dv}, q);
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
        fill_empty_lse(lse, sink, 0);
        // Rows past the last sequence: +inf, as after a kernel.
        if (sink.defined() && b > 0 && total_q > 0 && h > 0) {
            zero_tail(out, cu_seqlens_q, b, lse.data_ptr<float>(), lse.stride(0));
        }
        if (!zero_fill) rng_state.zero_();  // no forward kernel below
        copy_back(out_, out);
        return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
    }

    flash::FwdParams params{};
    at::Tensor seqused_k, leftpad_k, block_table;
    auto set_params = [&](const at::Tensor &v_, const at::Tensor &out_kernel) {
        set_varlen_qkv(params, q, k, v_, out_kernel, lse, cu_seqlens_q, cu_seqlens_k, b, max_seqlen_q, max_seqlen_k,
                       softmax_scale, is_causal);
        set_score_mods(params, is_causal, window_left, window_right, softmax_scale, softcap, alibi_slopes, q, b, h);
        set_learnable_sink(params, sink);
        params.rng_state_ptr = rng_state.data_ptr<int64_t>();
        if (p_dropout > 0.0) set_dropout_fwd(params, p_dropout, max_seqlen_k, q, rng_state, s_dmask, return_softmax);
        params.seqused_k = optional_ints(seqused_k_, "seqused_k", b, q, seqused_k);
        params.leftpad_k = optional_ints(leftpad_k_, "leftpad_k", b, q, leftpad_k);
    };
    set_params(v, out);
    bool found;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    if (paged) {
        block_table = block_table_.value();
        check_block_table(block_table, b, q);
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
        // V narrower than Q / K (MLA): its own kernel where one serves the call, else V
        // zero-padded to d (zero columns of O, cut off after the kernel).
        found = dv != d ? flash::run_mha_fwd_head_dim_v(params, stream) : flash::run_mha_fwd(params, stream);
        if (!found && dv != d) {
            const at::Tensor v_padded = at::constant_pad_nd(v, {0, d - dv});
            const at::Tensor out_padded = at::empty({total_q, h, d}, q.options());
            set_params(v_padded, out_padded);
            params.total_k = static_cast<int>(k.size(0));
            set_fwd_ws_switches(params, rng_buffer, zero_fill, /*varlen=*/true);
            found = flash::run_mha_fwd(params, stream);
            if (found) out.copy_(out_padded.narrow(2, 0, dv));
        }
    }
    check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
    zero_tail(out, cu_seqlens_q, b, lse.data_ptr<float>(), lse.stride(0));
    check_built_and_launched(true, params.is_bf16, d, params.head_dim_tile);
    copy_back(out_, out);
    return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
}

static std::vector<at::Tensor> mha_varlen_bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                              at::Tensor softmax_lse, std::optional<at::Tensor> dq_,
                                              std::optional<at::Tensor> dk_, std::optional<at::Tensor> dv_,
                                              at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, double softmax_scale, bool zero_tensors, bool is_causal,
                                              bool deterministic, int64_t window_left, int64_t window_right,
                                              double softcap, std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                              std::optional<at::Tensor> rng_state) {
    // v may be narrower than q / k (head_dim_v); out, dout and dv then have v's head dim.
    check_varlen_qkv(q, k, v, false, /*head_dim_v=*/true);
    check_dropout(p_dropout, softcap);
    check_rng_state(p_dropout, rng_state, q);
    check_varlen_tensor(out, "out", q, 3, "(total_q, nheads, headdim)");
    check_varlen_tensor(dout, "dout", q, 3, "(total_q, nheads, headdim)");
    const std::vector<int64_t> o_shape{q.size(0), q.size(1), v.size(2)};
    FLASH_CHECK(out.sizes() == at::IntArrayRef(o_shape) && dout.sizes() == at::IntArrayRef(o_shape),
                "flash_attn: out and dout must have q's shape with v's head dim ", at::IntArrayRef(o_shape));
    const int64_t b = check_varlen_batch(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q);
    c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t total_q = q.size(0), h = q.size(1), d = q.size(2), total_k = k.size(0), h_k = k.size(1);
    const int64_t hd_v = v.size(2);
    const auto grads = prepare_bwd(q, k, v, out, dout, softmax_lse, {h, total_q}, "(nheads, total_q)", dq_, dk_, dv_);
    at::Tensor dq = grads[0], dk = grads[1], dv = grads[2];
    if (zero_tensors) dq.zero_(), dk.zero_(), dv.zero_();
    const int accum_rows = static_cast<int>(total_q + 128 * b);
    at::Tensor softmax_d = at::empty({h, accum_rows}, q.options().dtype(at::kFloat));
    if (b == 0 || h == 0 || total_q == 0 || total_k == 0 || max_seqlen_q == 0 || max_seqlen_k == 0) {
        dq.zero_(), dk.zero_(), dv.zero_();
        softmax_d.zero_();  // out = 0: rowsum(dO * O) = 0 (the learnable sink's gradient reads it)
    } else {
        at::Tensor dk_expanded = h_k == h ? dk : at::empty({total_k, h, d}, q.options());
        at::Tensor dv_expanded = h_k == h ? dv : at::empty({total_k, h, hd_v}, q.options());
        const int tile = flash::head_dim_tile(static_cast<int>(d));
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
        bool is_bf16 = false;
        // One backward over (v_k, out_k, dout_k) into dv_k (all at v_k's head dim): on the kernel
        // with a V head dim of its own (own_v) or the usual dispatch. False: nothing launched.
        auto run = [&](const at::Tensor &v_k, const at::Tensor &out_k, const at::Tensor &dout_k, const at::Tensor &dv_k,
                       bool own_v) {
            flash::BwdParams params{};
            set_varlen_qkv(params, q, k, v_k, out_k, softmax_lse, cu_seqlens_q, cu_seqlens_k, b, max_seqlen_q,
                           max_seqlen_k, softmax_scale, is_causal);
            set_score_mods(params, is_causal, window_left, window_right, softmax_scale, softcap, alibi_slopes, q, b, h);
            set_dropout_bwd(params, p_dropout, rng_state);
            // The kernels index the semaphores by (bidb, bidh, 64-row block) with seqlen_q_rounded,
            // and the preprocess visits its rows: 128 more than max_seqlen_q rounded up cover every
            // sequence's 128 padding rows, where an 80-row query block (d128) may reach past the
            // rounded rows (a 250-row sequence: 320 > 256) and reads softmax_d.
            const int seqlen_q_rounded = round_up(static_cast<int>(max_seqlen_q), 128) + 128;
            at::Tensor dq_semaphore;
            const at::Tensor dq_accum = make_dq_accum(params, deterministic, {h, accum_rows, tile}, b, h, max_seqlen_k,
                                                      seqlen_q_rounded, q, dq_semaphore, /*varlen=*/true);
            params.do_ptr = dout_k.data_ptr();
            params.do_batch_stride = 0, params.do_row_stride = dout_k.stride(0), params.do_head_stride = dout_k.stride(1);
            params.dq_ptr = dq.data_ptr();
            params.dq_batch_stride = 0, params.dq_row_stride = dq.stride(0), params.dq_head_stride = dq.stride(1);
            params.dk_ptr = dk_expanded.data_ptr();
            params.dk_batch_stride = 0, params.dk_row_stride = dk_expanded.stride(0);
            params.dk_head_stride = dk_expanded.stride(1);
            params.dv_ptr = dv_k.data_ptr();
            params.dv_batch_stride = 0, params.dv_row_stride = dv_k.stride(0);
            params.dv_head_stride = dv_k.stride(1);
            params.softmax_d_ptr = softmax_d.data_ptr<float>();
            params.seqlen_q_rounded = seqlen_q_rounded;
            params.accum_rows = accum_rows;
            set_backward_switches(params);
            is_bf16 = params.is_bf16;
            return own_v ? flash::run_mha_bwd_head_dim_v(params, stream) : flash::run_mha_bwd(params, stream);
        };
        const bool found = hd_v != d ? run_bwd_narrow_v(run, v, out, dout, dv_expanded, d)
                                     : run(v, out, dout, dv_expanded, /*own_v=*/false);
        check_built_and_launched(found, is_bf16, d, tile);
        zero_tail(dq, cu_seqlens_q, b);
        zero_tail(dk_expanded, cu_seqlens_k, b);
        zero_tail(dv_expanded, cu_seqlens_k, b);
        check_built_and_launched(true, is_bf16, d, tile);
        if (h_k != h) {
            at::sum_out(dk, dk_expanded.reshape({total_k, h_k, h / h_k, d}), {2});
            at::sum_out(dv, dv_expanded.reshape({total_k, h_k, h / h_k, hd_v}), {2});
        }
    }
    copy_back(dq_, dq), copy_back(dk_, dk), copy_back(dv_, dv);
    return {dq_.has_value() ? dq_.value() : dq, dk_.has_value() ? dk_.value() : dk,
            dv_.has_value() ? dv_.value() : dv, softmax_d};
}

void bind_varlen(py::module_ &m) {
    m.def("varlen_fwd", &mha_varlen_fwd, "Attention forward, variable-length batch", py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("out"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("seqused_k"),
          py::arg("leftpad_k"), py::arg("block_table"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
          py::arg("softmax_scale"), py::arg("zero_tensors"), py::arg("is_causal"), py::arg("window_size_left") = -1,
          py::arg("window_size_right") = -1, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false, py::arg("learnable_sink") = py::none());
    m.def("varlen_bwd", &mha_varlen_bwd, "Attention backward, variable-length batch", py::arg("dout"), py::arg("q"),
          py::arg("k"), py::arg("v"), py::arg("out"), py::arg("softmax_lse"), py::arg("dq"), py::arg("dk"),
          py::arg("dv"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"),
          py::arg("max_seqlen_k"), py::arg("softmax_scale"), py::arg("zero_tensors"), py::arg("is_causal"),
          py::arg("deterministic"), py::arg("window_size_left") = -1, py::arg("window_size_right") = -1,
          py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(), py::arg("dropout_p") = 0.0,
          py::arg("rng_state") = py::none());
    // varlen_bwd takes v, out and dout at v's head dim as bwd does (bwd_takes_head_dim_v, dense.cpp).
}

}  // namespace flash::api
