// What a device-side check of the GPU index tensors found wrong, and the pinned host record it
// writes the first bad value to (read by the Python layer without a synchronisation). Shared by
// the guard kernels (api/index_guard.cu) and the split-KV kernels, which check the KV-cache
// values of their own sequence (common/kv_index_check.h). Torch-free.
#pragma once

namespace flash {

// What a guard found wrong, numbered in the order the host checks report errors; mirrored by
// flash_attn/_checks.py, which words the error.
enum IndexErrorCode : int {
    kIndexOk = 0,
    kCacheSeqlensNegative = 1,    // index: sequence
    kCacheSeqlensPastEnd = 2,     // value: cache_seqlens[i], limit: rows the cache holds, column: new rows
    kCacheBatchIdxRange = 3,      // value: cache_batch_idx[i], limit: k_cache.shape[0]
    kCacheLeftpadRange = 4,       // value: cache_leftpad[i], limit: the sequence's cache rows
    kBlockTableRange = 5,         // index: row, column, value: entry, limit: num_blocks
    kCuSeqlensStart = 6,          // (+ 4 for cu_seqlens_k) value: cu_seqlens[0]
    kCuSeqlensDecreasing = 7,     // index i: cu_seqlens[i] > cu_seqlens[i + 1]; value, limit: those
    kCuSeqlensPastTotal = 8,      // value: cu_seqlens[-1], limit: the packed rows
    kMaxSeqlenShort = 9,          // index: sequence, value: its length, limit: max_seqlen
    kKeyRowsPastBlockTable = 14,  // paged varlen: index: sequence, value: key rows, limit: rows of its pages
    kVarlenBlockTableRange = 15,  // as kBlockTableRange, for the paged varlen keys
};
constexpr int kCuSeqlensKOffset = 4;  // kCuSeqlensStart + 4 = the same error in cu_seqlens_k

// The first bad value a guard saw since the host last took it (code 0: none). Written by the
// device through a mapped pointer; the code is written last, after a system-scope fence.
struct IndexErrorRecord {
    int code;
    int index;
    int column;
    int reserved;
    long long value;
    long long limit;
};

}  // namespace flash
