"""One profiled forward or backward for scripts/ncu_power_metrics.sh (and, forward only, through
scripts/fwd_profile_case.py for ncu_fwd_compare.sh / ncu_stall_source.sh): bf16, 16k tokens
(batch = 16384 / seqlen), hidden 2048. Arguments: backend ("ours", or "cudnn": PyTorch SDPA's cuDNN
backend), pass ("fwd" / "bwd"), head dim, seqlen, causal (0 / 1). One forward, three warm-up calls,
then one inside cudaProfilerStart / Stop (ncu --profile-from-start off: every kernel of that call;
a forward profiled this way is the 5th forward launch).

    python scripts/power_profile_case.py ours bwd 64 8192 1
"""
import sys

import torch
import torch.nn.functional as F


def profile_one(backend, kind, d, s, causal):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=kind == "bwd")
               for _ in range(3))
    if backend == "ours":
        from flash_attn import flash_attn_func

        def fwd():
            return flash_attn_func(q, k, v, causal=causal)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fwd():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

    with torch.set_grad_enabled(kind == "bwd"):
        out = fwd()
        dout = torch.randn_like(out)
        call = (lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)) if kind == "bwd" else fwd
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    profile_one(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
