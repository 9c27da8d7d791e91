"""One profiled forward for scripts/ncu_fwd_compare.sh: bf16, 16k tokens (batch = 16384 / seqlen),
hidden 2048; backend ("ours", or "cudnn": PyTorch SDPA's cuDNN backend), head dim, seqlen and
causal (0 / 1) from the command line. Four warm-up calls, then one inside cudaProfilerStart / Stop
(ncu --profile-from-start off: every kernel of that call, whatever its name). Extra environment
variables (FLASH_ATTN_FWD_WS_D64_M, FLASH_ATTN_FWD_WS_D128_N, ...) pass through to ours.

    python scripts/fwd_profile_case.py ours 64 512 1
"""
import sys

import torch
import torch.nn.functional as F

backend, d, s, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if backend == "ours":
    from flash_attn import flash_attn_func

    def call():
        return flash_attn_func(q, k, v, causal=causal)
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
with torch.no_grad():
    for _ in range(4):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
