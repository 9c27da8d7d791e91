// Bindings of the device-side index guards and the KV-cache append (api/index_guard.h). The Python
// layer has checked every shape, dtype and device; these check again only what a kernel would
// otherwise read out of bounds.
#include "api/binding.h"
#include "api/index_guard.h"

namespace flash::api {

namespace {

// A guard's output buffer: `n_outputs` int32 entries plus the grid scratch (api/index_guard.cu).
at::Tensor guard_buffer(int64_t n_outputs, const at::Tensor &like) {
    return at::empty({n_outputs + 8}, like.options().dtype(at::kInt));
}

int checked_int(int64_t v, const char *name) {
    FLASH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "flash_attn: ", name, " must be in [0, 2**31), got ",
                v);
    return static_cast<int>(v);
}

// The block table of a guard's paged keys (all zeros without one).
flash::PagedKeys paged_keys(const std::optional<at::Tensor> &block_table, int64_t b, int64_t page_block_size,
                            int64_t num_blocks, const at::Tensor &q) {
    flash::PagedKeys p{};
    if (!block_table.has_value()) return p;
    check_block_table(block_table.value(), b, q);
    p.block_table = block_table->data_ptr<int>();
    p.cols = checked_int(block_table->size(1), "block_table.shape[1]");
    p.stride = block_table->stride(0);
    p.page_block_size = checked_int(page_block_size, "page_block_size");
    p.num_blocks = checked_int(num_blocks, "num_blocks");
    FLASH_CHECK(p.page_block_size > 0, "flash_attn: page_block_size must be > 0");
    return p;
}

}  // namespace

at::Tensor run_kvcache_guard(const at::Tensor &q, const std::optional<at::Tensor> &cache_seqlens,
                             const std::optional<at::Tensor> &batch_idx, const std::optional<at::Tensor> &leftpad,
                             const std::optional<at::Tensor> &block_table, int64_t default_seqlen, int64_t seqlen_new,
                             int64_t seqlen_cache, int64_t batch_cache, int64_t page_block_size, int64_t num_blocks) {
    c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t b = q.size(0);
    at::Tensor seqlens_c, batch_idx_c, leftpad_c;
    flash::KvcacheGuardArgs args{};
    args.cache_seqlens = optional_ints(cache_seqlens, "cache_seqlens", b, q, seqlens_c);
    args.batch_idx = optional_ints(batch_idx, "cache_batch_idx", b, q, batch_idx_c);
    args.leftpad = optional_ints(leftpad, "cache_leftpad", b, q, leftpad_c);
    args.pages = paged_keys(block_table, b, page_block_size, num_blocks, q);
    args.b = checked_int(b, "batch_size");
    args.default_seqlen = checked_int(default_seqlen, "the default cache length");
    args.seqlen_new = checked_int(seqlen_new, "seqlen_new");
    args.seqlen_cache = checked_int(seqlen_cache, "seqlen_cache");
    args.batch_cache = checked_int(batch_cache, "k_cache.shape[0]");
    at::Tensor safe = guard_buffer(1 + 4 * b, q);
    args.safe = safe.data_ptr<int>();
    flash::clear_launch_error();
    if (b > 0) flash::guard_kvcache_indices(args, c10::cuda::getCurrentCUDAStream().stream());
    const std::string err = flash::last_launch_error();
    FLASH_CHECK_RUNTIME(err.empty(), "flash_attn: CUDA error: ", err);
    return safe;
}

static std::vector<at::Tensor> kvcache_guard(const at::Tensor &q, std::optional<at::Tensor> cache_seqlens,
                                             std::optional<at::Tensor> batch_idx, std::optional<at::Tensor> leftpad,
                                             std::optional<at::Tensor> block_table, int64_t default_seqlen,
                                             int64_t seqlen_new, int64_t seqlen_cache, int64_t batch_cache,
                                             int64_t page_block_size, int64_t num_blocks) {
    const at::Tensor safe = run_kvcache_guard(q, cache_seqlens, batch_idx, leftpad, block_table, default_seqlen,
                                              seqlen_new, seqlen_cache, batch_cache, page_block_size, num_blocks);
    const int64_t b = q.size(0);
    return {safe.narrow(0, 0, 1), safe.narrow(0, 1, b), safe.narrow(0, 1 + b, b), safe.narrow(0, 1 + 2 * b, b),
            safe.narrow(0, 1 + 3 * b, b)};
}

