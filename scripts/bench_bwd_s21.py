#!/usr/bin/env python3
"""Times the session-21 changes of the d64 / d128 warp-specialised backward against their A/B forms
(run-time switches, no extra kernels): dQ tiles swizzled in shared memory and dq_accum
(FLASH_ATTN_BWD_WS_DQ_SWIZZLE=0: row-major, 8-way bank conflicts) and dS^T stored with stmatrix
(FLASH_ATTN_BWD_WS_DS_STSM=0: element-wise). bf16 batch 2 x seqlen 8192, hidden 2048, causal off / on.

    python scripts/bench_bwd_s21.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_check_common import bench_backward_variants  # noqa: E402


def main():
    bench_backward_variants([("neither", {}, {"FLASH_ATTN_BWD_WS_DQ_SWIZZLE": "0", "FLASH_ATTN_BWD_WS_DS_STSM": "0"}),
                             ("swizzle", {}, {"FLASH_ATTN_BWD_WS_DS_STSM": "0"}),
                             ("stsm", {}, {"FLASH_ATTN_BWD_WS_DQ_SWIZZLE": "0"}),
                             ("both (default)", {}, {})],
                            head_dims=(64, 128))


if __name__ == "__main__":
    main()
