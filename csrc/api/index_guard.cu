// Device-side guards of GPU index tensors and the in-place KV-cache append (see index_guard.h).
#include "api/index_guard.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "common/kv_index_check.h"
#include "common/launch_check.h"

namespace flash {

namespace {

constexpr int kGuardThreads = 256;
constexpr int kMaxGuardBlocks = 64;

// Errors are ordered by (code, sequence, column), the order in which the host checks report them
// (the codes are numbered in that order). The block-level minimum lives in shared memory; the
// grid-level one is kept inverted (~key) so that a zero-filled scratch word is "no error" and
// atomicMax combines.
__device__ __forceinline__ unsigned long long error_key(int index, int code, int column) {
    return (static_cast<unsigned long long>(code) << 58) | (static_cast<unsigned long long>(index) << 31) |
           static_cast<unsigned>(column);
}
constexpr unsigned long long kNoError = ~0ull;

struct GuardScratch {
    unsigned long long error_inv;  // ~(first error key) over the grid; 0: none
    unsigned int blocks_done;
    unsigned int pad;
};

// Combines the block's first error into the grid's; true in the last block to finish (every other
// block's errors are then visible to it), which writes the outputs. A one-block grid (the usual
// case) needs no scratch, so that its launch needs no memset before it.
__device__ bool combine_and_elect_last(unsigned long long block_error, GuardScratch *scratch) {
    __shared__ bool is_last;
    __syncthreads();
    if (gridDim.x == 1) return true;
    if (threadIdx.x == 0) {
        if (block_error != kNoError) atomicMax(&scratch->error_inv, ~block_error);
        __threadfence();
        is_last = atomicAdd(&scratch->blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    return is_last;
}

__device__ unsigned long long grid_error(unsigned long long block_error, GuardScratch *scratch) {
    if (gridDim.x == 1) return block_error;
    __threadfence();
    return ~atomicAdd(&scratch->error_inv, 0ull);
}

// The host record takes the first error since the host last took one.
__device__ void publish(IndexErrorRecord *record, int code, int index, int column, long long value, long long limit) {
    if (record != nullptr) write_index_record(record, code, index, column, value, limit);
}

__device__ __forceinline__ int key_index(unsigned long long key) { return static_cast<int>((key >> 31) & 0x7ffffff); }
__device__ __forceinline__ int key_code(unsigned long long key) { return static_cast<int>(key >> 58); }
__device__ __forceinline__ int key_column(unsigned long long key) { return static_cast<int>(key & 0x7fffffffu); }

// Pages [0, ceil(rows_used(i) / page_block_size)) of every block-table row i < b in [0, num_blocks).
// The rows' entries are spread over every thread of the grid with kPageLoads loads in flight per
// thread: a long cache's row (128k keys in 16-row pages: 8192 entries) read a warp-step at a time
// would take longer than the attention that follows.
constexpr int kPageLoads = 4;
template <typename RowsUsed>
__device__ void check_pages(const PagedKeys &p, int b, RowsUsed rows_used, int code, unsigned long long *block_error) {
    const long long rows = (long long)p.cols * p.page_block_size;
    const int64_t total = int64_t(b) * p.cols, n_threads = int64_t(gridDim.x) * blockDim.x;
    for (int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; first < total; first += n_threads * kPageLoads) {
        int entry[kPageLoads], row[kPageLoads], col[kPageLoads];
        bool used[kPageLoads];
#pragma unroll
        for (int u = 0; u < kPageLoads; ++u) {
            const int64_t j = first + u * n_threads;
            row[u] = static_cast<int>(j / p.cols), col[u] = static_cast<int>(j % p.cols);
            used[u] = false;
            if (j < total) {
                const long long r = rows_used(row[u]);
                const long long capped = r < 0 ? 0 : (r > rows ? rows : r);
                used[u] = col[u] < (capped + p.page_block_size - 1) / p.page_block_size;
            }
            entry[u] = used[u] ? p.block_table[row[u] * p.stride + col[u]] : 0;
        }
#pragma unroll
        for (int u = 0; u < kPageLoads; ++u) {
            if (used[u] && (entry[u] < 0 || entry[u] >= p.num_blocks)) {
                atomicMin(block_error, error_key(row[u], code, col[u]));
            }
        }
    }
}

// The block's first error, reset to none (one per block: a static __shared__ variable).
__device__ unsigned long long *reset_block_error() {
    __shared__ unsigned long long block_error;
    if (threadIdx.x == 0) block_error = kNoError;
    __syncthreads();
    return &block_error;
}

__global__ void __launch_bounds__(kGuardThreads) kvcache_guard_kernel(const KvcacheGuardArgs a, GuardScratch *scratch,
                                                                     IndexErrorRecord *record) {
    unsigned long long &block_error = *reset_block_error();
    auto seqlen_of = [&](int i) { return a.cache_seqlens != nullptr ? a.cache_seqlens[i] : a.default_seqlen; };
    const int tid = blockIdx.x * kGuardThreads + threadIdx.x, n_threads = gridDim.x * kGuardThreads;
    for (int i = tid; i < a.b; i += n_threads) {
        const int code =
            kvcache_index_error(seqlen_of(i), a.seqlen_new, a.seqlen_cache, a.batch_idx, a.batch_cache, a.leftpad, i);
        if (code != kIndexOk) atomicMin(&block_error, error_key(i, code, 0));
    }
    if (a.pages.block_table != nullptr) {
        check_pages(a.pages, a.b, [&](int i) { return (long long)seqlen_of(i) + a.seqlen_new; }, kBlockTableRange,
                    &block_error);
    }
    if (!combine_and_elect_last(block_error, scratch)) return;

    const unsigned long long error = grid_error(block_error, scratch);
    const bool ok = error == kNoError;
    int *const cache_seqlens = a.safe + 1, *const seqused = cache_seqlens + a.b;
    int *const batch_idx = seqused + a.b, *const leftpad = batch_idx + a.b;
    for (int i = threadIdx.x; i < a.b; i += kGuardThreads) {
        const int s = ok ? seqlen_of(i) : 0;
        cache_seqlens[i] = s;
        seqused[i] = ok ? s + a.seqlen_new : 0;
        batch_idx[i] = ok ? (a.batch_idx != nullptr ? a.batch_idx[i] : i) : 0;
        leftpad[i] = ok && a.leftpad != nullptr ? a.leftpad[i] : 0;
    }
    if (threadIdx.x == 0) {
        a.safe[0] = ok ? 0 : 1;
        if (!ok) {
            const int i = key_index(error), code = key_code(error);
            int col = key_column(error);
            long long value = 0, limit = 0;
            switch (code) {
                case kCacheSeqlensNegative: value = seqlen_of(i); break;
                case kCacheSeqlensPastEnd: value = seqlen_of(i), limit = a.seqlen_cache, col = a.seqlen_new; break;
                case kCacheBatchIdxRange: value = a.batch_idx[i], limit = a.batch_cache; break;
                case kCacheLeftpadRange: value = a.leftpad[i], limit = seqlen_of(i); break;
                case kBlockTableRange:
                    value = a.pages.block_table[i * a.pages.stride + col], limit = a.pages.num_blocks;
                    break;
                default: break;
            }
            publish(record, code, i, col, value, limit);
        }
    }
}

// One cu_seqlens vector: index i checks entry i + 1 against entry i (and entry 0).
__device__ void check_cu_seqlens(const int *cu, int b, int64_t total, int64_t max_seqlen, int offset, int i,
                                 unsigned long long *block_error) {
    const int lo = cu[i], hi = cu[i + 1];
    int code = kIndexOk, index = i;
    if (i == 0 && lo != 0) {
        code = kCuSeqlensStart;
    } else if (hi < lo) {
        code = kCuSeqlensDecreasing;
    } else if (i == b - 1 && total >= 0 && hi > total) {
        code = kCuSeqlensPastTotal, index = b;
    } else if (hi - lo > max_seqlen) {
        code = kMaxSeqlenShort;
    }
    if (code != kIndexOk) atomicMin(block_error, error_key(index, code + offset, 0));
}

__global__ void __launch_bounds__(kGuardThreads) varlen_guard_kernel(const VarlenGuardArgs a, GuardScratch *scratch,
                                                                    IndexErrorRecord *record) {
    unsigned long long &block_error = *reset_block_error();
    const int tid = blockIdx.x * kGuardThreads + threadIdx.x, n_threads = gridDim.x * kGuardThreads;
    for (int i = tid; i < a.b; i += n_threads) {
        check_cu_seqlens(a.cu_seqlens_q, a.b, a.total_q, a.max_seqlen_q, 0, i, &block_error);
        check_cu_seqlens(a.cu_seqlens_k, a.b, a.total_k, a.max_seqlen_k, kCuSeqlensKOffset, i, &block_error);
        if (a.pages.block_table != nullptr) {
            const long long rows = a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i];
            if (rows > (long long)a.pages.cols * a.pages.page_block_size) {
                atomicMin(&block_error, error_key(i, kKeyRowsPastBlockTable, 0));
            }
        }
    }
    if (a.pages.block_table != nullptr) {
        check_pages(a.pages, a.b, [&](int i) { return (long long)a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i]; },
                    kVarlenBlockTableRange, &block_error);
    }
    if (!combine_and_elect_last(block_error, scratch)) return;

    const unsigned long long error = grid_error(block_error, scratch);
    const bool ok = error == kNoError;
    int *const cu_q = a.safe + 1, *const cu_k = cu_q + a.b + 1;
    for (int i = threadIdx.x; i <= a.b; i += kGuardThreads) {
        cu_q[i] = ok ? a.cu_seqlens_q[i] : 0;
        cu_k[i] = ok ? a.cu_seqlens_k[i] : 0;
    }
    if (threadIdx.x == 0) {
        a.safe[0] = ok ? 0 : 1;
        if (!ok) {
            const int i = key_index(error), code = key_code(error), col = key_column(error);
            const bool is_k = code > kMaxSeqlenShort && code <= kMaxSeqlenShort + kCuSeqlensKOffset;
            const int *cu = is_k ? a.cu_seqlens_k : a.cu_seqlens_q;
            long long value = 0, limit = 0;
            switch (is_k ? code - kCuSeqlensKOffset : code) {
                case kCuSeqlensStart: value = cu[0]; break;
                case kCuSeqlensDecreasing: value = cu[i], limit = cu[i + 1]; break;
                case kCuSeqlensPastTotal: value = cu[a.b], limit = is_k ? a.total_k : a.total_q; break;
                case kMaxSeqlenShort:
                    value = cu[i + 1] - cu[i], limit = is_k ? a.max_seqlen_k : a.max_seqlen_q;
                    break;
                case kKeyRowsPastBlockTable:
                    value = a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i];
                    limit = (long long)a.pages.cols * a.pages.page_block_size;
                    break;
                case kVarlenBlockTableRange:
                    value = a.pages.block_table[i * a.pages.stride + col], limit = a.pages.num_blocks;
                    break;
                default: break;
            }
            publish(record, code, i, col, value, limit);
        }
    }
}

// One block unless there is much to read: up to 4 sequences (or, paged, 16 block-table entries)
// per thread. A grid of several blocks needs its scratch zeroed first (one memset).
int guard_blocks(int b, const PagedKeys &pages) {
    const int64_t work = pages.block_table != nullptr ? int64_t(b) * pages.cols / 16 : int64_t(b) / 4;
    const int64_t blocks = (work + kGuardThreads - 1) / kGuardThreads;
    return blocks <= 1 ? 1 : (blocks > kMaxGuardBlocks ? kMaxGuardBlocks : static_cast<int>(blocks));
}

// The grid scratch sits after the outputs, 8-byte aligned; the caller's buffer has room for it.
GuardScratch *scratch_after(int *safe, int64_t n_outputs) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(safe + n_outputs);
    return reinterpret_cast<GuardScratch *>((end + 7) & ~uintptr_t(7));
}

