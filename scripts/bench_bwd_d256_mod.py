#!/usr/bin/env python3
"""Times the head-dim 256 feature backwards (ALiBi, softcap, deterministic, dropout) on the SM80-class kernels
(default) and on the split-d WS kernel's kMod variant (FLASH_ATTN_BWD_WS_D256_MOD=1), bf16 8k.

    python scripts/bench_bwd_d256_mod.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_check_common import bench_backward_variants  # noqa: E402


def main():
    import torch

    slopes = torch.rand(8, device="cuda", dtype=torch.float32) * 0.5
    mod = {"FLASH_ATTN_BWD_WS_D256_MOD": "1"}
    variants = [("plain", {}, {}), ("plain dq-v4", {}, {"FLASH_ATTN_BWD_WS_DQ_V4": "1"})]
    for tag, kw in (("alibi", {"alibi_slopes": slopes}), ("softcap", {"softcap": 30.0}), ("det", {"deterministic": True}),
                    ("drop", {"dropout_p": 0.1})):
        variants += [(f"{tag} sm80", kw, {}), (f"{tag} ws", kw, mod)]
    variants += [("det ws s=1", {"deterministic": True}, dict(mod, FLASH_ATTN_BWD_WS_DET_SPLITS="1"))]
    bench_backward_variants(variants, head_dims=(256,))


if __name__ == "__main__":
    main()
