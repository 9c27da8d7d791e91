"""GPU tests of the flash_attn_func features: sliding window, softcap, ALiBi, dropout and the
deterministic backward, alone and combined, through all three entry points.

The error rule (fa_test_utils): out within 2x and dq, dk, dv within 3x of the low-precision
naive error against the fp32 naive reference with the same features (+ tiny slack). Dropout:
the keep-mask is recovered from S_dmask (negative = dropped) and fed to the reference; it is
also compared with the Python model of the kernels' Philox mask (fa_test_utils.dropout_keep_ref).

Default set: a rotated sweep (every feature meets both dtypes, head dims 32..256 including 59,
unequal and odd seqlens, causal, MHA/GQA/MQA). FLASH_ATTN_TEST_FULL=1 adds the full products.
"""

import itertools

import pytest
import torch

from flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

from fa_test_utils import (DTYPE_NAMES, GRAD_SLACK, LSE_ATOL, LSE_RTOL, OUT_SLACK, attention_ref,
                           assert_close_to_ref, check_against_ref, debug_kernel,
                           dropout_keep_ref, local_visible, require_config,
                           window_size_form, window_size_forms)

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 59, 96, 128, 256]
SEQLENS = [(113, 203), (239, 113), (1, 77), (256, 256), (317, 1000)]
LAYOUTS = [(1, 4, 4), (2, 6, 2), (1, 4, 1)]  # (batch, nheads, nheads_k)
WINDOWS = [(0, 0), (16, 0), (0, 16), (7, 23), (64, -1), (-1, 40), (5000, 5000)]


def _alibi(kind, b, h):
    if kind is None:
        return None
    shape = (h,) if kind == "h" else (b, h)
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 0.5).contiguous()


def _dropout_mask_from_s_dmask(S_dmask, sq, sk):
    """Kept iff the S_dmask entry is not negative (sign bit, so -0.0 counts as dropped)."""
    return ~torch.signbit(S_dmask[:, :, :sq, :sk])


def _leaf_qkv(dtype, d, sq, sk, b, h, hk, variant):
    """(q, k, v, sk, hk): fresh random leaves; the qkv-packed variant has sk = sq, hk = h."""
    require_config(dtype, d)
    if variant == "qkvpacked":
        sk, hk = sq, h
    q, k, v = [torch.randn(b, s, n, d, device="cuda", dtype=dtype, requires_grad=True)
               for s, n in ((sq, h), (sk, hk), (sk, hk))]
    return q, k, v, sk, hk


