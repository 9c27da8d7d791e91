"""A/B of the SM80-class plain backward above head-dim tile 128 (the d256 kernel, 64 x 64 tiles,
8 warps: upstream FA2's configuration, yet 0.77x of FA2's TFLOP/s on the H200 in session 9).

FLASH_ATTN_BWD_SM80_VARIANT (BwdParams::bwd_sm80_variant): 1 (default since session 10) computes
dQ and issues its fp32 atomics before the dK GEMM (FA2's order: the reductions drain while dK
runs), 0 after it. Session 10 also measured scalar atomics (1.35x slower; removed). Each variant
is checked against the fp32 reference (the suite's 2x rule) on odd shapes, then all are timed
against SDPA-flash (FA2) in interleaved rounds: add a variant here to A/B the next change.

    python scripts/check_bwd_sm80_variants.py

Needs a build with FLASH_ATTN_AB_KERNELS=1 (these are A/B-only kernels; other builds reject the
switches).
"""
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_test_utils import check_against_ref  # noqa: E402
from gpu_check_common import env_set, random_qkv_dout  # noqa: E402

from flash_attn import flash_attn_func  # noqa: E402

VARIANTS = ("1", "0", "3", "5", "7")
CASES = [  # dtype, d, batch, seqlen_q, seqlen_k, heads, heads_k, causal
    (torch.bfloat16, 256, 2, 113, 203, 4, 2, False),
    (torch.float16, 256, 1, 1023, 777, 2, 2, True),
    (torch.bfloat16, 256, 2, 300, 300, 3, 1, True),
    (torch.bfloat16, 256, 1, 17, 1, 2, 2, False),
]


def check():
    failed = 0
    for dtype, d, b, sq, sk, h, hk, causal in CASES:
        q, k, v, dout = random_qkv_dout(dtype, b, sq, sk, h, hk, d, seed=sq * 7 + sk)
        for var in VARIANTS:
            tag = f"{str(dtype)[6:]:9} d{d} b{b} {sq}x{sk} h{h}/{hk} causal={causal} variant {var}"
            try:
                with env_set({"FLASH_ATTN_BWD_SM80_VARIANT": var}):
                    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
                    grads = torch.autograd.grad(out, (q, k, v), dout)
                torch.cuda.synchronize()
                check_against_ref(out, lse, grads, q, k, v, dout, causal)
                print(f"PASS  {tag}", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                failed += 1
                print(f"FAIL  {tag}: {str(e)[:300]}", flush=True)
    return failed


def bench(rounds=3):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print("\nbackward ms, bf16 d256, batch 2 x seqlen 8192, 8 heads (do_bench median; best of "
          f"{rounds} interleaved rounds); TFLOP/s = 2.5 * 4 * b * h * s^2 * d (/2 causal)")
    d, h, s, b = 256, 8, 8192, 2
    for causal in (False, True):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        times = {}
        out = flash_attn_func(q, k, v, causal=causal)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out_sdpa = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dout_t = dout.transpose(1, 2)
        for _ in range(rounds):
            for var in VARIANTS:
                with env_set({"FLASH_ATTN_BWD_SM80_VARIANT": var}):
                    ms = triton.testing.do_bench(
                        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=10, rep=100)
                times[var] = min(times.get(var, 1e9), ms)
            ms = triton.testing.do_bench(
                lambda: torch.autograd.grad(out_sdpa, (qt, kt, vt), dout_t, retain_graph=True), warmup=10, rep=100)
            times["flash"] = min(times.get("flash", 1e9), ms)
        base = times["0"]
        print(f"  {'causal' if causal else 'full  '}  " + "  ".join(
            f"{t}: {ms:6.3f} ms {flops / ms / 1e9:5.0f} TF ({ms / base:.3f}x)" for t, ms in times.items()), flush=True)


if __name__ == "__main__":
    n_failed = check()
    print("ALL PASS" if n_failed == 0 else f"{n_failed} FAILED", flush=True)
    if n_failed == 0 and "--no-bench" not in sys.argv:
        bench()
    sys.exit(1 if n_failed else 0)
