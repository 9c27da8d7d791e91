// The learnable sink's gradient (see sink_grad.h).
#include "api/sink_grad.h"

#include "common/launch_check.h"

namespace flash {

namespace {

constexpr int kSinkGradThreads = 512;

// Sum over the CTA, the same order on every run.
__device__ float block_sum(float x) {
    __shared__ float warp_sums[kSinkGradThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < kSinkGradThreads / 32 ? warp_sums[lane] : 0.f;
    if (warp == 0) {
        for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

__global__ void __launch_bounds__(kSinkGradThreads) sink_grad_kernel(const SinkGradArgs a) {
    const int head = blockIdx.x;
    const float sink = a.sink[head];
    float acc = 0.f;
    if (a.cu_seqlens_q == nullptr) {
        const int64_t rows = int64_t(a.b) * a.seqlen_q;
        for (int64_t i = threadIdx.x; i < rows; i += kSinkGradThreads) {
            const int64_t bidb = i / a.seqlen_q, r = i % a.seqlen_q;
            const int64_t bh = bidb * a.h + head;
            acc += __expf(sink - a.lse[bh * a.seqlen_q + r]) * a.softmax_d[bh * a.seqlen_q_rounded + r];
        }
    } else {
        // Rows past cu_seqlens_q[b] belong to no sequence and are left out.
        const float *lse = a.lse + int64_t(head) * a.total_q;
        const float *d = a.softmax_d + int64_t(head) * (a.total_q + 128 * int64_t(a.b));
        for (int s = 0; s < a.b; ++s) {
            const int begin = a.cu_seqlens_q[s], end = a.cu_seqlens_q[s + 1];
            for (int r = begin + threadIdx.x; r < end; r += kSinkGradThreads) {
                acc += __expf(sink - lse[r]) * d[r + 128 * int64_t(s)];
            }
        }
    }
    const float total = block_sum(acc);
    if (threadIdx.x == 0) a.dsink[head] = -total;
}

}  // namespace

void learnable_sink_grad(const SinkGradArgs &args, cudaStream_t stream) {
    if (args.h == 0) return;
    sink_grad_kernel<<<args.h, kSinkGradThreads, 0, stream>>>(args);
    FLASH_CHECK_LAUNCH();
}

}  // namespace flash