template <int kVec>
__global__ void __launch_bounds__(256) append_kv_kernel(const AppendKvArgs a) {
    if (a.skip_flag != nullptr && *a.skip_flag != 0) return;
    using Chunk = std::conditional_t<kVec == 8, uint4, uint16_t>;
    const int chunks_per_row = a.d / kVec;
    const int64_t total = int64_t(a.b) * a.seqlen_new * a.h_k * chunks_per_row;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int chunk = static_cast<int>(e % chunks_per_row);
        int64_t t = e / chunks_per_row;
        const int head = static_cast<int>(t % a.h_k);
        t /= a.h_k;
        const int j = static_cast<int>(t % a.seqlen_new), bi = static_cast<int>(t / a.seqlen_new);
        const int64_t pos = int64_t(a.cache_seqlens[bi]) + j;
        int64_t slot, row;
        if (a.block_table != nullptr) {
            slot = a.block_table[bi * a.block_table_stride + pos / a.page_block_size];
            row = pos % a.page_block_size;
        } else {
            slot = a.batch_idx != nullptr ? a.batch_idx[bi] : bi;
            row = pos;
        }
        const int64_t col = int64_t(chunk) * kVec;
        const int64_t dst = slot * a.cache_stride[0] + row * a.cache_stride[1] + head * a.cache_stride[2] + col;
        const int64_t src_k = bi * a.k_new_stride[0] + j * a.k_new_stride[1] + head * a.k_new_stride[2] + col;
        const int64_t src_v = bi * a.v_new_stride[0] + j * a.v_new_stride[1] + head * a.v_new_stride[2] + col;
        // Elements are 16-bit; element offsets of 8-aligned strides keep the chunks 16-byte aligned.
        *reinterpret_cast<Chunk *>(static_cast<uint16_t *>(a.k_cache) + dst) =
            *reinterpret_cast<const Chunk *>(static_cast<const uint16_t *>(a.k_new) + src_k);
        *reinterpret_cast<Chunk *>(static_cast<uint16_t *>(a.v_cache) + dst) =
            *reinterpret_cast<const Chunk *>(static_cast<const uint16_t *>(a.v_new) + src_v);
    }
}

