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
    const bool mod = params.softcap_scale > 0.f || params.alibi_slopes_ptr != nullptr;
    auto kernel = mod ? &flash_fwd_decode_kernel_sm90<Traits, true> : &flash_fwd_decode_kernel_sm90<Traits, false>;
    FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemSize));
    launch_splitkv_grid<Traits>(kernel, params, stream);
}

}  // namespace flash
