"""GPU tests of the variable-length and KV-cache functions against per-sequence naive attention.

Error rule (as tests/test_flash_attn.py, with the brief's factors): out within 2x and gradients
within 3x of the low-precision naive error against the fp32 naive reference, plus tiny slack.
Wide sweeps are marked slow (FLASH_ATTN_TEST_FULL=1).
"""

import math
import re

import pytest
import torch

from flash_attn import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flash_attn.layers.rotary import apply_rotary_emb_torch

from fa_test_utils import (DTYPE_NAMES, dropout_keep_ref, max_err, require_config, require_gpu,
                           window_size_form, window_size_forms)

pytestmark = pytest.mark.gpu

OUT_SLACK = 1e-5
GRAD_SLACK = 1e-4


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------


def visible_mask(sq, sk, causal, window, device):
    """(sq, sk) bool: query i sees key j (bottom-right aligned causal / window)."""
    wl, wr = window
    if causal:
        wr = 0
    row = torch.arange(sq, device=device).view(-1, 1)
    col = torch.arange(sk, device=device).view(1, -1)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wr >= 0:
        vis &= col <= row + sk - sq + wr
    if wl >= 0:
        vis &= col >= row + sk - sq - wl
    return vis


def attn_ref_one(q, k, v, causal, window, scale, upcast, softcap=0.0, alibi=None, dropout_p=0.0,
                 dropout_mask=None):
    """q (sq, h, d), k/v (sk, hk, d) -> out (sq, h, d) in q's dtype, lse (h, sq) fp32.

    Features as fa_test_utils.attention_ref: softcap * tanh(score / softcap), the ALiBi bias
    -alibi[h] * |i + sk - sq - j| (alibi: (h,) fp32 slopes of this sequence), and dropout with
    dropout_mask (h, sq, sk) bool, True = kept (kept probabilities scaled by 1 / (1 - p))."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    h, hk = q.shape[1], k.shape[1]
    if h != hk:
        k = k.repeat_interleave(h // hk, dim=1)
        v = v.repeat_interleave(h // hk, dim=1)
    sq, sk = q.shape[0], k.shape[0]
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi is not None:
        row = torch.arange(sq, device=q.device).view(-1, 1)
        col = torch.arange(sk, device=q.device).view(1, -1)
        dist = (row + sk - sq - col).abs().float()
        scores = scores + (-alibi.float().view(h, 1, 1) * dist).to(scores.dtype)
    vis = visible_mask(sq, sk, causal, window, q.device)
    row_ok = vis.any(-1)  # (sq,)
    scores = scores.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1).masked_fill(~row_ok, float("inf"))
    scores = torch.where(row_ok.view(1, -1, 1), scores, torch.zeros_like(scores))
    attn = torch.softmax(scores, dim=-1) * row_ok.view(1, -1, 1).to(scores.dtype)
    if dropout_mask is not None:
        attn = attn.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("hts,shd->thd", attn.to(v.dtype), v)
    return out.to(dtype), lse


def _slopes_of(alibi_slopes, b, h):
    """The (h,) slopes of sequence b from (h,) or (batch, h) alibi_slopes (None passes)."""
    if alibi_slopes is None:
        return None
    return alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]


def varlen_ref(q, k, v, cu_q, cu_k, causal, window, scale, upcast, softcap=0.0,
               alibi_slopes=None, dropout_p=0.0, dropout_masks=None):
    """Packed q (total_q, h, d), k/v (total_k, hk, d); rows past cu_q[-1] -> 0.
    dropout_masks: per sequence, (h, seqlen_q_b, seqlen_k_b) bool keep-masks."""
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        o, l = attn_ref_one(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal,
                            window, scale, upcast, softcap, _slopes_of(alibi_slopes, b, q.shape[1]),
                            dropout_p, None if dropout_masks is None else dropout_masks[b])
        outs.append(o)
        lses.append(l)
    tail = q.shape[0] - cq[-1]
    outs.append(torch.zeros(tail, q.shape[1], v.shape[2], dtype=q.dtype, device=q.device))
    lses.append(torch.full((q.shape[1], tail), float("inf"), device=q.device))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def assert_close(name, ours, ref, ref_lp, factor, slack):
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(ours).all(), f"{name} has NaN/inf"
    err, pt = max_err(ours, ref), max_err(ref_lp, ref)
    assert err <= factor * pt + slack, (
        f"{name}: max err {err:.3e} > {factor} x {pt:.3e} (low-precision reference) + {slack:.0e}"
    )


def lengths_for(mode, max_len, batch, gen=None):
    if mode == "full":
        return [max_len] * batch
    if mode == "random":
        return torch.randint(max(1, max_len - 20), max_len + 1, (batch,)).tolist()
    if mode == "third":
        return torch.randint(max_len // 3, max_len + 1, (batch,)).tolist()
    if mode == "edge":  # zero-length and length-1 sequences among normal ones
        base = [0, 1, max_len, 0, 1, max_len // 2 + 1, 3]
        return (base * (batch // len(base) + 1))[:batch]
    raise ValueError(mode)


def cu_from(lengths, device="cuda"):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return cu.to(device)


# ---------------------------------------------------------------------------------------
# Varlen
# ---------------------------------------------------------------------------------------

LAYOUTS = [(4, 4), (6, 2), (4, 1)]  # (nheads, nheads_k)
MODES = ["full", "random", "third", "edge"]
MASKS = [("full", False, (-1, -1)), ("causal", True, (-1, -1)), ("local", False, (32, 7)),
         ("causal-local", True, (48, -1))]


def _varlen_cases(full):
    cases = []
    i = 0
    for dtype in (torch.float16, torch.bfloat16):
        for d in ((32, 59, 64, 96, 128, 192, 256) if full else (59, 64, 128)):
            for sq, sk in ((257, 257), (113, 203), (128, 64)) if full else ((257, 257), (113, 203)):
                for mode in MODES:
                    for mask in MASKS:
                        layouts = LAYOUTS if full else [LAYOUTS[i % len(LAYOUTS)]]
                        for h, hk in layouts:
                            i += 1
                            if not full and i % 3 != 0:
                                continue
                            cases.append(pytest.param(
                                dtype, d, sq, sk, mode, mask, h, hk,
                                id=f"{DTYPE_NAMES[dtype]}-d{d}-sq{sq}-sk{sk}-{mode}-{mask[0]}-h{h}x{hk}"))
    return cases


def _check_varlen_result(q, k, v, cu_q, cu_k, lq, lk, causal, window, scale, out, lse, dout,
                         grads, **feats):
    """out, lse and grads = (dq, dk, dv) of a varlen call against the fp32 reference (within the
    slack of the low-precision reference), zeros / +inf on the rows past cu_seqlens[-1]."""
    dq, dk, dv = grads
    out_ref, lse_ref = varlen_ref(q, k, v, cu_q, cu_k, causal, window, scale, True, **feats)
    g_ref = torch.autograd.grad(out_ref, (q, k, v), dout)
    out_lp, _ = varlen_ref(q, k, v, cu_q, cu_k, causal, window, scale, False, **feats)
    g_lp = torch.autograd.grad(out_lp, (q, k, v), dout)
    assert_close("out", out, out_ref, out_lp, 2, OUT_SLACK)
    n = sum(lq)
    assert (out[n:] == 0).all(), "rows past cu_seqlens_q[-1] must be zero"
    assert torch.isposinf(lse[:, n:]).all(), "lse rows past cu_seqlens_q[-1] must be +inf"
    fin = torch.isfinite(lse_ref[:, :n])
    assert torch.equal(fin, torch.isfinite(lse[:, :n])), "lse: +inf exactly on rows without keys"
    torch.testing.assert_close(lse[:, :n][fin], lse_ref[:, :n][fin], atol=2e-3, rtol=1e-3)
    for name, g, gr, gl in zip(("dq", "dk", "dv"), (dq, dk, dv), g_ref, g_lp):
        assert_close(name, g, gr, gl, 3, GRAD_SLACK)
    assert (dq[n:] == 0).all() and (dk[sum(lk):] == 0).all() and (dv[sum(lk):] == 0).all(), \
        "gradient rows past cu_seqlens[-1] must be zero"


def _run_varlen(dtype, d, max_sq, max_sk, mode, mask, h, hk, batch=5, tail=3, use_sm90=True):
    ext = require_config(dtype, d)
    _, causal, window = mask
    lq = lengths_for(mode, max_sq, batch)
    lk = lq if max_sq == max_sk else lengths_for(mode, max_sk, batch)
    if mode == "edge":
        lk = [x if x > 0 else 0 for x in lengths_for(mode, max_sk, batch)]
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    tq, tk = sum(lq) + tail, sum(lk) + tail
    q = torch.randn(tq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(tk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(tk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    ext.set_sm90_kernels(use_sm90)
    try:
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                             window_size=window, return_attn_probs=True)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        ext.set_sm90_kernels(True)
    _check_varlen_result(q, k, v, cu_q, cu_k, lq, lk, causal, window, d ** -0.5, out, lse, dout,
                         (dq, dk, dv))


@pytest.mark.parametrize("dtype, d, sq, sk, mode, mask, h, hk", _varlen_cases(False))
def test_varlen_output(dtype, d, sq, sk, mode, mask, h, hk):
    _run_varlen(dtype, d, sq, sk, mode, mask, h, hk)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, d, sq, sk, mode, mask, h, hk", _varlen_cases(True))
def test_varlen_output_full(dtype, d, sq, sk, mode, mask, h, hk):
    _run_varlen(dtype, d, sq, sk, mode, mask, h, hk)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_sm80_kernels(d, causal):
    """The SM80-class forward on an sm_90 device (the sm_90a one is the default there)."""
    _run_varlen(torch.bfloat16, d, 300, 300, "third", ("m", causal, (-1, -1)), 4, 2,
                use_sm90=False)


def test_varlen_long_sequences():
    _run_varlen(torch.bfloat16, 128, 2100, 2100, "third", ("causal", True, (-1, -1)), 2, 1,
                batch=3)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_qkvpacked_and_kvpacked(causal):
    require_config(torch.float16, 64)
    lens = [17, 0, 130, 1, 64]
    cu = cu_from(lens)
    t = sum(lens)
    qkv = torch.randn(t, 3, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=causal)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out_ref, _ = varlen_ref(q, k, v, cu, cu, causal, (-1, -1), 64 ** -0.5, True)
    (g_ref,) = torch.autograd.grad(out_ref, qkv, dout)
    out_lp, _ = varlen_ref(q, k, v, cu, cu, causal, (-1, -1), 64 ** -0.5, False)
    (g_lp,) = torch.autograd.grad(out_lp, qkv, dout)
    assert_close("out", out, out_ref, out_lp, 2, OUT_SLACK)
    assert_close("dqkv", dqkv, g_ref, g_lp, 3, GRAD_SLACK)

    q2 = torch.randn(t, 6, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    kv = torch.randn(t, 2, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    out = flash_attn_varlen_kvpacked_func(q2, kv, cu, cu, max(lens), max(lens), causal=causal)
    dq, dkv = torch.autograd.grad(out, (q2, kv), dout[:, :1].expand(-1, 6, -1).contiguous())
    out_ref, _ = varlen_ref(q2, kv[:, 0], kv[:, 1], cu, cu, causal, (-1, -1), 64 ** -0.5, True)
    g_ref = torch.autograd.grad(out_ref, (q2, kv), dout[:, :1].expand(-1, 6, -1).contiguous())
    out_lp, _ = varlen_ref(q2, kv[:, 0], kv[:, 1], cu, cu, causal, (-1, -1), 64 ** -0.5, False)
    g_lp = torch.autograd.grad(out_lp, (q2, kv), dout[:, :1].expand(-1, 6, -1).contiguous())
    assert_close("out", out, out_ref, out_lp, 2, OUT_SLACK)
    assert_close("dq", dq, g_ref[0], g_lp[0], 3, GRAD_SLACK)
    assert_close("dkv", dkv, g_ref[1], g_lp[1], 3, GRAD_SLACK)


def test_varlen_all_empty_and_seqused_leftpad():
    ext = require_config(torch.bfloat16, 128)
    import flash_attn.flash_attn_interface as fi

    # Every sequence empty: zeros, no hang.
    q = torch.randn(4, 2, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, q, q, cu, cu, 0, 0)
    assert (out == 0).all()
    # seqused_k / leftpad_k through the private op: keys [leftpad, seqused) of each sequence.
    lq, lk = [5, 9], [40, 70]
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    q = torch.randn(sum(lq), 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lk), 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqused = torch.tensor([31, 70], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([3, 10], dtype=torch.int32, device="cuda")
    out, lse, _, _ = fi._wrapped_flash_attn_varlen_forward(
        q, k, v, cu_q, cu_k, 9, 70, 0.0, 128 ** -0.5, True, leftpad_k=leftpad, seqused_k=seqused)
    for b in range(2):
        kb = k[cu_k[b] + leftpad[b]: cu_k[b] + seqused[b]]
        vb = v[cu_k[b] + leftpad[b]: cu_k[b] + seqused[b]]
        qb = q[cu_q[b]:cu_q[b + 1]]
        ref, _ = attn_ref_one(qb, kb, vb, True, (-1, -1), 128 ** -0.5, True)
        lp, _ = attn_ref_one(qb, kb, vb, True, (-1, -1), 128 ** -0.5, False)
        assert_close(f"out[{b}]", out[cu_q[b]:cu_q[b + 1]], ref, lp, 2, OUT_SLACK)


def _paged_inputs(lq, lk, h, hk, d, page):
    """bf16 q (sum(lq), h, d), paged k and v (3 pages to spare) and a shuffled block_table."""
    q = torch.randn(sum(lq), h, d, device="cuda", dtype=torch.bfloat16)
    nblk = math.ceil(max(lk) / page)
    num_blocks = len(lk) * nblk + 3
    k_pages = torch.randn(num_blocks, page, hk, d, device="cuda", dtype=torch.bfloat16)
    v_pages = torch.randn_like(k_pages)
    block_table = torch.randperm(num_blocks, device="cuda")[: len(lk) * nblk].view(len(lk), nblk)
    return q, k_pages, v_pages, block_table.to(torch.int32)


@pytest.mark.parametrize("page", [16, 48, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_paged(page, causal):
    require_config(torch.bfloat16, 128)
    lq, lk = [1, 37, 0, 200], [300, 37, 5, 513]
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    h, hk, d = 8, 2, 128
    q, k_pages, v_pages, block_table = _paged_inputs(lq, lk, h, hk, d, page)
    out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                 block_table=block_table)
    k_dense = torch.cat([k_pages[block_table[b].long()].reshape(-1, hk, d)[: lk[b]] for b in range(4)])
    v_dense = torch.cat([v_pages[block_table[b].long()].reshape(-1, hk, d)[: lk[b]] for b in range(4)])
    ref, _ = varlen_ref(q, k_dense, v_dense, cu_q, cu_k, causal, (-1, -1), d ** -0.5, True)
    lp, _ = varlen_ref(q, k_dense, v_dense, cu_q, cu_k, causal, (-1, -1), d ** -0.5, False)
    assert_close("out", out, ref, lp, 2, OUT_SLACK)


def test_varlen_torch_compile():
    require_config(torch.float16, 64)
    lens = [10, 33, 1]
    cu = cu_from(lens)
    q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)

    def f(q):
        return flash_attn_varlen_func(q, q, q, cu, cu, 33, 33, causal=True).sum()

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q), f(q))


# ---------------------------------------------------------------------------------------
# Varlen features: softcap, ALiBi, dropout (keep-mask from S_dmask), deterministic backward
# ---------------------------------------------------------------------------------------


def _alibi_slopes(kind, b, h, device="cuda"):
    if kind is None:
        return None
    shape = (h,) if kind == "h" else (b, h)
    return (torch.rand(*shape, device=device, dtype=torch.float32) * 0.5).contiguous()


def _mask_from_s_dmask(S_dmask, lq, lk):
    """Per sequence (h, lq[b], lk[b]) keep-masks: kept iff the S_dmask entry is not negative
    (sign bit, so -0.0 counts as dropped). Entries the kernel never visits (masked keys) read
    as kept; the reference gives them probability 0 anyway."""
    return [~torch.signbit(S_dmask[b, :, :lq[b], :lk[b]]) for b in range(len(lq))]


def _run_varlen_feat(dtype, d, lq, lk, h, hk, causal=False, window=(-1, -1), softcap=0.0,
                     alibi=None, dropout_p=0.0, deterministic=False, variant="func", tail=3,
                     reruns=5, softmax_scale=None):
    require_config(dtype, d)
    if variant == "qkvpacked":
        lk, hk = lq, h
    b = len(lq)
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    max_q, max_k = max(lq), max(lk)
    q = torch.randn(sum(lq) + tail, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lk) + tail, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lk) + tail, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    slopes = _alibi_slopes(alibi, b, h)
    kw = dict(dropout_p=dropout_p, causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=slopes, deterministic=deterministic, return_attn_probs=True,
              softmax_scale=softmax_scale)
    if variant == "func":
        leaves = (q, k, v)
        out, lse, S_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)
    elif variant == "qkvpacked":
        leaves = (torch.stack([q, k, v], 1).detach().requires_grad_(),)
        out, lse, S_dmask = flash_attn_varlen_qkvpacked_func(leaves[0], cu_q, max_q, **kw)
    else:
        leaves = (q, torch.stack([k, v], 1).detach().requires_grad_())
        out, lse, S_dmask = flash_attn_varlen_kvpacked_func(q, leaves[1], cu_q, cu_k, max_q,
                                                            max_k, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout, retain_graph=deterministic)
    if deterministic:
        for _ in range(reruns):
            again = torch.autograd.grad(out, leaves, dout, retain_graph=True)
            for a, r in zip(again, grads):
                assert torch.equal(a, r), "gradients differ between deterministic runs"
    if variant == "qkvpacked":
        dq, dk, dv = grads[0].unbind(1)
    elif variant == "kvpacked":
        dq, (dk, dv) = grads[0], grads[1].unbind(1)
    else:
        dq, dk, dv = grads

    feats = dict(softcap=softcap, alibi_slopes=slopes)
    if dropout_p > 0:
        r = lambda x: (x + 127) // 128 * 128  # noqa: E731
        assert S_dmask.shape == (b, h, r(max_q), r(max_k)), S_dmask.shape
        assert S_dmask.dtype == dtype
        feats.update(dropout_p=dropout_p, dropout_masks=_mask_from_s_dmask(S_dmask, lq, lk))
    else:
        assert S_dmask.numel() == 0
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    _check_varlen_result(q, k, v, cu_q, cu_k, lq, lk, causal, window, scale, out, lse, dout,
                         (dq, dk, dv), **feats)


# (lq, lk, h, hk, d, dtype): zero-length and length-1 sequences, odd lengths, odd head dim,
# GQA / MQA, seqlen_q > seqlen_k in a sequence.
FEAT_SHAPES = [
    ([0, 1, 130, 77, 3], [5, 0, 130, 200, 1], 4, 4, 64, torch.bfloat16),
    ([257, 113, 1], [257, 113, 1], 6, 2, 59, torch.float16),
    ([64, 200, 0, 31], [300, 17, 9, 31], 4, 1, 128, torch.bfloat16),
]
FEATS = [
    ("softcap", dict(softcap=5.0)),
    ("softcap-causal-local", dict(softcap=30.0, causal=True, window=(40, -1))),
    ("alibi-h", dict(alibi="h")),
    ("alibi-bh-causal", dict(alibi="bh", causal=True)),
    ("dropout", dict(dropout_p=0.17)),
    ("dropout-causal-alibi", dict(dropout_p=0.3, causal=True, alibi="h")),
    ("deterministic", dict(deterministic=True)),
    ("det-causal-dropout-alibi", dict(deterministic=True, causal=True, dropout_p=0.1, alibi="bh")),
    ("det-softcap-alibi-local", dict(softcap=8.0, alibi="bh", window=(50, 10), deterministic=True)),
]


def _feat_cases():
    cases = []
    for name, feat in FEATS:
        for i, (lq, lk, h, hk, d, dtype) in enumerate(FEAT_SHAPES):
            cases.append(pytest.param(lq, lk, h, hk, d, dtype, feat,
                                      id=f"{name}-shape{i}-{DTYPE_NAMES[dtype]}-d{d}-h{h}x{hk}"))
    return cases


@pytest.mark.parametrize("lq, lk, h, hk, d, dtype, feat", _feat_cases())
def test_varlen_features(lq, lk, h, hk, d, dtype, feat):
    _run_varlen_feat(dtype, d, lq, lk, h, hk, **feat)


@pytest.mark.parametrize("variant, feat", [
    ("qkvpacked", dict(dropout_p=0.2, deterministic=True, causal=True)),
    ("qkvpacked", dict(softcap=10.0, alibi="h")),
    ("kvpacked", dict(alibi="bh", softcap=6.0, window=(30, 30))),
    ("kvpacked", dict(dropout_p=0.25, alibi="h", deterministic=True)),
])
def test_varlen_features_packed(variant, feat):
    _run_varlen_feat(torch.bfloat16, 64, [17, 0, 130, 1, 64], [40, 3, 100, 1, 64], 6, 2,
                     variant=variant, **feat)


def _feat_full_cases():
    cases = []
    lengths = [([0, 1, 130, 77, 3], [5, 0, 130, 200, 1]), ([257, 113, 1], [257, 113, 1]),
               ([300, 31, 128], [129, 400, 128])]
    for name, feat in FEATS:
        for dtype in (torch.float16, torch.bfloat16):
            for d in (32, 59, 96, 128, 192, 256):
                for j, (lq, lk) in enumerate(lengths):
                    for h, hk in LAYOUTS:
                        cases.append(pytest.param(
                            lq, lk, h, hk, d, dtype, feat,
                            id=f"{name}-{DTYPE_NAMES[dtype]}-d{d}-len{j}-h{h}x{hk}"))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("lq, lk, h, hk, d, dtype, feat", _feat_full_cases())
def test_varlen_features_full(lq, lk, h, hk, d, dtype, feat):
    _run_varlen_feat(dtype, d, lq, lk, h, hk, **feat)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_dropout_mask_matches_philox_model(causal):
    """S_dmask's signs are the documented Philox mask of rng_state's (seed, offset), with each
    sequence's own (row, column) and (batch, head) as the dense path's."""
    require_config(torch.bfloat16, 64)
    import flash_attn.flash_attn_interface as fi

    lq, lk = [77, 0, 200, 5], [150, 7, 130, 5]
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    h, p = 4, 0.3
    q = torch.randn(sum(lq), h, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lk), 2, 64, device="cuda", dtype=torch.bfloat16)
    _, _, S_dmask, rng_state = fi._wrapped_flash_attn_varlen_forward(
        q, k, k, cu_q, cu_k, max(lq), max(lk), p, 0.125, causal, return_softmax=True)
    seed, offset = rng_state.tolist()
    assert (seed, offset) != (0, 0)
    ref = dropout_keep_ref(seed, offset, len(lq), h, max(lq), max(lk), p).cuda()
    for b, got in enumerate(_mask_from_s_dmask(S_dmask, lq, lk)):
        vis = visible_mask(lq[b], lk[b], causal, (-1, -1), "cuda").expand_as(got)
        want = ref[b, :, :lq[b], :lk[b]]
        assert torch.equal(got[vis], want[vis]), f"dropout mask of sequence {b}"
    # a new call draws a new offset; the same generator state gives the same result
    _, _, _, rng2 = fi._wrapped_flash_attn_varlen_forward(
        q, k, k, cu_q, cu_k, max(lq), max(lk), p, 0.125, causal, return_softmax=True)
    assert rng2.tolist() != rng_state.tolist()
    torch.manual_seed(7)
    a = flash_attn_varlen_func(q, k, k, cu_q, cu_k, max(lq), max(lk), dropout_p=p)
    torch.manual_seed(7)
    b_ = flash_attn_varlen_func(q, k, k, cu_q, cu_k, max(lq), max(lk), dropout_p=p)
    assert torch.equal(a, b_)


@pytest.mark.parametrize("feat", [dict(softcap=12.0), dict(alibi="bh", causal=True),
                                  dict(alibi="h", softcap=5.0, window=(100, 0))],
                         ids=["softcap", "alibi-bh-causal", "alibi-softcap-local"])
def test_varlen_paged_features(feat):
    """Paged varlen runs the split-KV kernel: its softcap / ALiBi (kMod) variant."""
    require_config(torch.bfloat16, 128)
    lq, lk = [1, 37, 0, 200], [300, 37, 5, 513]
    cu_q, cu_k = cu_from(lq), cu_from(lk)
    h, hk, d, page = 8, 2, 128, 48
    q, k_pages, v_pages, block_table = _paged_inputs(lq, lk, h, hk, d, page)
    slopes = _alibi_slopes(feat.get("alibi"), len(lq), h)
    softcap, causal = feat.get("softcap", 0.0), feat.get("causal", False)
    window = feat.get("window", (-1, -1))
    out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                 window_size=window, softcap=softcap, alibi_slopes=slopes,
                                 block_table=block_table)
    k_dense = torch.cat([k_pages[block_table[b].long()].reshape(-1, hk, d)[: lk[b]] for b in range(4)])
    v_dense = torch.cat([v_pages[block_table[b].long()].reshape(-1, hk, d)[: lk[b]] for b in range(4)])
    feats = dict(softcap=softcap, alibi_slopes=slopes)
    ref, _ = varlen_ref(q, k_dense, v_dense, cu_q, cu_k, causal, window, d ** -0.5, True, **feats)
    lp, _ = varlen_ref(q, k_dense, v_dense, cu_q, cu_k, causal, window, d ** -0.5, False, **feats)
    assert_close("out", out, ref, lp, 2, OUT_SLACK)


# ---------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------


def _rotary_ref(x, cos, sin, pos, interleaved):
    """x (b, s, h, d) rotated at integer positions pos (b, s), computed in fp32 (as the
    implementation does) and rounded once, so the appended cache can be checked exactly."""
    y = apply_rotary_emb_torch(x.float(), cos.float()[pos], sin.float()[pos], interleaved=interleaved)
    return y.to(x.dtype)


def _run_kvcache(dtype=torch.bfloat16, d=128, b=3, sq=1, seqlen_cache=300, h=8, hk=2,
                 new_kv=True, seqlen_new=None, rotary_fraction=0.0, interleaved=False,
                 page=None, leftpad=False, batch_idx=False, num_splits=0, causal=False,
                 window=(-1, -1), check_lse=True, device="cuda", softcap=0.0, alibi=None,
                 softmax_scale=None):
    if device == "cuda":
        require_config(dtype, d)
    dev = device
    seqlen_new = (sq if seqlen_new is None else seqlen_new) if new_kv else 0
    b_cache = b + 2 if batch_idx else b
    k_dense = torch.randn(b_cache, seqlen_cache, hk, d, device=dev, dtype=dtype)
    v_dense = torch.randn_like(k_dense)
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    slopes = _alibi_slopes(alibi, b, h, dev)
    k_new = torch.randn(b, seqlen_new, hk, d, device=dev, dtype=dtype) if new_kv else None
    v_new = torch.randn_like(k_new) if new_kv else None
    lo = 0 if new_kv else 1
    cache_seqlens = torch.randint(lo, seqlen_cache - seqlen_new + 1, (b,), device=dev,
                                  dtype=torch.int32)
    cache_leftpad = None
    if leftpad:
        cache_leftpad = torch.stack([torch.randint(0, int(s) + 1, (), device=dev)
                                     for s in cache_seqlens]).to(torch.int32)
    cache_batch_idx = (torch.randperm(b_cache, device=dev)[:b].to(torch.int32) if batch_idx
                       else None)
    rotary_dim = int(rotary_fraction * d) // 16 * 16
    cos = sin = None
    if rotary_dim > 0:
        seqlen_ro = seqlen_cache if page is None else math.ceil(seqlen_cache / page) * page
        angle = torch.rand(seqlen_ro, rotary_dim // 2, device=dev) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)

    # Reference cache after the append (dense, indexed by cache entry).
    bidx = cache_batch_idx.long() if batch_idx else torch.arange(b, device=dev)
    k_ref_cache, v_ref_cache = k_dense.clone(), v_dense.clone()
    q_ro = q
    if new_kv:
        pos = cache_seqlens.long().unsqueeze(1) + torch.arange(seqlen_new, device=dev)
        k_ro = _rotary_ref(k_new, cos, sin, pos, interleaved) if rotary_dim else k_new
        for i in range(b):
            s0 = int(cache_seqlens[i])
            k_ref_cache[bidx[i], s0:s0 + seqlen_new] = k_ro[i]
            v_ref_cache[bidx[i], s0:s0 + seqlen_new] = v_new[i]
        if rotary_dim:
            local = causal or window != (-1, -1)
            qpos = (cache_seqlens.long().unsqueeze(1) + torch.arange(sq, device=dev)) if local \
                else cache_seqlens.long().unsqueeze(1).expand(b, sq)
            q_ro = _rotary_ref(q, cos, sin, qpos, interleaved)

    # The cache handed to the kernel: dense or paged copies of k_dense / v_dense.
    block_table = None
    if page is not None:
        assert not batch_idx
        nblk = math.ceil(seqlen_cache / page)
        num_blocks = b * nblk + 2
        block_table = torch.randperm(num_blocks, device=dev)[: b * nblk].view(b, nblk).to(torch.int32)
        k_cache = torch.randn(num_blocks, page, hk, d, device=dev, dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        pad = nblk * page - seqlen_cache
        kd = torch.nn.functional.pad(k_dense, (0, 0, 0, 0, 0, pad))
        vd = torch.nn.functional.pad(v_dense, (0, 0, 0, 0, 0, pad))
        k_cache[block_table.long().flatten()] = kd.reshape(b * nblk, page, hk, d)
        v_cache[block_table.long().flatten()] = vd.reshape(b * nblk, page, hk, d)
    else:
        k_cache, v_cache = k_dense.clone(), v_dense.clone()

    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        block_table=block_table, causal=causal, window_size=window, softcap=softcap,
        alibi_slopes=slopes, rotary_interleaved=interleaved, num_splits=num_splits,
        softmax_scale=softmax_scale, return_softmax_lse=True)

    # The appended cache, exactly.
    if page is not None:
        got_k = k_cache[block_table.long()].reshape(b, -1, hk, d)[:, :seqlen_cache]
        got_v = v_cache[block_table.long()].reshape(b, -1, hk, d)[:, :seqlen_cache]
        assert torch.equal(got_k, k_ref_cache[bidx]) and torch.equal(got_v, v_ref_cache[bidx])
    else:
        assert torch.equal(k_cache, k_ref_cache) and torch.equal(v_cache, v_ref_cache)

    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    for i in range(b):
        lo_k = int(cache_leftpad[i]) if leftpad else 0
        hi_k = int(cache_seqlens[i]) + seqlen_new
        kb, vb = k_ref_cache[bidx[i], lo_k:hi_k], v_ref_cache[bidx[i], lo_k:hi_k]
        feats = dict(softcap=softcap, alibi=_slopes_of(slopes, i, h))
        ref, lse_ref = attn_ref_one(q_ro[i], kb, vb, causal and sq > 1, window, scale, True, **feats)
        lp, _ = attn_ref_one(q_ro[i], kb, vb, causal and sq > 1, window, scale, False, **feats)
        assert_close(f"out[{i}]", out[i], ref, lp, 2, OUT_SLACK)
        if check_lse:
            fin = torch.isfinite(lse_ref)
            assert torch.equal(fin, torch.isfinite(lse[i])), "lse +inf pattern"
            torch.testing.assert_close(lse[i][fin], lse_ref[fin], atol=2e-3, rtol=1e-3)


KV_CASES = [
    # (name, kwargs)
    ("decode-gqa", dict(sq=1, h=32, hk=8)),
    ("decode-mqa-split3", dict(sq=1, h=8, hk=1, num_splits=3)),
    ("decode-mha-nosplit", dict(sq=1, h=4, hk=4, num_splits=1)),
    ("noappend", dict(new_kv=False, sq=1)),
    ("noappend-sq5-causal", dict(new_kv=False, sq=5, causal=True)),
    ("append-sq4-causal", dict(sq=4, causal=True)),
    ("append-new3-sq1", dict(sq=1, seqlen_new=3)),
    ("rotary-half", dict(sq=2, rotary_fraction=0.5, causal=True)),
    ("rotary-full-interleaved", dict(sq=1, rotary_fraction=1.0, interleaved=True)),
    ("rotary-noncausal-sq3", dict(sq=3, rotary_fraction=1.0)),
    ("paged16", dict(sq=1, page=16, h=32, hk=8)),
    ("paged64-causal-sq4", dict(sq=4, page=64, causal=True)),
    ("paged256-split3", dict(sq=1, page=256, num_splits=3, seqlen_cache=700)),
    ("paged48-rotary", dict(sq=2, page=48, rotary_fraction=0.5, causal=True)),
    ("leftpad", dict(sq=1, leftpad=True)),
    ("leftpad-paged", dict(sq=3, leftpad=True, page=32, causal=True)),
    ("batch-idx", dict(sq=1, batch_idx=True)),
    ("batch-idx-causal", dict(sq=4, batch_idx=True, causal=True, num_splits=2)),
    ("local", dict(sq=3, window=(40, 0))),
    ("local-split", dict(sq=1, window=(64, -1), num_splits=4)),
    ("prefill-kernel", dict(sq=100, causal=True, h=4, hk=4)),
    ("prefill-kernel-leftpad-idx", dict(sq=80, causal=True, leftpad=True, batch_idx=True)),
    ("fp16-d64", dict(dtype=torch.float16, d=64, sq=1)),
    ("d59-padded", dict(d=59, sq=1, h=4, hk=2, new_kv=False)),
    ("d256", dict(d=256, sq=2, causal=True)),
    # softcap / ALiBi: the split-KV kernel's kMod variant (GQA-packed rows: per-head slopes) and
    # the prefill feature kernels.
    ("decode-gqa-softcap", dict(sq=1, h=32, hk=8, softcap=10.0)),
    ("decode-gqa-alibi-bh-split3", dict(sq=1, h=32, hk=8, alibi="bh", num_splits=3)),
    ("decode-alibi-h-paged16", dict(sq=1, page=16, alibi="h")),
    ("append-sq4-causal-alibi-softcap", dict(sq=4, causal=True, alibi="bh", softcap=20.0)),
    ("leftpad-alibi-causal", dict(sq=2, leftpad=True, alibi="h", causal=True)),
    ("local-split-alibi", dict(sq=1, window=(64, -1), num_splits=4, alibi="h")),
    ("prefill-kernel-alibi-softcap", dict(sq=100, causal=True, h=4, hk=4, alibi="bh", softcap=15.0)),
    ("prefill-leftpad-idx-alibi", dict(sq=80, causal=True, leftpad=True, batch_idx=True, alibi="h")),
    ("d59-softcap-alibi", dict(d=59, sq=3, h=4, hk=2, softcap=7.0, alibi="bh", causal=True)),
]


@pytest.mark.parametrize("name, kw", KV_CASES, ids=[c[0] for c in KV_CASES])
def test_kvcache(name, kw):
    _run_kvcache(**kw)


def _kv_full_cases():
    cases = []
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128, 256):
            for sq, new in ((1, True), (1, False), (4, True), (65, True)):
                for page in (None, 16, 64, 256):
                    for h, hk in ((8, 8), (8, 2), (8, 1)):
                        for causal in (False, True):
                            for splits in (1, 0, 3):
                                i = len(cases)
                                # every third case with softcap / ALiBi
                                mod = [{}, dict(softcap=10.0), dict(alibi="bh")][i % 3]
                                cases.append(pytest.param(
                                    dict(dtype=dtype, d=d, sq=sq, new_kv=new, page=page, h=h,
                                         hk=hk, causal=causal, num_splits=splits,
                                         rotary_fraction=0.5 if new else 0.0,
                                         leftpad=page is None and sq == 4, **mod),
                                    id=f"{DTYPE_NAMES[dtype]}-d{d}-sq{sq}-new{int(new)}-p{page}-"
                                       f"h{h}x{hk}-c{int(causal)}-s{splits}"
                                       + "".join(f"-{k}{v}" for k, v in mod.items())))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("kw", _kv_full_cases())
def test_kvcache_full(kw):
    _run_kvcache(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("seqlen_cache", [32 * 1024, 128 * 1024 + 5])
@pytest.mark.parametrize("page", [None, 16])
def test_kvcache_long_context(seqlen_cache, page):
    _run_kvcache(sq=1, b=1, h=32, hk=8, seqlen_cache=seqlen_cache, page=page)


def test_kvcache_int_cache_seqlens_and_compile():
    require_config(torch.bfloat16, 128)
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    k = torch.randn(2, 1, 2, 128, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k, k, cache_seqlens=10)
    out2 = flash_attn_with_kvcache(
        q, kc.clone(), vc.clone(), k, k,
        cache_seqlens=torch.full((2,), 10, dtype=torch.int32, device="cuda"))
    torch.testing.assert_close(out, out2, atol=0, rtol=0)

    def step(q, kc, vc, k, seqlens):
        return flash_attn_with_kvcache(q, kc, vc, k, k, cache_seqlens=seqlens, causal=True)

    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    seqlens = torch.full((2,), 10, dtype=torch.int32, device="cuda")
    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(q, kc1, vc1, k, seqlens), step(q, kc2, vc2, k, seqlens))
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)


def test_kvcache_many_splits_fill_gpu():
    """1 query token against a long cache: the split heuristic kicks in and matches no split."""
    require_gpu()
    require_config(torch.bfloat16, 128)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(1, 20000, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    a = flash_attn_with_kvcache(q, kc, vc, num_splits=0)
    b = flash_attn_with_kvcache(q, kc, vc, num_splits=1)
    c = flash_attn_with_kvcache(q, kc, vc, num_splits=57)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(c, b, atol=2e-3, rtol=1e-2)


# The combine step: lse of up to 128 splits in 4 registers per lane, partials loaded 8 splits at a
# time, a programmatic dependent launch on sm_90. Split counts across the register / chunk boundaries, head dims with 2, 3, 4 and 8 columns per
# lane, sequences whose tail splits are empty (seqused shorter than the cache), against the reference.
@pytest.mark.parametrize("num_splits", [2, 9, 33, 128])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_kvcache_combine_split_counts(d, num_splits):
    _run_kvcache(d=d, b=2, sq=1, h=8, hk=2, seqlen_cache=16 * 1024 + 17, num_splits=num_splits)


# The sm_90a bulk-copy decode kernel: the paged calls that the CTA-schedule kernel does not take
# (head dim 64, cache_leftpad, pages that are not a power of two), tail / empty-split corners.
# Off sm_90, or for head dims other than 64 / 128, the SM80-class kernel serves them.
SM90_DECODE_CASES = [c for c in KV_CASES if c[1].get("page") is not None] + [
    ("d64-paged16-gqa", dict(dtype=torch.float16, d=64, sq=1, page=16, h=32, hk=8)),
    ("d64-paged16-splits64-mostly-empty", dict(d=64, sq=1, page=16, h=32, hk=8, seqlen_cache=200, num_splits=64)),
    ("paged16-leftpad-split5", dict(sq=1, page=16, leftpad=True, num_splits=5, seqlen_cache=1000)),
    ("paged48-gqa-causal-sq4", dict(sq=4, page=48, h=32, hk=8, causal=True, seqlen_cache=3000)),
    ("fp16-d128-paged48-split-heuristic", dict(dtype=torch.float16, sq=1, b=2, h=32, hk=8, page=48,
                                                seqlen_cache=9000)),
]


@pytest.mark.parametrize("name, kw", SM90_DECODE_CASES, ids=[c[0] for c in SM90_DECODE_CASES])
def test_kvcache_paged_decode_cases(name, kw):
    _run_kvcache(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("seqlen_cache", [32 * 1024, 128 * 1024 + 5])
@pytest.mark.parametrize("page", [None, 16, 48])
def test_kvcache_decode_long_context(seqlen_cache, page):
    _run_kvcache(sq=1, b=1, h=32, hk=8, seqlen_cache=seqlen_cache, page=page)


# The d128 split-KV decode with cuDNN's schedule (64-key CTA tiles, 4 warps, 3 buffers, K and V
# together): contiguous caches without softcap / ALiBi take it; the paged / softcap / ALiBi cases
# here check that those calls still run the wide kernel.
CTA_CASES = [c for c in KV_CASES if c[0] in (
    "decode-gqa", "decode-mqa-split3", "decode-mha-nosplit", "noappend", "noappend-sq5-causal", "append-sq4-causal",
    "append-new3-sq1", "rotary-half", "leftpad", "batch-idx-causal", "local", "local-split", "paged16",
    "decode-gqa-softcap", "decode-gqa-alibi-bh-split3")]


@pytest.mark.parametrize("name, kw", CTA_CASES, ids=[c[0] for c in CTA_CASES])
def test_kvcache_decode_cta(name, kw):
    _run_kvcache(**kw)


@pytest.mark.parametrize("seqlen_cache, num_splits", [(1, 0), (17, 1), (113, 0), (1023, 3), (5000, 0), (32 * 1024 + 5, 0)])
def test_kvcache_decode_cta_lengths(seqlen_cache, num_splits):
    _run_kvcache(sq=1, b=2, h=32, hk=8, seqlen_cache=seqlen_cache, new_kv=seqlen_cache > 1, num_splits=num_splits)


# Paged d128 decode across page sizes (power-of-two pages without cache_leftpad: the CTA-schedule
# kernel; 48-token pages and left padding: the sm_90a bulk-copy kernel), cache lengths around tile
# and page boundaries, left padding (pages then start mid-chunk) and split counts.
@pytest.mark.parametrize("page", [16, 32, 64, 256, 48])
@pytest.mark.parametrize("seqlen_cache, num_splits, leftpad", [(1, 0, False), (17, 1, True), (113, 0, False),
                                                               (1023, 3, True), (5000, 0, False),
                                                               (32 * 1024 + 5, 0, True), (32 * 1024 + 5, 0, False)])
def test_kvcache_decode_paged_lengths(page, seqlen_cache, num_splits, leftpad):
    _run_kvcache(sq=1, b=2, h=32, hk=8, seqlen_cache=seqlen_cache, page=page, leftpad=leftpad,
                 new_kv=seqlen_cache > 1, num_splits=num_splits)


# Varlen through the d64 WS backward on 128-row query blocks (dq_accum's 128 padding rows per
# sequence hold a whole last block).
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mask", MASKS, ids=[m[0] for m in MASKS])
def test_varlen_backward_m128(mode, mask):
    _run_varlen(torch.bfloat16, 64, 257, 300, mode, mask, 6, 2)
@pytest.fixture
def strict_checks():
    """The value checks of CUDA index tensors on (flash_attn.set_strict_checks; off by default)."""
    import flash_attn

    prev = flash_attn.set_strict_checks(True)
    yield
    flash_attn.set_strict_checks(prev)


# ---------------------------------------------------------------------------------------
# softmax_scale of any sign; window_size forms; value checks that leave the caches unchanged
# and the CUDA context usable (issue: bad values used to poison it).
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("softmax_scale", [0.0, -0.3, 0.3])
@pytest.mark.parametrize("feat", [dict(), dict(causal=True), dict(window=(32, 0)),
                                  dict(softcap=5.0, causal=True), dict(alibi="bh"),
                                  dict(alibi="h", softcap=8.0, window=(40, 8))],
                         ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()) or "plain")
def test_varlen_softmax_scale_any_finite_value(feat, softmax_scale):
    lq, lk, h, hk, d, dtype = FEAT_SHAPES[0]
    _run_varlen_feat(dtype, d, lq, lk, h, hk, softmax_scale=softmax_scale, **feat)


@pytest.mark.parametrize("softmax_scale", [0.0, -0.4])
@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked"])
def test_varlen_softmax_scale_packed(variant, softmax_scale):
    lq, lk, h, hk, d, dtype = FEAT_SHAPES[1]
    _run_varlen_feat(dtype, d, lq, lk, h, hk, causal=True, variant=variant,
                     softmax_scale=softmax_scale)


@pytest.mark.parametrize("softmax_scale", [0.0, -0.3, 0.3])
@pytest.mark.parametrize("name, kw", [
    ("decode-gqa", dict(sq=1, h=32, hk=8)),
    ("append-sq4-causal", dict(sq=4, causal=True)),
    ("paged16-softcap", dict(sq=1, page=16, softcap=10.0)),
    ("local-split-alibi", dict(sq=1, window=(64, -1), num_splits=4, alibi="h")),
    ("prefill-kernel-alibi-softcap", dict(sq=100, causal=True, h=4, hk=4, alibi="bh", softcap=15.0)),
    ("d59-leftpad", dict(d=59, sq=3, h=4, hk=2, leftpad=True, causal=True)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_kvcache_softmax_scale_any_finite_value(name, kw, softmax_scale):
    _run_kvcache(softmax_scale=softmax_scale, **kw)


@window_size_forms(40, 0)
def test_window_size_tensor_on_varlen_and_kvcache(window):
    """Upstream's tests pass window_size as a 2-element tensor; the same result as the tuple."""
    require_config(torch.bfloat16, 64)
    window = window_size_form(window, 40, 0)
    cu = cu_from([50, 70])
    q, k = [torch.randn(120, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    a = flash_attn_varlen_func(q, k, k, cu, cu, 70, 70, causal=True, window_size=window)
    b = flash_attn_varlen_func(q, k, k, cu, cu, 70, 70, causal=True, window_size=(40, 0))
    assert torch.equal(a, b)
    qd = torch.randn(2, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.bfloat16)
    a = flash_attn_with_kvcache(qd, kc, kc, window_size=window, causal=True)
    b = flash_attn_with_kvcache(qd, kc, kc, window_size=(40, 0), causal=True)
    assert torch.equal(a, b)


def _i32c(*xs):
    return torch.tensor(xs, dtype=torch.int32, device="cuda")


@pytest.fixture(params=["strict", "device"])
def check_mode(request):
    """Where the index values are checked: on the host at the call (strict checks on), or by
    the device-side guard (the default), whose error the next check_index_errors raises."""
    import flash_attn

    prev = flash_attn.set_strict_checks(request.param == "strict")
    yield request.param
    flash_attn.set_strict_checks(prev)


def _expect_rejected(call, name, mode, errors=(ValueError,)):
    """call() is rejected with an error naming `name`: at the call (strict checks, or a check
    that always runs on the host), or, in device mode, by check_index_errors afterwards."""
    import flash_attn

    pattern = rf"\b{name}\b"
    if mode == "strict":
        with pytest.raises(errors, match=pattern):
            call()
        return
    try:
        call()
    except errors as e:  # host-side argument checks (ints, layouts) run in both modes
        assert re.search(pattern, str(e)), str(e)
        return
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=pattern):
        flash_attn.check_index_errors()
    flash_attn.check_index_errors()  # taken: nothing pending


KV_BAD_GPU = [
    ("seqlens+new past the cache", dict(cache_seqlens="OVER_NEW"), "cache_seqlens"),
    ("int seqlens+new past the cache", dict(cache_seqlens=64), "cache_seqlens"),
    ("seqlens past the cache, no new", dict(cache_seqlens="OVER", new=False), "cache_seqlens"),
    ("negative seqlens", dict(cache_seqlens="NEG"), "cache_seqlens"),
    ("batch_idx past the batch", dict(cache_batch_idx="OVER"), "cache_batch_idx"),
    ("negative batch_idx", dict(cache_batch_idx="NEG"), "cache_batch_idx"),
    ("leftpad > seqlens", dict(cache_leftpad="OVER"), "cache_leftpad"),
    ("negative leftpad", dict(cache_leftpad="NEG"), "cache_leftpad"),
    ("negative seqlens, no new", dict(cache_seqlens="NEG", new=False), "cache_seqlens"),
    ("batch_idx past the batch, no new", dict(cache_batch_idx="OVER", new=False), "cache_batch_idx"),
    ("negative batch_idx, no new", dict(cache_batch_idx="NEG", new=False), "cache_batch_idx"),
    ("leftpad > seqlens, no new", dict(cache_leftpad="OVER", new=False), "cache_leftpad"),
    ("negative leftpad, no new", dict(cache_leftpad="NEG", new=False), "cache_leftpad"),
    ("block_table entry past num_blocks", dict(page=16, table="OVER"), "block_table"),
    ("block_table entry past num_blocks, no new", dict(page=16, table="OVER", new=False),
     "block_table"),
    ("negative block_table entry, no new", dict(page=16, table="NEG", new=False), "block_table"),
    ("negative block_table entry", dict(page=16, table="NEG"), "block_table"),
    ("block_table too few columns", dict(page=16, table="FEW"), "cache_seqlens"),
    ("num_splits 2**31", dict(num_splits=2**31), "num_splits"),
    ("unaligned k_cache view", dict(unaligned=True), "k_cache"),
    ("softcap string", dict(softcap="1.0"), "softcap"),
]


@pytest.mark.parametrize("case, kw, name", KV_BAD_GPU, ids=[c[0].replace(" ", "-") for c in KV_BAD_GPU])
def test_kvcache_bad_values_leave_caches_unchanged(case, kw, name, check_mode):
    """Each bad value raises naming the argument, before the in-place append; the caches are
    bit-identical afterwards and the process runs a valid call (the context is not poisoned)."""
    require_config(torch.bfloat16, 128)
    kw = dict(kw)
    b, sc, hk, d = 2, 64, 2, 128
    page, new = kw.pop("page", None), kw.pop("new", True)
    table, unaligned = kw.pop("table", None), kw.pop("unaligned", False)
    q = torch.randn(b, 1, 8, d, device="cuda", dtype=torch.bfloat16)
    if page is None:
        kc = torch.randn(b + 1, sc, hk, d + (8 if unaligned else 0), device="cuda",
                         dtype=torch.bfloat16)
        if unaligned:  # rows of 136 elements, sliced to 128 at an offset of 4: a misaligned base
            kc = kc[..., 4:4 + d]
        bt = None
    else:
        kc = torch.randn(8, page, hk, d, device="cuda", dtype=torch.bfloat16)
        bt = {None: _i32c(0, 1, 2, 3, 4, 5, 6, 7).view(2, 4),
              "OVER": _i32c(0, 1, 2, 3, 4, 5, 6, 8).view(2, 4),
              "NEG": _i32c(0, 1, 2, 3, 4, -1, 6, 7).view(2, 4),
              "FEW": _i32c(0, 1, 2, 3).view(2, 2)}[table]
    vc = torch.randn_like(kc)
    seqlens = _i32c(10, 60)
    spec = kw.pop("cache_seqlens", None)
    if spec is not None:
        seqlens = {"OVER_NEW": _i32c(10, 64), "OVER": _i32c(10, 65), "NEG": _i32c(10, -1)}.get(
            spec, spec)
    if "cache_batch_idx" in kw:
        kw["cache_batch_idx"] = {"OVER": _i32c(0, b + 1), "NEG": _i32c(-1, 0)}[kw["cache_batch_idx"]]
    if "cache_leftpad" in kw:
        kw["cache_leftpad"] = {"OVER": _i32c(0, 61), "NEG": _i32c(-1, 0)}[kw["cache_leftpad"]]
    kn = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16) if new else None
    before = kc.clone(), vc.clone()
    _expect_rejected(lambda: flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens,
                                                     block_table=bt, **kw),
                     name, check_mode, (ValueError, TypeError))
    torch.cuda.synchronize()
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]), "a rejected call wrote the cache"
    # a valid call afterwards works, in the same process
    kc_ok = torch.randn(b, sc, hk, d, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_with_kvcache(q, kc_ok, kc_ok.clone(), kn, kn,
                                  cache_seqlens=_i32c(10, 20) if new else None)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


VARLEN_BAD_GPU = [
    ("cu_seqlens_q starts at 1", dict(cu_q=[1, 50, 120]), "cu_seqlens_q"),
    ("cu_seqlens_q decreasing", dict(cu_q=[0, 50, 40]), "cu_seqlens_q"),
    ("cu_seqlens_k past the end", dict(cu_k=[0, 50, 121]), "cu_seqlens_k"),
    ("cu_seqlens_k negative", dict(cu_k=[0, -5, 120]), "cu_seqlens_k"),
    ("max_seqlen_q 0 with sequences", dict(max_q=0), "max_seqlen_q"),
    ("max_seqlen_k below the longest", dict(max_k=60), "max_seqlen_k"),
    ("max_seqlen_q 2**31", dict(max_q=2**31), "max_seqlen_q"),
]


@pytest.mark.parametrize("case, kw, name", VARLEN_BAD_GPU, ids=[c[0].replace(" ", "-") for c in VARLEN_BAD_GPU])
def test_varlen_bad_values_raise(case, kw, name, check_mode):
    require_config(torch.bfloat16, 64)
    q, k = [torch.randn(120, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2)]
    cu_q = torch.tensor(kw.get("cu_q", [0, 50, 120]), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor(kw.get("cu_k", [0, 50, 120]), dtype=torch.int32, device="cuda")
    max_q, max_k = kw.get("max_q", 70), kw.get("max_k", 70)
    _expect_rejected(lambda: flash_attn_varlen_func(q, k, k, cu_q, cu_k, max_q, max_k), name,
                     check_mode)
    from flash_attn.flash_attn_interface import _flash_attn_varlen_forward

    _expect_rejected(lambda: _flash_attn_varlen_forward(q.detach(), k.detach(), k.detach(), cu_q,
                                                        cu_k, max_q, max_k, 0.0, 0.125, False),
                     name, check_mode)
    torch.cuda.synchronize()
    good = cu_from([50, 70])
    out = flash_attn_varlen_func(q, k, k, good, good, 70, 70, causal=True)
    torch.autograd.grad(out, (q, k), torch.randn_like(out))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache_checks_in_the_split_kernels_report_the_first_bad_value(num_splits, check_mode):
    """Decoding on a contiguous cache without new keys: the split-KV kernels check each
    sequence's values themselves. With several bad sequences the error is the one the host
    checks report first (code order, then sequence), and the good sequences are computed."""
    require_config(torch.bfloat16, 128)
    import flash_attn

    b, sc, hk, d = 6, 64, 2, 128
    q = torch.randn(b, 1, 8, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, sc, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = _i32c(10, 70, 64, 5, -1, 20)  # 1 and 4 bad: -1 (sequence 4) is reported first
    _expect_rejected(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                     num_splits=num_splits),
                     r"cache_seqlens\[4\] = -1", check_mode)
    if check_mode == "device":
        good = _i32c(10, 1, 64, 5, 1, 20)
        out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=num_splits)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=r"cache_seqlens\[4\] = -1"):
            flash_attn.check_index_errors()
        ref = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=good, num_splits=num_splits)
        for i in (0, 2, 3, 5):
            assert torch.equal(out[i], ref[i]), i
        assert not out[1].any() and not out[4].any()  # rejected sequences attend to nothing
        batch_idx = _i32c(0, 1, 9, 3, 4, 7)
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=good, cache_batch_idx=batch_idx,
                                num_splits=num_splits)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=r"cache_batch_idx\[2\] = 9"):
            flash_attn.check_index_errors()
        flash_attn.check_index_errors()


