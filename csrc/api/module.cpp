// The extension module flash_attn._C: the entry points and the build / test queries.
#include "api/binding.h"

#include "common/heuristics.h"

namespace flash::api {

std::vector<std::tuple<std::string, int>> built_configs() {
    std::vector<std::tuple<std::string, int>> configs;
    for (bool is_bf16 : {false, true}) {
        for (int tile : {32, 64, 96, 128, 192, 256, 512}) {
            if (flash::is_built(is_bf16, tile)) configs.emplace_back(dtype_name(is_bf16), tile);
        }
    }
    return configs;
}

}  // namespace flash::api

using namespace flash::api;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "flash_attn CUDA kernels";
    bind_dense(m);
    bind_varlen(m);
    bind_kvcache(m);
    bind_index_checks(m);
    bind_sdpa(m);
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
    m.def("head_dim_tile", &flash::head_dim_tile, "The kernel head-dim tile a head dim runs in (-1 above 512; 512: forward only)");
    // The size-dependent kernel choices of common/heuristics.h, for CPU unit tests.
    m.def("heuristic_splitkv_splits", [](int ctas, int sms, int64_t max_seqlen_k, bool paged, bool one_cta_per_sm) {
        return one_cta_per_sm ? flash::splitkv_heuristic_sm90(ctas, sms, max_seqlen_k)
                              : flash::splitkv_heuristic(ctas, sms, max_seqlen_k, paged);
    }, "Key splits of a split-KV call with `ctas` CTAs before splitting (one_cta_per_sm: the sm_90a decode kernel and "
       "the d128 wide shape)", py::arg("ctas"), py::arg("sms"), py::arg("max_seqlen_k"), py::arg("paged"),
          py::arg("one_cta_per_sm"));
    m.def("heuristic_bwd_ws_causal_head_group", &flash::bwd_ws_causal_head_group,
          "Heads interleaved in the causal WS backward's launch order", py::arg("head_dim_tile"), py::arg("seqlen_q"));
    m.def("heuristic_bwd_ws_d128_block_m", [](int64_t window_left, int64_t window_right) {
        return flash::bwd_ws_d128_block_m(window_left < 0 ? flash::kWindowUnbounded : static_cast<int>(window_left),
                                          window_right < 0 ? flash::kWindowUnbounded : static_cast<int>(window_right));
    }, "Query rows per step of the plain d128 WS backward (windows: -1 unbounded)", py::arg("window_left"),
          py::arg("window_right"));
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
