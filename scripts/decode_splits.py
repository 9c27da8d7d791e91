"""Decode diagnostics (developer tool): K+V bandwidth of the split-KV kernel called directly
through flash_attn._C for several num_splits, and the public flash_attn_with_kvcache call, so the
cost of the Python layer and the split heuristic can be read apart. bf16, d 128, 32 q / 8 kv heads.

    python scripts/decode_splits.py
"""
import torch
from triton.testing import do_bench

import flash_attn._C as C
from flash_attn import flash_attn_with_kvcache


def main():
    torch.manual_seed(0)
    for b, sk in ((16, 4096), (16, 32768), (4, 131072)):
        h, hk, d = 32, 8, 128
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqused = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        gb = 2 * k.numel() * k.element_size() / 1e9
        line = [f"b={b:2d} sk={sk:6d}"]
        for splits in (0, 1, 2, 4, 8, 16):
            fn = lambda: C.fwd_kvcache(q, k, v, seqused, None, None, None, d ** -0.5, True, -1, 0, splits)
            t = do_bench(fn, warmup=25, rep=100, return_mode="median")
            line.append(f"_C s={splits}: {gb / t * 1e3:5.0f}")
        t = do_bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused, causal=True), warmup=25, rep=100,
                     return_mode="median")
        line.append(f"api: {gb / t * 1e3:5.0f} GB/s")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
