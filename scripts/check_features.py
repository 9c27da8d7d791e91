#!/usr/bin/env python3
"""GPU smoke check of the flash_attn_func features against the fp32 naive reference (< 1 min).

    python scripts/check_features.py            # from the repository root, extension built

One PASS/FAIL line per check: sliding window, softcap, ALiBi, dropout (mask recovered from
S_dmask and compared with the Python Philox model), combinations, packed entry points, and the
deterministic backward (bitwise reruns). The error rule is the test suite's: out within 2x and
grads within 3x of the low-precision naive error. Exit status 1 if anything failed.
"""

import os
import sys
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fa_test_utils import check_against_ref, dropout_keep_ref, local_visible  # noqa: E402

from flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func  # noqa: E402

RESULTS = []


def check(name, fn):
    try:
        fn()
        RESULTS.append((name, True))
        print(f"PASS {name}", flush=True)
    except Exception as e:  # noqa: BLE001
        RESULTS.append((name, False))
        msg = str(e).strip().splitlines()
        print(f"FAIL {name}: {type(e).__name__}: {msg[0] if msg else ''}", flush=True)
        if os.environ.get("VERBOSE"):
            traceback.print_exc()


def case(dtype, d, sq, sk, causal, b=2, h=4, hk=2, window=(-1, -1), softcap=0.0, alibi=None,
         dropout_p=0.0, deterministic=False, variant="func"):
    def run():
        nonlocal sk, hk
        if variant == "qkvpacked":
            sk, hk = sq, h
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
        slopes = None
        if alibi is not None:
            slopes = torch.rand(*((h,) if alibi == "h" else (b, h)), device="cuda") * 0.5
        kw = dict(dropout_p=dropout_p, causal=causal, window_size=window, softcap=softcap,
                  alibi_slopes=slopes, deterministic=deterministic, return_attn_probs=True)
        if variant == "func":
            out, lse, S = flash_attn_func(q, k, v, **kw)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        elif variant == "qkvpacked":
            qkv = torch.stack([q, k, v], 2).detach().requires_grad_()
            out, lse, S = flash_attn_qkvpacked_func(qkv, **kw)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (qkv,), dout)[0].unbind(2)
        else:
            kv = torch.stack([k, v], 2).detach().requires_grad_()
            out, lse, S = flash_attn_kvpacked_func(q, kv, **kw)
            dout = torch.randn_like(out)
            dq, dkv = torch.autograd.grad(out, (q, kv), dout)
            grads = (dq, *dkv.unbind(2))
        feats = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
        if dropout_p > 0:
            feats.update(dropout_p=dropout_p, dropout_mask=~torch.signbit(S[:, :, :sq, :sk]))
        check_against_ref(out, lse, grads, q, k, v, dout, causal, grad_factor=3, **feats)
    return run


def dropout_mask_model(d, causal):
    def run():
        b, sq, sk, h, p = 2, 200, 333, 3, 0.3
        q, k, v = [torch.randn(b, s, h, d, device="cuda", dtype=torch.float16)
                   for s in (sq, sk, sk)]
        _, _, S, rng = torch.ops.flash_attn._flash_attn_forward(
            q, k, v, p, d ** -0.5, causal, -1, -1, 0.0, None, True)
        seed, offset = rng.tolist()
        ref = dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()
        got = ~torch.signbit(S[:, :, :sq, :sk])
        vis = local_visible(sq, sk, (-1, -1), causal, device="cuda")
        if vis is not None:
            got, ref = got[..., vis], ref[..., vis]
        bad = (got != ref).sum().item()
        assert bad == 0, f"{bad} mask elements differ from the Philox model"
        kept = got.float().mean().item()
        assert abs(kept - (1 - p)) < 0.02, f"kept fraction {kept:.4f}, expected {1 - p}"
    return run


def seed_reproducible():
    q, k, v = [torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3)]
    dout = torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16)

    def run(seed):
        torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    a, b_, c = run(11), run(11), run(12)
    for name, x, y in zip(("out", "dq", "dk", "dv"), a, b_):
        assert torch.equal(x, y), f"{name} differs for the same seed"
    assert not torch.equal(a[0], c[0]), "another seed gave the same output"


def deterministic_bitwise(d, causal, window, hk, reruns=50):
    def run():
        b, sq, sk, h = 2, 777, 1031, 4
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True)
        first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        check_against_ref(out, None, first, q, k, v, dout, causal, grad_factor=3,
                          window_size=window)
        for _ in range(reruns):
            again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            for name, x, y in zip(("dq", "dk", "dv"), again, first):
                assert torch.equal(x, y), f"{name} differs between reruns"
    return run


def main():
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    f16, bf16 = torch.float16, torch.bfloat16
    for dtype in (f16, bf16):
        n = "fp16" if dtype == f16 else "bf16"
        for d in (64, 128):
            for w in ((0, 0), (16, 0), (0, 16), (7, 23), (5000, 5000)):
                check(f"window{w} {n} d{d} 239x1000", case(dtype, d, 239, 1000, False, window=w))
            check(f"window(64,-1)+causal {n} d{d}", case(dtype, d, 300, 300, True, window=(64, -1)))
        check(f"window(33,3) {n} d59 gqa", case(dtype, 59, 113, 203, False, window=(33, 3)))
        check(f"window(100,0) {n} d256 mqa", case(dtype, 256, 317, 317, True, hk=1,
                                                   window=(100, 0)))
        for d in (32, 59, 96, 128, 256):
            check(f"softcap5 {n} d{d}", case(dtype, d, 113, 203, d % 2 == 0, softcap=5.0))
            check(f"alibi(h) {n} d{d}", case(dtype, d, 203, 113, d % 2 == 1, alibi="h"))
            check(f"alibi(b,h)+window {n} d{d}", case(dtype, d, 150, 150, True, alibi="bh",
                                                      window=(40, 0)))
            check(f"dropout0.17 {n} d{d}", case(dtype, d, 239, 317, d % 2 == 0, dropout_p=0.17))
        check(f"dropout+alibi+window+causal+gqa {n}", case(dtype, 64, 300, 400, True, h=6, hk=2,
                                                           window=(50, -1), alibi="h",
                                                           dropout_p=0.1))
        check(f"softcap+alibi+window {n}", case(dtype, 128, 300, 300, False, softcap=8.0,
                                                alibi="bh", window=(60, 12)))
        check(f"qkvpacked dropout+alibi {n}", case(dtype, 64, 150, 150, True, variant="qkvpacked",
                                                   dropout_p=0.1, alibi="h"))
        check(f"kvpacked softcap+window {n}", case(dtype, 128, 150, 211, False, variant="kvpacked",
                                                   softcap=4.0, window=(20, 20)))
        check(f"deterministic+dropout {n}", case(dtype, 96, 200, 300, True, dropout_p=0.2,
                                                 deterministic=True))
    for d in (32, 64, 128, 256):
        check(f"dropout mask = Philox model d{d}", dropout_mask_model(d, d == 128))
    check("dropout same seed bitwise", seed_reproducible)
    check("deterministic 50x bitwise d64 full", deterministic_bitwise(64, False, (-1, -1), 4))
    check("deterministic 50x bitwise d128 causal mqa", deterministic_bitwise(128, True, (-1, -1), 1))
    check("deterministic 50x bitwise d256 window", deterministic_bitwise(256, False, (100, 20), 2))
    n_fail = sum(not ok for _, ok in RESULTS)
    print(f"\n{len(RESULTS) - n_fail}/{len(RESULTS)} passed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
