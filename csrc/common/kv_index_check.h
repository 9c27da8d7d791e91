// The KV-cache index values a split-KV CTA checks for its own sequence when the host did not
// (FwdParams::kv_index_record): calls without new keys, where the separate guard kernel
// (api/index_guard.h) would cost a launch on a decoding step of tens of microseconds. A CTA checks
// its sequence's cache_seqlens / cache_batch_idx / cache_leftpad before it reads a key, and each
// block-table entry as it reads it.
#pragma once

#include "common/flash.h"
#include "common/index_error.h"

namespace flash {

// The first bad index value of sequence i (kIndexOk: none), in the host checks' order.
__forceinline__ __device__ int kv_index_error(const FwdParams &p, int i) {
    const int rows = p.seqused_k != nullptr ? p.seqused_k[i] : p.kv_cache_rows;
    if (rows < 0) return kCacheSeqlensNegative;
    if (rows > p.kv_cache_rows) return kCacheSeqlensPastEnd;
    if (p.kv_batch_idx != nullptr && (p.kv_batch_idx[i] < 0 || p.kv_batch_idx[i] >= p.kv_cache_batch)) {
        return kCacheBatchIdxRange;
    }
    if (p.leftpad_k != nullptr && (p.leftpad_k[i] < 0 || p.leftpad_k[i] > rows)) return kCacheLeftpadRange;
    return kIndexOk;
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

// The rows of sequence i the block table must cover (what the guard and the host checks count).
__forceinline__ __device__ int kv_rows_used(const FwdParams &p, int i) {
    return p.seqused_k != nullptr ? p.seqused_k[i] : p.kv_cache_rows;
}

// Called at the end of the kernel by a thread that read a bad block-table entry (kv_page):
// unless a sequence has a bad value (its CTA reports that one), writes the first bad entry of the
// pages in use, in the host checks' order, which is not always the one this thread read. Several
// threads may write the same values. Out of line, and only after the main loop, so that it costs
// the loop no registers.
static __noinline__ __device__ void report_kv_page_error(const FwdParams &p, int i) {
    for (int j = 0; j < p.b; ++j) {
        if (kv_index_error(p, j) != kIndexOk) return;
    }
    for (int j = 0; j <= i; ++j) {
        const int *row = p.block_table + int64_t(j) * p.block_table_batch_stride;
        const int cols = (kv_rows_used(p, j) + p.page_block_size - 1) / p.page_block_size;
        for (int c = 0; c < cols; ++c) {
            const int page = row[c];
            if (page < 0 || page >= p.kv_num_blocks) {
                volatile IndexErrorRecord *r = p.kv_index_record;
                if (r->code != kIndexOk) return;
                r->index = j;
                r->column = c;
                r->value = page;
                r->limit = p.kv_num_blocks;
                __threadfence_system();
                r->code = kBlockTableRange;
                __threadfence_system();
                return;
            }
        }
    }
}

// Entry `col` of a block-table row: where the kernel checks the index values, a bad entry reads
// page 0 instead (the call is rejected) and sets `bad`, for report_kv_page_error.
__forceinline__ __device__ int kv_page(const FwdParams &p, const int *row, int col, bool &bad) {
    const int page = row[col];
    // Branch-free: a branch here costs the page-fetch loops of the split kernels ~40 registers.
    const bool out_of_range = static_cast<unsigned>(page) >= static_cast<unsigned>(p.kv_num_blocks);
    const bool rejected = out_of_range && p.kv_index_record != nullptr;
    bad |= rejected;
    return rejected ? 0 : page;
}

}  // namespace flash
