#!/usr/bin/env python3
"""GPU self-check of the warp-specialised sm_90a backward (csrc/hopper/flash_bwd_ws_*; the
default for plain calls since session 8, FLASH_ATTN_BWD_WS=0 selects the lock-step kernel): head
dims 64 / 128 (and d < tile), fp16 / bf16, causal on / off, sliding window, seqlens 1 .. 4096
with seqlen_q != seqlen_k, GQA / MQA, strided q / k / v, varlen (with NaN rows past the last
sequence). Needs an H200 (sm_90) and a build with sm_90 in
FLASH_ATTN_CUDA_ARCHS.

Each case runs one forward, then the backward once per path from the same graph: FLASH_ATTN_BWD_WS=0
(the lock-step sm_90a kernel), =1 with FLASH_ATTN_BWD_WS_DQ=atomic (the WS draft; the variables
are read at each call), and =1 with each WS option and their combination (OPTIONS below:
FLASH_ATTN_BWD_WS_DQ=tma (the default), dQ through
shared memory + bulk reduce-add; FLASH_ATTN_BWD_WS_OVERLAP=1, dQ write-out deferred behind the next
block's S^T / dP^T GEMMs, d64 only: at d128 it runs the kernel without it). Every gradient must
pass the test suite's rule against the fp32 naive reference (max error <= 2 x the error of the same
naive attention in the input dtype + GRAD_SLACK; NaN / inf fail), and each WS path must agree with
the lock-step one: dK / dV closely (the same GEMMs in the same order per CTA: usually
bit-identical), dQ within the rule's bound (fp32 adds in another order). The profiler confirms
which kernel ran (the WS kernel for served calls, the lock-step one for the calls it declines, e.g.
deterministic).

Then times the backwards (lock-step, WS, WS + each option: a column each; bwd only, from a
retained graph) with triton.testing.do_bench at batch 2 x seqlen 8k (16k tokens), hidden 2048, bf16
and fp16, d64 / d128, causal on / off: TFLOP/s with bwd FLOPs = 2.5 x 4 B H S^2 D, halved for
causal; plus cuDNN (torch SDPA) where it runs.

    python scripts/check_bwd_ws.py              # PASS/FAIL per case, bench; exit 1 on any FAIL
    python scripts/check_bwd_ws.py --no-bench
    python scripts/check_bwd_ws.py --bench-only
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

ENV = "FLASH_ATTN_BWD_WS"
WS_KERNEL = "flash_bwd_ws_kernel_sm90"
OLD_KERNEL = "flash_bwd_kernel_sm90"
# Options of the WS backward, each run on top of FLASH_ATTN_BWD_WS=1: tag -> extra env vars.
OPTIONS = {
    "dq_tma": {"FLASH_ATTN_BWD_WS_DQ": "tma"},
    "dq_tma+m64": {"FLASH_ATTN_BWD_WS_DQ": "tma", "FLASH_ATTN_BWD_WS_M128": "0"},  # d64 only
    "overlap": {"FLASH_ATTN_BWD_WS_OVERLAP": "1"},  # d64 only (ignored at d128)
    "dq_tma+overlap": {"FLASH_ATTN_BWD_WS_DQ": "tma", "FLASH_ATTN_BWD_WS_OVERLAP": "1"},
}
OPTION_ENVS = sorted({k for env in OPTIONS.values() for k in env})
# The 64-row d64 kernel and the overlap kernels are A/B-only (FLASH_ATTN_AB_KERNELS=1 builds).
try:
    from flash_attn import _C as _ext  # noqa: E402

    if not _ext.ab_kernels_built():
        OPTIONS = {"dq_tma": OPTIONS["dq_tma"]}
except (ImportError, AttributeError):
    pass
# The launcher's fallback while the LSE boxes are not aligned in the kernel (csrc/hopper/
# flash_bwd_ws_launch_sm90.h): dense calls with seqlen_q % 4 != 0 and varlen calls run the lock-step
# kernel. False once the aligned-box fix (branch bwd-ws-align) is in.
LSE_ALIGN_GUARD = False


def ws_serves(sq=None, varlen=False):
    if not LSE_ALIGN_GUARD:
        return True
    return not varlen and sq % 4 == 0


# The paths each case runs: False = lock-step, True = WS draft, a tag = WS + that option.
PATHS = (False, True) + tuple(OPTIONS)


def path_tag(ws):
    return "old" if ws is False else "ws" if ws is True else f"ws+{ws}"


def set_ws(ws):
    """ws: False (FLASH_ATTN_BWD_WS=0), True (=1 with dQ atomics: the draft) or an OPTIONS tag."""
    for k in OPTION_ENVS:
        os.environ.pop(k, None)
    if ws is False:
        os.environ[ENV] = "0"  # the lock-step kernel
        return
    os.environ[ENV] = "1"
    if ws is True:
        os.environ["FLASH_ATTN_BWD_WS_DQ"] = "atomic"  # the draft (tma is the default since session 8)
    else:
        os.environ.update(OPTIONS[ws])


def bwd(out, inputs, dout, ws):
    set_ws(ws)
    try:
        grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)
        torch.cuda.synchronize()
    finally:
        set_ws(False)
    return grads


def cuda_kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()]


def assert_kernel(out, inputs, dout, ws, expect_ws):
    """The backward on path ws (see set_ws) ran the WS kernel iff expect_ws (and the lock-step
    sm_90a kernel otherwise)."""
    names = cuda_kernel_names(lambda: bwd(out, inputs, dout, ws))
    has_ws = any(WS_KERNEL in n for n in names)
    has_old = any(OLD_KERNEL in n and WS_KERNEL not in n for n in names)
    if expect_ws:
        assert has_ws and not has_old, f"expected the WS backward kernel, profiler saw: {[n for n in names if 'bwd' in n]}"
    else:
        assert not has_ws, f"expected no WS backward kernel, profiler saw: {[n for n in names if 'bwd' in n]}"


def compare_paths(name, old, ws, ref, pt, exact_bound_factor=0.25, tag="ws"):
    """old / ws / ref / pt: (dq, dk, dv). Returns a short note (dK / dV bit-identical or not)."""
    notes = []
    for i, g in enumerate(("dq", "dk", "dv")):
        pt_err = U.max_err(pt[i], ref[i])
        diff = U.max_err(ws[i], old[i])
        if g == "dq":  # fp32 adds in another order
            bound = 2 * pt_err + U.GRAD_SLACK
        else:  # the same GEMMs in the same order: equal or extremely close
            bound = exact_bound_factor * pt_err + 1e-6
            notes.append(f"{g} {'==' if torch.equal(ws[i], old[i]) else f'~{diff:.1e}'}")
        assert diff <= bound, f"{name}: {tag} vs old {g} differ by {diff:.3e} > {bound:.3e}"
    return ", ".join(notes)


def check_dense(dtype, d, b, sq, sk, h, hk, causal, window=(-1, -1), layout="contiguous", deterministic=False):
    torch.manual_seed(sq * 7 + sk * 13 + d + h)

    def make(s, heads):
        if layout == "strided":  # every other row of a twice-as-long tensor: row stride 2 h d
            t = torch.randn(b, 2 * s, heads, d, device="cuda", dtype=dtype)[:, ::2]
        elif layout == "bhsd":  # (b, h, s, d) storage viewed as (b, s, h, d)
            t = torch.randn(b, heads, s, d, device="cuda", dtype=dtype).transpose(1, 2)
        else:
            t = torch.randn(b, s, heads, d, device="cuda", dtype=dtype)
        return t.requires_grad_()

    q, k, v = make(sq, h), make(sk, hk), make(sk, hk)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=deterministic)
    (out_ref, _, *g_ref), (out_pt, *g_pt) = U.ref_fwd_bwd(q, k, v, dout, causal, window_size=window)
    U.assert_close_to_ref("out", out, out_ref, out_pt, U.OUT_SLACK)
    grads = {}
    for ws in PATHS:
        g = bwd(out, (q, k, v), dout, ws)
        tag = path_tag(ws)
        for i, n in enumerate(("dq", "dk", "dv")):
            U.assert_close_to_ref(f"{n}[{tag}]", g[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        grads[tag] = g
    if deterministic:
        # The WS kernel serves deterministic calls with the dQ bulk reduce-add (ordered per query
        # block, BwdWsDqOrder; the default, so "overlap" too) and declines them with atomics (the
        # lock-step sliced mode runs):
        # dK / dV as in compare_paths, dQ within the rule (another fixed summation order).
        notes = []
        for ws in PATHS[1:]:
            serves = ws is not True
            notes.append(f"{path_tag(ws)}: " + compare_paths("dense det", grads["old"], grads[path_tag(ws)], g_ref,
                                                             g_pt, tag=path_tag(ws)))
            assert_kernel(out, (q, k, v), dout, ws, expect_ws=serves)
        return "deterministic: " + "; ".join(notes)
    notes = [compare_paths("dense", grads["old"], grads[path_tag(ws)], g_ref, g_pt, tag=path_tag(ws))
             for ws in PATHS[1:]]
    # A silent fallback to the lock-step kernel would make the comparison above meaningless.
    for ws in PATHS[1:]:
        assert_kernel(out, (q, k, v), dout, ws, expect_ws=ws_serves(sq))
    return "; ".join(f"{path_tag(ws)}: {n}" for ws, n in zip(PATHS[1:], notes))


def check_varlen(dtype, d, seqlens_q, seqlens_k, h, hk, causal, nan_tail=0, window=(-1, -1)):
    """nan_tail: rows of NaN after the last sequence of q / k / v / dout (must not leak)."""
    torch.manual_seed(sum(seqlens_q) + 3 * sum(seqlens_k) + d)
    cu_q, cu_k = U.cu_seqlens(seqlens_q), U.cu_seqlens(seqlens_k)

    def make(rows, heads):
        t = torch.randn(rows + nan_tail, heads, d, device="cuda", dtype=dtype)
        t[rows:] = float("nan")
        return t

    q = make(sum(seqlens_q), h).requires_grad_()
    k = make(sum(seqlens_k), hk).requires_grad_()
    v = make(sum(seqlens_k), hk).requires_grad_()
    dout = make(sum(seqlens_q), h)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                 window_size=window)
    grads = {ws: bwd(out, (q, k, v), dout, ws) for ws in PATHS}
    notes = []
    for i, (sq, sk) in enumerate(zip(seqlens_q, seqlens_k)):
        a, e = int(cu_q[i]), int(cu_k[i])
        qi = q.detach()[a:a + sq][None].clone().requires_grad_()
        ki = k.detach()[e:e + sk][None].clone().requires_grad_()
        vi = v.detach()[e:e + sk][None].clone().requires_grad_()
        (_, _, *g_ref), (_, *g_pt) = U.ref_fwd_bwd(qi, ki, vi, dout[a:a + sq][None], causal, window_size=window)
        per = {}
        for ws in PATHS:
            dq, dk, dv = grads[ws]
            g = (dq[a:a + sq][None], dk[e:e + sk][None], dv[e:e + sk][None])
            tag = f"seq{i}[{path_tag(ws)}]"
            for j, n in enumerate(("dq", "dk", "dv")):
                U.assert_close_to_ref(f"{n} {tag}", g[j], g_ref[j], g_pt[j], U.GRAD_SLACK)
            per[ws] = g
        for ws in PATHS[1:]:
            notes.append(f"{path_tag(ws)}: " + compare_paths(f"seq{i}", per[False], per[ws], g_ref, g_pt,
                                                             tag=path_tag(ws)))
    for ws in PATHS[1:]:
        assert_kernel(out, (q, k, v), dout, ws, expect_ws=ws_serves(varlen=True))
    return "; ".join(sorted(set(notes)))


def check_env_values():
    """Unset, empty and '1' are the default (WS) path, '0' the lock-step kernel; anything else is
    an error."""
    q, k, v = (torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    out = flash_attn_func(q, k, v, causal=True)
    for value, expect_ws in ((None, True), ("", True), ("0", False)):
        if value is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = value
        try:
            names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        finally:
            os.environ.pop(ENV, None)
        has_ws = any(WS_KERNEL in n for n in names)
        has_old = any(OLD_KERNEL in n and WS_KERNEL not in n for n in names)
        assert has_ws == expect_ws and has_old != expect_ws, (
            f"{ENV}={value!r}: expected the {'WS' if expect_ws else 'lock-step'} kernel, "
            f"saw {[n for n in names if 'bwd' in n]}")
    assert_kernel(out, (q, k, v), dout, True, expect_ws=True)
    os.environ[ENV] = "2"
    try:
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        raise AssertionError(f"{ENV}=2 was accepted")
    except RuntimeError as e:  # FlashAttn errors derive from RuntimeError / ValueError
        assert ENV in str(e), f"unexpected error for {ENV}=2: {e}"
    except ValueError as e:
        assert ENV in str(e), f"unexpected error for {ENV}=2: {e}"
    finally:
        os.environ.pop(ENV, None)
    # The options: their default spellings run the WS draft, an unknown value is an error (with WS on).
    for var, default, bad in (("FLASH_ATTN_BWD_WS_DQ", "atomic", "smem"), ("FLASH_ATTN_BWD_WS_OVERLAP", "0", "2"),
                               ("FLASH_ATTN_BWD_WS_M128", "1", "2")):
        os.environ[ENV], os.environ[var] = "1", default  # (not through set_ws, which clears the options)
        try:
            names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        finally:
            os.environ.pop(ENV, None)
            os.environ.pop(var, None)
        assert any(WS_KERNEL in n for n in names), f"{var}={default}: expected the WS kernel, saw {names}"
        os.environ[ENV], os.environ[var] = "1", bad
        try:
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            raise AssertionError(f"{var}={bad} was accepted")
        except (RuntimeError, ValueError) as e:  # FlashAttn errors derive from RuntimeError / ValueError
            assert var in str(e), f"unexpected error for {var}={bad}: {e}"
        finally:
            os.environ.pop(ENV, None)
            os.environ.pop(var, None)
    return "unset / '' / '1' -> WS, '0' -> lock-step, '2' -> error; option values checked"


def cases():
    bf, fp = torch.bfloat16, torch.float16
    out = [("env var values", check_env_values)]
    sizes = ((1, 1), (17, 17), (113, 113), (1023, 1023), (4096, 4096), (113, 1023), (1023, 113), (1, 300),
             (300, 1), (17, 4096), (4096, 1023))
    for dtype in (bf, fp):
        dn = U.DTYPE_NAMES[dtype]
        for d in (64, 128):
            for causal in (False, True):
                for sq, sk in sizes:
                    big = max(sq, sk) >= 4096
                    b, h, hk = (1, 2, 1) if big else (2, 4, 2)
                    out.append((f"{dn} d{d} {'causal' if causal else 'full  '} {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, sq=sq, sk=sk, b=b, h=h, hk=hk:
                                check_dense(dtype, d, b, sq, sk, h, hk, causal)))
    out += [
        ("bf16 d128 MQA 8 heads 1 kv", lambda: check_dense(bf, 128, 2, 511, 777, 8, 1, True)),
        ("fp16 d64 GQA 6 heads 2 kv", lambda: check_dense(fp, 64, 2, 700, 500, 6, 2, False)),
        ("bf16 d128 sliding window (64, 16)", lambda: check_dense(bf, 128, 2, 600, 700, 4, 2, False, (64, 16))),
        ("bf16 d64 causal window (100, 0)", lambda: check_dense(bf, 64, 2, 700, 600, 4, 4, True, (100, 0))),
        ("fp16 d128 window (0, 200)", lambda: check_dense(fp, 128, 1, 900, 900, 2, 2, False, (0, 200))),
        ("bf16 d120 -> tile 128 (zero-padded cols)", lambda: check_dense(bf, 120, 2, 300, 333, 4, 2, True)),
        ("fp16 d40 -> tile 64", lambda: check_dense(fp, 40, 2, 257, 190, 2, 2, False)),
        ("bf16 d128 strided rows", lambda: check_dense(bf, 128, 2, 300, 300, 4, 2, True, layout="strided")),
        ("bf16 d64 (b,h,s,d) storage", lambda: check_dense(bf, 64, 2, 300, 400, 4, 4, False, layout="bhsd")),
        ("bf16 d128 deterministic (ordered dQ)", lambda: check_dense(bf, 128, 2, 513, 700, 4, 2, True,
                                                                    deterministic=True)),
        ("varlen bf16 d128 causal gqa", lambda: check_varlen(bf, 128, [1, 17, 300, 129], [5, 300, 17, 129], 6, 2,
                                                              True)),
        ("varlen fp16 d64 full", lambda: check_varlen(fp, 64, [200, 1, 64], [64, 200, 1], 4, 4, False)),
        ("varlen bf16 d64 long causal", lambda: check_varlen(bf, 64, [1023, 4096, 113], [4096, 1023, 113], 2, 1,
                                                              True)),
        ("varlen fp16 d128 window (50, 10)", lambda: check_varlen(fp, 128, [333, 65], [300, 129], 4, 2, False,
                                                                   window=(50, 10))),
        ("varlen bf16 d128 NaN rows past the last seq", lambda: check_varlen(bf, 128, [100, 33], [70, 45], 4, 2, False,
                                                                             nan_tail=200)),
        ("varlen fp16 d64 NaN rows past the last seq", lambda: check_varlen(fp, 64, [190, 5], [20, 77], 2, 2, True,
                                                                            nan_tail=150)),
    ]
    return out


def bench():
    from triton.testing import do_bench

    b, s, hidden = 2, 8192, 2048
    print(f"\nbackward only, batch {b}, seqlen {s}, hidden {hidden}: TFLOP/s (2.5 x 4 B H S^2 D, halved for causal)")
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            h = hidden // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            dout = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
            for causal in (False, True):
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                out = flash_attn_func(q, k, v, causal=causal)
                row = {}
                for ws in PATHS:
                    set_ws(ws)
                    try:
                        ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                      warmup=25, rep=200)
                    finally:
                        set_ws(False)
                    row[ws] = flops / ms / 1e9
                cudnn = bench_cudnn(q, k, v, dout, causal, flops)
                cols = "   ".join(f"{path_tag(ws)} {row[ws]:6.1f} ({row[ws] / row[False]:.3f}x)" for ws in PATHS[1:])
                print(f"  {U.DTYPE_NAMES[dtype]} d{d:<3} {'causal' if causal else 'full  '}  "
                      f"old {row[False]:6.1f}   {cols}   cuDNN {cudnn}", flush=True)
                del out


def bench_cudnn(q, k, v, dout, causal, flops):
    """cuDNN's backward (torch SDPA, cuDNN backend) on the same problem, TFLOP/s, or a reason."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from triton.testing import do_bench

        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dt = dout.transpose(1, 2)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            ms = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True), warmup=25, rep=200)
        return f"{flops / ms / 1e9:6.1f}"
    except Exception as e:  # noqa: BLE001  (informational only)
        return f"n/a ({type(e).__name__})"


def run_cases(case_list):
    ok = True
    for name, fn in case_list:
        t0 = time.time()
        try:
            note = fn()
            print("PASS  %-48s %6.2fs  %s" % (name, time.time() - t0, note or ""), flush=True)
        except Exception as e:  # noqa: BLE001
            ok = False
            print("FAIL  %-48s %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""),
                  flush=True)
            traceback.print_exc(limit=3)
        finally:
            set_ws(False)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_bwd_ws: no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        sys.exit(f"check_bwd_ws: needs an sm_90 device (H100 / H200), got {torch.cuda.get_device_name()}")
    ok = True
    if not args.bench_only:
        ok = run_cases(cases())
    if not args.no_bench:
        bench()
    print("ALL PASS" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