def _run(dtype, d, sq, sk, causal, b, h, hk, variant="func", window=(-1, -1), softcap=0.0,
         alibi=None, dropout_p=0.0, deterministic=False, check_lse=True, softmax_scale=None):
    q, k, v, sk, hk = _leaf_qkv(dtype, d, sq, sk, b, h, hk, variant)
    slopes = _alibi(alibi, b, h)
    kw = dict(dropout_p=dropout_p, causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=slopes, deterministic=deterministic, return_attn_probs=True,
              softmax_scale=softmax_scale)
    if variant == "func":
        out, lse, S_dmask = flash_attn_func(q, k, v, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    elif variant == "qkvpacked":
        qkv = torch.stack([q, k, v], dim=2).detach().requires_grad_()
        out, lse, S_dmask = flash_attn_qkvpacked_func(qkv, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (qkv,), dout)[0].unbind(2)
    else:
        kv = torch.stack([k, v], dim=2).detach().requires_grad_()
        out, lse, S_dmask = flash_attn_kvpacked_func(q, kv, **kw)
        dout = torch.randn_like(out)
        dq, dkv = torch.autograd.grad(out, (q, kv), dout)
        grads = (dq, *dkv.unbind(2))
    feats = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    if dropout_p > 0:
        r = lambda x: (x + 127) // 128 * 128  # noqa: E731
        assert S_dmask.shape == (b, h, r(sq), r(sk)), S_dmask.shape
        feats.update(dropout_p=dropout_p, dropout_mask=_dropout_mask_from_s_dmask(S_dmask, sq, sk))
    else:
        assert S_dmask.numel() == 0
    check_against_ref(out, lse if check_lse else None, grads, q, k, v, dout, causal,
                      softmax_scale=softmax_scale, grad_factor=3, **feats)


def _rotated(features, seqlens=SEQLENS):
    """feature settings x dtype x seqlens x causal, with head dim and head layout rotated."""
    cases = []
    for i, (feat, dtype, (sq, sk), causal) in enumerate(
            itertools.product(features, DTYPES, seqlens, (False, True))):
        d = HEAD_DIMS[i % len(HEAD_DIMS)]
        b, h, hk = LAYOUTS[(i // len(HEAD_DIMS)) % len(LAYOUTS)]
        fid = "-".join(f"{k}{v}" for k, v in feat.items())
        cases.append(pytest.param(feat, dtype, d, sq, sk, causal, b, h, hk,
                                  id=f"{fid}-{DTYPE_NAMES[dtype]}-d{d}-sq{sq}-sk{sk}-"
                                     f"{'causal' if causal else 'full'}-b{b}h{h}k{hk}"))
    return cases


def _full(features):
    cases = []
    for feat, dtype, d, (sq, sk), causal, (b, h, hk) in itertools.product(
            features, DTYPES, HEAD_DIMS, SEQLENS, (False, True), LAYOUTS):
        fid = "-".join(f"{k}{v}" for k, v in feat.items())
        cases.append(pytest.param(feat, dtype, d, sq, sk, causal, b, h, hk,
                                  id=f"{fid}-{DTYPE_NAMES[dtype]}-d{d}-sq{sq}-sk{sk}-"
                                     f"{'causal' if causal else 'full'}-b{b}h{h}k{hk}"))
    return cases


WINDOW_FEATS = [{"window": w} for w in WINDOWS]
SOFTCAP_FEATS = [{"softcap": 5.0}, {"softcap": 30.0, "window": (40, 8)}]
ALIBI_FEATS = [{"alibi": "h"}, {"alibi": "bh", "window": (32, 32)}]
DROPOUT_FEATS = [{"dropout_p": 0.17}, {"dropout_p": 0.4, "window": (50, 10)}]
COMBO_FEATS = [
    {"dropout_p": 0.1, "alibi": "h", "window": (24, 0)},
    {"softcap": 8.0, "alibi": "bh", "window": (60, 12)},
    {"dropout_p": 0.25, "alibi": "bh", "deterministic": True},
    {"softcap": 10.0, "deterministic": True, "window": (0, 30)},
]


def _feat_kwargs(feat):
    kw = dict(feat)
    if "window" in kw:
        kw["window"] = tuple(kw["window"])
    return kw


FEATURE_GROUPS = (("window", WINDOW_FEATS), ("softcap", SOFTCAP_FEATS), ("alibi", ALIBI_FEATS),
                  ("dropout", DROPOUT_FEATS), ("combinations", COMBO_FEATS))


@pytest.mark.parametrize("feat, dtype, d, sq, sk, causal, b, h, hk", [
    pytest.param(*case.values, id=f"{group}-{case.id}")
    for group, feats in FEATURE_GROUPS for case in _rotated(feats)])
def test_features(feat, dtype, d, sq, sk, causal, b, h, hk):
    """Each group of feature settings (window, softcap, ALiBi, dropout, combinations) over
    dtypes, seqlens and causal, head dims and layouts rotated within the group."""
    _run(dtype, d, sq, sk, causal, b, h, hk, **_feat_kwargs(feat))


# Softcap / ALiBi and dropout backwards at head dims 64 and 128 (multiples of 8) run the
# warp-specialised sm_90a kernel's score-modifier variant (softcap at d128 only) and its dropout
# variant by default, and the lock-step feature kernel when forced (set_debug_kernel; elsewhere
# than sm_90 both run the SM80-class kernel). Dropout: the reference applies the mask
# recovered from S_dmask.
# The rotated sweeps above meet d = 64 not at all (their head dims: 32, 59, 96, 128, 256).
MOD_FEATS = [{"softcap": 5.0}, {"alibi": "h"}, {"alibi": "bh", "window": (32, 32)},
             {"softcap": 8.0, "alibi": "bh", "window": (60, 12)},
             {"dropout_p": 0.17}, {"dropout_p": 0.3, "alibi": "bh", "window": (40, 8)},
             {"dropout_p": 0.1, "alibi": "h", "window": (-1, 0)}]
MOD_SHAPES = [(113, 203, False, 2, 6, 2), (239, 113, True, 1, 4, 1), (1, 77, False, 1, 4, 4),
              (317, 1000, True, 2, 6, 2)]


@pytest.mark.parametrize("lockstep", [0, 1], ids=["ws", "lockstep"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("feat", MOD_FEATS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_feature_backward_paths(feat, d, lockstep):
    require_config(torch.bfloat16, d)
    with debug_kernel("bwd_lockstep", lockstep):
        _run_mod_shapes(feat, d)


def _run_mod_shapes(feat, d):
    for i, (sq, sk, causal, b, h, hk) in enumerate(MOD_SHAPES):
        _run(DTYPES[i % 2], d, sq, sk, causal, b, h, hk, **_feat_kwargs(feat))


@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked"])
@pytest.mark.parametrize("feat", WINDOW_FEATS[:4] + SOFTCAP_FEATS + ALIBI_FEATS + DROPOUT_FEATS
                         + COMBO_FEATS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed(variant, feat, dtype):
    _run(dtype, 64, 150, 211, True, 2, 6, 2, variant=variant, **_feat_kwargs(feat))


@pytest.mark.slow
@pytest.mark.parametrize("feat, dtype, d, sq, sk, causal, b, h, hk",
                         _full(WINDOW_FEATS + SOFTCAP_FEATS + ALIBI_FEATS + DROPOUT_FEATS
                               + COMBO_FEATS))
def test_features_full(feat, dtype, d, sq, sk, causal, b, h, hk):
    _run(dtype, d, sq, sk, causal, b, h, hk, **_feat_kwargs(feat))


# ---------------------------------------------------------------------------------------
# Window specifics
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 128])
def test_window_larger_than_seqlen_is_unbounded(d):
    dtype = torch.bfloat16
    require_config(dtype, d)
    q, k, v = [torch.randn(2, 300, 4, d, device="cuda", dtype=dtype) for _ in range(3)]
    full = flash_attn_func(q, k, v)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(300, 10**6)), full)
    assert torch.equal(flash_attn_func(q, k, v, window_size=torch.tensor([400, 301])), full)
    causal = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(1000, 0)), causal)


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90-if-built", "sm80-class"])
def test_window_both_forward_paths(sm90):
    """Window-only calls keep the plain (sm_90a where built) forward; both paths must agree with
    the reference."""
    ext = require_config(torch.bfloat16, 128)
    ext.set_sm90_kernels(sm90)
    try:
        for window in [(0, 0), (200, 0), (33, 77)]:
            _run(torch.bfloat16, 128, 1000, 1200, False, 1, 4, 2, window=window)
    finally:
        ext.set_sm90_kernels(True)


# ---------------------------------------------------------------------------------------
# Dropout specifics
# ---------------------------------------------------------------------------------------


def _op_forward(q, k, v, p, causal=False, window=(-1, -1), return_softmax=True):
    return torch.ops.flash_attn._flash_attn_forward(
        q, k, v, p, q.shape[-1] ** -0.5, causal, window[0], window[1], 0.0, None, return_softmax)


@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_mask_matches_philox_model(d, causal):
    """S_dmask's signs are the documented Philox mask of (seed, offset) from rng_state."""
    dtype = torch.float16
    require_config(dtype, d)
    b, sq, sk, h, p = 2, 200, 333, 3, 0.3
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, h, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, h, d, device="cuda", dtype=dtype)
    _, _, S_dmask, rng_state = _op_forward(q, k, v, p, causal=causal)
    seed, offset = rng_state.tolist()
    ref = dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()
    got = _dropout_mask_from_s_dmask(S_dmask, sq, sk)
    visible = local_visible(sq, sk, (-1, -1), causal, device="cuda")
    if visible is not None:
        got, ref = got[..., visible], ref[..., visible]
    assert torch.equal(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 77), (113, 1023), (300, 257), (640, 640)])
