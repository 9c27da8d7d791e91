// aten::_scaled_dot_product_flash_attention and its backward (F.scaled_dot_product_attention's
// flash backend) on mha_fwd / mha_bwd, in C++. flash_attn.sdpa registers them while its kernels
// are active: a forward at short sequences takes less GPU time than the host takes to run a
// Python kernel, so there the Python ones (flash_attn/sdpa.py) set the step time. The calls these
// do not take (head dims that need padding, softmax scales <= 0, return_debug_mask, varlen,
// anything the Python checks would reject with a message naming the argument) go to those Python
// kernels, which flash_attn.sdpa registers as CUDA kernels of ops of its own with aten's schemas.
#include "api/binding.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/library.h>

#include <cmath>
#include <memory>

namespace flash::api {

namespace {

// What a C++ kernel here hands over: the op named fallback, and the library that holds the kernel
// while it is registered.
struct Registration {
    std::optional<c10::OperatorHandle> fallback;
    std::unique_ptr<torch::Library> library;
};
Registration g_forward, g_backward;

// aten's arguments: query, key, value, dropout_p, is_causal, return_debug_mask, scale.
constexpr size_t kForwardArgs = 7;
// grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
// is_causal, philox_seed, philox_offset, scale.
constexpr size_t kBackwardArgs = 15;

bool is_defined_tensor(const c10::IValue &v) { return v.isTensor() && v.toTensor().defined(); }

// Whether mha_fwd / mha_bwd serve the call as the Python kernel would, with nothing to pad or
// transform: SDPA's (batch, nheads, seqlen, headdim) q / k / v on one CUDA device, fp16 / bf16,
// one head dim that is a multiple of 8 and built, heads a multiple of k's, a contiguous last
// dimension, a softmax scale > 0.
bool fast_path_takes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double dropout_p,
                     const std::optional<double> &scale) {
    if (!(dropout_p >= 0.0 && dropout_p < 1.0)) return false;
    if (scale.has_value() && !(std::isfinite(*scale) && *scale > 0.0)) return false;
    if (!q.defined() || !k.defined() || !v.defined()) return false;
    const at::ScalarType dtype = q.scalar_type();
    if (dtype != at::kHalf && dtype != at::kBFloat16) return false;
    for (const at::Tensor *x : {&q, &k, &v}) {
        if (!x->is_cuda() || x->dim() != 4 || x->scalar_type() != dtype || x->device() != q.device() ||
            x->stride(3) != 1) {
            return false;
        }
    }
    const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3);
    const int64_t hk = k.size(1), sk = k.size(2);
    if (b < 1 || h < 1 || sq < 1 || hk < 1 || sk < 1 || h % hk != 0 || d % 8 != 0 || d > 256) return false;
    if (k.size(0) != b || k.size(3) != d || v.sizes() != k.sizes()) return false;
    return flash::is_built(dtype == at::kBFloat16, flash::head_dim_tile(static_cast<int>(d)));
}

// As _resolve_window (flash_attn_interface.py): causal is right = 0, and a single query row is
// never causal (the bottom-right-aligned mask hides nothing).
bool effective_causal(bool is_causal, int64_t seqlen_q) { return is_causal && seqlen_q > 1; }

double softmax_scale_of(const std::optional<double> &scale, const at::Tensor &q) {
    return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

void hand_over(const Registration &r, torch::jit::Stack *stack) {
    r.fallback->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CUDA), stack);
}

void sdpa_flash_forward(const c10::OperatorHandle &, c10::DispatchKeySet, torch::jit::Stack *stack) {
    auto args = torch::jit::last(*stack, kForwardArgs);
    const at::Tensor &query = args[0].toTensor(), &key = args[1].toTensor(), &value = args[2].toTensor();
    const double dropout_p = args[3].toDouble();
    const bool is_causal = args[4].toBool(), return_debug_mask = args[5].toBool();
    const std::optional<double> scale = args[6].toOptional<double>();
    if (return_debug_mask || !fast_path_takes(query, key, value, dropout_p, scale)) return hand_over(g_forward, stack);
    const int64_t seqlen_q = query.size(2), seqlen_k = key.size(2);
    const bool causal = effective_causal(is_causal, seqlen_q);
    const at::Tensor q = query.transpose(1, 2);
    std::vector<at::Tensor> r = mha_fwd(q, key.transpose(1, 2), value.transpose(1, 2), std::nullopt,
                                        softmax_scale_of(scale, query), causal, -1, causal ? 0 : -1, 0.0, std::nullopt,
                                        dropout_p, /*return_softmax=*/false, std::nullopt);
    at::Tensor out = r[0];
    // torch's meta function promises empty_like(query); mha_fwd's output has that layout unless
    // it had to copy an unaligned q.
    if (out.strides() != q.strides()) out = at::empty_like(q).copy_(out);
    const at::TensorOptions options = query.options();
    torch::jit::drop(*stack, kForwardArgs);
    torch::jit::push(*stack, out.transpose(1, 2), r[1], at::Tensor(), at::Tensor(), c10::SymInt(seqlen_q),
                     c10::SymInt(seqlen_k), r[3].view(at::kUInt64), at::empty({}, options.dtype(at::kUInt64)),
                     at::empty({0}, options));
}

