#!/usr/bin/env python3
"""What attention dropout costs other kernels on this GPU: forward + backward time with
dropout_p = 0.1 over the time with dropout_p = 0, for ours and for PyTorch SDPA's flash (upstream
FA2 code) and cuDNN backends, bf16, batch 2 x seqlen 8192, hidden 2048 (the issue-3 benchmark
shape). A backend that refuses dropout is reported as such.

    python scripts/dropout_reference.py [--headdims 64,128,256]
"""

import argparse

import torch
import torch.nn.functional as F
import triton.testing

from flash_attn import flash_attn_func


def fwd_bwd_ms(fn, q, k, v, dout):
    def step():
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)
    return triton.testing.do_bench(step, warmup=25, rep=200)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    print("forward + backward ms, bf16, batch 2 x seqlen 8192, hidden 2048 (do_bench median); "
          "dropout 0.1 / dropout 0")
    for d in [int(x) for x in args.headdims.split(",")]:
        h = 2048 // d
        q, k, v = (torch.randn(2, 8192, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        cells = []
        for p in (0.0, 0.1):
            ms = fwd_bwd_ms(lambda q, k, v, p=p: flash_attn_func(q, k, v, dropout_p=p), q, k, v, dout)
            cells.append(("ours", p, ms))
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        doutt = dout.transpose(1, 2)
        for name, backend in backends.items():
            for p in (0.0, 0.1):
                try:
                    with sdpa_kernel([backend]):
                        ms = fwd_bwd_ms(lambda q, k, v, p=p: F.scaled_dot_product_attention(q, k, v, dropout_p=p),
                                        qt, kt, vt, doutt)
                except Exception as e:  # noqa: BLE001
                    ms = None
                    print(f"  d{d} {name} p={p}: refused ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                cells.append((name, p, ms))
        line = [f"d{d:<4}"]
        for name in ("ours", "flash", "cudnn"):
            t0 = next(ms for n, p, ms in cells if n == name and p == 0.0)
            t1 = next(ms for n, p, ms in cells if n == name and p == 0.1)
            if t0 is None or t1 is None:
                line.append(f"{name}: n/a")
            else:
                line.append(f"{name}: {t0:7.3f} -> {t1:7.3f} ms ({t1 / t0:.2f}x)")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
