#!/usr/bin/env python3
"""GPU check and A/B of FLASH_ATTN_FWD_WS_D64_DROP_WG2=1 (branch ws-fwd-d64-drop2): the d64 dropout
forward on 2 consumer warpgroups (128 x 128 tiles, 240 registers) instead of the default 3 (192 x
128, 160 registers).

Cases (dense and varlen, causal / window / ALiBi / GQA, odd lengths): the forward with the same
seed on both configurations must agree bit for bit (each row's online softmax sees the same key
tiles in the same order; only the rows per CTA change), and both must pass the suite's rule
against the fp32 reference built from the Philox model (fa_test_utils.dropout_keep_ref). Then the
forward at bf16 8k d64 (batch 2, 32 heads): plain, dropout 0.1 default, dropout 0.1 on 2 WGs.

    python scripts/check_fwd_ws_d64_drop2.py [--no-bench] [--bench-only]
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import torch  # noqa: E402

import fa_test_utils as U  # noqa: E402
import flash_attn  # noqa: E402  (registers the custom ops)

ENV = "FLASH_ATTN_FWD_WS_D64_DROP_WG2"
# (dtype, b, sq, sk, h, hk, causal, window, alibi, p, varlen)
CASES = [
    (torch.bfloat16, 2, 1024, 1024, 4, 4, False, (-1, -1), False, 0.1, False),
    (torch.float16, 2, 1000, 1300, 6, 2, True, (-1, -1), False, 0.17, False),
    (torch.bfloat16, 3, 113, 203, 4, 1, False, (-1, -1), True, 0.3, False),
    (torch.float16, 1, 777, 640, 4, 2, False, (64, 16), True, 0.25, False),
    (torch.bfloat16, 2, 1, 300, 4, 4, False, (-1, -1), False, 0.1, False),
    (torch.bfloat16, 3, 300, 257, 4, 2, True, (-1, -1), False, 0.4, True),
]


def run(case, wg2):
    assert hasattr(torch.ops.flash_attn, "_flash_attn_forward"), flash_attn.__file__
    dtype, b, sq, sk, h, hk, causal, (wl, wr), alibi, p, varlen = case
    d = 64
    if causal:
        wr = 0
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    slopes = torch.rand(h, device="cuda", generator=g) * 0.5 if alibi else None
    os.environ[ENV] = "1" if wg2 else "0"
    try:
        torch.manual_seed(1234)  # the same rng_state on both configurations
        if varlen:
            cu_q = torch.arange(0, (b + 1) * sq, sq, device="cuda", dtype=torch.int32)
            cu_k = torch.arange(0, (b + 1) * sk, sk, device="cuda", dtype=torch.int32)
            out, lse, _, rng = torch.ops.flash_attn._flash_attn_varlen_forward(
                q.reshape(-1, h, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d), cu_q, cu_k, sq, sk, p, d ** -0.5,
                causal, wl, wr, 0.0, slopes, False)
            out = out.view(b, sq, h, d)
        else:
            out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(q, k, v, p, d ** -0.5, causal, wl, wr, 0.0,
                                                                         slopes, False)
        torch.cuda.synchronize()
    finally:
        os.environ.pop(ENV, None)
    return (q, k, v, slopes, (wl, wr)), out, lse, rng


def check(case):
    (q, k, v, slopes, window), out0, lse0, rng0 = run(case, False)
    _, out1, lse1, rng1 = run(case, True)
    assert torch.equal(rng0, rng1), "rng_state differs"
    seed, offset = rng0.tolist()
    dtype, b, sq, sk, h, hk, causal, _, _, p, varlen = case
    mask = U.dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()
    out_ref, _ = U.attention_ref(q, k, v, causal=causal, upcast=True, window_size=window, alibi_slopes=slopes,
                                 dropout_p=p, dropout_mask=mask)
    out_pt, _ = U.attention_ref(q, k, v, causal=causal, upcast=False, window_size=window, alibi_slopes=slopes,
                                dropout_p=p, dropout_mask=mask)
    U.assert_close_to_ref("out (3 WGs)", out0, out_ref, out_pt, U.OUT_SLACK)
    U.assert_close_to_ref("out (2 WGs)", out1, out_ref, out_pt, U.OUT_SLACK)
    same_out, same_lse = torch.equal(out0, out1), torch.equal(lse0, lse1)
    assert same_out and same_lse, f"2 WGs vs 3 WGs: out {U.max_err(out0, out1):.2e}, lse {U.max_err(lse0, lse1):.2e}"
    return "2 WGs == 3 WGs (out, lse)"


def bench():
    import triton.testing

    from flash_attn import flash_attn_func

    q, k, v = (torch.randn(2, 8192, 32, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    print("\nforward ms, bf16 d64, batch 2 x seqlen 8192, 32 heads (do_bench median)")
    for causal in (False, True):
        row = []
        for tag, p, wg2 in (("plain", 0.0, False), ("dropout 3 WGs", 0.1, False), ("dropout 2 WGs", 0.1, True)):
            os.environ[ENV] = "1" if wg2 else "0"
            try:
                ms = triton.testing.do_bench(lambda: flash_attn_func(q, k, v, dropout_p=p, causal=causal),
                                             warmup=25, rep=150)
            finally:
                os.environ.pop(ENV, None)
            row.append((tag, ms))
        base = row[0][1]
        print(f"  {'causal' if causal else 'full  '}  " +
              "  ".join(f"{t} {ms:6.3f} ({ms / base:.3f}x)" for t, ms in row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    args = ap.parse_args()
    failed = 0
    if not args.bench_only:
        for case in CASES:
            label = " ".join(str(x).replace("torch.", "") for x in case)
            try:
                msg, ok = check(case), True
            except Exception as e:  # noqa: BLE001
                msg, ok = f"{type(e).__name__}: {e}", False
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {label:<70} {msg}", flush=True)
        print("ALL PASS" if not failed else f"{failed} FAILED")
    if not args.no_bench:
        bench()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
