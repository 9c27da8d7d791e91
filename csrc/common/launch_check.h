// Error checks for CUDA calls and kernel launches inside the torch-free kernel files.
// Errors are recorded (thread-local) and surfaced by the binding as Python exceptions.
#pragma once

#include <cuda_runtime.h>

namespace flash {

void record_launch_error(cudaError_t err, const char *what, const char *file, int line);

}  // namespace flash

#define FLASH_CUDA_CHECK(call)                                                   \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            ::flash::record_launch_error(err_, #call, __FILE__, __LINE__);       \
            return;                                                              \
        }                                                                        \
    } while (0)

#define FLASH_CHECK_LAUNCH() FLASH_CUDA_CHECK(cudaGetLastError())

// Makes the current device's primary context current on the calling thread, as the TMA descriptor
// encoding (cuTensorMapEncodeTiled, a driver call inside CuTe's make_tma_copy) needs. torch's
// autograd worker threads select the device without creating or binding a context, and when the
// caching allocator serves every allocation no runtime call binds one before the backward's
// descriptors are built: the encode then fails with CUDA_ERROR_INVALID_CONTEXT, which CuTe cannot
// report (it prints the descriptor and crashes). cudaSetDevice binds the primary context (CUDA 12+).
#define FLASH_BIND_CONTEXT()                                                     \
    do {                                                                         \
        int device_;                                                             \
        FLASH_CUDA_CHECK(cudaGetDevice(&device_));                               \
        FLASH_CUDA_CHECK(cudaSetDevice(device_));                                \
    } while (0)
