"""One profiled forward for the ncu scripts (profile_fwd_ws.sh, ncu_stall_source.sh): bf16, batch 2,
seqlen 8k, hidden 2048, head dim and dropout_p from the command line; three warm-up calls, then the
fourth (ncu: --launch-skip 3 --launch-count 1) inside an NVTX range "profiled".

    python scripts/ws_profile_case.py 128 0.1
"""
import sys

import torch

from flash_attn import flash_attn_func

d, p = int(sys.argv[1]), float(sys.argv[2])
b, s, h = 2, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(3):
        flash_attn_func(q, k, v, dropout_p=p)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")
    flash_attn_func(q, k, v, dropout_p=p)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
