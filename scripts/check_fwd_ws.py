#!/usr/bin/env python3
"""GPU self-check (about a minute on an H200) of the warp-specialised sm_90a forward
(FLASH_ATTN_FWD_WS=1, csrc/hopper/flash_fwd_ws_*): head dims 64 / 128 / 256 (and d < tile),
fp16 / bf16, causal on / off, sliding window, seqlens 1 .. 8192 with seqlen_q != seqlen_k, GQA / MQA,
non-contiguous strides and varlen. Each case runs FLASH_ATTN_FWD_WS=1 and =0 and checks both
against the fp32 reference with the test suite's rule (max error <= 2 x the PyTorch low-precision
error + tiny slack; LSE atol 2e-3; +inf LSE and zero output for rows without a visible key; NaN
fails), and that the two kernels agree closely. Then times both at bf16 seqlen 8k (batch 2,
hidden 2048) with triton.testing.do_bench.

    python scripts/check_fwd_ws.py            # PASS/FAIL per case, exit status 1 on any FAIL
    python scripts/check_fwd_ws.py --no-bench
    python scripts/check_fwd_ws.py --bench-only
"""

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import torch  # noqa: E402

import fa_test_utils as U  # noqa: E402
from flash_attn import flash_attn_func, flash_attn_varlen_func  # noqa: E402


def set_ws(on):
    os.environ["FLASH_ATTN_FWD_WS"] = "1" if on else "0"


def fwd(q, k, v, causal, window=(-1, -1), ws=True):
    set_ws(ws)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    torch.cuda.synchronize()
    return out, lse


def check_dense(dtype, d, b, sq, sk, h, hk, causal, window=(-1, -1), layout="contiguous"):
    torch.manual_seed(sq * 7 + sk * 13 + d + h)

    def make(s, heads):
        if layout == "strided":  # every other row of a twice-as-long tensor: row stride 2 h d
            return torch.randn(b, 2 * s, heads, d, device="cuda", dtype=dtype)[:, ::2]
        if layout == "bhsd":  # (b, h, s, d) storage viewed as (b, s, h, d)
            return torch.randn(b, heads, s, d, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, s, heads, d, device="cuda", dtype=dtype)

    q, k, v = make(sq, h), make(sk, hk), make(sk, hk)
    out_ref, lse_ref = U.attention_ref(q, k, v, causal=causal, window_size=window, upcast=True)
    out_pt, _ = U.attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
    results = {}
    for ws in (True, False):
        out, lse = fwd(q, k, v, causal, window, ws=ws)
        tag = "ws" if ws else "old"
        U.assert_close_to_ref(f"out[{tag}]", out, out_ref, out_pt, U.OUT_SLACK)
        U.assert_lse_close(lse, lse_ref, sq, sk, causal, window_size=window)
        results[tag] = (out, lse)
    # The two kernels round the same way up to accumulation order.
    diff = U.max_err(results["ws"][0], results["old"][0])
    bound = 2 * U.max_err(out_pt, out_ref) + 1e-3
    assert diff <= bound, f"ws vs old out differ by {diff:.3e} > {bound:.3e}"


def check_varlen(dtype, d, seqlens_q, seqlens_k, h, hk, causal, nan_tail=0):
    """nan_tail: rows of NaN after the last sequence of q / k / v (must not leak into out / lse)."""
    torch.manual_seed(sum(seqlens_q) + 3 * sum(seqlens_k) + d)
    cu_q = torch.tensor([0] + list(torch.tensor(seqlens_q).cumsum(0)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(seqlens_k).cumsum(0)), device="cuda", dtype=torch.int32)

    def make(rows, heads):
        t = torch.randn(rows + nan_tail, heads, d, device="cuda", dtype=dtype)
        t[rows:] = float("nan")
        return t

    q = make(sum(seqlens_q), h)
    k = make(sum(seqlens_k), hk)
    v = make(sum(seqlens_k), hk)
    outs = {}
    for ws in (True, False):
        set_ws(ws)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                             return_attn_probs=True)
        torch.cuda.synchronize()
        outs[ws] = (out, lse)
    for i, (sq, sk) in enumerate(zip(seqlens_q, seqlens_k)):
        a, e = int(cu_q[i]), int(cu_k[i])
        qi, ki, vi = q[a:a + sq][None], k[e:e + sk][None], v[e:e + sk][None]
        out_ref, lse_ref = U.attention_ref(qi, ki, vi, causal=causal, upcast=True)
        out_pt, _ = U.attention_ref(qi, ki, vi, causal=causal, upcast=False)
        for ws in (True, False):
            out, lse = outs[ws]
            tag = f"seq{i}[{'ws' if ws else 'old'}]"
            U.assert_close_to_ref(f"out {tag}", out[a:a + sq][None], out_ref, out_pt, U.OUT_SLACK)
            U.assert_lse_close(lse[:, a:a + sq][None], lse_ref, sq, sk, causal)


