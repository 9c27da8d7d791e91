"""One profiled backward for scripts/ncu_bwd_compare.sh: bf16, batch 2, seqlen 8k, hidden 2048;
backend ("ours", "flash": PyTorch SDPA's flash backend = upstream FA2 code, or "cudnn": SDPA's cuDNN
backend) and head dim from the command line. Three warm-up backwards, then the fourth (ncu:
--launch-skip 3 --launch-count 1), then a fifth inside cudaProfilerStart / Stop (ncu
--profile-from-start off: every kernel of one backward, whatever its name).

    python scripts/bwd_profile_case.py ours 256 [dropout_p]
"""
import sys

import torch
import torch.nn.functional as F

backend, d = sys.argv[1], int(sys.argv[2])
dropout_p = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # ours only
b, s, h = 2, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
if backend == "ours":
    from flash_attn import flash_attn_func

    out = flash_attn_func(q, k, v, dropout_p=dropout_p)
    go = dout
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    go = dout.transpose(1, 2)
for _ in range(4):
    torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
