// Device-side guards for index tensors that live on the GPU (cu_seqlens, cache_seqlens,
// cache_batch_idx, cache_leftpad, block_table) and the in-place KV-cache append.
//
// Checking those values on the host costs a stream synchronisation per call, so by default they are
// checked on the device instead: one small kernel reads them, writes "safe" copies for the
// attention kernels (the values themselves, or all zeros when any value is bad, so that a rejected
// call reads and writes nothing out of range and appends nothing), and records the first bad value
// in a pinned host record. The Python layer reads that record at its next call (no
// synchronisation) and raises an error naming the argument. Torch-free, like the kernel files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/index_error.h"

namespace flash {

// The process-wide record (pinned, mapped host memory, allocated on first use); nullptr if the
// allocation failed (the launch error is recorded).
IndexErrorRecord *index_error_record();
// The record if a guard has run in this process, else nullptr (no CUDA call).
IndexErrorRecord *index_error_record_if_allocated();

// A paged key cache's block table: (b, cols) int32 with row stride `stride`, entries in
// [0, num_blocks); nullptr when the keys are not paged.
struct PagedKeys {
    const int *block_table;
    int cols;
    int64_t stride;
    int page_block_size;
    int num_blocks;
};

struct KvcacheGuardArgs {
    const int *cache_seqlens;  // (b,) or nullptr: `default_seqlen` for every sequence
    const int *batch_idx;      // (b,) or nullptr
    const int *leftpad;        // (b,) or nullptr
    PagedKeys pages;
    int b;
    int default_seqlen;
    int seqlen_new;    // rows appended per sequence (k.shape[1]), 0 without new keys
    int seqlen_cache;  // rows a sequence can hold
    int batch_cache;   // k_cache.shape[0] (not paged)
    // Output: int32 [flag, cache_seqlens (b), seqused (b), batch_idx (b), leftpad (b)]; flag 1 and
    // every other entry 0 when a value is bad.
    int *safe;
};

struct VarlenGuardArgs {
    const int *cu_seqlens_q;  // (b + 1,)
    const int *cu_seqlens_k;  // (b + 1,)
    PagedKeys pages;          // total_k is -1 when paged
    int b;
    int64_t total_q;
    int64_t total_k;  // -1 with block_table
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    // Output: int32 [flag, cu_seqlens_q (b + 1), cu_seqlens_k (b + 1)]; zeros (every sequence
    // empty) when a value is bad.
    int *safe;
};

void guard_kvcache_indices(const KvcacheGuardArgs &args, cudaStream_t stream);
void guard_varlen_indices(const VarlenGuardArgs &args, cudaStream_t stream);

// k_cache[batch of b, cache_seqlens[b] + j] = k_new[b, j] (and v), in place; skipped entirely when
// *skip_flag != 0. Element strides; the head dim is contiguous in all four tensors.
struct AppendKvArgs {
    void *k_cache, *v_cache;
    const void *k_new, *v_new;
    int64_t cache_stride[3];  // batch (or page), row, head
    int64_t k_new_stride[3], v_new_stride[3];
    const int *cache_seqlens;  // (b,)
    const int *batch_idx;      // (b,) or nullptr
    const int *block_table;    // or nullptr
    int64_t block_table_stride;
    int page_block_size;
    const int *skip_flag;  // or nullptr
    int b, seqlen_new, h_k, d;  // fp16 / bf16 elements (the binding checks)
};

void append_kv(const AppendKvArgs &args, cudaStream_t stream);

}  // namespace flash
