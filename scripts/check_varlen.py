#!/usr/bin/env python3
"""Fast GPU smoke check (< 1 min on an H200) of varlen forward/backward (with softcap, ALiBi,
dropout and the deterministic backward), the KV cache (with softcap / ALiBi), paged KV and
split-KV, against the per-sequence naive references of tests/test_varlen_kvcache.py.

    python scripts/check_varlen.py            # PASS/FAIL per case, exit status 1 on any FAIL
    python scripts/check_varlen.py --bench    # plus a quick decode-bandwidth and varlen/dense timing
"""

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import pytest  # noqa: E402
import torch  # noqa: E402

import test_varlen_kvcache as T  # noqa: E402

VARLEN = [
    ("varlen bf16 d128 random causal gqa", dict(dtype=torch.bfloat16, d=128, max_sq=257, max_sk=257, mode="random", mask=("c", True, (-1, -1)), h=6, hk=2)),
    ("varlen fp16 d64 edge(0/1 lengths) full", dict(dtype=torch.float16, d=64, max_sq=200, max_sk=200, mode="edge", mask=("f", False, (-1, -1)), h=4, hk=4)),
    ("varlen bf16 d59 third sq!=sk causal mqa", dict(dtype=torch.bfloat16, d=59, max_sq=113, max_sk=203, mode="third", mask=("c", True, (-1, -1)), h=4, hk=1)),
    ("varlen bf16 d128 local window", dict(dtype=torch.bfloat16, d=128, max_sq=300, max_sk=300, mode="third", mask=("l", False, (32, 7)), h=4, hk=2)),
    ("varlen bf16 d256 edge causal-local", dict(dtype=torch.bfloat16, d=256, max_sq=150, max_sk=150, mode="edge", mask=("cl", True, (48, -1)), h=2, hk=2)),
    ("varlen bf16 d128 SM80 kernels", dict(dtype=torch.bfloat16, d=128, max_sq=300, max_sk=300, mode="random", mask=("c", True, (-1, -1)), h=4, hk=2, use_sm90=False)),
    ("varlen bf16 d128 long (2100)", dict(dtype=torch.bfloat16, d=128, max_sq=2100, max_sk=2100, mode="third", mask=("c", True, (-1, -1)), h=2, hk=1, batch=3)),
]

KVCACHE = [(name, kw) for name, kw in T.KV_CASES]


def run(name, fn):
    t0 = time.time()
    try:
        fn()
        print("PASS  %-45s %6.2fs" % (name, time.time() - t0), flush=True)
        return True
    except (Exception, pytest.skip.Exception) as e:  # noqa: BLE001  (Skipped is a BaseException)
        if isinstance(e, pytest.skip.Exception):
            print("SKIP  %-45s %s" % (name, e), flush=True)
            return True
        print("FAIL  %-45s %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""),
              flush=True)
        traceback.print_exc(limit=3)
        return False


