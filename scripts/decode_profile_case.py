#!/usr/bin/env python3
"""One decode shape of issue 4 (bf16, b16, 32k keys or DECODE_S, 32 query / 8 KV heads, d128), a few calls of
one implementation, for `ncu -k regex:...` (scripts/validate_h200.sh PART=DA).

    python scripts/decode_profile_case.py ours|cudnn [calls]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn import flash_attn_with_kvcache

which = sys.argv[1]
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.manual_seed(0)
b, s, h, hk, d = 16, int(os.environ.get("DECODE_S", 32768)), 32, 8, 128
q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
for _ in range(calls):
    if which == "ours":
        flash_attn_with_kvcache(q, k, v)
    else:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
torch.cuda.synchronize()
print("done", which, calls)
