// Where one batch element lives in memory: dense (batch stride) or varlen (cu_seqlens offsets),
// with the KV-cache refinements (seqused_k, leftpad_k, kv_batch_idx) when they are set.
#pragma once

#include "common/flash.h"

namespace flash {

struct BlockInfo {
    template <typename Params>
    __device__ BlockInfo(const Params &params, const int bidb) : BlockInfo(params, bidb, false) {}

    // kv_rejected: a KV-cache sequence whose index values are out of range (kv_index_check.h),
    // run as one without keys, reading none of them.
    template <typename Params>
    __device__ BlockInfo(const Params &params, const int bidb, const bool kv_rejected)
        : sum_s_q(params.cu_seqlens_q == nullptr ? -1 : params.cu_seqlens_q[bidb]),
          sum_s_k(params.cu_seqlens_k == nullptr ? -1 : params.cu_seqlens_k[bidb]),
          leftpad_k(kv_rejected || params.leftpad_k == nullptr ? 0 : params.leftpad_k[bidb]),
          bidb_k(kv_rejected ? 0 : params.kv_batch_idx == nullptr ? bidb : params.kv_batch_idx[bidb]),
          seqlen_q(params.cu_seqlens_q == nullptr ? params.seqlen_q
                                                  : params.cu_seqlens_q[bidb + 1] - sum_s_q),
          seqlen_k(kv_rejected ? 0
                               : (params.seqused_k != nullptr ? params.seqused_k[bidb]
                                  : params.cu_seqlens_k == nullptr ? params.seqlen_k
                                                                   : params.cu_seqlens_k[bidb + 1] - sum_s_k) -
                                     leftpad_k) {}

    // Offset of row 0 of this batch element, in elements.
    __device__ int64_t q_offset(int64_t batch_stride, int64_t row_stride, int bidb) const {
        return sum_s_q == -1 ? bidb * batch_stride : int64_t(sum_s_q) * row_stride;
    }
    // Offset of key 0 (after the left padding) of this batch element, in elements. Only for
    // tensors that kv_batch_idx / leftpad_k apply to (K and V; dK and dV never have them).
    __device__ int64_t k_offset(int64_t batch_stride, int64_t row_stride, int bidb) const {
        return sum_s_k == -1 ? bidb_k * batch_stride + int64_t(leftpad_k) * row_stride
                             : int64_t(sum_s_k + leftpad_k) * row_stride;
    }

    const int sum_s_q, sum_s_k;
    const int leftpad_k;
    const int bidb_k;
    const int seqlen_q, seqlen_k;
};

}  // namespace flash
