// Dense entry points: mha_fwd / mha_bwd, q (b, seqlen_q, h, d), k / v (b, seqlen_k, h_k, d).
#include "api/binding.h"
#include "api/sink_grad.h"

namespace flash::api {

// Returns {out, softmax_lse, S_dmask, rng_state}. S_dmask is empty unless return_softmax (which needs
// dropout); rng_state is (seed, offset) of the dropout mask, zeros without dropout.
std::vector<at::Tensor> mha_fwd(at::Tensor q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> out_,
                                double softmax_scale, bool is_causal, int64_t window_left, int64_t window_right,
                                double softcap, std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                bool return_softmax, std::optional<at::Tensor> learnable_sink) {
    check_qkv_shapes(q, k, v, /*head_dim_v=*/true, kMaxHeadDimFwd);
    check_dropout(p_dropout, softcap);
    FLASH_CHECK(!return_softmax || p_dropout > 0.0,
                "flash_attn: return_softmax is only supported when dropout_p > 0 (as upstream)");
    c10::cuda::CUDAGuard device_guard(q.device());
    q = aligned(q), k = aligned(k), v = aligned(v);
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1), dv = v.size(3);
    at::Tensor out = output_or_new(out_, "out", {b, sq, h, dv}, q);
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
    const at::Tensor sink = learnable_sink_f32(learnable_sink, q, h);
    if (b == 0 || sq == 0 || h == 0) return {out, lse, s_dmask, rng_state};
    if (sk == 0) {  // nothing to attend to: out = 0, lse = +inf or the sink (as a fully masked row)
        out.zero_();
        fill_empty_lse(lse, sink, 1);
        copy_back(out_, out);
        return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
    }

    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    flash::FwdParams params{};
    auto set_params = [&](const at::Tensor &v_, const at::Tensor &out_kernel) {
        set_qkv(params, q, k, v_, out_kernel, lse, softmax_scale, is_causal);
        set_score_mods(params, is_causal, window_left, window_right, softmax_scale, softcap, alibi_slopes, q,
                       q.size(0), q.size(2));
        set_learnable_sink(params, sink);
        params.rng_state_ptr = rng_state.data_ptr<int64_t>();
        if (p_dropout > 0.0) set_dropout_fwd(params, p_dropout, sk, q, rng_state, s_dmask, return_softmax);
        set_fwd_ws_switches(params, rng_buffer, zero_fill, /*varlen=*/false);
    };
    set_params(v, out);
    bool found = false;
    if (dv != d) {
        // V narrower than Q / K (MLA): its own kernel where one serves the call, else V
        // zero-padded to d (zero columns of O, cut off after the kernel).
        found = flash::run_mha_fwd_head_dim_v(params, stream);
        if (!found) {
            const at::Tensor v_padded = at::constant_pad_nd(v, {0, d - dv});
            const at::Tensor out_padded = at::empty({b, sq, h, d}, q.options());
            set_params(v_padded, out_padded);
            found = flash::run_mha_fwd(params, stream);
            if (found) out.copy_(out_padded.narrow(3, 0, dv));
        }
    } else {
        found = flash::run_mha_fwd(params, stream);
    }
    check_built_and_launched(found, params.is_bf16, d, params.head_dim_tile);
    copy_back(out_, out);
    return {out_.has_value() ? out_.value() : out, lse, s_dmask, rng_state};
}

