// The extension module flash_attn._C: the entry points and the build / test queries.
#include "api/binding.h"

#include "common/heuristics.h"

namespace flash::api {

std::vector<std::tuple<std::string, int>> built_configs() {
    std::vector<std::tuple<std::string, int>> configs;
    for (bool is_bf16 : {false, true}) {
        for (int tile : {32, 64, 96, 128, 192, 256}) {
            if (flash::is_built(is_bf16, tile)) configs.emplace_back(dtype_name(is_bf16), tile);
        }
    }
    return configs;
}

}  // namespace flash::api

using namespace flash::api;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "flash_attn CUDA kernels";
    m.def("fwd", &mha_fwd, "Attention forward", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
          py::arg("softmax_scale"), py::arg("is_causal"), py::arg("window_size_left") = -1,
          py::arg("window_size_right") = -1, py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false, py::arg("learnable_sink") = py::none());
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
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false, py::arg("learnable_sink") = py::none());
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
          py::arg("alibi_slopes") = py::none(), py::arg("learnable_sink") = py::none());
    m.def("kvcache_guard", &kvcache_guard,
          "Device-side check of the KV-cache index tensors: (skip flag, cache_seqlens, seqused, batch_idx, leftpad), "
          "their values or zeros (flag 1) when one is out of range; the first bad value goes to take_index_error",
          py::arg("q"), py::arg("cache_seqlens"), py::arg("batch_idx"), py::arg("leftpad"), py::arg("block_table"),
          py::arg("default_seqlen"), py::arg("seqlen_new"), py::arg("seqlen_cache"), py::arg("batch_cache"),
          py::arg("page_block_size"), py::arg("num_blocks"));
    m.def("varlen_guard", &varlen_guard,
          "Device-side check of cu_seqlens (and the block table): (skip flag, cu_seqlens_q, cu_seqlens_k), their "
          "values or zeros (flag 1) when one is bad; total_k -1 with block_table",
          py::arg("q"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("total_q"), py::arg("total_k"),
          py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("block_table"), py::arg("page_block_size"),
          py::arg("num_blocks"));
    m.def("append_kv", &append_kv,
          "k_cache[batch, cache_seqlens[b] + j] = k[b, j] (and v) in place, through block_table when paged; nothing "
          "when skip_flag[0] != 0",
          py::arg("k_cache"), py::arg("v_cache"), py::arg("k"), py::arg("v"), py::arg("cache_seqlens"),
          py::arg("batch_idx"), py::arg("block_table"), py::arg("skip_flag"));
    m.def("take_index_error", &take_index_error,
          "(code, index, column, value, limit) of the first bad index value a device-side guard found since the "
          "last take, or None; clears it");
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
    // The size-dependent kernel choices of common/heuristics.h, for CPU unit tests.
    m.def("heuristic_splitkv_splits", [](int ctas, int sms, int64_t max_seqlen_k, bool paged, bool one_cta_per_sm) {
        return one_cta_per_sm ? flash::splitkv_heuristic_sm90(ctas, sms, max_seqlen_k)
                              : flash::splitkv_heuristic(ctas, sms, max_seqlen_k, paged);
    }, "Key splits of a split-KV call with `ctas` CTAs before splitting (one_cta_per_sm: the sm_90a decode kernel and "
       "the d128 wide shape)", py::arg("ctas"), py::arg("sms"), py::arg("max_seqlen_k"), py::arg("paged"),
          py::arg("one_cta_per_sm"));
    m.def("heuristic_deterministic_splits", &flash::deterministic_splits,
          "dq_accum slices per (b, h) of the sliced deterministic backward", py::arg("bh"), py::arg("n_blocks"),
          py::arg("sms"));
    m.def("heuristic_fwd_ws_choice", [](int head_dim_tile, int seqlen_q, int seqlen_k, int64_t window_left,
                                        int64_t window_right) {
        flash::FwdParams p{};
        p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
        p.window_left = window_left < 0 ? flash::kWindowUnbounded : static_cast<int>(window_left);
        p.window_right = window_right < 0 ? flash::kWindowUnbounded : static_cast<int>(window_right);
        p.fwd_ws_persistent = flash::kFwdWsPersistentAuto;
        return std::make_tuple(flash::fwd_ws_use_persistent(p, head_dim_tile),
                               head_dim_tile == 64 && flash::fwd_ws_d64_m128(p));
    }, "(persistent kernel, d64 on 128-row tiles) for a plain warp-specialised forward (windows: -1 unbounded)",
          py::arg("head_dim_tile"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("window_left"),
          py::arg("window_right"));
}