def test_dropout_without_s_dmask_matches_philox_model(dtype, d, causal, sq, sk):
    """Without return_attn_probs the forward (sm_90a where built: its own packed-P dropout,
    64-key tiles sharing Philox groups at d64) and the backward apply exactly the documented mask."""
    require_config(dtype, d)
    b, h, hk, p = 2, 4, 2, 0.17
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse, _, rng_state = torch.ops.flash_attn._flash_attn_forward(
        qd, kd, vd, p, d ** -0.5, causal, -1, 0 if causal else -1, 0.0, None, False)
    seed, offset = rng_state.tolist()
    mask = dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()
    dout = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    torch.ops.flash_attn._flash_attn_backward(
        dout, qd, kd, vd, out, lse, dq, dk, dv, p, d ** -0.5, causal, -1, 0 if causal else -1, 0.0, None,
        False, rng_state)
    check_against_ref(out, lse, (dq, dk, dv), q, k, v, dout, causal, grad_factor=3,
                      dropout_p=p, dropout_mask=mask)


def test_dropout_kept_fraction():
    dtype = torch.bfloat16
    require_config(dtype, 64)
    q, k, v = [torch.randn(2, 1024, 8, 64, device="cuda", dtype=dtype) for _ in range(3)]
    for p in (0.1, 0.5, 0.83):
        _, _, S_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
        kept = _dropout_mask_from_s_dmask(S_dmask, 1024, 1024).float().mean().item()
        assert abs(kept - (1 - p)) < 0.01, (p, kept)


