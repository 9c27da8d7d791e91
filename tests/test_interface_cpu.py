"""Tests of the Python layer that run without a GPU (CPU and meta tensors).

They cover the public surface (names, signatures, defaults, op schemas), input validation
(including the feature arguments: window, softcap, ALiBi, dropout), the fake (meta) implementations of the
custom ops and their use under torch.compile, and - with the kernel replaced by a CPU
reference - the head-dim padding, softmax_scale defaulting and gradient plumbing of the
autograd Functions.
"""

import inspect
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import flash_attn
import flash_attn.flash_attn_interface as fi
from flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

from fa_test_utils import attention_ref

DEVICES = ["cpu", "meta"]


def _t(*shape, device="meta", dtype=torch.float16, requires_grad=False):
    if device == "meta":
        return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=requires_grad)
    return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)


def _qkv(b=2, sq=17, sk=33, h=6, hk=2, d=64, device="meta", dtype=torch.float16,
         requires_grad=False):
    return (
        _t(b, sq, h, d, device=device, dtype=dtype, requires_grad=requires_grad),
        _t(b, sk, hk, d, device=device, dtype=dtype, requires_grad=requires_grad),
        _t(b, sk, hk, d, device=device, dtype=dtype, requires_grad=requires_grad),
    )


# ---------------------------------------------------------------------------------------
# Public surface
# ---------------------------------------------------------------------------------------


def test_version_and_exports():
    assert flash_attn.__version__ == "2.8.3"
    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                 "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                 "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"):
        assert getattr(flash_attn, name) is getattr(fi, name)


_COMMON_TAIL = [
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("softcap", 0.0),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
]


@pytest.mark.parametrize(
    "fn, head",
    [
        (flash_attn_func, ["q", "k", "v"]),
        (flash_attn_qkvpacked_func, ["qkv"]),
        (flash_attn_kvpacked_func, ["q", "kv"]),
    ],
    ids=["func", "qkvpacked", "kvpacked"],
)
def test_public_signatures_match_upstream(fn, head):
    # Upstream's parameters, then the keyword-only learnable_sink.
    params = list(inspect.signature(fn).parameters.values())
    *params, sink = params
    assert sink.name == "learnable_sink" and sink.default is None
    assert sink.kind is inspect.Parameter.KEYWORD_ONLY
    assert [p.name for p in params] == head + [n for n, _ in _COMMON_TAIL]
    for p in params[: len(head)]:
        assert p.default is inspect.Parameter.empty
    for p, (name, default) in zip(params[len(head):], _COMMON_TAIL):
        assert p.default == default, f"{name}: default {p.default!r} != {default!r}"
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert fn.__doc__ and "causal" in fn.__doc__


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_custom_op_schemas_match_upstream():
    fwd = torch.ops.flash_attn._flash_attn_forward.default._schema
    assert [a.name for a in fwd.arguments] == [
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size_left",
        "window_size_right", "softcap", "alibi_slopes", "return_softmax", "learnable_sink",
    ]
    assert fwd.arguments[-1].default_value is None  # upstream's calls stay valid
    assert len(fwd.returns) == 4
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in fwd.arguments)
    bwd = torch.ops.flash_attn._flash_attn_backward.default._schema
    assert [a.name for a in bwd.arguments] == [
        "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "dropout_p",
        "softmax_scale", "causal", "window_size_left", "window_size_right", "softcap",
        "alibi_slopes", "deterministic", "rng_state",
    ]
    mutated = {a.name for a in bwd.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"dq", "dk", "dv"}
    assert len(bwd.returns) == 1


def test_autograd_function_forward_signatures():
    tail = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
            "deterministic", "return_softmax", "is_grad_enabled", "learnable_sink"]
    for cls, head in [
        (fi.FlashAttnFunc, ["q", "k", "v"]),
        (fi.FlashAttnQKVPackedFunc, ["qkv"]),
        (fi.FlashAttnKVPackedFunc, ["q", "kv"]),
    ]:
        names = list(inspect.signature(cls.forward).parameters)
        assert names == ["ctx"] + head + tail, cls.__name__


# ---------------------------------------------------------------------------------------
# Input validation (CPU and meta tensors)
# ---------------------------------------------------------------------------------------


def _bad_case(case, device):
    """Return (args for flash_attn_func, expected exception type, match regex)."""
    q, k, v = _qkv(device=device)
    if case == "dtype_fp32":
        return (q.float(), k.float(), v.float()), TypeError, r"\bq\b.*float32.*float16.*bfloat16"
    if case == "dtype_mismatch":
        return (q, k.to(torch.bfloat16), v), TypeError, r"\bk\b.*dtype.*same dtype"
    if case == "rank3":
        return (q[0], k, v), ValueError, r"\bq\b must have 4 dimensions"
    if case == "rank5_k":
        return (q, k.unsqueeze(0), v), ValueError, r"\bk\b must have 4 dimensions"
    if case == "batch_mismatch":
        return (q, k[:1], v[:1]), ValueError, r"\bk\b has batch size 1 but q has batch size 2"
    if case == "headdim_mismatch":
        return (q, k[..., :32], v[..., :32]), ValueError, r"\bk\b has headdim 32 but q has headdim 64"
    if case == "v_shape_mismatch":
        return (q, k, v[:, :5]), ValueError, r"\bv\b must have the same shape as k"
    if case == "headdim_too_large":
        q, k, v = _qkv(d=520, device=device)
        return (q, k, v), ValueError, r"\bq\b has headdim 520.*512"
    if case == "nheads_not_divisible":
        q, k, v = _qkv(h=6, hk=4, device=device)
        return (q, k, v), ValueError, r"heads in q \(6\).*divisible.*nheads_k=4"
    if case == "last_dim_not_contiguous":
        qt = _t(2, 17, 64, 6, device=device).transpose(-1, -2)
        return (qt, k, v), ValueError, r"\bq\b must have a contiguous last dimension"
    if case == "v_last_dim_not_contiguous":
        vt = _t(2, 33, 64, 2, device=device).transpose(-1, -2)
        return (q, k, vt), ValueError, r"\bv\b must have a contiguous last dimension"
    if case == "seqlen_q_zero":
        return (q[:, :0], k, v), ValueError, r"\bq\b has seqlen 0"
    if case == "seqlen_k_zero":
        return (q, k[:, :0], v[:, :0]), ValueError, r"\bk\b has seqlen 0"
    if case == "batch_zero":
        return (q[:0], k[:0], v[:0]), ValueError, r"\bq\b has batch size 0"
    if case == "not_a_tensor":
        return (q, 3.0, v), TypeError, r"\bk\b must be a torch.Tensor"
    if case == "window_size_not_pair":
        return (q, k, v), ValueError, r"window_size must be a pair"
    raise AssertionError(case)


BAD_CASES = [
    "dtype_fp32", "dtype_mismatch", "rank3", "rank5_k", "batch_mismatch", "headdim_mismatch",
    "v_shape_mismatch", "headdim_too_large", "nheads_not_divisible", "last_dim_not_contiguous",
    "v_last_dim_not_contiguous", "seqlen_q_zero", "seqlen_k_zero", "batch_zero", "not_a_tensor",
    "window_size_not_pair",
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD_CASES)
def test_invalid_inputs_raise(case, device):
    args, exc, match = _bad_case(case, device)
    kwargs = {"window_size": (-1, -1, 3)} if case == "window_size_not_pair" else {}
    with pytest.raises(exc, match=match) as info:
        flash_attn_func(*args, **kwargs)
    # Also a RuntimeError, like upstream's C++ checks.
    assert isinstance(info.value, RuntimeError)
    assert str(info.value).startswith("flash_attn: ")


