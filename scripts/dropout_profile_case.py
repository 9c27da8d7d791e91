"""One profiled forward or backward for scripts/ncu_dropout_issue.sh: bf16, batch 2, seqlen 8k,
hidden 2048; pass ("fwd" / "bwd"), head dim and dropout_p from the command line. Three warm-up
calls of the pass, then the fourth (ncu: --launch-skip 3 --launch-count 1 on that pass's kernel).

    python scripts/dropout_profile_case.py bwd 128 0.1
"""
import sys

import torch

from flash_attn import flash_attn_func

which, d, p = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
assert which in ("fwd", "bwd")
b, s, h = 2, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
if which == "fwd":
    with torch.no_grad():
        for _ in range(4):
            flash_attn_func(q, k, v, dropout_p=p)
else:
    torch.manual_seed(0)
    out = flash_attn_func(q, k, v, dropout_p=p)
    for _ in range(4):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
