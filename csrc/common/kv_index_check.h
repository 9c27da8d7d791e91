// The KV-cache index values a split-KV CTA checks for its own sequence when the host did not
// (FwdParams::kv_index_record): calls without new keys on a contiguous cache, where the separate
// guard kernel (api/index_guard.h) would cost a launch on a decoding step of tens of microseconds.
// A CTA checks its sequence's cache_seqlens / cache_batch_idx / cache_leftpad before it reads a
// key. Paged caches keep the guard kernel: checking each block-table entry where the split
// kernels read it made their page loads wait (paged decode at 0.66-0.75 of the unchecked kernels).
#pragma once

#include "common/flash.h"
#include "common/index_error.h"

namespace flash {

// The first bad KV-cache index value of sequence i (kIndexOk: none), in the host checks' order:
// its `rows` in use (cache_seqlens) plus the `rows_new` appended within `rows_cap`, its
// cache_batch_idx (nullptr: none) in [0, batch_cache), its cache_leftpad (nullptr: none) in
// [0, rows]. Shared by the guard kernel (api/index_guard.cu) and the split-KV kernels.
__forceinline__ __device__ int kvcache_index_error(int rows, int rows_new, int rows_cap, const int *batch_idx,
                                                   int batch_cache, const int *leftpad, int i) {
    if (rows < 0) return kCacheSeqlensNegative;
    if (static_cast<long long>(rows) + rows_new > rows_cap) return kCacheSeqlensPastEnd;
    if (batch_idx != nullptr && (batch_idx[i] < 0 || batch_idx[i] >= batch_cache)) return kCacheBatchIdxRange;
    if (leftpad != nullptr && (leftpad[i] < 0 || leftpad[i] > rows)) return kCacheLeftpadRange;
    return kIndexOk;
}

// kvcache_index_error for a split-KV kernel's sequence i (no new rows on this path).
__forceinline__ __device__ int kv_index_error(const FwdParams &p, int i) {
    const int rows = p.seqused_k != nullptr ? p.seqused_k[i] : p.kv_cache_rows;
    return kvcache_index_error(rows, 0, p.kv_cache_rows, p.kv_batch_idx, p.kv_cache_batch, p.leftpad_k, i);
}

// Called by one thread for a sequence i with a bad value `code`, before the kernel's main work:
// writes it to the host record unless another sequence's error comes first (its own CTA writes
// that one), so that one thread writes the record and the error is the one the host checks would
// report.
__forceinline__ __device__ void report_kv_index_error(const FwdParams &p, int i, int code) {
    for (int j = 0; j < p.b; ++j) {
        const int cj = j == i ? kIndexOk : kv_index_error(p, j);
        if (cj != kIndexOk && (cj < code || (cj == code && j < i))) return;
    }
    volatile IndexErrorRecord *r = p.kv_index_record;
    if (r->code != kIndexOk) return;  // an earlier call's error, not yet taken by the host
    const int rows = p.seqused_k != nullptr ? p.seqused_k[i] : p.kv_cache_rows;
    long long value = rows, limit = 0;
    if (code == kCacheSeqlensPastEnd) {
        limit = p.kv_cache_rows;
    } else if (code == kCacheBatchIdxRange) {
        value = p.kv_batch_idx[i], limit = p.kv_cache_batch;
    } else if (code == kCacheLeftpadRange) {
        value = p.leftpad_k[i], limit = rows;
    }
    r->index = i;
    r->column = 0;  // the new rows: none on this path
    r->value = value;
    r->limit = limit;
    __threadfence_system();
    r->code = code;
    __threadfence_system();
}

}  // namespace flash