@pytest.mark.parametrize("d", [64, 128])
def test_dropout_same_seed_bitwise(d):
    dtype = torch.bfloat16
    require_config(dtype, d)
    q, k, v = [torch.randn(2, 300, 4, d, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3)]
    dout = torch.randn(2, 300, 4, d, device="cuda", dtype=dtype)

    def run(seed):
        torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    first, again, other = run(7), run(7), run(8)
    for name, a, b_ in zip(("out", "dq", "dk", "dv"), first, again):
        if name == "dq":  # accumulated with atomics in the default backward
            torch.testing.assert_close(a, b_, atol=2e-2, rtol=0)
        else:
            assert torch.equal(a, b_), f"{name} differs for the same seed"
    assert not torch.equal(first[0], other[0]), "a different seed gave the same output"


def test_dropout_rng_state_advances():
    dtype = torch.float16
    require_config(dtype, 64)
    q, k, v = [torch.randn(1, 128, 2, 64, device="cuda", dtype=dtype) for _ in range(3)]
    torch.manual_seed(3)
    _, _, _, r1 = _op_forward(q, k, v, 0.5, return_softmax=False)
    _, _, _, r2 = _op_forward(q, k, v, 0.5, return_softmax=False)
    assert r1[0].item() == r2[0].item() == 3  # seed
    assert r2[1].item() > r1[1].item()  # offset advanced
    out0, _, _, r0 = _op_forward(q, k, v, 0.0, return_softmax=False)
    assert r0.tolist() == [0, 0]
    torch.testing.assert_close(out0, attention_ref(q, k, v)[0], atol=2e-3, rtol=1e-3)


def test_dropout_eval_mode_matches_plain():
    dtype = torch.bfloat16
    require_config(dtype, 128)
    q, k, v = [torch.randn(1, 200, 2, 128, device="cuda", dtype=dtype) for _ in range(3)]
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=0.0), flash_attn_func(q, k, v))


# ---------------------------------------------------------------------------------------
# Deterministic backward
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d, causal, window, hk, sq, sk",
    [
        (64, False, (-1, -1), 4, 1024, 1024),
        (128, True, (-1, -1), 1, 777, 1031),
        (96, False, (100, 20), 2, 1031, 600),
        (256, True, (64, -1), 4, 513, 513),
        (32, False, (-1, -1), 2, 100, 3000),
        (128, False, (-1, 40), 4, 1000, 1100),
        (64, True, (-1, -1), 2, 1100, 1000),
    ],
)
def test_deterministic_bitwise(d, causal, window, hk, sq, sk):
    dtype = torch.bfloat16
    require_config(dtype, d)
    b, h = 2, 4
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    check_against_ref(out, None, first, q, k, v, dout, causal, grad_factor=3, window_size=window)
    for _ in range(50):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for name, a, r in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(a, r), f"{name} differs between deterministic runs"


def test_deterministic_matches_default_closely():
    dtype = torch.float16
    require_config(dtype, 64)
    q, k, v = [torch.randn(2, 500, 4, 64, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3)]
    dout = torch.randn(2, 500, 4, 64, device="cuda", dtype=dtype)
    out = flash_attn_func(q, k, v, causal=True)
    g0 = torch.autograd.grad(out, (q, k, v), dout)
    out1 = flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert torch.equal(out, out1)  # the forward is the same kernel
    g1 = torch.autograd.grad(out1, (q, k, v), dout)
    for a, b_ in zip(g0, g1):
        torch.testing.assert_close(a, b_, atol=2e-3, rtol=1e-3)


# ---------------------------------------------------------------------------------------
# Errors from the op / binding
# ---------------------------------------------------------------------------------------


def test_feature_errors_on_gpu():
    require_config(torch.float16, 64)
    q, k, v = [torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3)]
    with pytest.raises(ValueError, match="softcap"):
        flash_attn_func(q, k, v, dropout_p=0.1, softcap=3.0)
    with pytest.raises(TypeError, match="float32"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="alibi_slopes is on device"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="return_softmax"):
        _op_forward(q, k, v, 0.0, return_softmax=True)
    # The binding's own checks are exercised in test_interface_cpu.py: on the H200's torch 2.11 a
    # C++ exception leaving flash_attn._C can take the process down (docs/design.md), so the GPU
    # suite only goes through the public API, which validates in Python first.


# The d64 WS backward on 128-row query blocks with sliding windows (tiles skipped per 128-row block).
@pytest.mark.parametrize("window", [(0, 0), (16, 0), (7, 23), (64, -1), (-1, 40)])
@pytest.mark.parametrize("sq, sk", [(113, 203), (317, 1000)])
def test_window_backward_m128(window, sq, sk):
    _run(torch.bfloat16, 64, sq, sk, False, 2, 6, 2, window=window)


