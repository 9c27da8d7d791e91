// Launch of the sm_90a decode (split-KV) kernel and, for num_splits > 1, the shared combine step.
// Only meaningful in a build that targets sm_90a (FLASH_ATTN_SM90A); instantiated by
// instantiations/flash_fwd_split_sm90_hdim*_*.cu, dispatched from run_mha_fwd_splitkv_.
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"
#include "dispatch/flash_fwd_splitkv_launch.h"  // the declaration of run_mha_fwd_decode_sm90
#include "common/launch_check.h"
#include "sm90/flash_fwd_decode_sm90.h"

namespace flash {

template <typename Element, int kHeadDim>
void run_mha_fwd_decode_sm90(FwdParams &params, cudaStream_t stream) {
    static_assert(kHasSm90Decode<kHeadDim>);
    using Traits = DecodeKernelTraitsSm90<kHeadDim, Element>;
    constexpr int smem_size = Traits::kSmemSize;
    const bool mod = params.softcap_scale > 0.f || params.alibi_slopes_ptr != nullptr;
    auto kernel = mod ? &flash_fwd_decode_kernel_sm90<Traits, true> : &flash_fwd_decode_kernel_sm90<Traits, false>;
    FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
    const int num_m_blocks = ceil_div(params.seqlen_q * params.h_h_k_ratio, Traits::kBlockM);
    const dim3 grid(params.b * params.h_k, num_m_blocks, params.num_splits);
    kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
    FLASH_CHECK_LAUNCH();
    launch_splitkv_combine<Element, kHeadDim>(params, stream);
}

}  // namespace flash
