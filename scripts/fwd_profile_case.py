"""One profiled forward for scripts/ncu_fwd_compare.sh: bf16, 16k tokens (batch = 16384 / seqlen),
hidden 2048; backend ("ours", or "cudnn": PyTorch SDPA's cuDNN backend), head dim, seqlen and
causal (0 / 1) from the command line. One forward and three warm-up calls (power_profile_case.py), then one inside cudaProfilerStart / Stop
(ncu --profile-from-start off: every kernel of that call, whatever its name). Extra environment
variables (FLASH_ATTN_FWD_WS_D64_M, FLASH_ATTN_FWD_WS_D128_N, ...) pass through to ours.

    python scripts/fwd_profile_case.py ours 64 512 1
"""
import sys

from power_profile_case import profile_one  # the 5th forward launch, as before

profile_one(sys.argv[1], "fwd", int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")
