// Small helpers for variable-length batches: zero the rows past the last sequence.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/flash.h"
#include "common/launch_check.h"

namespace flash {

namespace {

// One warp per (row, head) pair of the tail; 16-byte stores. The tail is usually empty, so the
// grid is small and loops.
__global__ void zero_varlen_tail_kernel(char *ptr, int64_t row_stride_bytes, int64_t head_stride_bytes, int h,
                                        int row_bytes, int total_rows, const int *cu_seqlens, int b, float *lse,
                                        int64_t lse_head_stride) {
    const int start = cu_seqlens[b];
    const int64_t pairs = int64_t(total_rows - start) * h;
    const int lane = threadIdx.x % 32;
    const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int64_t n_warps = int64_t(gridDim.x) * blockDim.x / 32;
    for (int64_t i = warp; i < pairs; i += n_warps) {
        const int row = start + int(i / h), head = int(i % h);
        char *p = ptr + row * row_stride_bytes + head * head_stride_bytes;
        for (int c = lane * 16; c < row_bytes; c += 32 * 16) { *reinterpret_cast<uint4 *>(p + c) = make_uint4(0, 0, 0, 0); }
        if (lse != nullptr && lane == 0) lse[head * lse_head_stride + row] = INFINITY;
    }
}

}  // namespace

void zero_varlen_tail(void *ptr, int64_t row_stride, int64_t head_stride, int h, int d, int elem_bytes,
                      int total_rows, const int *cu_seqlens, int b, float *lse, int64_t lse_head_stride,
                      cudaStream_t stream) {
    if (total_rows == 0 || h == 0) return;
    // At most ~8 warps per 1k tail pairs; a few CTAs cover any tail since the kernel loops.
    const int64_t max_pairs = int64_t(total_rows) * h;
    const int blocks = int(max_pairs / 64 + 1 < 128 ? max_pairs / 64 + 1 : 128);
    zero_varlen_tail_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<char *>(ptr), row_stride * elem_bytes,
                                                        head_stride * elem_bytes, h, d * elem_bytes, total_rows,
                                                        cu_seqlens, b, lse, lse_head_stride);
    FLASH_CHECK_LAUNCH();
}

}  // namespace flash