std::vector<at::Tensor> mha_bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                at::Tensor softmax_lse, std::optional<at::Tensor> dq_, std::optional<at::Tensor> dk_,
                                std::optional<at::Tensor> dv_, double softmax_scale, bool is_causal, bool deterministic,
                                int64_t window_left, int64_t window_right, double softcap,
                                std::optional<at::Tensor> alibi_slopes, double p_dropout,
                                std::optional<at::Tensor> rng_state) {
    // v may be narrower than q / k (head_dim_v); out, dout and dv then have v's head dim.
    check_qkv_shapes(q, k, v, /*head_dim_v=*/true);
    check_dropout(p_dropout, softcap);
    check_rng_state(p_dropout, rng_state, q);
    check_tensor(out, "out", q);
    check_tensor(dout, "dout", q);
    const std::vector<int64_t> o_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
    FLASH_CHECK(out.sizes() == at::IntArrayRef(o_shape) && dout.sizes() == at::IntArrayRef(o_shape),
                "flash_attn: out and dout must have q's shape with v's head dim ", at::IntArrayRef(o_shape));
    c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1), h_k = k.size(2);
    const int64_t hd_v = v.size(3);
    const auto grads = prepare_bwd(q, k, v, out, dout, softmax_lse, {b, h, sq}, "(batch, nheads, seqlen_q)", dq_, dk_, dv_);
    at::Tensor dq = grads[0], dk = grads[1], dv = grads[2];
    const int seqlen_q_rounded = round_up(static_cast<int>(sq), 128);
    at::Tensor softmax_d = at::empty({b, h, seqlen_q_rounded}, q.options().dtype(at::kFloat));
    if (b == 0 || h == 0 || sq == 0 || sk == 0) {
        dq.zero_(), dk.zero_(), dv.zero_();
        softmax_d.zero_();  // out = 0: rowsum(dO * O) = 0 (the learnable sink's gradient reads it)
    } else {
        // MQA/GQA: per-query-head dK/dV, summed over each group afterwards.
        at::Tensor dk_expanded = h_k == h ? dk : at::empty({b, sk, h, d}, q.options());
        at::Tensor dv_expanded = h_k == h ? dv : at::empty({b, sk, h, hd_v}, q.options());
        const int tile = flash::head_dim_tile(static_cast<int>(d));
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
        bool is_bf16 = false;
        // One backward over (v_k, out_k, dout_k) into dv_k (all at v_k's head dim): on the kernel
        // with a V head dim of its own (own_v) or the usual dispatch. False: nothing launched.
        auto run = [&](const at::Tensor &v_k, const at::Tensor &out_k, const at::Tensor &dout_k, const at::Tensor &dv_k,
                       bool own_v) {
            flash::BwdParams params{};
            set_qkv(params, q, k, v_k, out_k, softmax_lse, softmax_scale, is_causal);
            set_score_mods(params, is_causal, window_left, window_right, softmax_scale, softcap, alibi_slopes, q,
                           q.size(0), q.size(2));
            set_dropout_bwd(params, p_dropout, rng_state);
            at::Tensor dq_semaphore;
            const at::Tensor dq_accum = make_dq_accum(params, deterministic, {b, h, seqlen_q_rounded, tile}, b, h, sk,
                                                      seqlen_q_rounded, q, dq_semaphore, /*varlen=*/false);
            params.do_ptr = dout_k.data_ptr();
            params.do_batch_stride = dout_k.stride(0), params.do_row_stride = dout_k.stride(1);
            params.do_head_stride = dout_k.stride(2);
            params.dq_ptr = dq.data_ptr();
            params.dq_batch_stride = dq.stride(0), params.dq_row_stride = dq.stride(1), params.dq_head_stride = dq.stride(2);
            params.dk_ptr = dk_expanded.data_ptr();
            params.dk_batch_stride = dk_expanded.stride(0), params.dk_row_stride = dk_expanded.stride(1);
            params.dk_head_stride = dk_expanded.stride(2);
            params.dv_ptr = dv_k.data_ptr();
            params.dv_batch_stride = dv_k.stride(0), params.dv_row_stride = dv_k.stride(1);
            params.dv_head_stride = dv_k.stride(2);
            params.softmax_d_ptr = softmax_d.data_ptr<float>();
            params.seqlen_q_rounded = seqlen_q_rounded;
            set_backward_switches(params);
            is_bf16 = params.is_bf16;
            return own_v ? flash::run_mha_bwd_head_dim_v(params, stream) : flash::run_mha_bwd(params, stream);
        };
        const bool found = hd_v != d ? run_bwd_narrow_v(run, v, out, dout, dv_expanded, d)
                                     : run(v, out, dout, dv_expanded, /*own_v=*/false);
        check_built_and_launched(found, is_bf16, d, tile);
        if (h_k != h) {
            at::sum_out(dk, dk_expanded.reshape({b, sk, h_k, h / h_k, d}), {3});
            at::sum_out(dv, dv_expanded.reshape({b, sk, h_k, h / h_k, hd_v}), {3});
        }
    }
    copy_back(dq_, dq), copy_back(dk_, dk), copy_back(dv_, dv);
    return {dq_.has_value() ? dq_.value() : dq, dk_.has_value() ? dk_.value() : dk,
            dv_.has_value() ? dv_.value() : dv, softmax_d};
}

