#!/usr/bin/env python3
"""GPU self-check (about a minute on an H200) of the warp-specialised sm_90a forward
(FLASH_ATTN_FWD_WS=1, csrc/hopper/flash_fwd_ws_*): head dims 64 / 128 / 256 (and d < tile),
fp16 / bf16, causal on / off, sliding window, seqlens 1 .. 8192 with seqlen_q != seqlen_k, GQA / MQA,
non-contiguous strides and varlen. Each case runs FLASH_ATTN_FWD_WS=1 and =0 and checks both
against the fp32 reference with the test suite's rule (max error <= 2 x the PyTorch low-precision
error + tiny slack; LSE atol 2e-3; +inf LSE and zero output for rows without a visible key; NaN
fails), and that the two kernels agree closely. Then times both at bf16 seqlen 8k (batch 2,
hidden 2048) with triton.testing.do_bench.

Feature variant (the WS kernel's kFeat instantiations, *_feat.cu): softcap, ALiBi (per-head and
per-batch slopes) and dropout, dense / GQA / causal / sliding window / varlen, d64 / d128 / d256.
Dropout runs both paths with the same seed (torch.manual_seed before each call: same rng_state)
and checks each against the reference built from the Philox model (fa_test_utils.dropout_keep_ref),
WS against old (out and LSE), and - "mask" cases - the mask itself bit for bit: with a one-hot V
chunk (v[j0 + c, :, c] = 1) out[i, c] = P[i, j0 + c] * keep / (1 - p) is nonzero iff the element
is kept (small Q keeps every visible P > 0), compared with the model on every visible element.
The bench adds dropout 0.1 and ALiBi vs plain, forward and forward + backward, for both paths.

    python scripts/check_fwd_ws.py            # PASS/FAIL per case, exit status 1 on any FAIL
    python scripts/check_fwd_ws.py --no-bench
    python scripts/check_fwd_ws.py --bench-only
    python scripts/check_fwd_ws.py --feat-only [--no-bench]   # feature cases (+ feature bench)
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
    cu_q, cu_k = U.cu_seqlens(seqlens_q), U.cu_seqlens(seqlens_k)

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


# ---- feature variant -------------------------------------------------------------------------

def _slopes(kind, b, h):
    """ALiBi slopes: None, per head (h,) or per batch and head (b, h), fp32."""
    if kind is None:
        return None
    shape = (h,) if kind == "head" else (b, h)
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 0.5 + 0.05).contiguous()


def _window_args(causal, window):
    wl, wr = window
    return wl, (0 if causal else wr)


def fwd_feat(q, k, v, causal, window=(-1, -1), softcap=0.0, alibi=None, p=0.0, ws=True, seed=1234):
    """out, lse, (seed, offset) of one forward through the op (no S_dmask: the WS kernel serves it)."""
    set_ws(ws)
    torch.manual_seed(seed)  # same seed -> same rng_state -> same mask in both paths
    wl, wr = _window_args(causal, window)
    out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(
        q, k, v, p, q.shape[-1] ** -0.5, causal, wl, wr, softcap, alibi, False)
    torch.cuda.synchronize()
    return out, lse, tuple(rng.tolist())


def fwd_feat_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, alibi=None, p=0.0, ws=True, seed=1234):
    set_ws(ws)
    torch.manual_seed(seed)
    out, lse, _, rng = torch.ops.flash_attn._flash_attn_varlen_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, p, q.shape[-1] ** -0.5, causal, -1, 0 if causal else -1, 0.0, alibi,
        False)
    torch.cuda.synchronize()
    return out, lse, tuple(rng.tolist())


def _assert_ws_matches_old(res, out_pt, out_ref, sq, sk, causal, window=(-1, -1)):
    """Same mask and features -> the two kernels differ only by accumulation order."""
    (o_ws, l_ws), (o_old, l_old) = res["ws"][:2], res["old"][:2]
    diff = U.max_err(o_ws, o_old)
    bound = 2 * U.max_err(out_pt, out_ref) + 1e-3
    assert diff <= bound, f"ws vs old out differ by {diff:.3e} > {bound:.3e}"
    rows = U.visible_rows(sq, sk, causal, device=l_ws.device, window_size=window)
    if rows.any():
        ldiff = (l_ws[..., rows] - l_old[..., rows]).abs().max().item()
        assert ldiff <= 1e-3, f"ws vs old lse differ by {ldiff:.3e} on visible rows"
    if not rows.all():
        assert torch.equal(l_ws[..., ~rows], l_old[..., ~rows]), "ws vs old lse differ on rows without keys"


def check_feat_dense(dtype, d, b, sq, sk, h, hk, causal, window=(-1, -1), softcap=0.0, alibi=None, p=0.0):
    torch.manual_seed(sq * 7 + sk * 13 + d + h + int(p * 100))
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    slopes = _slopes(alibi, b, h)
    res = {}
    for ws in (True, False):
        res["ws" if ws else "old"] = fwd_feat(q, k, v, causal, window, softcap, slopes, p, ws=ws)
    assert res["ws"][2] == res["old"][2], f"rng_state differs: {res['ws'][2]} vs {res['old'][2]}"
    feats = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    if p > 0:
        seed, offset = res["ws"][2]
        feats.update(dropout_p=p, dropout_mask=U.dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda())
    out_ref, lse_ref = U.attention_ref(q, k, v, causal=causal, upcast=True, **feats)
    out_pt, _ = U.attention_ref(q, k, v, causal=causal, upcast=False, **feats)
    for tag, (out, lse, _) in res.items():
        U.assert_close_to_ref(f"out[{tag}]", out, out_ref, out_pt, U.OUT_SLACK)
        U.assert_lse_close(lse, lse_ref, sq, sk, causal, window_size=window)
    _assert_ws_matches_old(res, out_pt, out_ref, sq, sk, causal, window)


def check_dropout_mask(dtype, d, b, sq, sk, h, hk, causal, window=(-1, -1), p=0.17, alibi=None, paths=(True, False)):
    """The kept set of every visible element, bit for bit, against the Philox model (see the top)."""
    torch.manual_seed(sq + sk + d)
    q = 0.05 * torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    slopes = _slopes(alibi, b, h)
    if slopes is not None:  # small: every visible P must stay far from underflow
        slopes = slopes * 0.02
    visible = U.local_visible(sq, sk, window, causal, device="cuda")
    if visible is None:
        visible = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    ref = None
    for ws in paths:
        for j0 in range(0, sk, d):
            n = min(d, sk - j0)
            v = torch.zeros(b, sk, hk, d, device="cuda", dtype=dtype)
            v[:, j0:j0 + n, :, :n] = torch.eye(n, device="cuda", dtype=dtype)[:, None, :]  # v[j0 + c, :, c] = 1
            out, _, (seed, offset) = fwd_feat(q, k, v, causal, window, 0.0, slopes, p, ws=ws)
            if ref is None:
                ref = U.dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()
            kept = (out[..., :n] != 0).permute(0, 2, 1, 3)  # (b, h, sq, n)
            vis = visible[:, j0:j0 + n].expand_as(kept)
            want = ref[..., j0:j0 + n]
            bad = (kept != want) & vis
            assert not bad.any(), (
                f"[{'ws' if ws else 'old'}] dropout mask differs from the Philox model at "
                f"{bad.sum().item()} of {vis.sum().item()} visible elements of keys {j0}..{j0 + n - 1}, "
                f"first (b, h, row, key - {j0}) = {tuple(bad.nonzero()[0].tolist())}")


def check_feat_varlen(dtype, d, seqlens_q, seqlens_k, h, hk, causal, alibi=None, p=0.0):
    torch.manual_seed(sum(seqlens_q) + 3 * sum(seqlens_k) + d + int(p * 100))
    nb = len(seqlens_q)
    cu_q, cu_k = U.cu_seqlens(seqlens_q), U.cu_seqlens(seqlens_k)
    q = torch.randn(sum(seqlens_q), h, d, device="cuda", dtype=dtype)
    k = torch.randn(sum(seqlens_k), hk, d, device="cuda", dtype=dtype)
    v = torch.randn(sum(seqlens_k), hk, d, device="cuda", dtype=dtype)
    slopes = _slopes(alibi, nb, h)
    res = {}
    for ws in (True, False):
        res[ws] = fwd_feat_varlen(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal, slopes, p, ws=ws)
    assert res[True][2] == res[False][2], "rng_state differs"
    mask = None
    if p > 0:
        seed, offset = res[True][2]
        mask = U.dropout_keep_ref(seed, offset, nb, h, max(seqlens_q), max(seqlens_k), p).cuda()
    for i, (sq, sk) in enumerate(zip(seqlens_q, seqlens_k)):
        a, e = int(cu_q[i]), int(cu_k[i])
        qi, ki, vi = q[a:a + sq][None], k[e:e + sk][None], v[e:e + sk][None]
        feats = {}
        if slopes is not None:
            feats["alibi_slopes"] = slopes if slopes.dim() == 1 else slopes[i:i + 1]
        if p > 0:
            feats.update(dropout_p=p, dropout_mask=mask[i:i + 1, :, :sq, :sk])
        out_ref, lse_ref = U.attention_ref(qi, ki, vi, causal=causal, upcast=True, **feats)
        out_pt, _ = U.attention_ref(qi, ki, vi, causal=causal, upcast=False, **feats)
        per = {}
        for ws in (True, False):
            out, lse, _ = res[ws]
            tag = f"seq{i}[{'ws' if ws else 'old'}]"
            o, l_ = out[a:a + sq][None], lse[:, a:a + sq][None]
            U.assert_close_to_ref(f"out {tag}", o, out_ref, out_pt, U.OUT_SLACK)
            U.assert_lse_close(l_, lse_ref, sq, sk, causal)
            per["ws" if ws else "old"] = (o, l_)
        _assert_ws_matches_old(per, out_pt, out_ref, sq, sk, causal)


def feat_cases():
    bf, fp = torch.bfloat16, torch.float16
    out = []
    # Every head dim x dtype x causal: softcap, ALiBi per head, ALiBi per batch, dropout.
    for dtype in (bf, fp):
        dn = U.DTYPE_NAMES[dtype]
        for d in (64, 128, 256):
            for causal in (False, True):
                cs = "causal" if causal else "full  "
                for sq, sk in ((113, 1023), (1023, 1023), (300, 77)):
                    out.append((f"feat {dn} d{d} {cs} softcap {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, sq=sq, sk=sk:
                                check_feat_dense(dtype, d, 2, sq, sk, 4, 2, causal, softcap=30.0)))
                    out.append((f"feat {dn} d{d} {cs} alibi/head {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, sq=sq, sk=sk:
                                check_feat_dense(dtype, d, 2, sq, sk, 4, 2, causal, alibi="head")))
                    out.append((f"feat {dn} d{d} {cs} dropout 0.17 {sq}x{sk}",
                                lambda dtype=dtype, d=d, causal=causal, sq=sq, sk=sk:
                                check_feat_dense(dtype, d, 2, sq, sk, 4, 2, causal, p=0.17)))
                out.append((f"feat {dn} d{d} {cs} alibi/batch 257x400",
                            lambda dtype=dtype, d=d, causal=causal:
                            check_feat_dense(dtype, d, 3, 257, 400, 4, 4, causal, alibi="batch")))
                out.append((f"feat {dn} d{d} {cs} alibi/head + dropout 0.1",
                            lambda dtype=dtype, d=d, causal=causal:
                            check_feat_dense(dtype, d, 2, 400, 600, 4, 2, causal, alibi="head", p=0.1)))
    for d in (64, 128, 256):
        out += [
            (f"feat bf16 d{d} softcap + alibi/batch, window (64, 16)",
             lambda d=d: check_feat_dense(bf, d, 2, 600, 700, 4, 2, False, (64, 16), softcap=20.0, alibi="batch")),
            (f"feat bf16 d{d} dropout, window (100, 0)",
             lambda d=d: check_feat_dense(bf, d, 2, 700, 600, 4, 4, True, (100, 0), p=0.2)),
            (f"feat bf16 d{d} dropout, window (70, 30)",
             lambda d=d: check_feat_dense(bf, d, 2, 500, 500, 4, 2, False, (70, 30), p=0.3)),
            (f"feat bf16 d{d} MQA 8 heads 1 kv, dropout + alibi",
             lambda d=d: check_feat_dense(bf, d, 2, 511, 777, 8, 1, True, alibi="head", p=0.1)),
            (f"feat bf16 d{d} seq 1x1 / 1x300 dropout",
             lambda d=d: (check_feat_dense(bf, d, 2, 1, 1, 2, 2, False, p=0.5),
                          check_feat_dense(bf, d, 2, 1, 300, 2, 2, True, p=0.5))),
            # The mask itself, bit for bit (several 128-key groups; d256 runs 64-key tiles in pairs,
            # d128 128-key tiles instead of 176, d64 three 64-row warpgroups).
            (f"mask bf16 d{d} full 300x520 gqa",
             lambda d=d: check_dropout_mask(bf, d, 2, 300, 520, 4, 2, False)),
            (f"mask fp16 d{d} causal 520x300",
             lambda d=d: check_dropout_mask(fp, d, 1, 520, 300, 2, 1, True, p=0.5)),
            (f"mask bf16 d{d} window (90, 40) 400x400 + alibi",
             lambda d=d: check_dropout_mask(bf, d, 1, 400, 400, 2, 2, False, (90, 40), alibi="head")),
            (f"varlen feat bf16 d{d} causal gqa dropout",
             lambda d=d: check_feat_varlen(bf, d, [1, 17, 300, 129], [5, 300, 17, 129], 6, 2, True, p=0.17)),
            (f"varlen feat bf16 d{d} full alibi/batch + dropout",
             lambda d=d: check_feat_varlen(bf, d, [200, 1, 64, 333], [64, 200, 1, 500], 4, 4, False, alibi="batch",
                                           p=0.1)),
            (f"varlen feat fp16 d{d} causal alibi/head",
             lambda d=d: check_feat_varlen(fp, d, [130, 7, 260], [260, 7, 130], 2, 2, True, alibi="head")),
        ]
    out += [
        ("feat bf16 d128 8192 causal dropout 0.1", lambda: check_feat_dense(bf, 128, 1, 8192, 8192, 2, 2, True, p=0.1)),
        ("feat bf16 d64 4096 full alibi + dropout", lambda: check_feat_dense(bf, 64, 1, 4096, 4096, 2, 1, False,
                                                                            alibi="head", p=0.1)),
        ("feat bf16 d256 4096 causal dropout 0.1", lambda: check_feat_dense(bf, 256, 1, 4096, 4096, 1, 1, True, p=0.1)),
        ("feat bf16 d96->tile 128 softcap", lambda: check_feat_dense(bf, 120, 2, 300, 333, 4, 2, True, softcap=10.0)),
        ("feat bf16 d200->tile 256 dropout", lambda: check_feat_dense(bf, 200, 2, 257, 300, 2, 1, True, p=0.2)),
        ("mask bf16 d40->tile 64 full 200x700", lambda: check_dropout_mask(bf, 40, 1, 200, 700, 2, 2, False)),
    ]
    return out


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


def bench_feat():
    """Dropout 0.1 / ALiBi cost vs plain, per path (old = FLASH_ATTN_FWD_WS=0, ws = 1)."""
    from triton.testing import do_bench

    b, s, hidden = 2, 8192, 2048
    print("\nbf16 seqlen 8k, batch 2, hidden 2048: ms, and x plain of the same path")
    for d in (64, 128, 256):
        h = hidden // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        slopes = _slopes("head", b, h)
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                row = {}
                for ws in (False, True):
                    set_ws(ws)
                    for name, kw in (("plain", {}), ("dropout 0.1", dict(dropout_p=0.1)),
                                     ("alibi", dict(alibi_slopes=slopes))):
                        if mode == "fwd":
                            def fn(kw=kw):
                                with torch.no_grad():
                                    flash_attn_func(q, k, v, causal=causal, **kw)
                        else:
                            def fn(kw=kw):
                                out = flash_attn_func(q, k, v, causal=causal, **kw)
                                torch.autograd.grad(out, (q, k, v), dout)
                        row[(ws, name)] = do_bench(fn, warmup=10, rep=100)
                cells = []
                for ws in (False, True):
                    base = row[(ws, "plain")]
                    cells.append(f"{'ws ' if ws else 'old'} plain {base:7.3f}  " + "  ".join(
                        f"{n} {row[(ws, n)]:7.3f} ({row[(ws, n)] / base:.2f}x)" for n in ("dropout 0.1", "alibi")))
                print(f"  d{d:<3} {'causal' if causal else 'full  '} {mode:7}  " + "   |   ".join(cells), flush=True)
    set_ws(False)


def run_cases(case_list):
    ok = True
    for name, fn in case_list:
        t0 = time.time()
        try:
            fn()
            print("PASS  %-52s %6.2fs" % (name, time.time() - t0), flush=True)
        except Exception as e:  # noqa: BLE001
            ok = False
            print("FAIL  %-52s %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""),
                  flush=True)
            traceback.print_exc(limit=2)
    set_ws(False)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--feat-only", action="store_true", help="only the feature-variant cases / bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_fwd_ws: no CUDA device")
    ok = True
    if not args.bench_only:
        if not args.feat_only:
            ok = run_cases(cases()) and ok
        ok = run_cases(feat_cases()) and ok
    if not args.no_bench:
        if not args.feat_only:
            bench()
        bench_feat()
    print("ALL PASS" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