# ALiBi and / or deterministic d64 calls: the score-modifier WS kernel on 128-row query blocks
# (deterministic: one counter per 128-row block). Deterministic reruns must be bitwise equal.
@pytest.mark.parametrize("alibi, deterministic", [("bh", False), (None, True), ("h", True)])
@pytest.mark.parametrize("causal, window, sq, sk", [(False, (-1, -1), 317, 1000), (True, (-1, -1), 1000, 317),
                                                    (False, (40, 7), 257, 259)])
def test_mod_backward_m128(alibi, deterministic, causal, window, sq, sk):
    _run(torch.bfloat16, 64, sq, sk, causal, 2, 6, 2, window=window, alibi=alibi, deterministic=deterministic)
    if deterministic:
        require_config(torch.bfloat16, 64)
        q, k, v = (torch.randn(2, sq, 6 if i == 0 else 2, 64, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for i in range(3))
        slopes = _alibi(alibi, 2, 6)
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes, deterministic=True)
        dout = torch.randn_like(out)
        first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for _ in range(10):
            again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            for name, a, r in zip(("dq", "dk", "dv"), again, first):
                assert torch.equal(a, r), f"{name} differs between deterministic runs"


# softmax_scale: any finite value gives softmax(Q K^T * scale) V (0 and negatives run on a
# transformed q, see flash_attn._common.kernel_q_and_scale), forward and backward, with every
# score modifier. Against the fp32 reference with the suite's rule.
SCALE_FEATS = [{}, {"window": (16, 0)}, {"softcap": 5.0}, {"alibi": "bh"},
               {"softcap": 8.0, "alibi": "h", "window": (40, 8)}]


@pytest.mark.parametrize("softmax_scale", [0.0, -0.3, 0.3])
@pytest.mark.parametrize("feat", SCALE_FEATS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()) or "plain")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, d, sq, sk, b, h, hk", [
    (torch.bfloat16, 64, 113, 203, 2, 6, 2),
    (torch.float16, 128, 239, 113, 1, 4, 4),
    (torch.bfloat16, 59, 77, 77, 2, 4, 1),
], ids=["bf16-d64-gqa", "fp16-d128", "bf16-d59-mqa"])
def test_softmax_scale_any_finite_value(dtype, d, sq, sk, b, h, hk, causal, feat, softmax_scale):
    _run(dtype, d, sq, sk, causal, b, h, hk, softmax_scale=softmax_scale, **_feat_kwargs(feat))


@pytest.mark.parametrize("softmax_scale", [0.0, -0.5])
@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked"])
def test_softmax_scale_any_finite_value_packed(variant, softmax_scale):
    _run(torch.bfloat16, 64, 128, 160, True, 2, 4, 2, variant=variant,
         softmax_scale=softmax_scale, softcap=4.0)


def test_softmax_scale_zero_is_uniform_attention():
    """scale 0: every visible key gets the same weight (the mean of v), dq and dk are 0."""
    require_config(torch.bfloat16, 64)
    q = torch.randn(1, 50, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, softmax_scale=0.0)
    mean = v.float().mean(1, keepdim=True).expand(1, 50, 2, 64)
    torch.testing.assert_close(out.float(), mean, atol=1e-2, rtol=1e-2)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.all(dq == 0) and torch.all(dk == 0) and torch.isfinite(dv).all()