def test_cpu_tensors_rejected():
    q, k, v = _qkv(device="cpu")
    with pytest.raises(ValueError, match=r"^flash_attn: q must be on a CUDA device, got device cpu"):
        flash_attn_func(q, k, v)
    qkv = torch.randn(2, 17, 3, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"qkv must be on a CUDA device"):
        flash_attn_qkvpacked_func(qkv)
    kv = torch.randn(2, 17, 2, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"\bq\b must be on a CUDA device"):
        flash_attn_kvpacked_func(qkv[:, :, 0], kv)


def test_mixed_devices_rejected():
    q, _, _ = _qkv(device="meta")
    _, k, v = _qkv(device="cpu")
    with pytest.raises(ValueError, match=r"\bk\b is on device cpu but q is on device meta"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_layout_validation(device):
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch_size, seqlen, 3"):
        flash_attn_qkvpacked_func(_t(2, 17, 2, 4, 64, device=device))
    with pytest.raises(ValueError, match=r"qkv must have shape"):
        flash_attn_qkvpacked_func(_t(2, 17, 4, 64, device=device))
    with pytest.raises(TypeError, match=r"\bqkv\b has dtype torch.float32"):
        flash_attn_qkvpacked_func(_t(2, 17, 3, 4, 64, device=device, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"\bqkv\b has headdim 520"):
        flash_attn_qkvpacked_func(_t(2, 17, 3, 4, 520, device=device))
    q = _t(2, 17, 6, 64, device=device)
    with pytest.raises(ValueError, match=r"kv must have shape \(batch_size, seqlen_k, 2"):
        flash_attn_kvpacked_func(q, _t(2, 33, 3, 2, 64, device=device))
    with pytest.raises(ValueError, match=r"\bkv\b has batch size 3 but q has batch size 2"):
        flash_attn_kvpacked_func(q, _t(3, 33, 2, 2, 64, device=device))
    with pytest.raises(ValueError, match=r"heads in q \(6\).*divisible.*nheads_k=4"):
        flash_attn_kvpacked_func(q, _t(2, 33, 2, 4, 64, device=device))
    with pytest.raises(ValueError, match=r"\bkv\b must have a contiguous last dimension"):
        flash_attn_kvpacked_func(q, _t(2, 33, 2, 64, 2, device=device).transpose(-1, -2))


# ---------------------------------------------------------------------------------------
# Feature arguments: upstream's errors for bad or forbidden combinations, naming the argument
# ---------------------------------------------------------------------------------------

BAD_FEATURES = [
    ({"dropout_p": -0.1}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ({"dropout_p": 1.0}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ({"dropout_p": 1.5}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ({"softcap": 30.0, "dropout_p": 0.1}, ValueError, r"softcap.*does not support dropout"),
    ({"alibi_slopes": "F64"}, TypeError, r"alibi_slopes must have dtype torch.float32"),
    ({"alibi_slopes": "SHAPE"}, ValueError, r"alibi_slopes must have shape \(nheads,\)"),
    ({"alibi_slopes": "BATCH"}, ValueError, r"alibi_slopes must have shape"),
    ({"alibi_slopes": "LIST"}, TypeError, r"alibi_slopes must be a torch.Tensor"),
    ({"window_size": (1, 2, 3)}, ValueError, r"window_size must be a pair"),
    ({"window_size": "TENSOR3"}, ValueError, r"window_size must be a pair"),
]


def _bad_feature_kwargs(kwargs, device, nheads=6, batch=2):
    kwargs = dict(kwargs)
    special = kwargs.get("alibi_slopes")
    if special == "F64":
        kwargs["alibi_slopes"] = torch.ones(nheads, dtype=torch.float64, device=device)
    elif special == "SHAPE":
        kwargs["alibi_slopes"] = torch.ones(nheads + 1, dtype=torch.float32, device=device)
    elif special == "BATCH":
        kwargs["alibi_slopes"] = torch.ones(batch + 1, nheads, dtype=torch.float32, device=device)
    elif special == "LIST":
        kwargs["alibi_slopes"] = [1.0] * nheads
    if kwargs.get("window_size") == "TENSOR3":
        kwargs["window_size"] = torch.tensor([1, 2, 3])
    return kwargs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs, exc, match", BAD_FEATURES,
                         ids=[f"{next(iter(k))}{i}" for i, (k, _, _) in enumerate(BAD_FEATURES)])
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_bad_feature_arguments_raise(variant, kwargs, exc, match, device):
    kwargs = _bad_feature_kwargs(kwargs, device)
    if variant == "func":
        q, k, v = _qkv(device=device)
        call = lambda: flash_attn_func(q, k, v, **kwargs)  # noqa: E731
    elif variant == "qkvpacked":
        qkv = _t(2, 33, 3, 6, 64, device=device)
        call = lambda: flash_attn_qkvpacked_func(qkv, **kwargs)  # noqa: E731
    else:
        q = _t(2, 17, 6, 64, device=device)
        kv = _t(2, 33, 2, 2, 64, device=device)
        call = lambda: flash_attn_kvpacked_func(q, kv, **kwargs)  # noqa: E731
    with pytest.raises(exc, match=match):
        call()


def test_no_not_implemented_for_feature_arguments():
    """Every feature argument upstream accepts is accepted (meta tensors: shapes only)."""
    q, k, v = _qkv(requires_grad=True)
    slopes = torch.rand(6, device="meta")
    cases = [
        {"window_size": (4, 4)},
        {"window_size": (-1, 3)},
        {"window_size": (16, -1), "causal": True},
        {"window_size": torch.tensor([3, 0])},
        {"softcap": 30.0},
        {"softcap": 30.0, "window_size": (8, 0)},
        {"alibi_slopes": slopes},
        {"alibi_slopes": torch.rand(2, 6, device="meta"), "causal": True},
        {"dropout_p": 0.1},
        {"dropout_p": 0.1, "alibi_slopes": slopes, "window_size": (5, 2), "causal": True},
        {"deterministic": True},
    ]
    for kwargs in cases:
        out = flash_attn_func(q, k, v, **kwargs)
        assert out.shape == q.shape
        grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("sq, sk", [(17, 33), (128, 128), (129, 200)])
def test_meta_dropout_returns_s_dmask(sq, sk):
    q, k, v = _qkv(sq=sq, sk=sk)
    out, lse, S_dmask = flash_attn_func(q, k, v, dropout_p=0.2, return_attn_probs=True)
    r = lambda x: (x + 127) // 128 * 128  # noqa: E731
    assert S_dmask.shape == (2, 6, r(sq), r(sk)) and S_dmask.dtype == q.dtype


def test_get_block_size_n():
    for d in (32, 64):
        assert fi._get_block_size_n("cuda", d, True, False) == 128
    for d in (96, 128, 256):
        assert fi._get_block_size_n("cuda", d, True, True) == 64


@pytest.mark.parametrize(
    "causal, window_size",
    [
        (False, (-1, -1)),
        (True, (-1, -1)),
        (False, (-1, 0)),  # the same as causal=True (upstream)
        (True, (-1, 7)),  # causal overrides the right window (upstream)
        (False, (33, -1)),  # >= seqlen_k: no limit (upstream)
        (False, (-1, 33)),
        (True, (100, 100)),
        (False, [-1, -1]),  # a list is fine
        (False, (4, 4)),
        (False, (0, 0)),
        (True, (7, -1)),
        (False, torch.tensor([3, 2])),  # a 2-element tensor is fine (upstream)
    ],
)
def test_supported_window_sizes_accepted(causal, window_size):
    q, k, v = _qkv(sk=33)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    assert out.shape == q.shape


@pytest.mark.parametrize(
    "causal, window_size, seqlen_q, expected",
    [
        (False, (-1, -1), 17, False),
        (True, (-1, -1), 17, True),
        (False, (-1, 0), 17, True),
        (True, (-1, 5), 17, True),
        (True, (-1, -1), 1, False),  # one query row: causal hides nothing
        (False, (40, 40), 17, False),
        (True, (33, -1), 17, True),
        (False, (4, 0), 17, False),
        (True, (4, -1), 17, False),  # a sliding window, not plain causal
    ],
)
def test_effective_causal(causal, window_size, seqlen_q, expected):
    assert fi._effective_causal(causal, *window_size, seqlen_q, 33, False) is expected


@pytest.mark.parametrize(
    "causal, window_size, seqlen_q, has_alibi, expected",
    [
        (False, (-1, -1), 17, False, (False, -1, -1)),
        (True, (-1, -1), 17, False, (True, -1, 0)),
        (True, (-1, 9), 17, False, (True, -1, 0)),
        (False, (4, 3), 17, False, (False, 4, 3)),
        (False, (33, 40), 17, False, (False, -1, -1)),  # sides >= seqlen_k are unbounded
        (False, (-5, 2), 17, False, (False, -1, 2)),  # any negative side is unbounded
        (True, (4, -1), 1, False, (False, 4, -1)),  # one query row: causal dropped
        (True, (4, -1), 1, True, (False, 4, 0)),  # ... unless ALiBi (upstream)
        (True, (32, -1), 17, False, (False, 32, 0)),
    ],
)
def test_resolve_window(causal, window_size, seqlen_q, has_alibi, expected):
    assert fi._resolve_window(causal, *window_size, seqlen_q, 33, has_alibi) == expected


def test_softcap_negative_means_off():
    # As upstream documents, softcap <= 0 means no softcapping.
    q, k, v = _qkv()
    assert flash_attn_func(q, k, v, softcap=-1.0).shape == q.shape


# ---------------------------------------------------------------------------------------
# Fake / meta implementations
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [32, 59, 64, 111, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_meta_forward_backward_shapes(d, causal, dtype):
    q, k, v = _qkv(d=d, dtype=dtype, requires_grad=True)
    out, lse, S_dmask = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == "meta"
    assert lse.shape == (2, 6, 17) and lse.dtype == torch.float32
    assert S_dmask.shape == (0,)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == dtype


def test_meta_packed_shapes():
    qkv = _t(3, 19, 3, 4, 59, requires_grad=True)
    out, lse, S = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert out.shape == (3, 19, 4, 59) and lse.shape == (3, 4, 19) and S.numel() == 0
    (g,) = torch.autograd.grad(out, (qkv,), torch.empty_like(out))
    assert g.shape == qkv.shape
    q = _t(3, 19, 4, 59, requires_grad=True)
    kv = _t(3, 23, 2, 1, 59, requires_grad=True)
    out = flash_attn_kvpacked_func(q, kv)
    assert out.shape == q.shape
    gq, gkv = torch.autograd.grad(out, (q, kv), torch.empty_like(out))
    assert gq.shape == q.shape and gkv.shape == kv.shape


def test_return_attn_probs_tuple_and_plain_output():
    q, k, v = _qkv()
    res = flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_fake_ops_on_meta():
    q, k, v = _qkv(d=64)
    out, lse, S, rng = torch.ops.flash_attn._flash_attn_forward(
        q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, False)
    assert out.shape == q.shape and out.is_contiguous()
    assert lse.shape == (2, 6, 17) and lse.dtype == torch.float32
    assert S.shape == (0,) and rng.shape == (2,) and rng.dtype == torch.int64
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    softmax_d = torch.ops.flash_attn._flash_attn_backward(
        out, q, k, v, out, lse, dq, dk, dv, 0.0, 0.125, True, -1, -1, 0.0, None, False, rng)
    assert softmax_d.shape == (2, 6, 128) and softmax_d.dtype == torch.float32
    q2 = _t(1, 200, 2, 64)
    _, lse2, _, _ = torch.ops.flash_attn._flash_attn_forward(
        q2, q2, q2, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    sd2 = torch.ops.flash_attn._flash_attn_backward(
        q2, q2, q2, q2, q2, lse2, None, None, None, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    assert sd2.shape == (1, 2, 256)
    _, _, S3, rng3 = torch.ops.flash_attn._flash_attn_forward(
        q, k, v, 0.1, 0.125, True, 4, -1, 0.0, None, True)
    assert S3.shape == (2, 6, 128, 128) and rng3.shape == (2,)
    with pytest.raises(ValueError, match="return_softmax=True is only supported when dropout_p > 0"):
        torch.ops.flash_attn._flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, True)
    with pytest.raises(ValueError, match="softcap"):
        torch.ops.flash_attn._flash_attn_forward(q, k, v, 0.1, 0.125, True, -1, -1, 5.0, None, False)
    sd3 = torch.ops.flash_attn._flash_attn_backward(
        out, q, k, v, out, lse, dq, dk, dv, 0.1, 0.125, True, 3, 2, 0.0, None, True, rng)
    assert sd3.shape == (2, 6, 128)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_on_meta(causal):
    q, k, v = _qkv(d=64)
    torch.library.opcheck(
        torch.ops.flash_attn._flash_attn_forward.default,
        (q, k, v, 0.0, 0.125, causal, -1, -1, 0.0, None, False),
    )
    out = _t(2, 17, 6, 64)
    lse = torch.empty(2, 6, 17, device="meta", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    torch.library.opcheck(
        torch.ops.flash_attn._flash_attn_backward.default,
        (out, q, k, v, out, lse, dq, dk, dv, 0.0, 0.125, causal, -1, -1, 0.0, None, False, None),
    )


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_on_meta(variant, dynamic):
    """torch.compile(fullgraph=True) traces forward and backward without graph breaks; the
    aot_eager backend then runs the graphs on meta tensors through the fake kernels."""
    torch._dynamo.reset()
    fn = {"func": flash_attn_func, "qkvpacked": flash_attn_qkvpacked_func,
          "kvpacked": flash_attn_kvpacked_func}[variant]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for s, d in [(17, 59), (40, 64)]:
        if variant == "func":
            args = _qkv(sq=s, sk=s + 5, d=d, requires_grad=True)
        elif variant == "qkvpacked":
            args = (_t(2, s, 3, 4, d, requires_grad=True),)
        else:
            args = (_t(2, s, 4, d, requires_grad=True), _t(2, s + 5, 2, 2, d, requires_grad=True))
        out = compiled(*args, causal=True)
        b, s_q = args[0].shape[:2]
        assert out.shape == (b, s_q, args[0].shape[-2], d)
        grads = torch.autograd.grad(out, args, torch.empty_like(out))
        for g, a in zip(grads, args):
            assert g.shape == a.shape


# ---------------------------------------------------------------------------------------
# Padding, softmax_scale defaulting and gradient plumbing, with the kernel replaced by a
# CPU reference (fp32 math on whatever the autograd Functions hand to the ops).
# ---------------------------------------------------------------------------------------


class _CpuKernel:
    def __init__(self):
        self.fwd_calls = []
        self.bwd_calls = []

    @staticmethod
    def _features(q, k, dropout_p, causal, window_size_left, window_size_right, softcap,
                  alibi_slopes, rng_state):
        """The op's arguments as attention_ref features (window resolved as the binding does;
        the dropout mask from the Python reference of the kernels' Philox mask)."""
        from fa_test_utils import dropout_keep_ref

        is_causal, wl, wr = fi._resolve_window(causal, window_size_left, window_size_right,
                                               q.shape[1], k.shape[1], alibi_slopes is not None)
        feats = {"window_size": (wl, wr), "softcap": softcap, "alibi_slopes": alibi_slopes}
        if dropout_p > 0:
            seed, offset = rng_state.tolist()
            feats["dropout_p"] = dropout_p
            feats["dropout_mask"] = dropout_keep_ref(seed, offset, q.shape[0], q.shape[2],
                                                     q.shape[1], k.shape[1], dropout_p)
        return is_causal, feats

    def fwd(self, q, k, v, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, softcap, alibi_slopes, return_softmax):
        fi._check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                           alibi_slopes, False, q.shape[1], k.shape[1])
        rng_state = torch.tensor([1234 + len(self.fwd_calls), 8 * len(self.fwd_calls)])
        is_causal, feats = self._features(q, k, dropout_p, causal, window_size_left,
                                          window_size_right, softcap, alibi_slopes, rng_state)
        self.fwd_calls.append({"headdim": q.shape[-1], "k_headdim": k.shape[-1],
                               "v_headdim": v.shape[-1], "softmax_scale": softmax_scale,
                               "causal": is_causal, **feats})
        out, lse = attention_ref(q.float(), k.float(), v.float(), causal=is_causal,
                                 softmax_scale=softmax_scale, **feats)
        return out.to(q.dtype), lse, torch.empty(0, dtype=q.dtype), rng_state

    def bwd(self, dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
            causal, window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
            rng_state=None):
        fi._check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                           alibi_slopes, deterministic, q.shape[1], k.shape[1])
        is_causal, feats = self._features(q, k, dropout_p, causal, window_size_left,
                                          window_size_right, softcap, alibi_slopes, rng_state)
        self.bwd_calls.append({"dout_headdim": dout.shape[-1], "headdim": q.shape[-1],
                               "softmax_scale": softmax_scale,
                               "dq_is_view": dq._base is not None,
                               "deterministic": deterministic})
        with torch.enable_grad():
            qf, kf, vf = [x.detach().float().requires_grad_() for x in (q, k, v)]
            o, _ = attention_ref(qf, kf, vf, causal=is_causal, softmax_scale=softmax_scale,
                                 **feats)
            gq, gk, gv = torch.autograd.grad(o, (qf, kf, vf), dout.float())
        dq.copy_(gq)
        dk.copy_(gk)
        dv.copy_(gv)
        b, sq, h, _ = q.shape
        return torch.empty(b, h, fi.round_multiple(sq, 128), dtype=torch.float32)


@pytest.fixture
def cpu_kernel(monkeypatch):
    kernel = _CpuKernel()
    monkeypatch.setattr(fi, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(fi, "_wrapped_flash_attn_forward", kernel.fwd)
    monkeypatch.setattr(fi, "_wrapped_flash_attn_backward", kernel.bwd)
    return kernel


def _ref_fp32(q, k, v, causal, softmax_scale, dout):
    qf, kf, vf = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out, lse = attention_ref(qf, kf, vf, causal=causal, softmax_scale=softmax_scale)
    grads = torch.autograd.grad(out, (qf, kf, vf), dout.float())
    return out, lse, grads


def _assert_bf16_close(ours, ref, what):
    assert ours.dtype == torch.bfloat16, what
    torch.testing.assert_close(ours.float(), ref.float(), atol=2e-2, rtol=2e-2,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("d", [8, 59, 64, 100, 111])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softmax_scale", [None, 0.3])
def test_padding_and_scale_func(cpu_kernel, d, causal, softmax_scale):
    b, sq, sk, h, hk = 2, 13, 21, 4, 2
    dtype = torch.bfloat16
    q, k, v = [torch.randn(b, s, n, d, dtype=dtype, requires_grad=True)
               for s, n in ((sq, h), (sk, hk), (sk, hk))]
    out, lse, S = flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                  return_attn_probs=True)
    (call,) = cpu_kernel.fwd_calls
    d_pad = (d + 7) // 8 * 8
    assert call["headdim"] == call["k_headdim"] == call["v_headdim"] == d_pad
    expected_scale = d ** (-0.5) if softmax_scale is None else softmax_scale
    assert call["softmax_scale"] == expected_scale  # from the unpadded headdim
    assert call["causal"] is causal
    assert out.shape == q.shape and S.numel() == 0
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    (bcall,) = cpu_kernel.bwd_calls
    assert bcall["dout_headdim"] == d_pad and bcall["headdim"] == d_pad
    assert bcall["softmax_scale"] == expected_scale
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape

    out_ref, lse_ref, (dq_ref, dk_ref, dv_ref) = _ref_fp32(q, k, v, causal, expected_scale, dout)
    _assert_bf16_close(out, out_ref, "out")
    rows = torch.ones(sq, dtype=torch.bool)
    torch.testing.assert_close(lse[..., rows], lse_ref[..., rows], atol=1e-4, rtol=1e-4)
    _assert_bf16_close(dq, dq_ref, "dq")
    _assert_bf16_close(dk, dk_ref, "dk")
    _assert_bf16_close(dv, dv_ref, "dv")


@pytest.mark.parametrize("d", [59, 64])
def test_padding_and_grads_qkvpacked(cpu_kernel, d):
    qkv = torch.randn(2, 13, 3, 4, d, dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    assert cpu_kernel.fwd_calls[0]["softmax_scale"] == d ** (-0.5)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    assert dqkv.shape == qkv.shape
    assert cpu_kernel.bwd_calls[0]["dq_is_view"]  # dq/dk/dv are views into one dqkv buffer
    q, k, v = qkv.unbind(2)
    out_ref, _, (dq_ref, dk_ref, dv_ref) = _ref_fp32(q, k, v, True, None, dout)
    _assert_bf16_close(out, out_ref, "out")
    _assert_bf16_close(dqkv[:, :, 0], dq_ref, "dq")
    _assert_bf16_close(dqkv[:, :, 1], dk_ref, "dk")
    _assert_bf16_close(dqkv[:, :, 2], dv_ref, "dv")


@pytest.mark.parametrize("d", [59, 64])
def test_padding_and_grads_kvpacked(cpu_kernel, d):
    q = torch.randn(2, 13, 6, d, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(2, 19, 2, 2, d, dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_kvpacked_func(q, kv)
    assert cpu_kernel.fwd_calls[0]["softmax_scale"] == d ** (-0.5)
    dout = torch.randn_like(out)
    dq, dkv = torch.autograd.grad(out, (q, kv), dout)
    assert dq.shape == q.shape and dkv.shape == kv.shape
    k, v = kv.unbind(2)
    out_ref, _, (dq_ref, dk_ref, dv_ref) = _ref_fp32(q, k, v, False, None, dout)
    _assert_bf16_close(out, out_ref, "out")
    _assert_bf16_close(dq, dq_ref, "dq")
    _assert_bf16_close(dkv[:, :, 0], dk_ref, "dk")
    _assert_bf16_close(dkv[:, :, 1], dv_ref, "dv")


FEATURE_CASES = [
    {"window_size": (3, 2)},
    {"window_size": (0, 0)},
    {"window_size": (5, -1), "causal": True},
    {"window_size": torch.tensor([4, 1])},
    {"softcap": 2.0},
    {"softcap": 2.0, "window_size": (6, 0)},
    {"alibi_slopes": "H"},
    {"alibi_slopes": "BH", "causal": True},
    {"dropout_p": 0.3},
    {"dropout_p": 0.3, "alibi_slopes": "H", "window_size": (4, 1), "causal": True},
]


@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
@pytest.mark.parametrize("kwargs", FEATURE_CASES, ids=[str(i) for i in range(len(FEATURE_CASES))])
def test_feature_arguments_reach_the_kernel(cpu_kernel, variant, kwargs):
    """The feature arguments travel through every entry point to the op unchanged, forward and
    backward (the CPU kernel is the fp32 reference with the same features)."""
    b, s, h, d = 2, 13, 4, 24
    hk = 2 if variant != "qkvpacked" else h
    kwargs = dict(kwargs)
    if kwargs.get("alibi_slopes") == "H":
        kwargs["alibi_slopes"] = torch.rand(h) * 0.5
    elif kwargs.get("alibi_slopes") == "BH":
        kwargs["alibi_slopes"] = torch.rand(b, h) * 0.5
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hk, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hk, d, dtype=torch.bfloat16, requires_grad=True)
    if variant == "func":
        inputs = (q, k, v)
        out = flash_attn_func(q, k, v, **kwargs)
    elif variant == "qkvpacked":
        qkv = torch.stack([q, k, v], dim=2).detach().requires_grad_()
        inputs = (qkv,)
        out = flash_attn_qkvpacked_func(qkv, **kwargs)
    else:
        kv = torch.stack([k, v], dim=2).detach().requires_grad_()
        inputs = (q, kv)
        out = flash_attn_kvpacked_func(q, kv, **kwargs)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, dout)
    (call,) = cpu_kernel.fwd_calls
    (bcall,) = cpu_kernel.bwd_calls
    assert bcall["deterministic"] is False
    # The reference on the same features (and the dropout mask the kernel used).
    feats = {key: call[key] for key in ("window_size", "softcap", "alibi_slopes", "dropout_p",
                                        "dropout_mask") if key in call}
    qr, kr, vr = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out_ref, _ = attention_ref(qr, kr, vr, causal=call["causal"], **feats)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(out_ref, (qr, kr, vr), dout.float())
    _assert_bf16_close(out, out_ref, "out")
    if variant == "func":
        got = grads
    elif variant == "qkvpacked":
        got = grads[0].unbind(2)
    else:
        got = (grads[0], *grads[1].unbind(2))
    for g, r, name in zip(got, (dq_ref, dk_ref, dv_ref), ("dq", "dk", "dv")):
        _assert_bf16_close(g, r, name)
    # What the op saw, resolved as upstream's C++ does.
    window = kwargs.get("window_size", (-1, -1))
    if isinstance(window, torch.Tensor):
        window = tuple(window.tolist())
    expect = fi._resolve_window(kwargs.get("causal", False), *window, s, s,
                                "alibi_slopes" in kwargs)
    assert (call["causal"], *call["window_size"]) == expect


def test_deterministic_reaches_the_backward(cpu_kernel):
    q, k, v = [torch.randn(1, 5, 2, 16, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3)]
    out = flash_attn_func(q, k, v, deterministic=True)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert cpu_kernel.bwd_calls[0]["deterministic"] is True


def test_reference_window_mask():
    from fa_test_utils import local_visible

    vis = local_visible(3, 5, (1, 0))  # diag offset 2: row i sees [i + 1, i + 2]
    assert vis.int().tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    vis = local_visible(4, 2, (0, 0), causal=True)  # diag offset -2
    assert vis.int().tolist() == [[0, 0], [0, 0], [1, 0], [0, 1]]
    assert local_visible(4, 4, (-1, -1)) is None


def test_dropout_reference_mask():
    from fa_test_utils import PHILOX_ROUNDS, dropout_keep_ref, philox4x32

    # Philox4x32-10 known answers (Random123): the round function the mask's Philox iterates
    # (7 rounds, as upstream flash-attn).
    assert PHILOX_ROUNDS == 7
    assert [int(x) for x in philox4x32([0, 0, 0, 0], [0, 0], rounds=10)] == \
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(x) for x in philox4x32([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
                                       [0xA4093822, 0x299F31D0], rounds=10)] == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    m = dropout_keep_ref(42, 1024, 2, 3, 256, 512, 0.25)
    assert abs(m.float().mean().item() - 0.75) < 0.01
    assert torch.equal(m, dropout_keep_ref(42, 1024, 2, 3, 256, 512, 0.25))
    assert not torch.equal(m, dropout_keep_ref(42, 1040, 2, 3, 256, 512, 0.25))
    # Mask of a sub-rectangle = the sub-rectangle of the mask (a pure function of the indices).
    assert torch.equal(dropout_keep_ref(42, 1024, 2, 3, 100, 300, 0.25), m[:, :, :100, :300])


def test_saves_for_backward_only_when_needed(cpu_kernel):
    q, k, v = [torch.randn(1, 5, 2, 16, dtype=torch.bfloat16) for _ in range(3)]
    out = flash_attn_func(q, k, v)
    assert out.grad_fn is None
    q.requires_grad_()
    out = flash_attn_func(q, k, v)
    assert out.grad_fn is not None and len(out.grad_fn.saved_tensors) == 6
    with torch.no_grad():
        out = flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad


def test_cpu_kernel_masked_rows_give_zero(cpu_kernel):
    # seqlen_q > seqlen_k with causal: the first rows see no key.
    q = torch.randn(1, 7, 2, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 3, 2, 16, dtype=torch.bfloat16)
    out, lse, _ = flash_attn_func(q, k, k.clone(), causal=True, return_attn_probs=True)
    assert torch.all(out[:, :4] == 0)
    assert torch.isposinf(lse[..., :4]).all()
    assert torch.isfinite(lse[..., 4:]).all()


# ---------------------------------------------------------------------------------------
# The reference itself
# ---------------------------------------------------------------------------------------


def test_attention_ref_matches_sdpa():
    q = torch.randn(2, 9, 4, 16)
    k = torch.randn(2, 9, 4, 16)
    v = torch.randn(2, 9, 4, 16)
    out, _ = attention_ref(q, k, v, causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)


def test_attention_ref_gqa_and_bottom_right_causal():
    q = torch.randn(1, 2, 4, 8)
    k = torch.randn(1, 5, 2, 8)
    v = torch.randn(1, 5, 2, 8)
    out, lse = attention_ref(q, k, v, causal=True)
    # query 0 sees keys 0..3, query 1 sees keys 0..4; head 3 uses kv head 1.
    s = (q[0, 0, 3] @ k[0, :4, 1].T) / math.sqrt(8)
    torch.testing.assert_close(out[0, 0, 3], torch.softmax(s, -1) @ v[0, :4, 1])
    torch.testing.assert_close(lse[0, 3, 0], torch.logsumexp(s, -1))


# ---------------------------------------------------------------------------------------
# Without the extension
# ---------------------------------------------------------------------------------------


def test_missing_extension_gives_clear_import_error(monkeypatch):
    from flash_attn import _common

    monkeypatch.setattr(_common, "_C", None)  # the loader's cache (fi._C reads it)
    monkeypatch.setitem(sys.modules, "flash_attn._C", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"flash_attn\._C could not be imported"):
        fi._get_ext()


def test_package_imports_without_extension():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["flash_attn._C"] = None  # simulate a build without kernels
        import torch, flash_attn
        from flash_attn import flash_attn_func
        q = torch.empty(1, 4, 2, 64, device="meta", dtype=torch.float16)
        assert flash_attn_func(q, q, q).shape == q.shape
        c = torch.randn(1, 4, 2, 64, dtype=torch.float16)
        try:
            flash_attn_func(c, c, c)
        except ValueError as e:
            assert "CUDA device" in str(e)
        else:
            raise AssertionError("CPU tensors accepted")
        print("ok")
        """
    )
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(flash_attn.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


# ---------------------------------------------------------------------------------------
# The GPU tests' error rule, exercised on CPU with an emulation of a FlashAttention kernel's
# numerics (fp32 scores and accumulators, P and dS rounded to the input dtype before the
# second GEMMs).  It must accept such a kernel on the sweep's edge shapes and reject a
# slightly wrong one.
# ---------------------------------------------------------------------------------------


class _FlashLikeCpuKernel:
    def __init__(self, scale_error=1.0):
        self.scale_error = scale_error

    def _scores(self, q, k, softmax_scale, is_causal):
        h, hk = q.shape[2], k.shape[2]
        kf = k.float().repeat_interleave(h // hk, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q.float(), kf) * (softmax_scale * self.scale_error)
        if is_causal:
            from fa_test_utils import causal_visible

            s = s.masked_fill(~causal_visible(q.shape[1], k.shape[1]), float("-inf"))
        return s

    def fwd(self, q, k, v, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, softcap, alibi_slopes, return_softmax):
        is_causal = fi._effective_causal(causal, window_size_left, window_size_right,
                                         q.shape[1], k.shape[1], False)
        h, hk = q.shape[2], k.shape[2]
        s = self._scores(q, k, softmax_scale, is_causal)
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        vf = v.float().repeat_interleave(h // hk, dim=2)
        acc = torch.einsum("bhts,bshd->bthd", p.to(q.dtype).float(), vf)
        l_t = l.squeeze(-1).transpose(1, 2).unsqueeze(-1)  # (b, t, h, 1)
        out = torch.where(l_t > 0, acc / l_t, torch.zeros_like(acc)).to(q.dtype)
        lse = (m + torch.log(l)).squeeze(-1)
        lse = torch.where(l.squeeze(-1) > 0, lse, torch.full_like(lse, float("inf")))
        return out, lse, torch.empty(0, dtype=q.dtype), torch.zeros(2, dtype=torch.int64)

    def bwd(self, dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
            causal, window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
            rng_state=None):
        is_causal = fi._effective_causal(causal, window_size_left, window_size_right,
                                         q.shape[1], k.shape[1], False)
        b, sq, h, d = q.shape
        hk = k.shape[2]
        scale = softmax_scale * self.scale_error
        s = self._scores(q, k, softmax_scale, is_causal)
        lse = softmax_lse.unsqueeze(-1)
        p = torch.where(torch.isinf(lse), torch.zeros_like(s), torch.exp(s - lse))
        vf = v.float().repeat_interleave(h // hk, dim=2)
        kf = k.float().repeat_interleave(h // hk, dim=2)
        do = dout.float()
        dp = torch.einsum("bthd,bshd->bhts", do, vf)
        D = (do * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, t, 1)
        ds = p * (dp - D)
        dv_e = torch.einsum("bhts,bthd->bshd", p.to(q.dtype).float(), do)
        dq_e = torch.einsum("bhts,bshd->bthd", ds.to(q.dtype).float(), kf) * scale
        dk_e = torch.einsum("bhts,bthd->bshd", ds.to(q.dtype).float(), q.float()) * scale
        g = h // hk
        dk.copy_(dk_e.view(b, -1, hk, g, d).sum(3))
        dv.copy_(dv_e.view(b, -1, hk, g, d).sum(3))
        dq.copy_(dq_e)
        return torch.empty(b, h, fi.round_multiple(sq, 128), dtype=torch.float32)


def _install(monkeypatch, kernel):
    monkeypatch.setattr(fi, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(fi, "_wrapped_flash_attn_forward", kernel.fwd)
    monkeypatch.setattr(fi, "_wrapped_flash_attn_backward", kernel.bwd)


def _run_emulated(dtype, d, sq, sk, causal, b, h, hk):
    from fa_test_utils import check_against_ref

    q = torch.randn(b, sq, h, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, dtype=dtype, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, lse, grads, q, k, v, dout, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 59, 128])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 113), (113, 203), (239, 1), (64, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_error_rule_accepts_flash_like_numerics(monkeypatch, dtype, d, sq, sk, causal):
    _install(monkeypatch, _FlashLikeCpuKernel())
    _run_emulated(dtype, d, sq, sk, causal, 2, 4, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_error_rule_rejects_wrong_kernel(monkeypatch, dtype):
    _install(monkeypatch, _FlashLikeCpuKernel(scale_error=1.02))
    with pytest.raises(AssertionError, match=r"out: max abs error"):
        _run_emulated(dtype, 64, 113, 203, True, 2, 4, 2)


def test_binding_rejects_cpu_tensors():
    """flash_attn._C checks its arguments too (for direct callers): a clear ValueError, no crash."""
    try:
        import flash_attn._C as C
    except ImportError:
        pytest.skip("flash_attn._C is not built")
    q = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        C.fwd(q, q, q, None, 0.125, False, -1, -1, 0.0, None, 0.1, False)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        C.fwd(q, q, q, None, 0.125, False, -1, -1, 3.0, None, 0.0, False)


# ---------------------------------------------------------------------------------------
# softmax_scale: any finite value (0 and negatives included) through the real op
# implementations, with the extension replaced by a CPU stand-in that asserts the kernels'
# preconditions (softmax_scale > 0 among them).
# ---------------------------------------------------------------------------------------


@pytest.fixture
def cpu_ext(monkeypatch):
    from fa_test_utils import install_cpu_ext

    return install_cpu_ext(monkeypatch)


SCALE_FEATURES = [
    {},
    {"causal": True},
    {"window_size": (3, 1)},
    {"window_size": (2, 0), "causal": True},
    {"softcap": 2.0},
    {"softcap": 1.5, "causal": True},
    {"alibi_slopes": "H"},
    {"alibi_slopes": "BH", "causal": True, "window_size": (4, -1)},
]


@pytest.mark.parametrize("softmax_scale", [0.0, -0.0, -0.3, -1.7, 0.4, None])
@pytest.mark.parametrize("feat", SCALE_FEATURES, ids=lambda f: "-".join(f) or "plain")
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_softmax_scale_any_finite_value(cpu_ext, variant, feat, softmax_scale):
    """softmax(Q K^T * scale) V for every finite scale, forward and backward, while the kernel
    only ever sees scale > 0 (CpuExt asserts it)."""
    from fa_test_utils import check_against_ref

    b, s, h, d = 2, 9, 4, 16
    hk = h if variant == "qkvpacked" else 2
    feat = dict(feat)
    if feat.get("alibi_slopes") == "H":
        feat["alibi_slopes"] = torch.rand(h) * 0.5
    elif feat.get("alibi_slopes") == "BH":
        feat["alibi_slopes"] = torch.rand(b, h) * 0.5
    causal = feat.pop("causal", False)
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s + 3 if variant != "qkvpacked" else s, hk, d, dtype=torch.bfloat16,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    kw = dict(softmax_scale=softmax_scale, causal=causal, return_attn_probs=True, **feat)
    if variant == "func":
        out, lse, _ = flash_attn_func(q, k, v, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    elif variant == "qkvpacked":
        qkv = torch.stack([q, k, v], 2).detach().requires_grad_()
        out, lse, _ = flash_attn_qkvpacked_func(qkv, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, qkv, dout)[0].unbind(2)
    else:
        kv = torch.stack([k, v], 2).detach().requires_grad_()
        out, lse, _ = flash_attn_kvpacked_func(q, kv, **kw)
        dout = torch.randn_like(out)
        dq, dkv = torch.autograd.grad(out, (q, kv), dout)
        grads = (dq, *dkv.unbind(2))
    check_against_ref(out, lse, grads, q, k, v, dout, causal, softmax_scale=softmax_scale,
                      **feat)
    if softmax_scale == 0.0:
        assert torch.all(grads[0] == 0) and torch.all(grads[1] == 0)
    assert [c[0] for c in cpu_ext.calls] == ["fwd", "bwd"]
    assert all(c[1] > 0 for c in cpu_ext.calls)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 1e39, -1e300])
def test_softmax_scale_nonfinite_rejected(bad):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attn_func(q, k, v, softmax_scale=bad)
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attn_qkvpacked_func(_t(2, 17, 3, 6, 64), softmax_scale=bad)
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attn_kvpacked_func(q, _t(2, 33, 2, 2, 64), softmax_scale=bad)


def test_softmax_scale_transform_skips_positive():
    """The fast path (scale > 0) hands q through untouched."""
    from flash_attn._common import fix_dq, kernel_q_and_scale

    q = torch.randn(2, 3)
    q2, s, sign = kernel_q_and_scale(q, 0.5)
    assert q2 is q and s == 0.5 and sign == 1
    q2, s, sign = kernel_q_and_scale(q, -0.5)
    assert torch.equal(q2, -q) and s == 0.5 and sign == -1
    q2, s, sign = kernel_q_and_scale(q, 0.0)
    assert torch.equal(q2, torch.zeros_like(q)) and s == 1.0 and sign == 0
    dq = torch.ones(3)
    fix_dq(dq, -1)
    assert torch.equal(dq, -torch.ones(3))
    fix_dq(dq, 0)
    assert torch.equal(dq, torch.zeros(3))
    fix_dq(None, 0)
    with pytest.raises(ValueError, match="softmax_scale"):
        kernel_q_and_scale(q, float("nan"))


def test_private_ops_handle_any_scale(cpu_ext):
    """_flash_attn_forward / _flash_attn_backward (called directly by ring-flash-attn and
    TransformerEngine) take any finite scale too; the lse is that of the scaled scores."""
    from fa_test_utils import attention_ref

    q, k, v = [torch.randn(1, 6, 2, 16) for _ in range(3)]
    for scale in (-0.7, 0.0):
        out, lse, _, rng = fi._flash_attn_forward_impl(q, k, v, 0.0, scale, False, -1, -1, 0.0,
                                                       None, False)
        ref, lse_ref = attention_ref(q, k, v, softmax_scale=scale)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(lse, lse_ref)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fi._flash_attn_backward_impl(dout, q, k, v, out, lse, dq, dk, dv, 0.0, scale, False, -1,
                                     -1, 0.0, None, False, rng)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o, _ = attention_ref(*leaves, softmax_scale=scale)
        for g, r in zip((dq, dk, dv), torch.autograd.grad(o, leaves, dout)):
            torch.testing.assert_close(g, r)


# ---------------------------------------------------------------------------------------
# Argument forms upstream accepts, and type errors naming the argument
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"window_size": [3, 1]},
    {"window_size": torch.tensor([3, 1])},
    {"window_size": torch.tensor([3, 1], dtype=torch.int32)},
    {"window_size": torch.tensor([3, 1], dtype=torch.int16)},
    {"window_size": (torch.tensor(3), torch.tensor(1))},
    {"window_size": (np.int64(3), np.int32(1))},
    {"window_size": (2**40, -(2**40))},
    {"causal": np.bool_(True)},
    {"causal": torch.tensor(True)},
    {"causal": 1},
    {"deterministic": 0},
    {"softmax_scale": 1},
    {"softmax_scale": np.float32(0.3)},
    {"softmax_scale": torch.tensor(0.3)},
    {"softcap": 3},
    {"softcap": torch.tensor(2.0)},
    {"dropout_p": np.float64(0.1)},
    {"dropout_p": 0},
    {"return_attn_probs": np.bool_(False)},
], ids=lambda kw: f"{next(iter(kw))}-{type(next(iter(kw.values()))).__name__}")
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_upstream_argument_forms_accepted(variant, kwargs):
    q, k, v = _qkv(requires_grad=True)
    if variant == "func":
        out = flash_attn_func(q, k, v, **kwargs)
    elif variant == "qkvpacked":
        out = flash_attn_qkvpacked_func(_t(2, 17, 3, 6, 64, requires_grad=True), **kwargs)
    else:
        out = flash_attn_kvpacked_func(q, _t(2, 33, 2, 2, 64, requires_grad=True), **kwargs)
    assert out.shape == q.shape


def test_window_size_reaches_the_kernel_in_int32(cpu_ext):
    q, k, v = [torch.randn(1, 5, 2, 16, dtype=torch.bfloat16) for _ in range(3)]
    a = flash_attn_func(q, k, v, window_size=(2**40, -(2**40)))
    b = flash_attn_func(q, k, v)
    assert torch.equal(a, b)
    c = flash_attn_func(q, k, v, window_size=torch.tensor([1, 0], dtype=torch.int32))
    d = flash_attn_func(q, k, v, window_size=(1, 0))
    assert torch.equal(c, d) and not torch.equal(c, b)


TYPE_ERRORS = [
    ({"causal": "False"}, "causal"),
    ({"causal": None}, "causal"),
    ({"causal": 2}, "causal"),
    ({"causal": 1.0}, "causal"),
    ({"deterministic": "yes"}, "deterministic"),
    ({"return_attn_probs": None}, "return_attn_probs"),
    ({"dropout_p": "0.1"}, "dropout_p"),
    ({"dropout_p": None}, "dropout_p"),
    ({"dropout_p": True}, "dropout_p"),
    ({"softcap": None}, "softcap"),
    ({"softcap": "1.0"}, "softcap"),
    ({"softmax_scale": "0.1"}, "softmax_scale"),
    ({"softmax_scale": True}, "softmax_scale"),
    ({"softmax_scale": [0.1]}, "softmax_scale"),
    ({"window_size": (2.5, 0)}, "window_size"),
    ({"window_size": (2.0, 0)}, "window_size"),
    ({"window_size": (True, 0)}, "window_size"),
    ({"window_size": ("1", 0)}, "window_size"),
    ({"window_size": torch.tensor([1.0, 2.0])}, "window_size"),
    ({"window_size": (None, 0)}, "window_size"),
]
VALUE_ERRORS = [
    ({"dropout_p": float("nan")}, "dropout_p"),
    ({"softcap": float("nan")}, "softcap"),
    ({"softcap": float("inf")}, "softcap"),
    ({"window_size": None}, "window_size"),
    ({"window_size": 3}, "window_size"),
    ({"window_size": "ab"}, "window_size"),
]


BAD_ARGS = [(kw, n, TypeError) for kw, n in TYPE_ERRORS] + \
    [(kw, n, ValueError) for kw, n in VALUE_ERRORS]


@pytest.mark.parametrize("kwargs, name, exc", BAD_ARGS,
                         ids=[f"{n}{i}" for i, (_, n, _) in enumerate(BAD_ARGS)])
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_bad_argument_raises_naming_it(variant, kwargs, name, exc):
    q, k, v = _qkv()
    with pytest.raises(exc, match=rf"\b{name}\b") as info:
        if variant == "func":
            flash_attn_func(q, k, v, **kwargs)
        elif variant == "qkvpacked":
            flash_attn_qkvpacked_func(_t(2, 17, 3, 6, 64), **kwargs)
        else:
            flash_attn_kvpacked_func(q, _t(2, 33, 2, 2, 64), **kwargs)
    assert isinstance(info.value, RuntimeError)  # as upstream's C++ / op-schema errors


def test_causal_string_is_not_causal(cpu_ext):
    q, k, v = [torch.randn(1, 5, 2, 16, dtype=torch.bfloat16) for _ in range(3)]
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attn_func(q, k, v, causal="False")
    assert cpu_ext.calls == []


# ---------------------------------------------------------------------------------------
# Module layout: one shared checks module, no import cycle, every name still where it was
# ---------------------------------------------------------------------------------------


def test_interface_names_importable():
    from flash_attn.flash_attn_interface import (  # noqa: F401
        FlashAttnFunc, FlashAttnKVPackedFunc, FlashAttnQKVPackedFunc, FlashAttnTypeError,
        FlashAttnValueError, FlashAttnVarlenFunc, FlashAttnVarlenKVPackedFunc,
        FlashAttnVarlenQKVPackedFunc, _check_alibi, _check_features, _check_inputs,
        _check_return_softmax, _effective_causal, _ext_for, _flash_attn_backward,
        _flash_attn_forward, _flash_attn_varlen_backward, _flash_attn_varlen_forward,
        _get_block_size_n, _get_ext, _HAS_CUSTOM_OP, _resolve_window, _window_pair,
        _wrapped_flash_attn_backward, _wrapped_flash_attn_forward,
        _wrapped_flash_attn_varlen_backward, _wrapped_flash_attn_varlen_forward, maybe_contiguous,
        round_multiple, set_strict_checks, strict_checks_enabled,
    )

    assert fi._C is None or hasattr(fi._C, "fwd")
    assert flash_attn.set_strict_checks is fi.set_strict_checks
    from flash_attn import _checks

    assert fi.FlashAttnValueError is _checks.FlashAttnValueError
    import flash_attn._varlen_kvcache as vk

    assert vk.FlashAttnTypeError is fi.FlashAttnTypeError


def test_no_import_cycle():
    """_checks and _common import nothing else from the package and _varlen_kvcache does not
    import flash_attn_interface; importing any module first works."""
    root = os.path.dirname(os.path.abspath(flash_attn.__file__))
    for name in ("_checks.py", "_common.py", "_varlen_kvcache.py"):
        src = open(os.path.join(root, name)).read()
        imports = re.findall(r"^\s*(?:from\s+\S+\s+)?import\s.*$", src, re.M)
        assert not [i for i in imports if "flash_attn_interface" in i], name
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(root) + os.pathsep + env.get("PYTHONPATH", "")
    for mod in ("flash_attn._checks", "flash_attn._common", "flash_attn._varlen_kvcache",
                "flash_attn.flash_attn_interface"):
        res = subprocess.run([sys.executable, "-c", f"import {mod}; import flash_attn; "
                              "print(flash_attn.flash_attn_varlen_func.__module__)"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]


def test_set_strict_checks_api():
    prev = flash_attn.set_strict_checks(False)
    try:
        assert flash_attn.strict_checks_enabled() is False
        assert flash_attn.set_strict_checks(True) is False
        assert flash_attn.strict_checks_enabled() is True
        with pytest.raises(TypeError, match="enabled"):
            flash_attn.set_strict_checks("no")
    finally:
        flash_attn.set_strict_checks(prev)
    assert "synchronis" in flash_attn.set_strict_checks.__doc__
    code = "import flash_attn; print(flash_attn.strict_checks_enabled())"
    env = dict(os.environ, FLASH_ATTN_STRICT_CHECKS="1")
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(flash_attn.__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.stdout.strip() == "True", res.stderr[-2000:]


# ---------------------------------------------------------------------------------------
# flash_attn.sdpa: the aten kernels' argument binding (no GPU needed)
# ---------------------------------------------------------------------------------------


def test_sdpa_kernels_bind_by_name_and_refuse_unknown_arguments():
    from flash_attn import sdpa
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:
        pytest.skip("this torch has no aten::_flash_attention_forward")
    schema = op.default._schema
    seen = []
    impl, needed, optional = sdpa._OPS["_flash_attention_forward"]
    kernel = sdpa.make_kernel(schema, lambda a: seen.append(a) or "ok", needed, optional)
    assert kernel("q", "k", "v", None, None, 5, 7, 0.1, True, False, scale=0.5) == "ok"
    a = seen[-1]
    assert (a["query"], a["max_q"], a["max_k"], a["dropout_p"], a["is_causal"], a["scale"]) == \
        ("q", 5, 7, 0.1, True, 0.5)
    # Arguments left out take the schema's defaults.
    names = [arg.name for arg in schema.arguments]
    for arg in schema.arguments[10:]:
        if arg.name != "scale":
            assert a[arg.name] == arg.default_value, arg.name
    assert list(a) == names
    unknown = [arg.name for arg in schema.arguments if arg.name not in needed + optional]
    for name in unknown:  # e.g. alibi_slopes: anything but the default is refused, by name
        with pytest.raises(RuntimeError, match=name):
            kernel("q", "k", "v", None, None, 5, 7, 0.0, False, False, **{name: torch.ones(1)})
    with pytest.raises(TypeError, match="missing argument"):
        kernel("q", "k")
