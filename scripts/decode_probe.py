#!/usr/bin/env python
"""Where does decode bandwidth go? (H200 probe, about a minute; not part of the test suite.)

    python scripts/decode_probe.py             # timings
    python scripts/decode_probe.py --profile   # a few calls of each, for `ncu -k regex:...`

bf16, d 128, 32 query / 8 KV heads, 1 query token. For each shape it times:
  - read:      a Triton kernel that only streams K and V once (the read ceiling for these bytes);
  - ours:      flash_attn_with_kvcache, split heuristic and explicit split counts
               (FLASH_ATTN_DECODE_KERNEL picks old / new; --paged adds page-16 caches);
  - ours_bhsd: the same call on a cache whose memory is (b, h_k, s, d) (one contiguous stream per
               KV head) seen through a (b, s, h_k, d) view: does the strided row pattern cost?
  - cudnn / flash: SDPA on the (b, s, h_k, d) cache (transposed view, as the benchmark) and on
               a contiguous (b, h_k, s, d) copy.
GB/s = bytes of K and V / median time (triton.testing.do_bench, L2 flushed each call).
"""
import argparse
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from flash_attn import flash_attn_with_kvcache
except ImportError:  # SDPA / read-ceiling variants still run
    flash_attn_with_kvcache = None

H, HK, D = 32, 8, 128


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def read_both(k, v, out):
    for x in (k, v):
        n = x.numel()
        block, iters = 4096, 16
        grid = (triton.cdiv(n, block * iters),)
        _read_kernel[grid](x, out, n, BLOCK=block, ITERS=iters)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--configs", default="16x4096,16x32768,4x131072")
    ap.add_argument("--paged", action="store_true", help="also time page-16 caches")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    dev = "cuda"
    for cfg in args.configs.split(","):
        b, s = (int(x) for x in cfg.split("x"))
        kv_bytes = 2 * b * s * HK * D * 2
        sets = []
        for _ in range(2):
            q = torch.randn(b, 1, H, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(b, s, HK, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(b, s, HK, D, device=dev, dtype=torch.bfloat16)
            kb = k.transpose(1, 2).contiguous()  # (b, hk, s, d) memory
            vb = v.transpose(1, 2).contiguous()
            sets.append((q, k, v, kb, vb))
        seqlens = torch.full((b,), s, dtype=torch.int32, device=dev)
        red = torch.empty(1 << 20, device=dev, dtype=torch.float32)
        it = [0]

        def rot():
            i = it[0] % 2
            it[0] += 1
            return sets[i]

        variants = {}
        if args.paged and flash_attn_with_kvcache is not None:
            page = 16
            nblk = s // page
            perm = torch.randperm(b * nblk, device=dev)
            paged = []
            for q, k, v, _, _ in sets:
                kp, vp = torch.empty_like(k).view(b * nblk, page, HK, D), torch.empty_like(v).view(b * nblk, page, HK, D)
                kp[perm], vp[perm] = k.reshape(b * nblk, page, HK, D), v.reshape(b * nblk, page, HK, D)
                paged.append((q, kp, vp))
            table = perm.view(b, nblk).to(torch.int32)
            for kern in ("old", "new"):
                for ns in (0, 1):
                    def f(kern=kern, ns=ns):
                        os.environ["FLASH_ATTN_DECODE_KERNEL"] = kern
                        q, kp, vp = paged[it[0] % 2]
                        it[0] += 1
                        flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=ns)
                    variants["ours_pg16_%s_s%d" % (kern, ns)] = f
        variants["read"] = lambda: read_both(*rot()[1:3], red)
        for kern in ("old", "new"):
            for ns in (0, 1, 2, 4, 8, 16):
                def f(kern=kern, ns=ns):
                    os.environ["FLASH_ATTN_DECODE_KERNEL"] = kern
                    q, k, v, _, _ = rot()
                    flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=ns)
                variants["ours_%s_s%d" % (kern, ns)] = f
            for ns in (0, 4):
                def f(kern=kern, ns=ns):
                    os.environ["FLASH_ATTN_DECODE_KERNEL"] = kern
                    q, _, _, kb, vb = rot()
                    flash_attn_with_kvcache(q, kb.transpose(1, 2), vb.transpose(1, 2), cache_seqlens=seqlens,
                                            num_splits=ns)
                variants["ours_bhsd_%s_s%d" % (kern, ns)] = f
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def f(be=be):
                q, k, v, _, _ = rot()
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   enable_gqa=True)
            variants[name] = f

            def g(be=be):
                q, _, _, kb, vb = rot()
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(q.transpose(1, 2), kb, vb, enable_gqa=True)
            variants[name + "_bhsd"] = g

        print("\nb=%d s=%d  K+V %.0f MB" % (b, s, kv_bytes / 1e6), flush=True)
        only = [x for x in args.only.split(",") if x]
        for name, fn in variants.items():
            if only and not any(name == o or (o.endswith("*") and name.startswith(o[:-1])) for o in only):
                continue
            try:
                if args.profile:
                    torch.cuda.nvtx.range_push(name)
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
                    continue
                ms = bench(fn)
                print("  %-22s %7.1f us  %6.0f GB/s" % (name, ms * 1e3, kv_bytes / (ms * 1e-3) / 1e9), flush=True)
            except Exception as e:  # noqa: BLE001
                print("  %-22s failed: %s" % (name, str(e).splitlines()[0][:150]), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