@pytest.mark.parametrize("d, page, leftpad", [(128, 16, False), (128, 48, False), (64, 16, False), (128, 16, True)],
                         ids=["d128-page16", "d128-page48", "d64-page16", "d128-leftpad"])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("window", [(-1, -1), (20, 0)])
def test_kvcache_paged_checks_in_the_split_kernels(d, page, leftpad, num_splits, window, check_mode):
    """Paged decoding without new keys: each split-KV CTA checks the block-table entries of its
    keys. The error is the host checks' first (row, then column), also for an entry that a
    sliding window never reads; rows without a bad entry are computed."""
    require_config(torch.bfloat16, d)
    import flash_attn

    b, hk, cols = 5, 2, 8
    q = torch.randn(b, 1, 8, d, device="cuda", dtype=torch.bfloat16)
    n_pages = b * cols
    kp, vp = (torch.randn(n_pages, page, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    good = torch.randperm(n_pages, device="cuda").to(torch.int32).view(b, cols)
    seqlens = _i32c(*[cols * page - 3, 6 * page + 1, cols * page, 3 * page, 5 * page + 7])
    kw = dict(cache_seqlens=seqlens, num_splits=num_splits, window_size=window)
    if leftpad:
        kw["cache_leftpad"] = _i32c(0, 3, page + 2, 0, 1)
    bad = good.clone()
    bad[1, 2] = n_pages      # row 1, a page the window skips
    bad[3, 0] = -1           # a later row
    bad[4, 7] = n_pages + 5  # past row 4's pages in use: never checked
    _expect_rejected(lambda: flash_attn_with_kvcache(q, kp, vp, block_table=bad, **kw),
                     rf"block_table\[1, 2\] = {n_pages}", check_mode)
    if check_mode == "device":
        out = flash_attn_with_kvcache(q, kp, vp, block_table=bad, **kw)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=rf"block_table\[1, 2\] = {n_pages}"):
            flash_attn.check_index_errors()
        ref = flash_attn_with_kvcache(q, kp, vp, block_table=good, **kw)
        for i in (0, 2, 4):
            assert torch.equal(out[i], ref[i]), i
        flash_attn.check_index_errors()
        only_unused = good.clone()
        only_unused[4, 7] = -7
        out = flash_attn_with_kvcache(q, kp, vp, block_table=only_unused, **kw)
        torch.cuda.synchronize()
        flash_attn.check_index_errors()
        assert torch.equal(out, ref)


def test_device_guard_in_a_cuda_graph():
    """Default checks: the device-side guard is captured with the call, so a bad value written
    into the index tensor after capture is caught at replay: nothing is appended, and the error
    names the argument."""
    require_config(torch.bfloat16, 128)
    import flash_attn

    assert not flash_attn.strict_checks_enabled()
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    kn = torch.randn(2, 1, 2, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = _i32c(10, 20)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flash_attn_with_kvcache(q, kc.clone(), vc.clone(), kn, kn, cache_seqlens=seqlens)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens)
    before = kc.clone(), vc.clone()
    seqlens.copy_(_i32c(10, 64))  # 64 + 1 new row > the 64 rows of the cache
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 64"):
        flash_attn.check_index_errors()
    seqlens.copy_(_i32c(10, 20))
    g.replay()
    torch.cuda.synchronize()
    flash_attn.check_index_errors()
    assert not torch.equal(kc, before[0])  # the valid replay appended


def test_device_guard_paged_varlen():
    """Paged varlen with a block-table entry past num_blocks: rejected on the device, the
    error names block_table; the next valid call runs."""
    require_config(torch.bfloat16, 64)
    import flash_attn

    q = torch.randn(40, 4, 64, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(6, 16, 4, 64, device="cuda", dtype=torch.bfloat16)
    cu_q, cu_k = cu_from([20, 20]), cu_from([30, 40])
    table = _i32c(0, 1, 2, 3, 4, 9).view(2, 3)
    flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 20, 40, block_table=table)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = 9"):
        flash_attn.check_index_errors()
    table[1, 2] = 5
    out = flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 20, 40, block_table=table)
    torch.cuda.synchronize()
    flash_attn.check_index_errors()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("b", [3, 80, 300])