bool aligned_for_chunks(const AppendKvArgs &a) {
    auto ok = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    bool aligned = a.d % 8 == 0 && ok(a.k_cache) && ok(a.v_cache) && ok(a.k_new) && ok(a.v_new);
    for (int i = 0; i < 3; ++i) {
        aligned = aligned && a.cache_stride[i] % 8 == 0 && a.k_new_stride[i] % 8 == 0 && a.v_new_stride[i] % 8 == 0;
    }
    return aligned;
}

}  // namespace

namespace {
std::atomic<IndexErrorRecord *> g_record{nullptr};
}

IndexErrorRecord *index_error_record() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Allowed while a stream is being captured: this is not a stream operation.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&mode);
        void *p = nullptr;
        const cudaError_t err = cudaHostAlloc(&p, sizeof(IndexErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable);
        cudaThreadExchangeStreamCaptureMode(&mode);
        if (err != cudaSuccess) {
            record_launch_error(err, "cudaHostAlloc(index error record)", __FILE__, __LINE__);
            return;
        }
        std::memset(p, 0, sizeof(IndexErrorRecord));
        g_record.store(static_cast<IndexErrorRecord *>(p));
    });
    return g_record.load();
}

IndexErrorRecord *index_error_record_if_allocated() { return g_record.load(); }

