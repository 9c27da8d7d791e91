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
