"""Kernel-level smoke check for developers: calls flash_attn._C directly (no autograd layer),
compares against naive attention in fp32 with the project's 2x rule, and times a few configs
against SDPA's flash backend. Prints one line per check; exits non-zero on any failure.

    python benchmarks/check_kernels.py [--quick] [--no-time]
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

import flash_attn._C as C


def reference(q, k, v, causal, scale, upcast):
    """softmax(QK^T*scale + mask)V with bottom-right causal alignment; (b, s, h, d) layout."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o.to(dtype) if not upcast else o, lse


def check(b, sq, sk, h, h_k, d, causal, dtype, gen):
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(b, sk, h_k, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    v = torch.randn(b, sk, h_k, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    do = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen)
    scale = d ** -0.5
    out, lse = C.fwd(q, k, v, None, scale, causal)[:2]
    dq, dk, dv, _ = C.bwd(do, q, k, v, out, lse, None, None, None, scale, causal, False)
    torch.cuda.synchronize()

    o_ref, lse_ref = reference(q, k, v, causal, scale, upcast=True)
    o_pt, _ = reference(q, k, v, causal, scale, upcast=False)
    g_ref = torch.autograd.grad(o_ref, (q, k, v), do.float())
    g_pt = torch.autograd.grad(o_pt, (q, k, v), do)
    errs = {}
    ok = True
    for name, ours, ref, pt in (("out", out, o_ref, o_pt), ("dq", dq, g_ref[0], g_pt[0]), ("dk", dk, g_ref[1], g_pt[1]),
                                ("dv", dv, g_ref[2], g_pt[2])):
        e = (ours.float() - ref).abs().max().item()
        e_pt = (pt.float() - ref).abs().max().item()
        errs[name] = (e, e_pt)
        ok &= bool(torch.isfinite(ours).all()) and e <= 2 * e_pt + 1e-4
    finite = torch.isfinite(lse_ref)
    lse_err = (lse[finite] - lse_ref[finite]).abs().max().item() if finite.any() else 0.0
    ok &= lse_err < 1e-2 and bool((lse[~finite] == float("inf")).all())
    desc = f"b={b} sq={sq} sk={sk} h={h}/{h_k} d={d} causal={int(causal)} {str(dtype)[6:]}"
    detail = " ".join(f"{n}={e:.2e}/{p:.2e}" for n, (e, p) in errs.items())
    print(f"{'ok  ' if ok else 'FAIL'} {desc:55s} {detail} lse={lse_err:.1e}", flush=True)
    return ok


def bench(seqlen, d, causal, dtype=torch.bfloat16):
    from triton.testing import do_bench

    b, h = 16384 // seqlen, 2048 // d
    q, k, v, do = (torch.randn(b, seqlen, h, d, device="cuda", dtype=dtype) for _ in range(4))
    scale = d ** -0.5
    flops = 4 * b * h * seqlen * seqlen * d / (2 if causal else 1)
    out, lse = C.fwd(q, k, v, None, scale, causal)[:2]
    t_fwd = do_bench(lambda: C.fwd(q, k, v, None, scale, causal), warmup=50, rep=200, return_mode="median")
    t_bwd = do_bench(lambda: C.bwd(do, q, k, v, out, lse, None, None, None, scale, causal, False), warmup=50,
                     rep=200, return_mode="median")
    qt, kt, vt = (x.transpose(1, 2).requires_grad_() for x in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        t_sfwd = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=50, rep=200,
                          return_mode="median")
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = do.transpose(1, 2)
        t_sbwd = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True), warmup=50, rep=200,
                          return_mode="median")
    tf = lambda t, mult: flops * mult / t / 1e9
    print(f"bench d={d} s={seqlen} causal={int(causal)}: ours fwd {tf(t_fwd, 1):6.1f} bwd {tf(t_bwd, 2.5):6.1f} | "
          f"sdpa-flash fwd {tf(t_sfwd, 1):6.1f} bwd {tf(t_sbwd, 2.5):6.1f} TFLOP/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--bench-only", action="store_true", help="skip the correctness checks")
    ap.add_argument("--paths", default="sm90,sm80", help="kernel paths to check: sm90 (wgmma where built), sm80")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    built = C.built_configs()
    print("built:", built)
    dims = sorted({t for _, t in built})
    dtypes = sorted({dt for dt, _ in built})
    ok = True
    shapes = [(1, 1, 1), (2, 17, 113), (2, 113, 203), (1, 239, 1), (2, 512, 256), (1, 1023, 1024), (1, 128, 217)]
    if args.quick:
        shapes = shapes[:3] + shapes[5:6]
    for path in args.paths.split(","):
        C.set_sm90_kernels(path == "sm90")
        print(f"--- path {path}", flush=True)
        for dt in dtypes:
            dtype = torch.bfloat16 if dt == "bf16" else torch.float16
            for tile in dims:
                for d in sorted({tile, max(8, tile - 24)}):
                    if C.head_dim_tile(d) != tile:
                        continue
                    for b, sq, sk in ([] if args.bench_only else shapes):
                        for causal in (False, True):
                            for h, h_k in ((4, 4), (4, 1)):
                                ok &= check(b, sq, sk, h, h_k, d, causal, dtype, gen)
        if not args.no_time:
            for d in (64, 128, 256):
                if ("bf16", d) in built:
                    for causal in (False, True):
                        bench(8192, d, causal)
    C.set_sm90_kernels(True)
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