// Buffers of guard_kvcache_indices / guard_varlen_indices hold the outputs plus 24 bytes of scratch
// (binding: guard_buffer_ints).
void guard_kvcache_indices(const KvcacheGuardArgs &args, cudaStream_t stream) {
    IndexErrorRecord *record = index_error_record();
    GuardScratch *scratch = scratch_after(args.safe, 1 + 4 * int64_t(args.b));
    const int blocks = guard_blocks(args.b, args.pages);
    if (blocks > 1) FLASH_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(GuardScratch), stream));
    kvcache_guard_kernel<<<blocks, kGuardThreads, 0, stream>>>(args, scratch, record);
    FLASH_CHECK_LAUNCH();
}

void guard_varlen_indices(const VarlenGuardArgs &args, cudaStream_t stream) {
    IndexErrorRecord *record = index_error_record();
    GuardScratch *scratch = scratch_after(args.safe, 1 + 2 * (int64_t(args.b) + 1));
    const int blocks = guard_blocks(args.b, args.pages);
    if (blocks > 1) FLASH_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(GuardScratch), stream));
    varlen_guard_kernel<<<blocks, kGuardThreads, 0, stream>>>(args, scratch, record);
    FLASH_CHECK_LAUNCH();
}

void append_kv(const AppendKvArgs &args, cudaStream_t stream) {
    const int vec = aligned_for_chunks(args) ? 8 : 1;
    const int64_t total = int64_t(args.b) * args.seqlen_new * args.h_k * (args.d / vec);
    if (total == 0) return;
    const int blocks = static_cast<int>(total / 256 + 1 < 1024 ? total / 256 + 1 : 1024);
    if (vec == 8) {
        append_kv_kernel<8><<<blocks, 256, 0, stream>>>(args);
    } else {
        append_kv_kernel<1><<<blocks, 256, 0, stream>>>(args);
    }
    FLASH_CHECK_LAUNCH();
}

}  // namespace flash
