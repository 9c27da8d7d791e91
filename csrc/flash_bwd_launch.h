// Backward launch: preprocess -> main kernel -> dq conversion, tile configuration per head dim.
#pragma once

#include <cuda_runtime.h>

#include "flash.h"
#include "flash_bwd_kernel.h"
#include "launch_check.h"
#ifdef FLASH_ATTN_SM90A
#include "hopper/flash_bwd_launch_sm90.h"
#endif

namespace flash {

template <typename Traits, bool kFeat>
void launch_bwd(BwdParams &params, cudaStream_t stream) {
    launch_bwd_passes<typename Traits::Element>(params, stream, [&] {
        constexpr int smem_size = Traits::kSmemSize;
        auto kernel = &flash_bwd_kernel<Traits, kFeat>;
        if (smem_size >= 48 * 1024) {
            FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
        }
        const dim3 grid(ceil_div(params.seqlen_k, Traits::kBlockN), params.b, params.h);
        kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
        FLASH_CHECK_LAUNCH();
    });
}

// (kBlockM, kBlockN, warps, warps along M for S/dP, along N for dK/dV, along M for dQ).
// kFeat: the softcap / ALiBi / dropout / deterministic variant (its own translation units).
template <typename Element, int kHeadDim, bool kFeat = false>
void run_mha_bwd_(BwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    if constexpr (kHasSm90Bwd<kHeadDim>) {
        if (params.use_sm90) {
            run_mha_bwd_sm90<Element, kHeadDim, kFeat>(params, stream);
            return;
        }
    }
#endif
    if constexpr (kHeadDim <= 64) {
        launch_bwd<BwdKernelTraits<kHeadDim, 128, 128, 8, 4, 4, 4, Element>, kFeat>(params, stream);
    } else if constexpr (kHeadDim <= 96) {
        launch_bwd<BwdKernelTraits<kHeadDim, 64, 128, 8, 2, 4, 4, Element>, kFeat>(params, stream);
    } else if constexpr (kHeadDim <= 128) {
        launch_bwd<BwdKernelTraits<kHeadDim, 64, 128, 8, 2, 4, 2, Element>, kFeat>(params, stream);
    } else {
        launch_bwd<BwdKernelTraits<kHeadDim, 64, 64, 8, 4, 2, 2, Element>, kFeat>(params, stream);
    }
}

}  // namespace flash
