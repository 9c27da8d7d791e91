// The KV-cache index values a split-KV CTA checks for its own sequence when the host did not
// (FwdParams::kv_index_record): calls without new keys, where the separate guard kernel
// (api/index_guard.h) would cost a launch and its latency on a decoding step of tens of
// microseconds. A CTA checks its sequence's cache_seqlens / cache_batch_idx / cache_leftpad before
// it reads a key, and, paged, the block-table entries of its split's keys in one pass before its
// first page load (splitkv_checked_tiles). Checking each entry where the main loop fetches it made
// the page loads wait instead (paged decode at 0.66-0.75 of the unchecked kernels).
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

// Writes an error to the host record unless it holds one the host has not taken yet; the code is
// written last, after a system-scope fence.
__forceinline__ __device__ void write_index_record(IndexErrorRecord *record, int code, int index, int column,
                                                   long long value, long long limit) {
    volatile IndexErrorRecord *r = record;
    if (r->code != kIndexOk) return;
    r->index = index;
    r->column = column;
    r->value = value;
    r->limit = limit;
    __threadfence_system();
    r->code = code;
    __threadfence_system();
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
    const int rows = p.seqused_k != nullptr ? p.seqused_k[i] : p.kv_cache_rows;
    long long value = rows, limit = 0;
    if (code == kCacheSeqlensPastEnd) {
        limit = p.kv_cache_rows;
    } else if (code == kCacheBatchIdxRange) {
        value = p.kv_batch_idx[i], limit = p.kv_cache_batch;
    } else if (code == kCacheLeftpadRange) {
        value = p.leftpad_k[i], limit = rows;
    }
    write_index_record(p.kv_index_record, code, i, /*column (new rows): none on this path*/ 0, value, limit);
}

// Paged keys: entry e of a block table names a page of the cache.
__forceinline__ __device__ bool kv_page_bad(const FwdParams &p, int e) { return e < 0 || e >= p.kv_cache_batch; }

// The block-table columns of sequence j that the host checks: the pages of its cache_seqlens
// rows, capped to the table (a cache_seqlens value out of range is an error of its own).
__forceinline__ __device__ int kv_pages_in_use(const FwdParams &p, int j) {
    const int rows = p.seqused_k != nullptr ? p.seqused_k[j] : p.kv_cache_rows;
    return (max(0, min(rows, p.kv_cache_rows)) + p.page_block_size - 1) / p.page_block_size;
}

// Called by one thread for a bad block-table entry (i, col) when no entry of row i before col is
// bad: writes it to the host record unless an error the host checks report earlier exists (a bad
// cache_seqlens / batch_idx / leftpad value of any sequence, whose codes come first, or a bad
// entry of an earlier row), whose own CTA writes it. The error path only: a serial scan.
static __device__ __noinline__ void report_kv_page_error(const FwdParams &p, int i, int col) {
    for (int j = 0; j < p.b; ++j) {
        if (kv_index_error(p, j) != kIndexOk) return;
    }
    for (int j = 0; j < i; ++j) {
        const int *row = p.block_table + int64_t(j) * p.block_table_batch_stride;
        for (int c = 0, n = kv_pages_in_use(p, j); c < n; ++c) {
            if (kv_page_bad(p, row[c])) return;
        }
    }
    write_index_record(p.kv_index_record, kBlockTableRange, i, col,
                       p.block_table[int64_t(i) * p.block_table_batch_stride + col], p.kv_cache_batch);
}

}  // namespace flash