static std::vector<at::Tensor> varlen_guard(const at::Tensor &q, at::Tensor cu_seqlens_q, at::Tensor cu_seqlens_k,
                                            int64_t total_q, int64_t total_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                            std::optional<at::Tensor> block_table, int64_t page_block_size,
                                            int64_t num_blocks) {
    c10::cuda::CUDAGuard device_guard(q.device());
    FLASH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) >= 1,
                "flash_attn: cu_seqlens_q must have shape (batch_size + 1,), got ", cu_seqlens_q.sizes());
    const int64_t b = cu_seqlens_q.size(0) - 1;
    cu_seqlens_q = checked_int_vector(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    cu_seqlens_k = checked_int_vector(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
    flash::VarlenGuardArgs args{};
    args.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
    args.cu_seqlens_k = cu_seqlens_k.data_ptr<int>();
    args.b = checked_int(b, "batch_size");
    args.total_q = total_q;
    args.total_k = total_k;
    args.max_seqlen_q = max_seqlen_q;
    args.max_seqlen_k = max_seqlen_k;
    args.pages = paged_keys(block_table, b, page_block_size, num_blocks, q);
    at::Tensor safe = guard_buffer(1 + 2 * (b + 1), q);
    args.safe = safe.data_ptr<int>();
    flash::clear_launch_error();
    flash::guard_varlen_indices(args, c10::cuda::getCurrentCUDAStream().stream());
    const std::string err = flash::last_launch_error();
    FLASH_CHECK_RUNTIME(err.empty(), "flash_attn: CUDA error: ", err);
    // [skip flag, cu_seqlens_q, cu_seqlens_k]
    return {safe.narrow(0, 0, 1), safe.narrow(0, 1, b + 1), safe.narrow(0, 2 + b, b + 1)};
}

static void append_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor &k, const at::Tensor &v,
                      const at::Tensor &cache_seqlens, std::optional<at::Tensor> batch_idx,
                      std::optional<at::Tensor> block_table, std::optional<at::Tensor> skip_flag) {
    c10::cuda::CUDAGuard device_guard(k.device());
    for (const at::Tensor *t : {static_cast<const at::Tensor *>(&k_cache), static_cast<const at::Tensor *>(&v_cache), &k, &v}) {
        FLASH_CHECK(t->is_cuda() && t->device() == k.device() && t->scalar_type() == k.scalar_type() &&
                        t->element_size() == 2 && t->dim() == 4 && t->stride(3) == 1,
                    "flash_attn: append_kv needs 4-d fp16 / bf16 CUDA tensors on one device with a contiguous "
                    "head dim");
    }
    FLASH_CHECK(k.sizes() == v.sizes() && k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() &&
                    k.size(2) == k_cache.size(2) && k.size(3) == k_cache.size(3),
                "flash_attn: append_kv: k / v and k_cache / v_cache shapes disagree");
    const int64_t b = k.size(0);
    at::Tensor seqlens_c = checked_int_vector(cache_seqlens, "cache_seqlens", b, k), batch_idx_c, table_c, flag_c;
    flash::AppendKvArgs args{};
    args.k_cache = k_cache.data_ptr(), args.v_cache = v_cache.data_ptr();
    args.k_new = k.data_ptr(), args.v_new = v.data_ptr();
    for (int i = 0; i < 3; ++i) {
        args.cache_stride[i] = k_cache.stride(i);
        args.k_new_stride[i] = k.stride(i);
        args.v_new_stride[i] = v.stride(i);
    }
    args.cache_seqlens = seqlens_c.data_ptr<int>();
    args.batch_idx = optional_ints(batch_idx, "cache_batch_idx", b, k, batch_idx_c);
    if (block_table.has_value()) {
        check_block_table(block_table.value(), b, k);
        args.block_table = block_table->data_ptr<int>();
        args.block_table_stride = block_table->stride(0);
        args.page_block_size = checked_int(k_cache.size(1), "page_block_size");
    }
    args.skip_flag = optional_ints(skip_flag, "skip_flag", 1, k, flag_c);
    args.b = checked_int(b, "batch_size");
    args.seqlen_new = checked_int(k.size(1), "seqlen_new");
    args.h_k = checked_int(k.size(2), "nheads_k");
    args.d = checked_int(k.size(3), "headdim");
    flash::clear_launch_error();
    flash::append_kv(args, c10::cuda::getCurrentCUDAStream().stream());
    const std::string err = flash::last_launch_error();
    FLASH_CHECK_RUNTIME(err.empty(), "flash_attn: CUDA error: ", err);
}

static std::optional<std::tuple<int, int, int, int64_t, int64_t>> take_index_error() {
    flash::IndexErrorRecord *record = flash::index_error_record_if_allocated();
    if (record == nullptr) return std::nullopt;
    volatile flash::IndexErrorRecord *r = record;
    const int code = r->code;
    if (code == flash::kIndexOk) return std::nullopt;
    auto taken = std::make_tuple(code, static_cast<int>(r->index), static_cast<int>(r->column),
                                 static_cast<int64_t>(r->value), static_cast<int64_t>(r->limit));
    r->code = flash::kIndexOk;
    return taken;
}

void bind_index_checks(py::module_ &m) {
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
}

}  // namespace flash::api
