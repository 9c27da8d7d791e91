"""One profiled attention call for scripts/ncu_profile.sh: bf16, 16k tokens (batch = 16384 /
seqlen), hidden 2048 (nheads = 2048 / head dim). Three warm-up calls, then one inside
cudaProfilerStart / Stop, so `ncu --profile-from-start off` sees every kernel of that one call.

    python scripts/profile_case.py BACKEND PASS D SEQLEN CAUSAL [DROPOUT_P]

BACKEND: ours (flash_attn_func), cudnn or flash (PyTorch SDPA's cuDNN / flash backend, the latter
upstream FA2's code); PASS: fwd or bwd; CAUSAL: 0 or 1; DROPOUT_P: ours only.
"""
import sys

import torch
import torch.nn.functional as F


def profile_one(backend, kind, d, s, causal, dropout_p=0.0):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=kind == "bwd")
               for _ in range(3))
    if backend == "ours":
        from flash_attn import flash_attn_func

        def fwd():
            return flash_attn_func(q, k, v, causal=causal, dropout_p=dropout_p)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

        def fwd():
            with sdpa_kernel([chosen]):
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
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    profile_one(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1",
                float(sys.argv[6]) if len(sys.argv) == 7 else 0.0)
