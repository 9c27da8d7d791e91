"""GPU tests of head dims 257-512 (the sm_90a forward alone: flash_attn_func, its packed forms,
flash_attn_varlen_func without pages, the private forward op): against the naive reference by the
error rule of fa_test_utils (out within 2x the low-precision naive error, softmax_lse within
LSE_ATOL / LSE_RTOL), odd sizes, GQA / MQA, causal, sliding windows, a learnable sink; and the
calls they refuse (a backward, dropout / softcap / ALiBi, pages) with a ValueError naming why.
"""

import pytest
import torch

from flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_with_kvcache)
from flash_attn.flash_attn_interface import _flash_attn_forward

from fa_test_utils import (LSE_ATOL, LSE_RTOL, OUT_SLACK, assert_close_to_ref, attention_ref,
                           assert_lse_close, cu_seqlens, require_config)

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [264, 300, 384, 512]  # 300: zero-padded to 304
# (seqlen_q, seqlen_k, batch, nheads, nheads_k): odd lengths, one query row, MHA / GQA / MQA.
SHAPES = [(1, 17, 2, 4, 4), (77, 113, 2, 4, 2), (113, 1023, 1, 3, 1), (1023, 77, 1, 2, 2)]


def _require(dtype):
    ext = require_config(dtype, 512)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("head dims above 256 run on the sm_90a forward only")
    return ext


def _inputs(*shapes, dtype):
    return [torch.randn(*s, device="cuda", dtype=dtype) for s in shapes]


def _check(out, lse, q, k, v, causal, **features):
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, **features)
    out_lp, _ = attention_ref(q, k, v, causal=causal, upcast=False, **features)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:3], v.shape[-1])
    assert_close_to_ref("out", out, out_ref, out_lp, OUT_SLACK)
    if lse is not None:
        assert_lse_close(lse, lse_ref, q.shape[1], k.shape[1], causal,
                         features.get("window_size", (-1, -1)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk, b, h, hk", SHAPES)
def test_dense(dtype, d, causal, sq, sk, b, h, hk):
    _require(dtype)
    q, k, v = _inputs((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), dtype=dtype)
    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    _check(out, lse, q, k, v, causal)


@pytest.mark.parametrize("feat", [dict(window_size=(64, 16)), dict(softmax_scale=0.02),
                                  dict(softmax_scale=-0.03)], ids=["window", "scale", "negative"])
def test_dense_window_and_scale(feat):
    dtype = torch.bfloat16
    _require(dtype)
    q, k, v = _inputs((2, 113, 4, 512), (2, 203, 2, 512), (2, 203, 2, 512), dtype=dtype)
    with torch.inference_mode():
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, **feat)
    _check(out, lse, q, k, v, True, **feat)


def test_packed_forms_and_private_op_match():
    dtype = torch.bfloat16
    _require(dtype)
    qkv = torch.randn(2, 77, 3, 4, 320, device="cuda", dtype=dtype)
    with torch.no_grad():
        out = flash_attn_qkvpacked_func(qkv, causal=True)
        out_kv = flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True)
        ref = flash_attn_func(*qkv.unbind(2), causal=True)
        out_op = _flash_attn_forward(*qkv.unbind(2), 0.0, 320 ** -0.5, True, -1, 0, 0.0, None,
                                     False)[0]
    for x in (out, out_kv, out_op):
        torch.testing.assert_close(x, ref, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(dtype, causal):
    from test_varlen_kvcache import varlen_ref

    _require(dtype)
    lens_q, lens_k = [17, 0, 113, 1, 1023], [113, 5, 113, 17, 1023]
    d = 512
    q, k, v = _inputs((sum(lens_q), 4, d), (sum(lens_k), 2, d), (sum(lens_k), 2, d), dtype=dtype)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    with torch.no_grad():
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                             causal=causal, return_attn_probs=True)
    ref, lse_ref = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), d ** -0.5, True)
    lp, _ = varlen_ref(q, k, v, cu_q, cu_k, causal, (-1, -1), d ** -0.5, False)
    assert_close_to_ref("out", out, ref, lp, OUT_SLACK)
    seen = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[seen], lse_ref[seen], atol=LSE_ATOL, rtol=LSE_RTOL)


def test_learnable_sink():
    dtype = torch.bfloat16
    _require(dtype)
    q, k, v = _inputs((2, 113, 4, 512), (2, 113, 2, 512), (2, 113, 2, 512), dtype=dtype)
    sink = torch.randn(4, device="cuda")
    with torch.no_grad():
        out = flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    _check(out, None, q, k, v, True, learnable_sink=sink)


def test_refused_calls_name_why():
    dtype = torch.bfloat16
    _require(dtype)
    q, k, v = _inputs((1, 64, 2, 512), (1, 64, 2, 512), (1, 64, 2, 512), dtype=dtype)
    with pytest.raises(ValueError, match="forward only.*require grad"):
        flash_attn_func(q.requires_grad_(), k, v)
    q = q.detach()
    with torch.no_grad():
        for kwargs in (dict(dropout_p=0.1), dict(softcap=5.0),
                       dict(alibi_slopes=torch.rand(1, 2, device="cuda"))):
            with pytest.raises(ValueError, match="plain attention only"):
                flash_attn_func(q, k, v, **kwargs)
        with pytest.raises(ValueError, match="headdim must be between 1 and 256"):
            flash_attn_with_kvcache(q, k, v)