def test_device_guard_many_sequences(b):
    """The guard's one-block and multi-block grids both find the first bad block-table entry
    and cache_seqlens value, as the host checks would report them."""
    require_config(torch.bfloat16, 64)
    import flash_attn

    q = torch.randn(b, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    pages = torch.randn(4 * b, 16, 1, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(4 * b, device="cuda").to(torch.int32).view(b, 4)
    seqlens = torch.randint(1, 64, (b,), dtype=torch.int32, device="cuda")
    bad_row = b - 2
    seqlens[bad_row] = 64
    table[bad_row, 3], table[b - 1, 0] = 4 * b, -1
    before = pages.clone()
    flash_attn_with_kvcache(q, pages, pages, cache_seqlens=seqlens, block_table=table)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=rf"block_table\[{bad_row}, 3\] = {4 * b}"):
        flash_attn.check_index_errors()
    kn = torch.randn(b, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
    flash_attn_with_kvcache(q, pages, pages, kn, kn, cache_seqlens=seqlens, block_table=table)
    torch.cuda.synchronize()
    assert torch.equal(pages, before), "a rejected call wrote the cache"
    with pytest.raises(ValueError, match=rf"cache_seqlens\[{bad_row}\] = 64 plus the 1 new"):
        flash_attn.check_index_errors()
    cu = torch.arange(0, 2 * b + 1, 2, dtype=torch.int32, device="cuda")
    cu[b // 2 + 1:] += 1  # sequence b // 2 has 3 rows > max_seqlen 2
    qv = torch.randn(2 * b + 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_varlen_func(qv, qv, qv, cu, cu, 2, 2)
    torch.cuda.synchronize()
    assert not out.any(), "a rejected varlen call computes nothing (zeros)"
    with pytest.raises(ValueError, match=rf"max_seqlen_q = 2 is less than the length of sequence {b // 2}"):
        flash_attn.check_index_errors()


def test_value_checks_skipped_under_cuda_graph_capture(strict_checks):
    """Strict checks on: under CUDA-graph capture the value checks (a host sync) are skipped,
    so capture works; replay matches the eager result."""
    require_config(torch.bfloat16, 128)
    import flash_attn

    assert flash_attn.strict_checks_enabled()
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    kn = torch.randn(2, 1, 2, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = _i32c(10, 20)
    cu = cu_from([50, 70])
    qv, kv = [torch.randn(120, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    kc_eager, vc_eager = kc.clone(), vc.clone()
    ref = flash_attn_with_kvcache(q, kc_eager, vc_eager, kn, kn, cache_seqlens=seqlens)
    ref_v = flash_attn_varlen_func(qv, kv, kv, cu, cu, 70, 70, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (allocations, lazy init)
        flash_attn_with_kvcache(q, kc.clone(), vc.clone(), kn, kn, cache_seqlens=seqlens)
        flash_attn_varlen_func(qv, kv, kv, cu, cu, 70, 70, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens)
        out_v = flash_attn_varlen_func(qv, kv, kv, cu, cu, 70, 70, causal=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref) and torch.equal(out_v, ref_v)
    assert torch.equal(kc, kc_eager) and torch.equal(vc, vc_eager)


def test_strict_checks_off_skips_the_sync(monkeypatch, strict_checks):
    """set_strict_checks(False): valid calls do not copy index values to the host."""
    require_config(torch.bfloat16, 128)
    import flash_attn
    from flash_attn import _checks

    calls = []
    real = _checks._to_host
    monkeypatch.setattr(_checks, "_to_host", lambda parts: calls.append(1) or real(parts))
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = _i32c(10, 20)
    flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=seqlens)
    assert calls == [1]
    prev = flash_attn.set_strict_checks(False)
    try:
        flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=seqlens)
        cu = cu_from([1, 1])
        flash_attn_varlen_func(q[:, 0], kc[:, 0, :, :], kc[:, 0, :, :], cu, cu, 1, 1)
    finally:
        flash_attn.set_strict_checks(prev)
    assert calls == [1]
