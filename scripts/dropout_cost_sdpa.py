#!/usr/bin/env python3
"""Dropout 0.1 cost, forward + backward time / the same call without dropout, for ours and for
PyTorch SDPA's flash (upstream FA2 code), cuDNN and efficient backends, in one run: bf16, seqlen
8192, batch 2, nheads 2048 / d (the --features configuration of benchmarks/benchmark_attn.py).
Context for issue 3's "dropout costs <= 15%" criterion: what the other kernels pay for it.

    python scripts/dropout_cost_sdpa.py [--headdims 64,128,256]
"""
import argparse

import torch
import torch.nn.functional as F
import triton.testing as tt


def fwd_bwd_ms(fn, q, k, v):
    def run():
        out = fn(q, k, v)
        out.backward(gout)
    gout = torch.randn_like(q)
    return tt.do_bench(run, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128,256")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from flash_attn import flash_attn_func
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    print("bf16 seqlen 8192 batch 2 nheads 2048/d; fwd+bwd ms (do_bench median), dropout 0 / 0.1, ratio")
    for d in [int(x) for x in args.headdims.split(",")]:
        h, s, b = 2048 // d, 8192, 2
        # ours: (b, s, h, d); SDPA: (b, h, s, d)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        cells = []
        for name in ["ours"] + list(backends):
            ms = []
            for p in (0.0, 0.1):
                try:
                    if name == "ours":
                        fn = lambda q, k, v, p=p: flash_attn_func(q, k, v, dropout_p=p)  # noqa: E731
                        ms.append(fwd_bwd_ms(fn, q, k, v))
                    else:
                        qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))

                        def fn(q, k, v, p=p, be=backends[name]):
                            with sdpa_kernel([be]):
                                return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
                        ms.append(fwd_bwd_ms(fn, qt, kt, vt))
                except Exception as e:  # noqa: BLE001
                    ms.append(None)
                    print("  [n/a] %s d%d p=%.1f: %s" % (name, d, p, str(e).splitlines()[0][:120]))
            if None in ms:
                cells.append("%s n/a" % name)
            else:
                cells.append("%s %.3f / %.3f = %.3fx" % (name, ms[0], ms[1], ms[1] / ms[0]))
        print("d%-4d %s" % (d, " | ".join(cells)), flush=True)


if __name__ == "__main__":
    main()
