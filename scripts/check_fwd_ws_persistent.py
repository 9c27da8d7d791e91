#!/usr/bin/env python3
"""GPU check (about a minute on an H200) of the persistent warp-specialised sm_90a forward
(FLASH_ATTN_FWD_WS_PERSISTENT=1; plain variant, default tiles): one CTA per SM walking the tiles
(m block, batch, head) instead of one CTA per tile.

Each case runs the forward with the variable unset and set (it is read at each call) and checks
that out and softmax_lse are **bitwise equal** (the same per-tile math in the same order), and
checks the persistent result against the fp32 reference with the suite's rule. Cases: fp16 /
bf16, d64 / d128 / d256 (and d below a tile), causal / not, sliding windows, seqlen_q != seqlen_k
(rows without a visible key: tiles with no work), GQA / MQA, batch x heads both below and far
above the SM count (tiles per CTA 0..~100), varlen with short, long and length-0/1 sequences.
Then times both paths over seqlen 512..16k (16k tokens, hidden 2048), bf16, causal off / on.

    python scripts/check_fwd_ws_persistent.py [--no-bench] [--bench-only] [--headdims 64,128,256]
        [--case-timeout 30]

A case still running after --case-timeout seconds (a hang) ends the run with its name printed.

Needs a build with FLASH_ATTN_AB_KERNELS=1 (these are A/B-only kernels; other builds reject the
switches).
"""

import argparse
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import torch  # noqa: E402

import fa_test_utils as U  # noqa: E402
from flash_attn import flash_attn_func, flash_attn_varlen_func  # noqa: E402

ENV = "FLASH_ATTN_FWD_WS_PERSISTENT"


class Watchdog:
    """Ends the process (exit status 3) when one case runs longer than `seconds`, naming it: a
    kernel that hangs blocks the main thread in a CUDA call, so the check cannot raise by itself,
    and the device stays busy until the process dies."""

    def __init__(self, seconds):
        import threading
        import time

        self.seconds, self.name, self.t0 = seconds, None, 0.0
        self._time = time.monotonic

        def watch():
            while True:
                time.sleep(1.0)
                if self.name is not None and self._time() - self.t0 > self.seconds:
                    print(f"HANG  {self.name}: no result after {self.seconds:.0f} s", flush=True)
                    os._exit(3)

        threading.Thread(target=watch, daemon=True).start()

    def start(self, name):
        self.name, self.t0 = name, self._time()

    def stop(self):
        self.name = None


def set_persistent(on):
    os.environ[ENV] = "1" if on else "0"  # (unset = the default: persistent for tiles 64 / 128 up to 8k keys)


def both(call):
    res = {}
    for on in (False, True):
        set_persistent(on)
        res[on] = call()
        torch.cuda.synchronize()
    set_persistent(False)
    return res


def assert_bitwise(res):
    (out0, lse0), (out1, lse1) = res[False], res[True]
    assert not torch.isnan(out1).any(), "persistent: NaN in out"
    if not torch.equal(out0, out1):
        diff = (out0.float() - out1.float()).abs().max().item()
        raise AssertionError(f"out differs from the default kernel (max |diff| {diff:.3e})")
    same_lse = torch.equal(torch.nan_to_num(lse0, posinf=1e30), torch.nan_to_num(lse1, posinf=1e30))
    assert same_lse, "softmax_lse differs from the default kernel"


def check_dense(dtype, d, b, sq, sk, h, hk, causal, window=(-1, -1)):
    torch.manual_seed(sq * 7 + sk * 13 + d + h + b)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)

    def call():
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
        return out, lse

    res = both(call)
    assert_bitwise(res)
    if b * h * sq * sk <= 64 * 1024 * 1024:  # the fp32 reference fits comfortably
        out_ref, lse_ref = U.attention_ref(q, k, v, causal=causal, window_size=window, upcast=True)
        out_pt, _ = U.attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
        U.assert_close_to_ref("out[persistent]", res[True][0], out_ref, out_pt, U.OUT_SLACK)
        U.assert_lse_close(res[True][1], lse_ref, sq, sk, causal, window_size=window)


def check_varlen(dtype, d, seqlens_q, seqlens_k, h, hk, causal):
    torch.manual_seed(sum(seqlens_q) + 3 * sum(seqlens_k) + d)
    cu_q, cu_k = U.cu_seqlens(seqlens_q), U.cu_seqlens(seqlens_k)
    q = torch.randn(sum(seqlens_q), h, d, device="cuda", dtype=dtype)
    k = torch.randn(sum(seqlens_k), hk, d, device="cuda", dtype=dtype)
    v = torch.randn(sum(seqlens_k), hk, d, device="cuda", dtype=dtype)

    def call():
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                             return_attn_probs=True)
        return out, lse

    res = both(call)
    assert_bitwise(res)
    out, lse = res[True]
    for i, (sq, sk) in enumerate(zip(seqlens_q, seqlens_k)):
        if sq == 0:
            continue
        a, e = int(cu_q[i]), int(cu_k[i])
        qi, ki, vi = q[a:a + sq][None], k[e:e + sk][None], v[e:e + sk][None]
        out_ref, lse_ref = U.attention_ref(qi, ki, vi, causal=causal, upcast=True)
        out_pt, _ = U.attention_ref(qi, ki, vi, causal=causal, upcast=False)
        U.assert_close_to_ref(f"out seq{i}", out[a:a + sq][None], out_ref, out_pt, U.OUT_SLACK)
        U.assert_lse_close(lse[:, a:a + sq][None], lse_ref, sq, sk, causal)


