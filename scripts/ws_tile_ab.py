#!/usr/bin/env python3
"""A/B timing of run-time tile / order switches (H200, bf16, 16k tokens, hidden 2048):
the warp-specialised forward's d128 key tile (FLASH_ATTN_FWD_WS_D128_N unset = 128, the default
since session 5, or FA3's 176) and d256 key tile (FLASH_ATTN_FWD_WS_D256_N unset = 64, or FA3's
80), the persistent forward (FLASH_ATTN_FWD_WS_PERSISTENT=1), the d64 forward on 128-row tiles
(FLASH_ATTN_FWD_WS_D64_M=192 or 128, `--d64-m-only`; in every build), and the cost of the deterministic
backward (causal and not) next to the default one.

    python scripts/ws_tile_ab.py [--fwd-only | --d64-m-only | --ext-tiles]

Needs a build with FLASH_ATTN_AB_KERNELS=1 (these are A/B-only kernels; other builds reject the
switches).
"""
import os

import torch
from triton.testing import do_bench

from flash_attn import flash_attn_func


def tflops(ms, b, h, s, d, causal, bwd=False):
    f = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if bwd else 1)
    return f / ms * 1e-9


def make(s, d):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    return b, h, q, k, v


def fwd_ab(d, env, choices, seqlens=(2048, 8192, 16384)):
    for causal in (False, True):
        for s in seqlens:
            b, h, q, k, v = make(s, d)
            cells = []
            for c in choices:
                if c is None:
                    os.environ.pop(env, None)
                else:
                    os.environ[env] = c
                with torch.no_grad():
                    ms = do_bench(lambda: flash_attn_func(q, k, v, causal=causal), warmup=25, rep=100)
                cells.append(f"{env.rsplit('_', 1)[-1]}={c or 'default'} {tflops(ms, b, h, s, d, causal):6.1f}")
            os.environ.pop(env, None)
            print(f"fwd d{d:<3} {'causal' if causal else 'full  '} s={s:<6} " + "   ".join(cells), flush=True)


def det_ab(d, s=8192):
    b, h, q, k, v = make(s, d)
    dout = torch.randn_like(q)
    for causal in (False, True):
        out = {}
        for det in (False, True):
            o = flash_attn_func(q, k, v, causal=causal, deterministic=det)
            out[det] = do_bench(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), warmup=25, rep=100)
        print(f"bwd d{d:<3} {'causal' if causal else 'full  '} s={s}  default {out[False]:.3f} ms "
              f"({tflops(out[False], b, h, s, d, causal, True):.0f} TFLOP/s)  deterministic {out[True]:.3f} ms  "
              f"({out[True] / out[False]:.3f}x)", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    import sys
    if "--d64-m-only" in sys.argv:  # session 22's prepared A/B: d64 on 128-row tiles (2 consumer WGs)
        fwd_ab(64, "FLASH_ATTN_FWD_WS_D64_M", ["192", "128"], seqlens=(512, 1024, 2048, 4096, 8192))
        sys.exit(0)
    if "--ext-tiles" in sys.argv:  # session 23's prepared A/B: FA3's key tiles as single wgmmas
        for env_p in (None, "0"):  # the default (persistent up to 8k keys at d128), then one CTA per tile
            if env_p is not None:
                os.environ["FLASH_ATTN_FWD_WS_PERSISTENT"] = env_p
                print("FLASH_ATTN_FWD_WS_PERSISTENT=0 (the 176 / 80 tiles run one CTA per tile)")
            fwd_ab(128, "FLASH_ATTN_FWD_WS_D128_N", [None, "176"], seqlens=(1024, 2048, 4096, 8192, 16384))
            fwd_ab(256, "FLASH_ATTN_FWD_WS_D256_N", [None, "80"], seqlens=(1024, 2048, 4096, 8192, 16384))
        sys.exit(0)
    fwd_ab(128, "FLASH_ATTN_FWD_WS_D128_N", [None, "176"])
    fwd_ab(256, "FLASH_ATTN_FWD_WS_D256_N", [None, "80"])
    for d in (128, 256):
        fwd_ab(d, "FLASH_ATTN_FWD_WS_PERSISTENT", [None, "1"])
    if "--fwd-only" not in sys.argv:
        for d in (64, 128):
            det_ab(d)
