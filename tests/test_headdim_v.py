"""GPU tests of a v head dim other than q's and k's (DeepSeek MLA prefill: q/k 192, v 128; also
v smaller or larger than q/k), through flash_attn_func, flash_attn_varlen_func, the private ops
and torch.compile.  The kernels run at the larger head dim on zero-padded copies, but for
kernels with a V head dim of their own on sm_90a: the forward at (192, 128) and (128, 64), the
dense backward at (192, 128) (the warp-specialised split-d kernel; test_backward_head_dim_v_kernel).

The error rule (fa_test_utils): out, dq, dk, dv within 2x the low-precision naive error against
the fp32 naive reference (+ tiny slack), 3x for the gradients with the features (softcap, window,
a negative scale) as in test_flash_attn_features.py; softmax_lse within LSE_ATOL / LSE_RTOL.
"""

import pytest
import torch

import flash_attn.flash_attn_interface as fi
from flash_attn import _common, flash_attn_func, flash_attn_varlen_func

from fa_test_utils import (GRAD_SLACK, LSE_ATOL, LSE_RTOL, OUT_SLACK, assert_close_to_ref,
                           check_against_ref, cu_seqlens, debug_kernel, max_err, ref_fwd_bwd,
                           require_config)

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [(192, 128), (128, 64), (64, 128)]  # (q/k, v)
HEAD_DIM_IDS = [f"qk{a}-v{b}" for a, b in HEAD_DIMS]
# (seqlen_q, seqlen_k, batch, nheads, nheads_k): odd lengths, one query row, MHA / GQA / MQA.
SHAPES = [(1, 17, 2, 4, 4), (17, 113, 2, 6, 2), (113, 1023, 1, 6, 3), (1023, 113, 1, 4, 1)]


def _require(dtype, d_qk, d_v):
    """Skip unless the build has kernels for the head dim the call runs at."""
    require_config(dtype, _common.kernel_head_dim(d_qk, d_v))


def _leaves(*shapes, dtype):
    return [torch.randn(*s, device="cuda", dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk, b, h, hk", SHAPES)
def test_dense(dtype, d_qk, d_v, causal, sq, sk, b, h, hk):
    _require(dtype, d_qk, d_v)
    q, k, v = _leaves((b, sq, h, d_qk), (b, sk, hk, d_qk), (b, sk, hk, d_v), dtype=dtype)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == (b, sq, h, d_v)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # softmax_scale=None on both sides: the reference's default is 1 / sqrt(q's head dim).
    check_against_ref(out, lse, grads, q, k, v, dout, causal)


@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("feat", [dict(window_size=(64, 16)), dict(softcap=8.0),
                                  dict(softmax_scale=-0.07)], ids=["window", "softcap", "scale"])
def test_dense_with_features(d_qk, d_v, feat):
    dtype = torch.bfloat16
    _require(dtype, d_qk, d_v)
    q, k, v = _leaves((2, 113, 6, d_qk), (2, 203, 2, d_qk), (2, 203, 2, d_v), dtype=dtype)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, **feat)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # Gradients within 3x, the rule of the feature tests (test_flash_attn_features.py).
    check_against_ref(out, lse, grads, q, k, v, dout, True, grad_factor=3, **feat)


def _varlen_case(dtype, d_qk, d_v, h=6, hk=2):
    """Packed leaves for lengths with an empty query sequence, a one-row one and odd ones."""
    lens_q, lens_k = [17, 0, 113, 1, 1023], [113, 5, 113, 17, 1023]
    q, k, v = _leaves((sum(lens_q), h, d_qk), (sum(lens_k), hk, d_qk), (sum(lens_k), hk, d_v),
                      dtype=dtype)
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(dtype, d_qk, d_v, causal):
    from test_varlen_kvcache import varlen_ref

    _require(dtype, d_qk, d_v)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case(dtype, d_qk, d_v)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal,
                                         return_attn_probs=True)
    assert out.shape == (q.shape[0], q.shape[1], d_v)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    scale = d_qk ** -0.5
    ref, lse_ref = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), scale, True)
    grads_ref = torch.autograd.grad(ref, (q, k, v), dout)
    lp, _ = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), scale, False)
    grads_lp = torch.autograd.grad(lp, (q, k, v), dout)
    assert_close_to_ref("out", out, ref, lp, OUT_SLACK)
    seen = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[seen], lse_ref[seen], atol=LSE_ATOL, rtol=LSE_RTOL)
    for name, g, r, g_lp in zip(("dq", "dk", "dv"), grads, grads_ref, grads_lp):
        assert_close_to_ref(name, g, r, g_lp, GRAD_SLACK)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("feat", [dict(), dict(softcap=8.0), dict(deterministic=True),
                                  dict(window_size=(100, 30))],
                         ids=["plain", "softcap", "deterministic", "window"])
