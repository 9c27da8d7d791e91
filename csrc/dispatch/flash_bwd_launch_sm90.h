// Launch of the sm_90a backward. Only meaningful in a build that targets sm_90a (FLASH_ATTN_SM90A).
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"
#include "common/bwd_passes.h"
#include "common/launch_check.h"
#include "sm90/flash_bwd_kernel_sm90.h"

namespace flash {

// Head-dim tiles that have a Hopper backward; the rest use the SM80-class kernel.
template <int kHeadDim>
constexpr bool kHasSm90Bwd = kHeadDim == 64 || kHeadDim == 128;

template <typename Traits, bool kFeat>
void launch_bwd_sm90(BwdParams &params, cudaStream_t stream) {
    launch_bwd_passes<typename Traits::Element, Traits::kHeadDim>(params, stream, [&] {
        constexpr int smem_size = Traits::kSmemSize;
        auto kernel = &flash_bwd_kernel_sm90<Traits, kFeat>;
        FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
        // Deterministic: dq_accum_splits CTAs per (b, h), each with its own dq_accum slice.
        const bool sliced = kFeat && params.deterministic;
        params.dq_slice_block_m = Traits::kBlockM, params.dq_slice_block_n = Traits::kBlockN;  // the conversion's view
        const dim3 grid(sliced ? params.dq_accum_splits : ceil_div(params.seqlen_k, Traits::kBlockN), params.b,
                        params.h);
        kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
        FLASH_CHECK_LAUNCH();
    });
}

template <typename Element, int kHeadDim, bool kFeat = false>
void run_mha_bwd_sm90(BwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90Bwd<kHeadDim>);
    // 64 query rows per step for both head dims. d64 with 128 rows: 255 registers, 328 B of
    // spills, 284 vs 307 TFLOP/s (H200, bf16, seqlen 8k).
    // 128-key CTAs (2 warpgroups). d64 with 64-key CTAs (1 warpgroup, 2 CTAs/SM, twice the dQ
    // atomics): 273 vs 307 TFLOP/s.
    using Traits = BwdKernelTraitsSm90<kHeadDim, 64, 128, Element>;
    launch_bwd_sm90<Traits, kFeat>(params, stream);
}

}  // namespace flash