// The learnable sink's gradient (api/sink_grad.h) from the forward's softmax_lse and the backward's
// softmax_d, dense ((b, h, seqlen_q) and (b, h, seqlen_q_rounded)) or, with cu_seqlens_q, varlen
// ((h, total_q) and (h, total_q + 128 b)). fp32 (h,).
static at::Tensor learnable_sink_grad(const at::Tensor &sink, const at::Tensor &softmax_lse,
                                      const at::Tensor &softmax_d, std::optional<at::Tensor> cu_seqlens_q) {
    for (const at::Tensor *t : {&sink, &softmax_lse, &softmax_d}) {
        FLASH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                    "flash_attn: learnable_sink_grad takes contiguous fp32 CUDA tensors");
        FLASH_CHECK(t->device() == sink.device(), "flash_attn: learnable_sink_grad's tensors must share a device");
    }
    c10::cuda::CUDAGuard device_guard(sink.device());
    flash::SinkGradArgs args{};
    const bool varlen = cu_seqlens_q.has_value();
    FLASH_CHECK(sink.dim() == 1 && softmax_lse.dim() == (varlen ? 2 : 3) && softmax_d.dim() == softmax_lse.dim(),
                "flash_attn: learnable_sink_grad: bad shapes");
    const int64_t h = sink.size(0);
    at::Tensor cu;
    if (varlen) {
        cu = cu_seqlens_q.value();
        FLASH_CHECK(cu.is_cuda() && cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.size(0) >= 1 &&
                        cu.device() == sink.device(),
                    "flash_attn: learnable_sink_grad: cu_seqlens_q must be a 1-D int32 CUDA tensor");
        cu = cu.contiguous();
        args.b = static_cast<int>(cu.size(0) - 1);
        args.total_q = softmax_lse.size(1);
        FLASH_CHECK(softmax_lse.size(0) == h && softmax_d.size(0) == h &&
                        softmax_d.size(1) == args.total_q + 128 * int64_t(args.b),
                    "flash_attn: learnable_sink_grad: bad varlen shapes");
        args.cu_seqlens_q = cu.data_ptr<int>();
    } else {
        FLASH_CHECK(softmax_lse.size(1) == h && softmax_d.size(0) == softmax_lse.size(0) && softmax_d.size(1) == h &&
                        softmax_d.size(2) >= softmax_lse.size(2),
                    "flash_attn: learnable_sink_grad: bad dense shapes");
        args.b = static_cast<int>(softmax_lse.size(0));
        args.seqlen_q = static_cast<int>(softmax_lse.size(2));
        args.seqlen_q_rounded = static_cast<int>(softmax_d.size(2));
    }
    at::Tensor dsink = at::empty({h}, sink.options());
    args.sink = sink.data_ptr<float>();
    args.lse = softmax_lse.data_ptr<float>();
    args.softmax_d = softmax_d.data_ptr<float>();
    args.h = static_cast<int>(h);
    args.dsink = dsink.data_ptr<float>();
    flash::clear_launch_error();
    flash::learnable_sink_grad(args, c10::cuda::getCurrentCUDAStream().stream());
    const std::string err = flash::last_launch_error();
    FLASH_CHECK_RUNTIME(err.empty(), "flash_attn: CUDA error: ", err);
    return dsink;
}

void bind_dense(py::module_ &m) {
    m.def("fwd", &mha_fwd, "Attention forward", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
          py::arg("softmax_scale"), py::arg("is_causal"), py::arg("window_size_left") = -1,
          py::arg("window_size_right") = -1, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false, py::arg("learnable_sink") = py::none());
    m.def("bwd", &mha_bwd, "Attention backward", py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("out"), py::arg("softmax_lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
          py::arg("softmax_scale"), py::arg("is_causal"), py::arg("deterministic"),
          py::arg("window_size_left") = -1, py::arg("window_size_right") = -1, py::arg("softcap") = 0.0,
          py::arg("alibi_slopes") = py::none(), py::arg("dropout_p") = 0.0, py::arg("rng_state") = py::none());
    // The forward takes v with a head dim below q's (multiple of 8; out gets it).
    m.attr("fwd_takes_head_dim_v") = true;
    // The backward takes v, out and dout with that head dim (dv returned at it): on its own kernel
    // where one serves the call (sm_90a, q / k 129-192 with v up to 128, no dropout), else padded
    // inside the binding.
    m.attr("bwd_takes_head_dim_v") = true;
    m.def("learnable_sink_grad", &learnable_sink_grad, "The learnable sink's gradient (fp32) from softmax_lse and softmax_d",
          py::arg("learnable_sink"), py::arg("softmax_lse"), py::arg("softmax_d"), py::arg("cu_seqlens_q") = py::none());
}

}  // namespace flash::api