def test_backward_head_dim_v_kernel(dtype, causal, feat):
    """(192, 128) on sm_90a: the dense backward runs the split-d kernel with a V head dim of its
    own (v, out, dout and dv at 128; _common._backward_takes_head_dim_v). Its gradients within the
    2x rule (3x with softcap, as the feature tests) of the fp32 reference, and as close to the
    padded backward's (v / out / dout zero-padded to 192: the tile-192 kernels, run by the
    binding's own fallback under bwd_lockstep) as the low-precision reference is to fp32."""
    d_qk, d_v = 192, 128
    _require(dtype, d_qk, d_v)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the backward with a V head dim of its own is an sm_90a kernel")
    b, sq, sk, h, hk = 2, 300, 517, 6, 2
    q, k, v = _leaves((b, sq, h, d_qk), (b, sk, hk, d_qk), (b, sk, hk, d_v), dtype=dtype)
    assert _common._backward_takes_head_dim_v(q, v, 0.0)
    assert not _common._backward_takes_head_dim_v(q, v, 0.1)
    det = feat.get("deterministic", False)
    ref_feat = {key: val for key, val in feat.items() if key != "deterministic"}
    out = flash_attn_func(q, k, v, causal=causal, **feat)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    # The padded backward: the same call with the WS kernels off (the binding pads v / out / dout).
    with debug_kernel("bwd_lockstep", 1):
        grads_pad = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    factor = 3 if "softcap" in feat else 2
    (_, _, *grads_ref), (_, *grads_lp) = ref_fwd_bwd(q, k, v, dout, causal, **ref_feat)
    for name, g, g_pad, r, g_lp in zip(("dq", "dk", "dv"), grads, grads_pad, grads_ref, grads_lp):
        assert g.shape == r.shape and g_pad.shape == r.shape
        assert_close_to_ref(name, g, r, g_lp, GRAD_SLACK, factor)
        assert_close_to_ref(name + " (padded)", g_pad, r, g_lp, GRAD_SLACK, factor)
        assert max_err(g, g_pad) <= factor * max_err(g_lp, r) + GRAD_SLACK, name
    if det:  # deterministic: bit-identical on a second run
        grads2 = torch.autograd.grad(out, (q, k, v), dout)
        for name, g, g2 in zip(("dq", "dk", "dv"), grads, grads2):
            assert torch.equal(g, g2), name


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward_head_dim_v_kernel(dtype, causal):
    """As test_backward_head_dim_v_kernel through flash_attn_varlen_func (packed rows, an empty
    and a one-row sequence): the split-d kernel's gradients within the 2x rule and as close to
    the binding's padded fallback (bwd_lockstep) as the low-precision reference is to fp32."""
    from test_varlen_kvcache import varlen_ref

    d_qk, d_v = 192, 128
    _require(dtype, d_qk, d_v)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the backward with a V head dim of its own is an sm_90a kernel")
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case(dtype, d_qk, d_v)
    assert _common._backward_takes_head_dim_v(q, v, 0.0)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    with debug_kernel("bwd_lockstep", 1):
        grads_pad = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    scale = d_qk ** -0.5
    ref, _ = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), scale, True)
    grads_ref = torch.autograd.grad(ref, (q, k, v), dout)
    lp, _ = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), scale, False)
    grads_lp = torch.autograd.grad(lp, (q, k, v), dout)
    for name, g, g_pad, r, g_lp in zip(("dq", "dk", "dv"), grads, grads_pad, grads_ref, grads_lp):
        assert_close_to_ref(name, g, r, g_lp, GRAD_SLACK)
        assert_close_to_ref(name + " (padded)", g_pad, r, g_lp, GRAD_SLACK)
        assert max_err(g, g_pad) <= 2 * max_err(g_lp, r) + GRAD_SLACK, name


@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_private_ops_match_the_function(d_qk, d_v):
    """_flash_attn_forward / _flash_attn_backward called directly (ring-flash-attn,
    TransformerEngine) with v's head dim of its own: the same numbers as flash_attn_func, the
    gradients written into the caller's buffers of the inputs' head dims."""
    dtype = torch.bfloat16
    _require(dtype, d_qk, d_v)
    q, k, v = _leaves((2, 113, 6, d_qk), (2, 203, 2, d_qk), (2, 203, 2, d_v), dtype=dtype)
    scale = d_qk ** -0.5
    out_f, lse_f, _ = flash_attn_func(q, k, v, causal=True, deterministic=True,
                                      return_attn_probs=True)
    dout = torch.randn_like(out_f)
    grads_f = torch.autograd.grad(out_f, (q, k, v), dout)
    qd, kd, vd = (x.detach() for x in (q, k, v))
    out, lse, _, rng = fi._flash_attn_forward(qd, kd, vd, 0.0, scale, True, -1, -1, 0.0, None,
                                              False)
    assert out.shape == out_f.shape and out.is_contiguous()
    assert torch.equal(out, out_f) and torch.equal(lse, lse_f)
    bufs = [torch.empty_like(x) for x in (qd, kd, vd)]
    fi._flash_attn_backward(dout, qd, kd, vd, out, lse, *bufs, 0.0, scale, True, -1, -1, 0.0,
                            None, True, rng)
    for name, g, g_f in zip(("dq", "dk", "dv"), bufs, grads_f):
        assert torch.equal(g, g_f), name


@pytest.mark.parametrize("variant", ["func", "varlen"])
def test_torch_compile_fullgraph(variant):
    """torch.compile(fullgraph=True) through the custom ops: forward and backward match the
    eager call."""
    if not _common._HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")
    dtype, d_qk, d_v = torch.bfloat16, 192, 128
    _require(dtype, d_qk, d_v)
    torch._dynamo.reset()
    if variant == "func":
        args = _leaves((2, 113, 6, d_qk), (2, 203, 2, d_qk), (2, 203, 2, d_v), dtype=dtype)
        fn = flash_attn_func
    else:
        args = _varlen_case(dtype, d_qk, d_v)
        fn = flash_attn_varlen_func
    compiled = torch.compile(fn, fullgraph=True)
    out = compiled(*args, causal=True, deterministic=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, args[:3], dout)
    out_e = fn(*args, causal=True, deterministic=True)
    grads_e = torch.autograd.grad(out_e, args[:3], dout)
    assert out.shape == args[0].shape[:-1] + (d_v,)
    torch.testing.assert_close(out, out_e, atol=0, rtol=0)
    for name, g, g_e in zip(("dq", "dk", "dv"), grads, grads_e):
        assert g.shape == g_e.shape
        torch.testing.assert_close(g, g_e, msg=lambda m, name=name: f"{name}: {m}")