@window_size_forms(16, 0)
def test_window_size_forms_match_tuple(window):
    require_config(torch.bfloat16, 64)
    window = window_size_form(window, 16, 0)
    q, k, v = [torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    assert torch.equal(flash_attn_func(q, k, v, window_size=window),
                       flash_attn_func(q, k, v, window_size=(16, 0)))


# ---------------------------------------------------------------------------------------
# Learnable attention sinks
# ---------------------------------------------------------------------------------------

SINK_GRAD_FACTOR = 3  # as the other feature tests' gradients (see the module docstring)


def _sink_values(h, dtype=torch.float32):
    """Sink logits around the scores' scale, one very negative and one large (the sink then
    takes most of the row's mass)."""
    s = torch.randn(h, device="cuda") * 1.5
    s[0] = -30.0
    if h > 1:
        s[-1] = 6.0
    return s.to(dtype)


def _assert_sink_grads(names, ours, refs, refs_lp, factor=SINK_GRAD_FACTOR):
    for name, g, g_ref, g_lp in zip(names, ours, refs, refs_lp):
        assert_close_to_ref(name, g, g_ref, g_lp, GRAD_SLACK, factor)


def _dense_sink_refs(q, k, v, sink, dout, causal, window, softmax_scale=None, **feats):
    """(out, lse, dq, dk, dv, dsink) of the fp32 reference and (out, dq, dk, dv, dsink) of the
    same reference in the input dtype, the sink column appended to the scores."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sink)]
    out_ref, lse_ref = attention_ref(*leaves[:3], causal=causal, window_size=window,
                                     softmax_scale=softmax_scale, learnable_sink=leaves[3], **feats)
    grads_ref = torch.autograd.grad(out_ref, leaves, dout)
    lp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    sink_lp = sink.detach().to(q.dtype).requires_grad_()
    out_lp, _ = attention_ref(*lp, causal=causal, window_size=window, upcast=False,
                              softmax_scale=softmax_scale, learnable_sink=sink_lp, **feats)
    grads_lp = torch.autograd.grad(out_lp, lp + [sink_lp], dout)
    return (out_ref, lse_ref, *grads_ref), (out_lp, *grads_lp)


def _run_sink_dense(dtype, d, sq, sk, causal, window, b, h, hk, sink_dtype, variant="func",
                    **feats):
    q, k, v, sk, hk = _leaf_qkv(dtype, d, sq, sk, b, h, hk, variant)
    sink = _sink_values(h, sink_dtype).requires_grad_()
    kw = dict(causal=causal, window_size=window, return_attn_probs=True, learnable_sink=sink,
              **feats)
    if variant == "func":
        out, lse, S_dmask = flash_attn_func(q, k, v, **kw)
        dout = torch.randn_like(out)
        dq, dk, dv, dsink = torch.autograd.grad(out, (q, k, v, sink), dout)
    elif variant == "qkvpacked":
        qkv = torch.stack([q, k, v], dim=2).detach().requires_grad_()
        out, lse, S_dmask = flash_attn_qkvpacked_func(qkv, **kw)
        dout = torch.randn_like(out)
        dqkv, dsink = torch.autograd.grad(out, (qkv, sink), dout)
        dq, dk, dv = dqkv.unbind(2)
    else:
        kv = torch.stack([k, v], dim=2).detach().requires_grad_()
        out, lse, S_dmask = flash_attn_kvpacked_func(q, kv, **kw)
        dout = torch.randn_like(out)
        dq, dkv, dsink = torch.autograd.grad(out, (q, kv, sink), dout)
        dk, dv = dkv.unbind(2)
    ref_feats = {k_: v_ for k_, v_ in feats.items() if k_ in ("softcap", "alibi_slopes")}
    if feats.get("dropout_p", 0.0) > 0:
        ref_feats.update(dropout_p=feats["dropout_p"],
                         dropout_mask=_dropout_mask_from_s_dmask(S_dmask, sq, sk))
    (out_ref, lse_ref, *g_ref), (out_lp, *g_lp) = _dense_sink_refs(
        q, k, v, sink, dout, causal, window, **ref_feats)
    assert dsink.dtype == sink_dtype and dsink.shape == (h,)
    assert_close_to_ref("out", out, out_ref, out_lp, OUT_SLACK)
    # Every row has a finite lse with a sink (sink[h] where no key is visible).
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)
    _assert_sink_grads(("dq", "dk", "dv", "dsink"), (dq, dk, dv, dsink), g_ref, g_lp)


SINK_DENSE_CASES = [
    # dtype, d, sq, sk, causal, window, b, h, hk, sink dtype
    (torch.float16, 64, 128, 128, False, (-1, -1), 2, 4, 4, torch.float32),
    (torch.bfloat16, 128, 113, 203, True, (-1, -1), 2, 4, 4, torch.float32),
    (torch.bfloat16, 64, 256, 256, False, (128, 0), 1, 4, 4, torch.bfloat16),
    (torch.float16, 128, 77, 77, False, (-1, -1), 2, 8, 2, torch.float16),
    (torch.bfloat16, 128, 1, 77, False, (-1, -1), 2, 8, 2, torch.float32),
    (torch.float16, 64, 17, 113, True, (-1, -1), 1, 4, 1, torch.float32),
    (torch.bfloat16, 64, 239, 113, True, (-1, -1), 2, 4, 4, torch.float32),  # rows with no key
    (torch.float16, 128, 113, 17, False, (16, 0), 1, 8, 2, torch.bfloat16),
    (torch.bfloat16, 96, 317, 1000, True, (-1, -1), 1, 4, 2, torch.float32),
    (torch.float16, 128, 640, 640, False, (-1, -1), 1, 4, 4, torch.float32),
]


@pytest.mark.parametrize("dtype, d, sq, sk, causal, window, b, h, hk, sink_dtype",
                         SINK_DENSE_CASES)
def test_sink_dense(dtype, d, sq, sk, causal, window, b, h, hk, sink_dtype):
    _run_sink_dense(dtype, d, sq, sk, causal, window, b, h, hk, sink_dtype)


@pytest.mark.parametrize("case", [1, 3, 6], ids=["causal", "gqa", "no-key-rows"])
def test_sink_dense_sm80_class(case):
    """The SM80-class forward (and backward) with a sink, on the same GPU."""
    ext = require_config(torch.bfloat16, 128)
    ext.set_sm90_kernels(False)
    try:
        _run_sink_dense(*SINK_DENSE_CASES[case])
    finally:
        ext.set_sm90_kernels(True)


@pytest.mark.parametrize("feat", [dict(softcap=5.0), dict(alibi="h"), dict(dropout_p=0.17)],
                         ids=["softcap", "alibi", "dropout"])
@pytest.mark.parametrize("d", [64, 128])
def test_sink_with_features(feat, d):
    """The feature kernels: the sink is neither softcapped nor biased, dropout scales out only."""
    require_config(torch.bfloat16, d)
    feats = dict(feat)
    if "alibi" in feats:
        feats["alibi_slopes"] = _alibi(feats.pop("alibi"), 2, 4)
    _run_sink_dense(torch.bfloat16, d, 113, 203, True, (-1, -1), 2, 4, 2, torch.float32, **feats)


@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked"])
def test_sink_packed(variant):
    _run_sink_dense(torch.float16, 64, 97, 130, False, (-1, -1), 2, 4, 2, torch.float32,
                    variant=variant)


def test_sink_none_and_minus_inf_match_plain():
    """learnable_sink=None is the plain call; a -inf sink gives the same out and lse (rows
    with visible keys) as no sink."""
    require_config(torch.bfloat16, 128)
    q, k, v = (torch.randn(2, 200, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out0, lse0, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out1, lse1, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                    learnable_sink=None)
    sink = torch.full((4,), float("-inf"), device="cuda")
    out2, lse2, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                    learnable_sink=sink)
    assert torch.equal(out0, out1) and torch.equal(lse0, lse1)
    assert torch.equal(out0, out2) and torch.equal(lse0, lse2)


def test_sink_grad_kernel_matches_the_torch_form():
    """The extension's one-launch dsink (api/sink_grad.h) against the torch form it replaces on
    CUDA, dense and varlen (an empty sequence, rows past cu_seqlens_q[-1]); the same bits on a
    rerun (one CTA per head, a fixed summation order)."""
    from flash_attn import _common

    require_config(torch.bfloat16, 64)
    h, b, sq = 6, 3, 77
    sink = torch.randn(h, device="cuda")
    lse = torch.randn(b, h, sq, device="cuda") + 2
    d = torch.randn(b, h, 128, device="cuda")
    got = _common._sink_grad_kernel(sink, lse, d)
    want = _common._sink_grad_rows(sink, lse, d[..., :sq], (1, -1, 1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, _common._sink_grad_kernel(sink, lse, d))
    lens = [17, 0, 113, 1]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
    total = sum(lens) + 5  # 5 rows past the last sequence
    lse_v = torch.randn(h, total, device="cuda") + 2
    d_v = torch.randn(h, total + 128 * len(lens), device="cuda")
    got = _common._sink_grad_kernel(sink.to(torch.bfloat16), lse_v, d_v, cu)
    rows = torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) + 128 * i for i in range(len(lens))]).cuda()
    p_sink = torch.exp(sink.to(torch.bfloat16).float().view(h, 1) - lse_v[:, :sum(lens)])
    want = -(p_sink * d_v[:, rows]).sum(1)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16))


def _varlen_sink_ref(q, k, v, cu_q, cu_k, sink, causal, window, upcast):
    """Packed (total, h, d) attention with a sink, one sequence at a time (attention_ref)."""
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qi, ki, vi = (x[None] for x in (q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]],
                                        v[ck[i]:ck[i + 1]]))
        o, lse = attention_ref(qi, ki, vi, causal=causal, upcast=upcast, window_size=window,
                               learnable_sink=sink)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


@pytest.mark.parametrize("dtype, d, causal, window", [
    (torch.bfloat16, 64, False, (-1, -1)),
    (torch.float16, 128, True, (-1, -1)),
    (torch.bfloat16, 128, False, (32, 0)),
    (torch.float16, 64, True, (-1, -1)),
])
def test_sink_varlen(dtype, d, causal, window):
    """Several lengths: an empty query sequence, a sequence without keys (out 0, lse = sink),
    one-row and odd-length ones; GQA."""
    from flash_attn import flash_attn_varlen_func

    require_config(dtype, d)
    h, hk = 6, 2
    lens_q = [17, 0, 77, 1, 113, 40]
    lens_k = [30, 5, 77, 9, 200, 0]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lens_k), hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lens_k), hk, d, device="cuda", dtype=dtype, requires_grad=True)
    sink = _sink_values(h).requires_grad_()
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                         causal=causal, window_size=window,
                                         return_attn_probs=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sink)]
    out_ref, lse_ref = _varlen_sink_ref(*leaves[:3], cu_q, cu_k, leaves[3], causal, window, True)
    g_ref = torch.autograd.grad(out_ref, leaves, dout)
    lp = [x.detach().clone().requires_grad_() for x in (q, k, v)] + [
        sink.detach().to(dtype).requires_grad_()]
    out_lp, _ = _varlen_sink_ref(*lp[:3], cu_q, cu_k, lp[3], causal, window, False)
    g_lp = torch.autograd.grad(out_lp, lp, dout)
    assert_close_to_ref("out", out, out_ref, out_lp, OUT_SLACK)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)
    # The sequence without keys: out 0, lse = sink.
    rows = slice(int(cu_q[5]), int(cu_q[6]))
    assert torch.equal(out[rows], torch.zeros_like(out[rows]))
    torch.testing.assert_close(lse[:, rows], sink.detach().view(h, 1).expand(h, lens_q[5]))
    _assert_sink_grads(("dq", "dk", "dv", "dsink"), grads, g_ref, g_lp)


# fp16 at d64 only through paged16: the other fp16 cases run at d128.
SINK_KV_CASES = [(mode, d, dtype) for mode in ("contiguous", "contiguous-split", "paged16", "paged256-split")
                 for d in (64, 128) for dtype in (torch.bfloat16, torch.float16)
                 if not (dtype == torch.float16 and d == 64 and mode != "paged16")]


@pytest.mark.parametrize("mode, d, dtype", SINK_KV_CASES)
def test_sink_kvcache(mode, d, dtype):
    """flash_attn_with_kvcache with a sink through the split-KV writers (num_splits 1 and > 1,
    the combine), contiguous and paged (the sm_90a decode and CTA-schedule kernels); one
    sequence with an empty cache: out 0, lse = sink."""
    from flash_attn import flash_attn_with_kvcache

    require_config(dtype, d)
    b, sq, h, hk, S = 4, 1 if "split" in mode else 3, 8, 2, 512
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    kc = torch.randn(b, S, hk, d, device="cuda", dtype=dtype)
    vc = torch.randn(b, S, hk, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([300, 0, 512, 77], device="cuda", dtype=torch.int32)
    sink = _sink_values(h)
    num_splits = 4 if "split" in mode else 1
    kw = dict(cache_seqlens=seqlens, causal=True, num_splits=num_splits, return_softmax_lse=True,
              learnable_sink=sink)
    if mode.startswith("paged"):
        page = 16 if mode == "paged16" else 256
        nb = b * S // page
        perm = torch.randperm(nb, device="cuda")
        block_table = perm.view(b, S // page).to(torch.int32)
        kp = torch.empty(nb, page, hk, d, device="cuda", dtype=dtype)
        vp = torch.empty_like(kp)
        kp[perm] = kc.view(nb, page, hk, d)
        vp[perm] = vc.view(nb, page, hk, d)
        out, lse = flash_attn_with_kvcache(q, kp, vp, block_table=block_table, **kw)
    else:
        out, lse = flash_attn_with_kvcache(q, kc, vc, **kw)
    outs_ref, outs_lp, lses_ref = [], [], []
    for i, n in enumerate(seqlens.tolist()):
        args = (q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n])
        o, l = attention_ref(*args, causal=True, learnable_sink=sink)
        o_lp, _ = attention_ref(*args, causal=True, upcast=False, learnable_sink=sink)
        outs_ref.append(o)
        outs_lp.append(o_lp)
        lses_ref.append(l)
    assert_close_to_ref("out", out, torch.cat(outs_ref), torch.cat(outs_lp), OUT_SLACK)
    torch.testing.assert_close(lse, torch.cat(lses_ref), atol=LSE_ATOL, rtol=LSE_RTOL)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(lse[1], sink.view(h, 1).expand(h, sq))


def test_sink_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) of flash_attn_func with a sink: forward and backward match
    the eager call."""
    from flash_attn import _common

    if not _common._HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")
    dtype, d = torch.bfloat16, 128
    require_config(dtype, d)
    torch._dynamo.reset()

    def fn(q, k, v, sink):
        return flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    compiled = torch.compile(fn, fullgraph=True)
    q = torch.randn(2, 113, 6, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(2, 203, 2, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(2, 203, 2, d, device="cuda", dtype=dtype, requires_grad=True)
    sink = _sink_values(6).requires_grad_()
    out = compiled(q, k, v, sink)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    out_e = fn(q, k, v, sink)
    grads_e = torch.autograd.grad(out_e, (q, k, v, sink), dout)
    assert torch.equal(out, out_e)
    for name, g, g_e in zip(("dq", "dk", "dv", "dsink"), grads, grads_e):
        torch.testing.assert_close(g, g_e, msg=lambda m, name=name: f"{name}: {m}")