def bench():
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

    def timeit(fn, n=20):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / n

    print("\ndecode: bf16 d128, 32 q / 8 kv heads, 1 token; K+V GB/s")
    for b, sk in ((16, 4096), (16, 32768), (4, 131072), (1, 131072)):
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        seq = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        nbytes = 2 * kc.numel() * 2
        ms = timeit(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seq))
        page = 16
        nblk = sk // page
        perm = torch.randperm(b * nblk, device="cuda")
        kp, vp = torch.empty_like(kc).view(b * nblk, page, 8, 128), torch.empty_like(vc).view(b * nblk, page, 8, 128)
        kp[perm], vp[perm] = kc.view(b * nblk, page, 8, 128), vc.view(b * nblk, page, 8, 128)
        table = perm.view(b, nblk).to(torch.int32)
        ms_p = timeit(lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seq, block_table=table))
        sdpa = None
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                try:
                    with sdpa_kernel([be]):
                        t = timeit(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
                    sdpa = min(sdpa, t) if sdpa else t
                except Exception:  # noqa: BLE001
                    pass
        except Exception:  # noqa: BLE001
            pass
        print("  b=%-3d sk=%-7d ours %6.0f  paged16 %6.0f  sdpa-best %s GB/s" % (
            b, sk, nbytes / ms / 1e6, nbytes / ms_p / 1e6, "%6.0f" % (nbytes / sdpa / 1e6) if sdpa else "n/a"))
        del kc, vc, kp, vp

    sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
    from benchmark_attn import varlen_lengths
    lens = varlen_lengths(16384)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    cu = cu.cuda()
    total, h, d = sum(lens), 16, 128
    print("\nvarlen fwd+bwd TFLOP/s vs dense (s=2048), bf16 d128 h16, lengths %s" % lens)
    for causal in (False, True):
        q, k, v = [torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        flops = sum(4 * h * L * L * d / (2 if causal else 1) for L in lens) * 3.5
        do = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
        t_v = timeit(lambda: torch.autograd.grad(flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal), (q, k, v), do), 10)
        b = total // 2048
        qd, kd, vd = [t.detach()[: b * 2048].view(b, 2048, h, d).requires_grad_() for t in (q, k, v)]
        flops_d = 4 * b * h * 2048 * 2048 * d / (2 if causal else 1) * 3.5
        dod = do[: b * 2048].view(b, 2048, h, d)
        t_d = timeit(lambda: torch.autograd.grad(flash_attn_func(qd, kd, vd, causal=causal), (qd, kd, vd), dod), 10)
        tv, td = flops / t_v / 1e9, flops_d / t_d / 1e9
        print("  causal=%d  varlen %5.0f  dense %5.0f  ratio %.2f" % (causal, tv, td, tv / td))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", action="store_true", help="also time decode and varlen")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible")
    torch.manual_seed(0)
    ok = True
    for name, kw in VARLEN:
        kw = dict(kw)
        ok &= run(name, lambda kw=kw: T._run_varlen(kw.pop("dtype"), kw.pop("d"), kw.pop("max_sq"),
                                                   kw.pop("max_sk"), kw.pop("mode"), kw.pop("mask"),
                                                   kw.pop("h"), kw.pop("hk"), **kw))
    ok &= run("varlen qkvpacked/kvpacked causal", lambda: T.test_varlen_qkvpacked_and_kvpacked(True))
    ok &= run("varlen all-empty + seqused_k/leftpad_k", T.test_varlen_all_empty_and_seqused_leftpad)
    for page in (16, 48, 256):
        ok &= run("varlen paged page=%d causal" % page, lambda page=page: T.test_varlen_paged(page, True))
    # Features: softcap, ALiBi, dropout (mask from S_dmask), deterministic (reruns bitwise).
    for i, (name, feat) in enumerate(T.FEATS):
        lq, lk, h, hk, d, dtype = T.FEAT_SHAPES[i % len(T.FEAT_SHAPES)]
        ok &= run("varlen %s d%d h%dx%d" % (name, d, h, hk),
                  lambda a=(dtype, d, lq, lk, h, hk), feat=feat: T._run_varlen_feat(*a, **feat))
    ok &= run("varlen qkvpacked dropout+deterministic", lambda: T.test_varlen_features_packed(
        "qkvpacked", dict(dropout_p=0.2, deterministic=True, causal=True)))
    ok &= run("varlen kvpacked alibi+softcap+local", lambda: T.test_varlen_features_packed(
        "kvpacked", dict(alibi="bh", softcap=6.0, window=(30, 30))))
    ok &= run("varlen dropout mask = Philox model (causal)",
              lambda: T.test_varlen_dropout_mask_matches_philox_model(True))
    ok &= run("varlen paged alibi+softcap+local (split-KV kMod)",
              lambda: T.test_varlen_paged_features(dict(alibi="h", softcap=5.0, window=(100, 0))))
    for name, kw in KVCACHE:
        ok &= run("kvcache " + name, lambda kw=kw: T._run_kvcache(**kw))
    ok &= run("kvcache 1 token x 20k keys, splits 0/1/57", T.test_kvcache_many_splits_fill_gpu)
    ok &= run("kvcache 1 token x 128k keys paged16", lambda: T._run_kvcache(sq=1, b=1, h=32, hk=8, seqlen_cache=128 * 1024 + 5, page=16))
    ok &= run("kvcache int cache_seqlens + torch.compile", T.test_kvcache_int_cache_seqlens_and_compile)
    print("\nALL PASS" if ok else "\nSOME FAILED")
    if args.bench:
        bench()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
