// The learnable sink's gradient from the forward's softmax_lse and the backward's softmax_d
// (rowsum(dO * O)): the sink's probability in row r of head h is exp(sink[h] - lse[r]) and
// carries no value, so dsink[h] = -sum_r exp(sink[h] - lse[r]) * D[r]. One CTA per head sums its
// rows in a fixed order (deterministic); one launch in place of a chain of elementwise kernels and
// a reduction. Torch-free, like the kernel files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flash {

struct SinkGradArgs {
    const float *sink;       // (h,)
    const float *lse;        // dense (b, h, seqlen_q); varlen (h, total_q)
    const float *softmax_d;  // dense (b, h, seqlen_q_rounded); varlen (h, total_q + 128 b): row r of
                             // sequence i at column r + 128 i
    const int *cu_seqlens_q; // (b + 1,) for varlen, else nullptr
    int b, h;
    int seqlen_q, seqlen_q_rounded;  // dense
    int64_t total_q;                 // varlen: softmax_lse.shape[1]
    float *dsink;                    // (h,) fp32
};

void learnable_sink_grad(const SinkGradArgs &args, cudaStream_t stream);

}  // namespace flash
