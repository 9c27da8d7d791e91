#!/usr/bin/env python3
"""Times the head-dim 256 feature backwards (ALiBi, softcap, deterministic, dropout) on the split-d WS kernel's
kMod variant (the default since session 12) and on the SM80-class kernels (FLASH_ATTN_BWD_WS_D256_MOD=0), bf16 8k;
with FLASH_ATTN_AB_KERNELS=1 builds also the plain kernel with float2 / float4 dQ atomics (FLASH_ATTN_BWD_WS_D256_DQ_ATOMIC=1 /
FLASH_ATTN_BWD_WS_DQ_V4=1) instead of dQ through the Q / dO stage (the default since session 12).

    python scripts/bench_bwd_d256_mod.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_check_common import bench_backward_variants  # noqa: E402


def main():
    import torch

    import flash_attn._C as ext

    slopes = torch.rand(8, device="cuda", dtype=torch.float32) * 0.5
    sm80 = {"FLASH_ATTN_BWD_WS_D256_MOD": "0"}
    variants = [("plain", {}, {}), ("plain, plain kernel", {}, {"FLASH_ATTN_BWD_WS_D256_PLAIN_MOD": "0"})]
    if ext.ab_kernels_built():
        variants += [("plain dq-atomic", {}, {"FLASH_ATTN_BWD_WS_D256_DQ_ATOMIC": "1"}),
                     ("plain dq-v4", {}, {"FLASH_ATTN_BWD_WS_DQ_V4": "1"})]
    for tag, kw in (("alibi", {"alibi_slopes": slopes}), ("softcap", {"softcap": 30.0}), ("det", {"deterministic": True}),
                    ("drop", {"dropout_p": 0.1})):
        variants += [(f"{tag} sm80", kw, sm80), (f"{tag} ws", kw, {})]
    variants += [("det ws s=2", {"deterministic": True}, {"FLASH_ATTN_BWD_WS_DET_SPLITS": "2"})]
    bench_backward_variants(variants, head_dims=(256,))


if __name__ == "__main__":
    main()
