// Launch of the split-KV forward and its combine step; the split-count heuristic.
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"
#include "sm80/flash_fwd_splitkv_cta_kernel.h"
#include "common/splitkv_combine.h"
#include "sm80/flash_fwd_splitkv_kernel.h"
#include "common/launch_check.h"

namespace flash {

#ifdef FLASH_ATTN_SM90A
// Head-dim tiles with the sm_90a bulk-copy decode kernel (sm90/flash_fwd_decode_sm90.h). It is
// defined in dispatch/flash_fwd_decode_launch_sm90.h and instantiated in its own translation units
// (instantiations/flash_fwd_split_sm90_hdim*_*.cu), so that they compile in parallel.
template <int kHeadDim>
constexpr bool kHasSm90Decode = kHeadDim == 64 || kHeadDim == 128;
template <typename Element, int kHeadDim>
void run_mha_fwd_decode_sm90(FwdParams &params, cudaStream_t stream);
#endif

// A split-KV kernel over the grid (b * h_k, blocks of Traits::kBlockM packed rows, splits), then
// the combine step (launch_splitkv_combine).
template <typename Traits, typename Kernel>
void launch_splitkv_grid(Kernel kernel, FwdParams &params, cudaStream_t stream) {
    const int num_m_blocks = ceil_div(params.seqlen_q * params.h_h_k_ratio, Traits::kBlockM);
    const dim3 grid(params.b * params.h_k, num_m_blocks, params.num_splits);
    kernel<<<grid, Traits::kNThreads, Traits::kSmemSize, stream>>>(params);
    FLASH_CHECK_LAUNCH();
    launch_splitkv_combine<typename Traits::Element, Traits::kHeadDim>(params, stream);
}

template <typename Traits>
void launch_splitkv(FwdParams &params, cudaStream_t stream) {
    constexpr int smem_size = Traits::kSmemSize;
    // Softcap / ALiBi: the kMod variant; the plain kernel is unchanged without them.
    const bool mod = params.softcap_scale > 0.f || params.alibi_slopes_ptr != nullptr;
    auto kernel = mod ? &flash_fwd_splitkv_kernel<Traits, true> : &flash_fwd_splitkv_kernel<Traits, false>;
    if constexpr (Traits::kNWarps == 8) {
        // The wide shape's plain kernel skips the rescale of rows whose max did not move.
        if (!mod) kernel = &flash_fwd_splitkv_kernel<Traits, false, /*kSkipRescale=*/true>;
    }
    if (smem_size >= 48 * 1024) {
        FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size));
    }
    launch_splitkv_grid<Traits>(kernel, params, stream);
}

// The CTA-schedule kernel (the caller has checked: d = 128, no softcap / ALiBi; a block table only
// with kPaged).
template <typename Traits, bool kPaged = false>
void launch_splitkv_cta(FwdParams &params, cudaStream_t stream) {
    auto kernel = &flash_fwd_splitkv_cta_kernel<Traits, kPaged>;
    FLASH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemSize));
    launch_splitkv_grid<Traits>(kernel, params, stream);
}

template <typename Element, int kHeadDim>
void run_mha_fwd_splitkv_(FwdParams &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_SM90A
    // params.decode_sm90: the binding's choice (paged calls on an sm_90 device); the
    // kernel needs d to fill the tile (no zero columns to pad).
    if constexpr (kHasSm90Decode<kHeadDim>) {
        if (params.decode_sm90 && params.d == kHeadDim) {
            run_mha_fwd_decode_sm90<Element, kHeadDim>(params, stream);
            return;
        }
    }
#endif
    if constexpr (kHeadDim == 128) {
        if (params.splitkv_wide) {
            // Contiguous caches without softcap / ALiBi (and without the wide kernel's A/B switches):
            // cuDNN's schedule, 4 warps x 16 keys of 64-key CTA tiles, K and V of a tile issued
            // together, 3 buffers (+0.5-1.3% over the wide kernel, 1.000 / 0.998 / 1.004 of cuDNN;
            // flash_fwd_splitkv_cta_kernel.h).
            const bool mod = params.softcap_scale > 0.f || params.alibi_slopes_ptr != nullptr;
            // Paged: where the binding chose it (params.decode_paged_cta: power-of-two pages, no
            // cache_leftpad), in the default variant's shape.
            const bool paged = params.block_table != nullptr;
            if (paged && params.decode_paged_cta && !mod && params.d == 128) {
                launch_splitkv_cta<SplitKVCtaTraits<Element, 3, 4, true, 64>, /*kPaged=*/true>(params, stream);
                return;
            }
            if (!paged && !mod && params.d == 128) {
                launch_splitkv_cta<SplitKVCtaTraits<Element, 3, 4, true, 64>>(params, stream);
                return;
            }
            launch_splitkv<SplitKVWideTraits<Element>>(params, stream);
            return;
        }
    }
    launch_splitkv<SplitKVKernelTraits<kHeadDim, Element>>(params, stream);
}

}  // namespace flash
