// Launch of the sm_90a forward. Only meaningful in a build that targets sm_90a (FLASH_ATTN_SM90A).
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"
#include "common/launch_check.h"
#include "sm90/flash_fwd_kernel_sm90.h"

namespace flash {

// Head-dim tiles that have a Hopper forward; the rest use the SM80-class kernel.
template <int kHeadDim>
constexpr bool kHasSm90Fwd = kHeadDim == 64 || kHeadDim == 128;

template <typename Traits, bool kFeat>
void launch_fwd_sm90(FwdParams &params, cudaStream_t stream) {
    constexpr int smem_size = Traits::kSmemSize + (kFeat ? Traits::kSmemDropoutFlags : 0);
    auto kernel = &flash_fwd_kernel_sm90<Traits, kFeat>;
    FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
    const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.b, params.h);
    kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
    FLASH_CHECK_LAUNCH();
}

template <typename Element, int kHeadDim, bool kFeat = false>
void run_mha_fwd_sm90(FwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90Fwd<kHeadDim>);
    if constexpr (kHeadDim == 64) {
        // 64-key tiles keep registers at 128, so two CTAs share an SM and one's softmax overlaps
        // the other's GEMMs: 361 vs 301 TFLOP/s for 128-key tiles (H200, seqlen 8k).
        launch_fwd_sm90<FwdKernelTraitsSm90<kHeadDim, 128, 64, Element, 2>, kFeat>(params, stream);
    } else {
        launch_fwd_sm90<FwdKernelTraitsSm90<kHeadDim, 128, 128, Element>, kFeat>(params, stream);
    }
}

}  // namespace flash
