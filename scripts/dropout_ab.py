"""TEMPORARY: where does the sm_90a dropout cost go? Times plain vs dropout 0.1 fwd / bwd at
seqlen 8k, bf16, for FLASH_ATTN_DROPOUT_DEBUG settings (1 skip generation, 2 skip apply,
4 Philox-7, 8 forward pair masks precomputed)."""
import os
import torch
from triton.testing import do_bench
from flash_attn import flash_attn_func

torch.manual_seed(0)
for d in (128, 64):
    b, s, h = 2, 8192, 2048 // d
    qkv = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    base = None
    for dbg, p in [(0, 0.0), (0, 0.1), (1, 0.1), (2, 0.1), (3, 0.1), (4, 0.1), (8, 0.1), (12, 0.1)]:
        os.environ["FLASH_ATTN_DROPOUT_DEBUG"] = str(dbg)
        fwd = lambda: flash_attn_func(*qkv, dropout_p=p)
        out = fwd()
        bwd = lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True)
        tf = do_bench(fwd, warmup=25, rep=150)
        tb = do_bench(bwd, warmup=25, rep=150)
        if base is None:
            base = (tf, tb)
        print("d%-4d p=%.1f debug=%-2d fwd %.3f ms (%.3fx)  bwd %.3f ms (%.3fx)  f+b %.3fx" % (
            d, p, dbg, tf, tf / base[0], tb, tb / base[1], (tf + tb) / sum(base)), flush=True)
