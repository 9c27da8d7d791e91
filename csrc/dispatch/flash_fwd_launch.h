// Forward launch: tile configuration per head-dim tile, grid, shared-memory opt-in, error check.
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"
#include "sm80/flash_fwd_kernel.h"
#include "common/launch_check.h"
#ifdef FLASH_ATTN_SM90A
#include "dispatch/flash_fwd_launch_sm90.h"
#endif

namespace flash {

#ifdef FLASH_ATTN_SM90A
// Head-dim tiles with the warp-specialised sm_90a forward (sm90/flash_fwd_ws_launch_sm90.h),
// instantiated in its own translation units (instantiations/flash_fwd_ws_sm90_hdim*_*{,_feat}.cu,
// kFeat = the softcap / ALiBi / dropout variant). It returns false, launching nothing, for the
// calls it does not serve (among them S_dmask).
template <int kHeadDim>
constexpr bool kHasSm90FwdWs = kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256;
template <typename Element, int kHeadDim, bool kFeat>
bool run_mha_fwd_ws_sm90(FwdParams &params, cudaStream_t stream);
#endif

template <typename Traits, bool kFeat, int kStatic = 0>
void launch_fwd(FwdParams &params, cudaStream_t stream) {
    constexpr int smem_size = Traits::kSmemSize;
    auto kernel = &flash_fwd_kernel<Traits, kFeat, kStatic>;
    if (smem_size >= 48 * 1024) {
        FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
    }
    const int num_m_blocks = ceil_div(params.seqlen_q, Traits::kBlockM);
    dim3 grid(num_m_blocks, params.b, params.h);
    kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
    FLASH_CHECK_LAUNCH();
}

// Head dims whose feature calls run fixed-feature-set kernels (kStatic; attn_mods.h; S_dmask
// calls excepted). The generic run-time variant costs 1.3-1.6x the plain kernel at d = 256
// whatever the feature (its optional code is if-converted into one predicated block).
template <int kHeadDim>
constexpr bool kFeatSets = kHeadDim == 256;

// The fixed feature set of a feature call, or 0 where none applies (S_dmask: the generic kernel).
inline int fwd_feature_set(const FwdParams &params) {
    if (params.s_dmask_ptr != nullptr) return 0;
    return kModStatic | (params.softcap_scale > 0.f ? kModSoftcap : 0) |
           (params.alibi_slopes_ptr != nullptr ? kModAlibi : 0) | (params.p_dropout > 0.f ? kModDropout : 0);
}

template <typename Traits>
void launch_fwd_feat(FwdParams &params, cudaStream_t stream) {
    if constexpr (kFeatSets<Traits::kHeadDim>) {
        switch (fwd_feature_set(params)) {  // softcap excludes dropout (checked by the binding)
            case kModStatic | kModSoftcap: launch_fwd<Traits, true, kModStatic | kModSoftcap>(params, stream); return;
            case kModStatic | kModAlibi: launch_fwd<Traits, true, kModStatic | kModAlibi>(params, stream); return;
            case kModStatic | kModSoftcap | kModAlibi:
                launch_fwd<Traits, true, kModStatic | kModSoftcap | kModAlibi>(params, stream);
                return;
            case kModStatic | kModDropout: launch_fwd<Traits, true, kModStatic | kModDropout>(params, stream); return;
            case kModStatic | kModAlibi | kModDropout:
                launch_fwd<Traits, true, kModStatic | kModAlibi | kModDropout>(params, stream);
                return;
            default: break;
        }
    }
    launch_fwd<Traits, true>(params, stream);
}

// (kBlockM, kBlockN, warps) per head-dim tile, sized for the 227 KB of shared memory and the
// register file of sm_80/sm_90 (accumulators for kBlockM x d outputs stay in registers).
// kFeat: the softcap / ALiBi / dropout variant (its own translation units, *_feat.cu).
template <typename Element, int kHeadDim, bool kFeat = false>
void run_mha_fwd_(FwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    // The warp-specialised kernel, plain or feature variant
    // (not S_dmask: it declines, and the calls below run).
    if constexpr (kHasSm90FwdWs<kHeadDim>) {
        if (params.use_sm90 && run_mha_fwd_ws_sm90<Element, kHeadDim, kFeat>(params, stream)) {
            return;
        }
    }
    if constexpr (kHasSm90Fwd<kHeadDim>) {
        // S_dmask (return_attn_probs with dropout, for tests) is written by the SM80-class kernel only.
        if (params.use_sm90 && !(kFeat && params.s_dmask_ptr != nullptr)) {
            run_mha_fwd_sm90<Element, kHeadDim, kFeat>(params, stream);
            return;
        }
    }
#endif
    if constexpr (kHeadDim <= 64) {
        launch_fwd<FwdKernelTraits<kHeadDim, 128, 128, 4, Element>, kFeat>(params, stream);
    } else if constexpr (kHeadDim <= 128) {
        launch_fwd<FwdKernelTraits<kHeadDim, 128, 64, 4, Element>, kFeat>(params, stream);
    } else {
        using Traits = FwdKernelTraits<kHeadDim, 128, 64, 8, Element>;
        if constexpr (kFeat) {
            launch_fwd_feat<Traits>(params, stream);
        } else {
            launch_fwd<Traits, false>(params, stream);
        }
    }
}

}  // namespace flash
