// Backward launch: preprocess -> main kernel -> dq conversion, tile configuration per head dim.
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "common/flash.h"
#include "sm80/flash_bwd_kernel.h"
#include "common/launch_check.h"
#ifdef FLASH_ATTN_SM90A
#include "dispatch/flash_bwd_launch_sm90.h"
#endif

namespace flash {

#ifdef FLASH_ATTN_SM90A
// The warp-specialised sm_90a backward (dispatch/flash_bwd_ws_launch_sm90.h; head-dim tiles 64 and
// 128; kMod = false: plain calls, true: softcap / ALiBi / deterministic calls), instantiated in
// its own translation units (instantiations/flash_bwd_ws_sm90_hdim*_*.cu, *_mod.cu). Run when
// params.bwd_ws (always, but for set_debug_kernel('bwd_lockstep')); it returns false, launching
// nothing, for the calls it does not serve.
template <typename Element, int kHeadDim, bool kMod>
bool run_mha_bwd_ws_sm90(BwdParams &params, cudaStream_t stream);
// Its dropout calls (kFeat with dropout; instantiations/flash_bwd_ws_sm90_hdim*_*_drop.cu).
template <typename Element, int kHeadDim>
bool run_mha_bwd_ws_sm90_dropout(BwdParams &params, cudaStream_t stream);
// Head dim 256: its split-d form, plain and feature calls (instantiations/flash_bwd_ws_sm90_hdim256_*.cu).
template <typename Element>
bool run_mha_bwd_ws_sm90_d256(BwdParams &params, cudaStream_t stream);
#endif

template <typename Traits, bool kFeat, int kStatic = 0, bool kDqBeforeDk = false>
void launch_bwd(BwdParams &params, cudaStream_t stream) {
    launch_bwd_passes<typename Traits::Element, Traits::kHeadDim>(params, stream, [&] {
        constexpr int smem_size = Traits::kSmemSize;
        auto kernel = &flash_bwd_kernel<Traits, kFeat, kStatic, kDqBeforeDk>;
        if (smem_size >= 48 * 1024) {
            FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
        }
        // Fixed-feature-set variants, deterministic: one CTA per dq_accum slice (see the kernel).
        const bool sliced = kStatic != 0 && params.deterministic;
        const dim3 grid(sliced ? std::max(params.dq_accum_splits, 1) : ceil_div(params.seqlen_k, Traits::kBlockN),
                        params.b, params.h);
        kernel<<<grid, Traits::kNThreads, smem_size, stream>>>(params);
        FLASH_CHECK_LAUNCH();
    });
}

// Head dims whose feature calls run fixed-feature-set kernels (kStatic; attn_mods.h); their deterministic mode uses dq_accum slices (the binding allocates them,
// bwd_uses_dq_slices in flash_api.cpp), the generic variants' semaphores otherwise.
template <int kHeadDim>
constexpr bool kBwdFeatSets = kHeadDim == 256;

template <typename Traits>
void launch_bwd_feat(BwdParams &params, cudaStream_t stream) {
    if constexpr (kBwdFeatSets<Traits::kHeadDim>) {
        {
            const int set = (params.softcap_scale > 0.f ? kModSoftcap : 0) |
                            (params.alibi_slopes_ptr != nullptr ? kModAlibi : 0) |
                            (params.p_dropout > 0.f ? kModDropout : 0);
            switch (set) {  // softcap excludes dropout (checked by the binding)
                case 0: launch_bwd<Traits, true, kModStatic>(params, stream); return;  // deterministic only
                case kModSoftcap: launch_bwd<Traits, true, kModStatic | kModSoftcap>(params, stream); return;
                case kModAlibi: launch_bwd<Traits, true, kModStatic | kModAlibi>(params, stream); return;
                case kModSoftcap | kModAlibi:
                    launch_bwd<Traits, true, kModStatic | kModSoftcap | kModAlibi>(params, stream);
                    return;
                case kModDropout: launch_bwd<Traits, true, kModStatic | kModDropout>(params, stream); return;
                case kModAlibi | kModDropout:
                    launch_bwd<Traits, true, kModStatic | kModAlibi | kModDropout>(params, stream);
                    return;
                default: break;
            }
            // Softcap with dropout: rejected by the binding. The generic kernel's deterministic
            // mode would need the semaphores that the binding did not allocate.
            if (params.deterministic) {
                record_launch_error(cudaErrorInvalidValue, "d256 backward: unsupported feature set", __FILE__,
                                    __LINE__);
                return;
            }
        }
    }
    launch_bwd<Traits, true>(params, stream);
}

// (kBlockM, kBlockN, warps, warps along M for S/dP, along N for dK/dV, along M for dQ).
// kFeat: the softcap / ALiBi / dropout / deterministic variant (its own translation units).
template <typename Element, int kHeadDim, bool kFeat = false>
void run_mha_bwd_(BwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    if constexpr (kHasSm90Bwd<kHeadDim>) {
        if (params.use_sm90) {
            if (params.bwd_ws) {
                if constexpr (kFeat) {
                    if (params.p_dropout > 0.f && run_mha_bwd_ws_sm90_dropout<Element, kHeadDim>(params, stream)) return;
                }
                if (run_mha_bwd_ws_sm90<Element, kHeadDim, kFeat>(params, stream)) return;
            }
            run_mha_bwd_sm90<Element, kHeadDim, kFeat>(params, stream);
            return;
        }
    }
#endif
#ifdef FLASH_ATTN_SM90A
    if constexpr (kHeadDim == 256) {
        if (params.use_sm90 && params.bwd_ws) {
            if (run_mha_bwd_ws_sm90_d256<Element>(params, stream)) return;
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
        using Traits = BwdKernelTraits<kHeadDim, 64, 64, 8, 4, 2, 2, Element>;
        if constexpr (kFeat) {
            launch_bwd_feat<Traits>(params, stream);
        } else {
            // dQ before dK (FA2's order; docs/perf-notes.md).
            launch_bwd<Traits, false, 0, true>(params, stream);
        }
    }
}

}  // namespace flash