def cases():
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        dn = U.DTYPE_NAMES[dtype]
        for d in (64, 128, 256):
            for causal in (False, True):
                for sq, sk in ((1, 1), (17, 17), (113, 113), (1023, 1023), (113, 1023), (1023, 113), (1, 300),
                               (300, 1)):
                    out.append((f"{dn} d{d} {'causal' if causal else 'full  '} {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, sq=sq, sk=sk:
                                check_dense(dtype, d, 2, sq, sk, 4, 2, causal)))
    bf = torch.bfloat16
    out += [
        ("bf16 d128 8192 causal", lambda: check_dense(bf, 128, 1, 8192, 8192, 2, 2, True)),
        ("bf16 d64 8192 full", lambda: check_dense(bf, 64, 1, 8192, 8192, 2, 1, False)),
        ("bf16 d256 8192 causal", lambda: check_dense(bf, 256, 1, 8192, 8192, 1, 1, True)),
        ("bf16 d128 MQA 8 heads 1 kv", lambda: check_dense(bf, 128, 2, 511, 777, 8, 1, True)),
        ("bf16 d128 sliding window (64, 16)", lambda: check_dense(bf, 128, 2, 600, 700, 4, 2, False, (64, 16))),
        ("bf16 d128 causal window (100, 0)", lambda: check_dense(bf, 128, 2, 700, 600, 4, 4, True, (100, 0))),
        ("bf16 d96->tile 128 (zero-padded cols)", lambda: check_dense(bf, 120, 2, 300, 333, 4, 2, True)),
        ("fp16 d40->tile 64", lambda: check_dense(torch.float16, 40, 2, 257, 190, 2, 2, False)),
        ("bf16 d200->tile 256", lambda: check_dense(bf, 200, 2, 257, 300, 2, 1, True)),
        ("bf16 d128 strided rows", lambda: check_dense(bf, 128, 2, 300, 300, 4, 2, True, layout="strided")),
        ("bf16 d64 (b,h,s,d) storage", lambda: check_dense(bf, 64, 2, 300, 400, 4, 4, False, layout="bhsd")),
        ("varlen bf16 d128 causal gqa", lambda: check_varlen(bf, 128, [1, 17, 300, 129], [5, 300, 17, 129], 6, 2, True)),
        ("varlen fp16 d64 full", lambda: check_varlen(torch.float16, 64, [200, 1, 64], [64, 200, 1], 4, 4, False)),
        ("varlen bf16 d256 causal", lambda: check_varlen(bf, 256, [130, 7, 260], [260, 7, 130], 2, 2, True)),
        ("varlen bf16 d128 NaN rows past the last seq", lambda: check_varlen(bf, 128, [100, 33], [70, 45], 4, 2, False,
                                                                             nan_tail=200)),
        ("varlen fp16 d64 NaN rows past the last seq", lambda: check_varlen(torch.float16, 64, [190, 5], [20, 77], 2, 2,
                                                                            True, nan_tail=150)),
    ]
    return out


def bench():
    from triton.testing import do_bench

    b, s, hidden = 2, 8192, 2048
    print("\nbf16 seqlen 8k, batch 2, hidden 2048: TFLOP/s (4 B H S^2 D, halved for causal)")
    for d in (64, 128, 256):
        h = hidden // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            row = []
            for ws in (False, True):
                set_ws(ws)
                ms = do_bench(lambda: flash_attn_func(q, k, v, causal=causal), warmup=25, rep=200)
                row.append(flops / ms / 1e9)
            print(f"  d{d:<3} {'causal' if causal else 'full  '}  old {row[0]:6.1f}   ws {row[1]:6.1f}   "
                  f"({row[1] / row[0]:.2f}x)", flush=True)
    set_ws(False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_fwd_ws: no CUDA device")
    ok = True
    if not args.bench_only:
        for name, fn in cases():
            t0 = time.time()
            try:
                fn()
                print("PASS  %-42s %6.2fs" % (name, time.time() - t0), flush=True)
            except Exception as e:  # noqa: BLE001
                ok = False
                print("FAIL  %-42s %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""),
                      flush=True)
                traceback.print_exc(limit=2)
        set_ws(False)
    if not args.no_bench:
        bench()
    print("ALL PASS" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