void sdpa_flash_backward(const c10::OperatorHandle &, c10::DispatchKeySet, torch::jit::Stack *stack) {
    auto args = torch::jit::last(*stack, kBackwardArgs);
    if (!is_defined_tensor(args[0]) || !is_defined_tensor(args[1]) || !is_defined_tensor(args[2]) ||
        !is_defined_tensor(args[3]) || !is_defined_tensor(args[4]) || !is_defined_tensor(args[5]) ||
        is_defined_tensor(args[6]) || is_defined_tensor(args[7])) {
        return hand_over(g_backward, stack);
    }
    const at::Tensor &grad_out = args[0].toTensor(), &query = args[1].toTensor(), &key = args[2].toTensor();
    const at::Tensor &value = args[3].toTensor(), &out = args[4].toTensor(), &lse = args[5].toTensor();
    const double dropout_p = args[10].toDouble();
    const bool is_causal = args[11].toBool();
    const std::optional<double> scale = args[14].toOptional<double>();
    std::optional<at::Tensor> rng_state;
    if (dropout_p > 0.0) {  // the forward's (seed, offset), uint64 (2,)
        if (!is_defined_tensor(args[12]) || args[12].toTensor().scalar_type() != at::kUInt64 ||
            args[12].toTensor().numel() != 2) {
            return hand_over(g_backward, stack);
        }
        rng_state = args[12].toTensor().view(at::kLong);
    }
    const bool same_as_q = [&] {
        for (const at::Tensor *x : {&grad_out, &out}) {
            if (!x->is_cuda() || x->sizes() != query.sizes() || x->scalar_type() != query.scalar_type() ||
                x->stride(3) != 1) {
                return false;
            }
        }
        return true;
    }();
    if (!same_as_q || !fast_path_takes(query, key, value, dropout_p, scale)) return hand_over(g_backward, stack);
    const bool causal = effective_causal(is_causal, query.size(2));
    const at::Tensor q = query.transpose(1, 2), k = key.transpose(1, 2), v = value.transpose(1, 2);
    // empty_like keeps a transposed view's strides: the gradients come back in SDPA's layout.
    std::vector<at::Tensor> r = mha_bwd(grad_out.transpose(1, 2), q, k, v, out.transpose(1, 2), lse,
                                        at::empty_like(q), at::empty_like(k), at::empty_like(v),
                                        softmax_scale_of(scale, query), causal,
                                        at::globalContext().deterministicAlgorithms(), -1, causal ? 0 : -1, 0.0,
                                        std::nullopt, dropout_p, rng_state);
    torch::jit::drop(*stack, kBackwardArgs);
    torch::jit::push(*stack, r[0].transpose(1, 2), r[1].transpose(1, 2), r[2].transpose(1, 2));
}

// Our C++ kernel for op (aten's SDPA forward or backward) on CUDA, the op named fallback taking
// the calls it does not (see above). The dispatcher's warning that a kernel is overridden reaches
// Python's warnings, where flash_attn.sdpa silences it.
void sdpa_register(const std::string &op, const std::string &fallback) {
    torch::PyWarningHandler warnings;
    try {
        const bool forward = op == "_scaled_dot_product_flash_attention";
        FLASH_CHECK(forward || op == "_scaled_dot_product_flash_attention_backward",
                    "flash_attn: no C++ SDPA kernel for ", op);
        Registration &r = forward ? g_forward : g_backward;
        const size_t n_args = forward ? kForwardArgs : kBackwardArgs;
        auto &dispatcher = c10::Dispatcher::singleton();
        const size_t n = dispatcher.findSchemaOrThrow(("aten::" + op).c_str(), "").schema().arguments().size();
        FLASH_CHECK(n == n_args, "flash_attn: aten::", op, " has ", n, " arguments here, the C++ kernel takes ",
                    n_args);
        r.library.reset();
        r.fallback = dispatcher.findSchemaOrThrow(fallback.c_str(), "");
        r.library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA,
                                                     __FILE__, __LINE__);
        if (forward) {
            r.library->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&sdpa_flash_forward>());
        } else {
            r.library->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&sdpa_flash_backward>());
        }
    } catch (...) {
        // The handler's destructor may raise the buffered warnings as Python errors: not while
        // this exception unwinds.
        warnings.set_in_exception();
        throw;
    }
}

void sdpa_unregister() {
    for (Registration *r : {&g_forward, &g_backward}) {
        r->library.reset();
        r->fallback.reset();
    }
}

}  // namespace

void bind_sdpa(py::module_ &m) {
    m.def("sdpa_register", &sdpa_register,
          "Register the C++ kernel of aten's op (_scaled_dot_product_flash_attention or its backward) on CUDA; "
          "fallback: the op that takes the calls it does not",
          py::arg("op"), py::arg("fallback"));
    m.def("sdpa_unregister", &sdpa_unregister, "Remove them (torch's or the Python kernels return)");
    m.def("sdpa_registered", []() {
        return std::vector<bool>{g_forward.library != nullptr, g_backward.library != nullptr};
    }, "Whether the forward and the backward C++ kernels are registered");
}

}  // namespace flash::api