def cases(headdims=(64, 128, 256), dtypes=(torch.bfloat16, torch.float16)):
    out = []
    for dtype in dtypes:
        dn = U.DTYPE_NAMES[dtype]
        for d in headdims:
            for causal in (False, True):
                for b, sq, sk, h, hk in ((2, 1, 1, 4, 2), (2, 113, 1023, 4, 2), (2, 1023, 113, 4, 2),
                                         (3, 777, 777, 5, 5), (1, 4096, 4096, 2, 1), (16, 512, 512, 16, 4)):
                    out.append((f"{dn} d{d} {'causal' if causal else 'full  '} b{b} h{h}/{hk} {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, b=b, sq=sq, sk=sk, h=h, hk=hk:
                                check_dense(dtype, d, b, sq, sk, h, hk, causal)))
    bf = torch.bfloat16
    if bf not in dtypes:
        return out
    extra = [
        ("bf16 d128 many tiles (b32 h32 s512: 4096 tiles)", lambda: check_dense(bf, 128, 32, 512, 512, 32, 8, True)),
        ("bf16 d64 fewer tiles than SMs (b1 h1 s1000)", lambda: check_dense(bf, 64, 1, 1000, 1000, 1, 1, False)),
        ("bf16 d128 sliding window (64, 16)", lambda: check_dense(bf, 128, 2, 600, 700, 4, 2, False, (64, 16))),
        ("bf16 d128 causal window (100, 0), sq > sk", lambda: check_dense(bf, 128, 2, 900, 600, 4, 4, True, (100, 0))),
        ("bf16 d128 window (0, 0) sq >> sk (tiles without work)",
         lambda: check_dense(bf, 128, 3, 2000, 150, 4, 2, False, (0, 0))),
        ("bf16 d112->tile 128", lambda: check_dense(bf, 112, 2, 300, 333, 4, 2, True)),
        ("fp16 d40->tile 64", lambda: check_dense(torch.float16, 40, 2, 257, 190, 2, 2, False)),
        ("varlen bf16 d128 causal gqa", lambda: check_varlen(bf, 128, [1, 17, 300, 129, 0, 2000], [5, 300, 17, 129, 3, 2000],
                                                             6, 2, True)),
        ("varlen fp16 d64 full", lambda: check_varlen(torch.float16, 64, [200, 1, 64, 0], [64, 200, 1, 9], 4, 4, False)),
        ("varlen bf16 d256 causal", lambda: check_varlen(bf, 256, [130, 7, 260, 1500], [260, 7, 130, 1500], 2, 2, True)),
    ]
    tile = {40: 64, 64: 64, 112: 128, 128: 128, 256: 256}
    names = {U.DTYPE_NAMES[dt] for dt in dtypes}
    for name, fn in extra:
        d = int(name.split(" d")[1].split()[0].split("-")[0])
        dn = "fp16" if "fp16" in name.split(" d")[0] else "bf16"
        if tile[d] in headdims and dn in names:
            out.append((name, fn))
    return out


def bench(headdims=(64, 128, 256)):
    from triton.testing import do_bench

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    print("\nbf16, 16k tokens, hidden 2048: TFLOP/s (4 B H S^2 D, halved for causal), default -> persistent "
          "(ratio) [SDPA cuDNN, same run]")
    for d in headdims:
        h = 2048 // d
        for causal in (False, True):
            cells = []
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                b = 16384 // s
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                row = []
                for on in (False, True):
                    set_persistent(on)
                    ms = do_bench(lambda: flash_attn_func(q, k, v, causal=causal), warmup=25, rep=100)
                    row.append(flops / ms / 1e9)
                set_persistent(False)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                try:
                    ms = do_bench(lambda: cudnn(qt, kt, vt, causal), warmup=25, rep=100)
                    ref = f"{flops / ms / 1e9:4.0f}"
                except RuntimeError:
                    ref = " n/a"
                cells.append(f"s{s}: {row[0]:4.0f} -> {row[1]:4.0f} ({row[1] / row[0]:.2f}x) [{ref}]")
            print(f"  d{d:<3} {'causal' if causal else 'full  '}  " + "  ".join(cells), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--headdims", default="64,128,256", help="head-dim tiles built (a developer build may have fewer)")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--case-timeout", type=float, default=30.0, help="seconds before a case counts as hung")
    args = ap.parse_args()
    headdims = tuple(int(x) for x in args.headdims.split(","))
    dtypes = tuple({"bf16": torch.bfloat16, "fp16": torch.float16}[x] for x in args.dtypes.split(","))
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    failed = 0
    watchdog = Watchdog(args.case_timeout)
    if not args.bench_only:
        for name, fn in cases(headdims, dtypes):
            try:
                watchdog.start(name)
                fn()
                watchdog.stop()
                print(f"PASS  {name}", flush=True)
            except Exception as e:  # noqa: BLE001 - report every case
                watchdog.stop()
                failed += 1
                print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc()
        print("ALL PASS" if failed == 0 else f"{failed} FAILED", flush=True)
    if not args.no_bench:
        bench(headdims)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
