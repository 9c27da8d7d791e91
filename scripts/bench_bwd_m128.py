#!/usr/bin/env python3
"""Times the head-dim 64 warp-specialised backward on 128-row query blocks (the default since session
14; FA3's d64 tiles) against the 64-row blocks (FLASH_ATTN_BWD_WS_M128=0, A/B-only:
FLASH_ATTN_AB_KERNELS=1 builds), bf16 batch 2 x seqlen 8192, hidden 2048, causal off / on.

    python scripts/bench_bwd_m128.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_check_common import bench_backward_variants  # noqa: E402


def main():
    bench_backward_variants([("m64", {}, {"FLASH_ATTN_BWD_WS_M128": "0"}), ("m128 (default)", {}, {})],
                            head_dims=(64,))


if __name__ == "__main__":
    main()
