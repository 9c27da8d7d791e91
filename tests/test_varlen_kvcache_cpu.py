"""CPU-only tests of the varlen and KV-cache Python layer: signatures, op schemas, argument
validation and the fake (meta) implementations. No GPU needed."""

import inspect

import numpy as np
import pytest
import torch

import flash_attn
import flash_attn.flash_attn_interface as fi
from flash_attn import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)


def _m(*shape, dtype=torch.float16, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


def _cu(b, device="meta"):
    return torch.empty(b + 1, dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------------------
# Surface
# ---------------------------------------------------------------------------------------


def _params(f):
    """(name, default) of f's parameters up to the keyword-only learnable_sink (checked here),
    which follows upstream's."""
    params = list(inspect.signature(f).parameters.values())
    assert params[-1].name == "learnable_sink" and params[-1].default is None
    assert params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    return [(p.name, p.default) for p in params[:-1]]


def test_varlen_signatures_match_upstream():
    tail = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
            ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
            ("deterministic", False), ("return_attn_probs", False)]
    e = inspect.Parameter.empty
    assert _params(flash_attn_varlen_func) == [
        ("q", e), ("k", e), ("v", e), ("cu_seqlens_q", e), ("cu_seqlens_k", e),
        ("max_seqlen_q", e), ("max_seqlen_k", e)] + tail + [("block_table", None)]
    assert _params(flash_attn_varlen_qkvpacked_func) == [
        ("qkv", e), ("cu_seqlens", e), ("max_seqlen", e)] + tail
    assert _params(flash_attn_varlen_kvpacked_func) == [
        ("q", e), ("kv", e), ("cu_seqlens_q", e), ("cu_seqlens_k", e), ("max_seqlen_q", e),
        ("max_seqlen_k", e)] + tail


def test_kvcache_signature_matches_upstream():
    names = [n for n, _ in _params(flash_attn_with_kvcache)]
    assert names == ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                     "cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table",
                     "softmax_scale", "causal", "window_size", "softcap", "rotary_interleaved",
                     "alibi_slopes", "num_splits", "return_softmax_lse"]
    d = dict(_params(flash_attn_with_kvcache))
    assert d["rotary_interleaved"] is True and d["num_splits"] == 0 and d["window_size"] == (-1, -1)


def test_private_op_schemas():
    fwd = str(torch.ops.flash_attn._flash_attn_varlen_forward.default._schema)
    assert ("max_seqlen_q, SymInt max_seqlen_k, float dropout_p, float softmax_scale, bool causal, "
            "SymInt window_size_left=-1, SymInt window_size_right=-1, float softcap=0., "
            "Tensor? alibi_slopes=None, bool return_softmax=False, Tensor? block_table=None, "
            "Tensor? leftpad_k=None, Tensor? seqused_k=None, bool zero_tensors=False, "
            "Tensor? learnable_sink=None)") in fwd
    bwd = str(torch.ops.flash_attn._flash_attn_varlen_backward.default._schema)
    assert "Tensor(a6!)? dq, Tensor(a7!)? dk, Tensor(a8!)? dv, Tensor cu_seqlens_q" in bwd
    assert bwd.endswith("bool deterministic, Tensor? rng_state=None, bool zero_tensors=False) -> Tensor")
    kv = str(torch.ops.flash_attn._flash_attn_kvcache.default._schema)
    assert "Tensor(a1!) k_cache, Tensor(a2!) v_cache" in kv
    assert fi._wrapped_flash_attn_varlen_forward is torch.ops.flash_attn._flash_attn_varlen_forward
    assert fi._wrapped_flash_attn_varlen_backward is torch.ops.flash_attn._flash_attn_varlen_backward


# ---------------------------------------------------------------------------------------
# Fake implementations (meta tensors)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 59])
def test_varlen_meta_shapes(d):
    q, k, v = _m(30, 6, d), _m(40, 2, d), _m(40, 2, d)
    out, lse, s = flash_attn_varlen_func(q, k, v, _cu(3), _cu(3), 17, 20, causal=True,
                                         window_size=(8, 0), return_attn_probs=True)
    assert out.shape == (30, 6, d) and lse.shape == (6, 30) and lse.dtype == torch.float32
    assert s.numel() == 0
    qkv = _m(30, 3, 4, d)
    assert flash_attn_varlen_qkvpacked_func(qkv, _cu(2), 20).shape == (30, 4, d)
    kv = _m(40, 2, 2, d)
    assert flash_attn_varlen_kvpacked_func(q, kv, _cu(2), _cu(2), 20, 20).shape == (30, 6, d)


def test_varlen_backward_fake_shape():
    q = _m(30, 6, 64)
    sd = torch.ops.flash_attn._flash_attn_varlen_backward(
        q, q, _m(40, 2, 64), _m(40, 2, 64), q, _m(6, 30, dtype=torch.float32), None, None, None,
        _cu(3), _cu(3), 17, 20, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    assert sd.shape == (6, 30 + 128 * 3)


def test_varlen_paged_meta():
    q = _m(30, 8, 128)
    kp = _m(10, 48, 2, 128)
    bt = torch.empty(3, 4, dtype=torch.int32, device="meta")
    out = flash_attn_varlen_func(q, kp, kp, _cu(3), _cu(3), 17, 190, block_table=bt)
    assert out.shape == (30, 8, 128)


def test_kvcache_meta_shapes():
    q = _m(2, 3, 8, 128)
    kc = _m(2, 100, 2, 128)
    out, lse = flash_attn_with_kvcache(q, kc, kc, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 3)
    assert flash_attn_with_kvcache(q, kc, kc).shape == q.shape


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def test_varlen_validation_errors():
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    cu = _cu(3)
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        flash_attn_varlen_func(_m(1, 30, 6, 64), k, k, cu, cu, 10, 10)
    with pytest.raises(TypeError, match="cu_seqlens_q must have dtype torch.int32"):
        flash_attn_varlen_func(q, k, k, torch.empty(4, dtype=torch.int64, device="meta"), cu, 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k must have shape"):
        flash_attn_varlen_func(q, k, k, cu, _cu(2), 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_q must have shape"):
        flash_attn_varlen_func(q, k, k, torch.empty(1, dtype=torch.int32, device="meta"), cu, 10, 10)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
        flash_attn_varlen_func(q, k, k, cu, cu, 10.0, 10)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int"):
        flash_attn_varlen_func(q, k, k, cu, cu, 10, True)
    # int-like values (numpy / 0-d integer tensors) are accepted, as upstream's C++ int is
    assert flash_attn_varlen_func(q, k, k, cu, cu, torch.tensor(10), 10).shape == q.shape
    with pytest.raises(ValueError, match=r"max_seqlen_k must satisfy 0 <= max_seqlen_k"):
        flash_attn_varlen_func(q, k, k, cu, cu, 10, -1)
    with pytest.raises(ValueError, match="must be a positive multiple"):
        flash_attn_varlen_func(_m(30, 5, 64), k, k, cu, cu, 10, 10)
    with pytest.raises(TypeError, match="dtype"):
        flash_attn_varlen_func(q, _m(40, 2, 64, dtype=torch.bfloat16), k, cu, cu, 10, 10)
    with pytest.raises(ValueError, match="same shape"):
        flash_attn_varlen_func(q, k, _m(41, 2, 64), cu, cu, 10, 10)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_varlen_func(q, k, k, cu, cu, 10, 10, window_size=(1, 2, 3))
    with pytest.raises(ValueError, match="CUDA device"):
        flash_attn_varlen_func(_m(30, 6, 64, device="cpu"), _m(40, 2, 64, device="cpu"),
                               _m(40, 2, 64, device="cpu"), _cu(3, "cpu"), _cu(3, "cpu"), 10, 10)
    with pytest.raises(ValueError, match="headdim"):
        flash_attn_varlen_func(_m(30, 6, 520), _m(40, 2, 520), _m(40, 2, 520), cu, cu, 10, 10)


def test_varlen_paged_validation():
    q = _m(30, 8, 128)
    cu = _cu(3)
    bt = torch.empty(3, 4, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="multiple of 16"):
        flash_attn_varlen_func(q, _m(10, 40, 2, 128), _m(10, 40, 2, 128), cu, cu, 10, 10,
                               block_table=bt)
    with pytest.raises(ValueError, match="k must have 4 dimensions"):
        flash_attn_varlen_func(q, _m(40, 2, 128), _m(40, 2, 128), cu, cu, 10, 10, block_table=bt)
    with pytest.raises(TypeError, match="block_table must have dtype torch.int32"):
        flash_attn_varlen_func(q, _m(10, 32, 2, 128), _m(10, 32, 2, 128), cu, cu, 10, 10,
                               block_table=bt.long())
    with pytest.raises(ValueError, match="block_table must have shape"):
        flash_attn_varlen_func(q, _m(10, 32, 2, 128), _m(10, 32, 2, 128), cu, cu, 10, 10,
                               block_table=torch.empty(2, 4, dtype=torch.int32, device="meta"))


@pytest.mark.parametrize("kw", [
    dict(dropout_p=0.1),
    dict(softcap=1.0),
    dict(alibi_slopes=torch.empty(6, dtype=torch.float32, device="meta")),
    dict(alibi_slopes=torch.empty(3, 6, dtype=torch.float32, device="meta"), causal=True),
    dict(deterministic=True),
    dict(dropout_p=0.2, alibi_slopes=torch.empty(6, dtype=torch.float32, device="meta"),
         window_size=(5, 2), deterministic=True),
], ids=["dropout", "softcap", "alibi-h", "alibi-bh", "deterministic", "all"])
def test_varlen_features_accepted(kw):
    """The feature arguments go through (on meta tensors: the fake implementations)."""
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    out = flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), 10, 10, **kw)
    assert out.shape == q.shape
    qkv = _m(30, 3, 6, 64)
    assert flash_attn_varlen_qkvpacked_func(qkv, _cu(3), 10, **kw).shape == q.shape
    kv = _m(40, 2, 6, 64)
    assert flash_attn_varlen_kvpacked_func(q, kv, _cu(3), _cu(3), 10, 10, **kw).shape == q.shape


@pytest.mark.parametrize("sq, sk", [(10, 10), (129, 300), (0, 5)])
def test_varlen_meta_dropout_returns_s_dmask(sq, sk):
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    out, lse, s_dmask = flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), sq, sk, dropout_p=0.2,
                                               return_attn_probs=True)
    r = lambda x: (x + 127) // 128 * 128  # noqa: E731
    assert s_dmask.shape == (3, 6, r(sq), r(sk)) and s_dmask.dtype == q.dtype
    assert lse.shape == (6, 30)
    # without dropout: empty, as the dense path
    _, _, s_dmask = flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), sq, sk, return_attn_probs=True)
    assert s_dmask.numel() == 0
    # the op itself (upstream 2.8's private signature): (out, lse, S_dmask, rng_state)
    res = torch.ops.flash_attn._flash_attn_varlen_forward(
        q, k, k, _cu(3), _cu(3), sq, sk, 0.1, 0.125, False, -1, -1, 0.0, None, True)
    assert len(res) == 4 and res[2].shape == (3, 6, r(sq), r(sk))
    assert res[3].shape == (2,) and res[3].dtype == torch.int64


@pytest.mark.parametrize("kw, err, msg", [
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(dropout_p=-0.1), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(softcap=30.0, dropout_p=0.1), ValueError, r"softcap.*does not support dropout"),
    (dict(alibi_slopes=torch.empty(6, dtype=torch.float16, device="meta")), TypeError,
     "alibi_slopes must have dtype torch.float32"),
    (dict(alibi_slopes=torch.empty(5, dtype=torch.float32, device="meta")), ValueError,
     r"alibi_slopes must have shape \(nheads,\)"),
    (dict(alibi_slopes=torch.empty(2, 6, dtype=torch.float32, device="meta")), ValueError,
     r"alibi_slopes must have shape"),
    (dict(alibi_slopes=torch.empty(6, dtype=torch.float32, device="cpu")), ValueError,
     "alibi_slopes is on device cpu"),
    (dict(return_attn_probs=True, dropout_p=0.0), None, None),
])
def test_varlen_feature_errors(kw, err, msg):
    """The dense path's errors (upstream's), for every varlen entry point."""
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    qkv, kv = _m(30, 3, 6, 64), _m(40, 2, 2, 64)
    calls = [
        lambda: flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), 10, 10, **kw),
        lambda: flash_attn_varlen_qkvpacked_func(qkv, _cu(3), 10, **kw),
        lambda: flash_attn_varlen_kvpacked_func(q, kv, _cu(3), _cu(3), 10, 10, **kw),
    ]
    for call in calls:
        if err is None:
            call()  # return_attn_probs without dropout: lse and an empty S_dmask
        else:
            with pytest.raises(err, match=msg):
                call()


def test_varlen_op_feature_errors():
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    fwd = torch.ops.flash_attn._flash_attn_varlen_forward
    with pytest.raises(ValueError, match="return_softmax=True is only supported when dropout_p > 0"):
        fwd(q, k, k, _cu(3), _cu(3), 10, 10, 0.0, 0.125, False, return_softmax=True)
    with pytest.raises(ValueError, match="does not support dropout"):
        fwd(q, k, k, _cu(3), _cu(3), 10, 10, 0.1, 0.125, False, softcap=5.0)
    bwd = torch.ops.flash_attn._flash_attn_varlen_backward
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        bwd(q, q, k, k, q, _m(6, 30, dtype=torch.float32), None, None, None, _cu(3), _cu(3),
            10, 10, 1.0, 0.125, False, -1, -1, 0.0, None, False)


def test_varlen_paged_dropout_not_implemented():
    q = _m(30, 8, 128)
    kp = _m(10, 48, 2, 128)
    bt = torch.empty(3, 4, dtype=torch.int32, device="meta")
    with pytest.raises(NotImplementedError, match="block_table"):
        flash_attn_varlen_func(q, kp, kp, _cu(3), _cu(3), 17, 190, block_table=bt, dropout_p=0.1)
    # softcap / ALiBi go to the split-KV kernel's score modifiers
    out = flash_attn_varlen_func(q, kp, kp, _cu(3), _cu(3), 17, 190, block_table=bt, softcap=5.0,
                                 alibi_slopes=torch.empty(8, dtype=torch.float32, device="meta"))
    assert out.shape == q.shape


def test_kvcache_validation_errors():
    q = _m(2, 1, 8, 128)
    kc = _m(2, 64, 2, 128)
    kn = _m(2, 1, 2, 128)
    seq = torch.empty(2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="k and v must be given together"):
        flash_attn_with_kvcache(q, kc, kc, k=kn)
    with pytest.raises(ValueError, match="k and v must have shape"):
        flash_attn_with_kvcache(q, kc, kc, k=_m(2, 1, 4, 128), v=_m(2, 1, 4, 128))
    with pytest.raises(ValueError, match="v_cache must have the same shape"):
        flash_attn_with_kvcache(q, kc, _m(2, 65, 2, 128))
    with pytest.raises(ValueError, match="multiple of the number of heads"):
        flash_attn_with_kvcache(_m(2, 1, 5, 128), kc, kc)
    with pytest.raises(TypeError, match="cache_seqlens must have dtype torch.int32"):
        flash_attn_with_kvcache(q, kc, kc, cache_seqlens=seq.long())
    with pytest.raises(ValueError, match="cache_batch_idx must have shape"):
        flash_attn_with_kvcache(q, kc, kc, cache_batch_idx=torch.empty(3, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="pass cache_batch_idx"):
        flash_attn_with_kvcache(_m(3, 1, 8, 128), kc, kc)
    with pytest.raises(ValueError, match="rotary_cos / rotary_sin need the new k"):
        cos = _m(64, 32)
        flash_attn_with_kvcache(q, kc, kc, rotary_cos=cos, rotary_sin=cos)
    with pytest.raises(ValueError, match="rotary_dim"):
        cos = _m(64, 4)
        flash_attn_with_kvcache(q, kc, kc, kn, kn, rotary_cos=cos, rotary_sin=cos)
    with pytest.raises(ValueError, match="seqlen_ro must cover"):
        cos = _m(10, 32)
        flash_attn_with_kvcache(q, kc, kc, kn, kn, rotary_cos=cos, rotary_sin=cos)
    with pytest.raises(ValueError, match="num_splits"):
        flash_attn_with_kvcache(q, kc, kc, num_splits=-1)
    with pytest.raises(TypeError, match="alibi_slopes must have dtype torch.float32"):
        flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.empty(8, dtype=torch.float16,
                                                                    device="meta"))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.empty(2, 4, device="meta"))
    # softcap and ALiBi are supported
    assert flash_attn_with_kvcache(q, kc, kc, softcap=5.0).shape == q.shape
    assert flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.empty(2, 8, device="meta")).shape \
        == q.shape
    bt = torch.empty(2, 4, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="multiple of 16"):
        flash_attn_with_kvcache(q, _m(10, 24, 2, 128), _m(10, 24, 2, 128), block_table=bt)
    with pytest.raises(ValueError, match="cache_batch_idx cannot be combined"):
        flash_attn_with_kvcache(q, _m(10, 32, 2, 128), _m(10, 32, 2, 128), block_table=bt,
                                cache_batch_idx=torch.empty(2, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="CUDA device"):
        flash_attn_with_kvcache(_m(2, 1, 8, 128, device="cpu"), _m(2, 64, 2, 128, device="cpu"),
                                _m(2, 64, 2, 128, device="cpu"))


def test_varlen_torch_compile_meta_fullgraph():
    """The varlen path traces without graph breaks (custom op + fake impl)."""
    def f(q, k, v, cu):
        return flash_attn_varlen_func(q, k, v, cu, cu, 16, 16, causal=True)

    q, k = _m(30, 6, 64), _m(30, 2, 64)
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(q, k, k, _cu(2))
    assert any("flash_attn._flash_attn_varlen_forward" in str(n.target) for n in gm.graph.nodes)


# ---------------------------------------------------------------------------------------
# The Python half of flash_attn_with_kvcache (append, rotary, paging, padding) on CPU, with
# the kernel replaced by a per-sequence reference.
# ---------------------------------------------------------------------------------------


@pytest.fixture
def cpu_kvcache(monkeypatch):
    import flash_attn._varlen_kvcache as vk

    monkeypatch.setattr(vk, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(vk, "_wrapped_flash_attn_kvcache", vk._kvcache_impl)
    from fa_test_utils import CpuExt

    monkeypatch.setattr(vk, "_ext_for", lambda q: CpuExt())


@pytest.mark.parametrize("kw", [
    dict(sq=1), dict(sq=3, causal=True), dict(new_kv=False, sq=2),
    dict(sq=2, rotary_fraction=0.5, causal=True), dict(sq=1, rotary_fraction=1.0, interleaved=True),
    dict(sq=3, rotary_fraction=1.0), dict(sq=1, page=16), dict(sq=2, page=48, causal=True),
    dict(sq=1, leftpad=True), dict(sq=2, leftpad=True, page=32, rotary_fraction=0.5, causal=True),
    dict(sq=1, batch_idx=True), dict(sq=4, batch_idx=True, causal=True),
    dict(sq=3, window=(40, 0)), dict(d=59, sq=1, h=4, hk=2, new_kv=False), dict(sq=2, seqlen_new=5),
    dict(sq=1, softcap=10.0), dict(sq=3, alibi="bh", causal=True, page=16),
    dict(sq=2, alibi="h", softcap=5.0, leftpad=True),
], ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_kvcache_python_path_on_cpu(cpu_kvcache, kw):
    from test_varlen_kvcache import _run_kvcache

    _run_kvcache(device="cpu", dtype=torch.bfloat16, d=kw.pop("d", 64),
                 seqlen_cache=120, **kw)


# ---------------------------------------------------------------------------------------
# The varlen autograd plumbing (padding of odd head dims, packed gradients) on CPU, with the
# kernels replaced by the per-sequence reference.
# ---------------------------------------------------------------------------------------


def _ref_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, scale, causal,
                    window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
                    return_softmax=False, block_table=None, leftpad_k=None, seqused_k=None,
                    zero_tensors=False):
    from test_varlen_kvcache import varlen_ref

    assert dropout_p == 0.0, "the CPU reference has no dropout"
    out, lse = varlen_ref(q, k, v, cu_q, cu_k, causal, (window_size_left, window_size_right),
                          scale, True, softcap, alibi_slopes)
    return out, lse, torch.empty(0), torch.zeros(2, dtype=torch.int64)


def _ref_varlen_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, dropout_p,
                    scale, causal, wl, wr, softcap, alibi, deterministic, rng_state=None,
                    zero_tensors=False):
    from test_varlen_kvcache import varlen_ref

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        o, _ = varlen_ref(*leaves, cu_q, cu_k, causal, (wl, wr), scale, True, softcap, alibi)
        grads = torch.autograd.grad(o, leaves, dout)
    for dst, g in zip((dq, dk, dv), grads):
        dst.copy_(g)
    return torch.empty(0)


@pytest.fixture
def cpu_varlen(monkeypatch):
    import flash_attn._varlen_kvcache as vk

    monkeypatch.setattr(vk, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(vk, "_SUPPORTED_DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    monkeypatch.setattr(vk, "_wrapped_flash_attn_varlen_forward", _ref_varlen_fwd)
    monkeypatch.setattr(vk, "_wrapped_flash_attn_varlen_backward", _ref_varlen_bwd)


@pytest.mark.parametrize("d", [64, 59])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_plumbing_on_cpu(cpu_varlen, d, causal):
    from test_varlen_kvcache import cu_from, varlen_ref

    lens = [5, 0, 9, 1]
    cu = cu_from(lens, "cpu")
    t = sum(lens) + 2
    torch.manual_seed(0)
    qkv = torch.randn(t, 3, 4, d, dtype=torch.float32, requires_grad=True)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=causal,
                                           window_size=(3, -1))
    dout = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, qkv, dout)
    ref, _ = varlen_ref(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, causal, (3, -1), d ** -0.5, True)
    (g_ref,) = torch.autograd.grad(ref, qkv, dout)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(g, g_ref)

    q = torch.randn(t, 4, d, requires_grad=True)
    kv = torch.randn(t, 2, 2, d, requires_grad=True)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lens), max(lens), causal=causal)
    gq, gkv = torch.autograd.grad(out, (q, kv), dout)
    ref, _ = varlen_ref(q, kv[:, 0], kv[:, 1], cu, cu, causal, (-1, -1), d ** -0.5, True)
    rq, rkv = torch.autograd.grad(ref, (q, kv), dout)
    torch.testing.assert_close(gq, rq)
    torch.testing.assert_close(gkv, rkv)

    k = torch.randn(t, 2, d, requires_grad=True)
    out, lse, _ = flash_attn_varlen_func(q, k, k, cu, cu, max(lens), max(lens), causal=causal,
                                         softmax_scale=0.3, return_attn_probs=True)
    ref, lse_ref = varlen_ref(q, k, k, cu, cu, causal, (-1, -1), 0.3, True)
    torch.testing.assert_close(out, ref)
    assert lse.shape == (4, t)


def test_varlen_feature_plumbing_on_cpu(cpu_varlen):
    """softcap and alibi_slopes reach the forward and the backward op (packed and unpacked)."""
    from test_varlen_kvcache import cu_from, varlen_ref

    lens = [5, 0, 9, 1]
    cu = cu_from(lens, "cpu")
    t = sum(lens) + 2
    torch.manual_seed(0)
    slopes = torch.rand(4, 4) * 0.5
    feats = dict(softcap=3.0, alibi_slopes=slopes)
    qkv = torch.randn(t, 3, 4, 64, dtype=torch.float32, requires_grad=True)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, **feats)
    dout = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, qkv, dout)
    ref, _ = varlen_ref(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, True, (-1, -1), 64 ** -0.5, True,
                        **feats)
    (g_ref,) = torch.autograd.grad(ref, qkv, dout)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(g, g_ref)
    plain = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    assert not torch.allclose(plain, out)

    q = torch.randn(t, 4, 64, requires_grad=True)
    kv = torch.randn(t, 2, 2, 64, requires_grad=True)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lens), max(lens),
                                          alibi_slopes=slopes[0], deterministic=True)
    gq, gkv = torch.autograd.grad(out, (q, kv), dout)
    ref, _ = varlen_ref(q, kv[:, 0], kv[:, 1], cu, cu, False, (-1, -1), 64 ** -0.5, True,
                        alibi_slopes=slopes[0])
    rq, rkv = torch.autograd.grad(ref, (q, kv), dout)
    torch.testing.assert_close(gq, rq)
    torch.testing.assert_close(gkv, rkv)


# ---------------------------------------------------------------------------------------
# Through the real op implementations with a CPU stand-in for the extension that asserts the
# kernels' preconditions (fa_test_utils.CpuExt): softmax_scale of any sign, argument forms,
# and the values of the index tensors (CPU tensors are checked on the host for free).
# ---------------------------------------------------------------------------------------


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


@pytest.fixture
def cpu_ext(monkeypatch):
    from fa_test_utils import install_cpu_ext

    return install_cpu_ext(monkeypatch, fp32=True)


def _varlen_data(lens=(5, 0, 7, 1), h=4, hk=2, d=16, tail=2):
    from test_varlen_kvcache import cu_from

    cu = cu_from(list(lens), "cpu")
    t = sum(lens) + tail
    q = torch.randn(t, h, d, requires_grad=True)
    k = torch.randn(t, hk, d, requires_grad=True)
    v = torch.randn(t, hk, d, requires_grad=True)
    return q, k, v, cu, max(lens)


@pytest.mark.parametrize("softmax_scale", [0.0, -0.3, 0.4])
@pytest.mark.parametrize("feat", [
    dict(), dict(causal=True), dict(window_size=(3, 0)), dict(causal=True, window_size=(2, -1)),
    dict(softcap=1.5), dict(alibi="h", causal=True), dict(alibi="bh", softcap=2.0),
], ids=lambda f: "-".join(f) or "plain")
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_varlen_softmax_scale_any_finite_value(cpu_ext, variant, feat, softmax_scale):
    from test_varlen_kvcache import varlen_ref

    feat = dict(feat)
    q, k, v, cu, mx = _varlen_data(hk=4 if variant == "qkvpacked" else 2)
    alibi = feat.pop("alibi", None)
    slopes = None if alibi is None else torch.rand(*((4,) if alibi == "h" else (4, 4))) * 0.5
    causal = feat.pop("causal", False)
    window = feat.pop("window_size", (-1, -1))
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window,
              alibi_slopes=slopes, **feat)
    if variant == "func":
        out = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    elif variant == "qkvpacked":
        qkv = torch.stack([q, k, v], 1).detach().requires_grad_()
        out = flash_attn_varlen_qkvpacked_func(qkv, cu, mx, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, qkv, dout)[0].unbind(1)
    else:
        kv = torch.stack([k, v], 1).detach().requires_grad_()
        out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, mx, mx, **kw)
        dout = torch.randn_like(out)
        dq, dkv = torch.autograd.grad(out, (q, kv), dout)
        grads = (dq, *dkv.unbind(1))
    ref, _ = varlen_ref(q, k, v, cu, cu, causal, window, softmax_scale, True,
                        feat.get("softcap", 0.0), slopes)
    grads_ref = torch.autograd.grad(ref, (q, k, v), dout)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r)
    assert [c[0] for c in cpu_ext.calls] == ["varlen_fwd", "varlen_bwd"]


@pytest.mark.parametrize("softmax_scale", [0.0, -0.3, 0.7])
@pytest.mark.parametrize("kw", [
    dict(sq=1), dict(sq=3, causal=True), dict(sq=2, page=16, causal=True),
    dict(sq=1, softcap=5.0, alibi="bh"), dict(sq=2, leftpad=True, window=(5, 0)),
    dict(sq=1, new_kv=False, batch_idx=True),
], ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_kvcache_softmax_scale_any_finite_value(cpu_ext, kw, softmax_scale):
    from test_varlen_kvcache import _run_kvcache

    _run_kvcache(device="cpu", dtype=torch.float32, d=32, seqlen_cache=50,
                 softmax_scale=softmax_scale, **kw)
    assert all(c[1] > 0 for c in cpu_ext.calls)


KV_TYPE_ERRORS = [
    ({"causal": "False"}, "causal"), ({"softcap": "1.0"}, "softcap"), ({"softcap": None}, "softcap"),
    ({"window_size": (2.5, 0)}, "window_size"), ({"softmax_scale": "1"}, "softmax_scale"),
    ({"num_splits": 1.5}, "num_splits"), ({"num_splits": True}, "num_splits"),
    ({"num_splits": "2"}, "num_splits"), ({"rotary_interleaved": None}, "rotary_interleaved"),
    ({"return_softmax_lse": "yes"}, "return_softmax_lse"), ({"cache_seqlens": 3.0}, "cache_seqlens"),
    ({"cache_seqlens": "3"}, "cache_seqlens"),
]
KV_VALUE_ERRORS = [
    ({"softmax_scale": float("nan")}, "softmax_scale"), ({"softmax_scale": float("inf")}, "softmax_scale"),
    ({"num_splits": 2**31}, "num_splits"), ({"num_splits": -1}, "num_splits"),
    ({"cache_seqlens": 64}, "cache_seqlens"), ({"cache_seqlens": -1}, "cache_seqlens"),
    ({"softcap": float("nan")}, "softcap"), ({"window_size": (1, 2, 3)}, "window_size"),
]


@pytest.mark.parametrize("kwargs, name, exc",
                         [(a, n, TypeError) for a, n in KV_TYPE_ERRORS]
                         + [(a, n, ValueError) for a, n in KV_VALUE_ERRORS],
                         ids=[n + str(i) for i, (_, n) in enumerate(KV_TYPE_ERRORS + KV_VALUE_ERRORS)])
def test_kvcache_bad_scalar_arguments(kwargs, name, exc):
    q, kc, kn = _m(2, 1, 8, 128), _m(2, 64, 2, 128), _m(2, 1, 2, 128)
    with pytest.raises(exc, match=rf"\b{name}\b"):
        flash_attn_with_kvcache(q, kc, kc, kn, kn, **kwargs)


VARLEN_BAD = [
    ({"causal": "False"}, TypeError, "causal"), ({"dropout_p": "0.1"}, TypeError, "dropout_p"),
    ({"softcap": None}, TypeError, "softcap"), ({"window_size": (2.5, 0)}, TypeError, "window_size"),
    ({"window_size": torch.tensor([2.0, 0.0])}, TypeError, "window_size"),
    ({"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    ({"deterministic": "x"}, TypeError, "deterministic"),
    ({"return_attn_probs": None}, TypeError, "return_attn_probs"),
]


@pytest.mark.parametrize("kwargs, exc, name", VARLEN_BAD, ids=[b[2] + str(i) for i, b in enumerate(VARLEN_BAD)])
def test_varlen_bad_scalar_arguments(kwargs, exc, name):
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    qkv, kv = _m(30, 3, 6, 64), _m(40, 2, 2, 64)
    for call in (lambda: flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), 10, 10, **kwargs),
                 lambda: flash_attn_varlen_qkvpacked_func(qkv, _cu(3), 10, **kwargs),
                 lambda: flash_attn_varlen_kvpacked_func(q, kv, _cu(3), _cu(3), 10, 10, **kwargs)):
        with pytest.raises(exc, match=rf"\b{name}\b"):
            call()


@pytest.mark.parametrize("window", [torch.tensor([3, 0]), torch.tensor([3, 0], dtype=torch.int32),
                                    [3, 0], (np.int64(3), 0), (torch.tensor(3), torch.tensor(0))],
                         ids=["tensor64", "tensor32", "list", "numpy", "0d"])
def test_window_size_forms_on_varlen_and_kvcache(window):
    """Upstream's tests pass window_size as a 2-element tensor to every entry point."""
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    assert flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), 10, 10, window_size=window).shape == q.shape
    assert flash_attn_varlen_qkvpacked_func(_m(30, 3, 6, 64), _cu(3), 10,
                                            window_size=window).shape == q.shape
    assert flash_attn_varlen_kvpacked_func(q, _m(40, 2, 2, 64), _cu(3), _cu(3), 10, 10,
                                           window_size=window).shape == q.shape
    qd, kc = _m(2, 1, 8, 128), _m(2, 64, 2, 128)
    assert flash_attn_with_kvcache(qd, kc, kc, window_size=window).shape == qd.shape


def test_int_forms_accepted():
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    for mx in (10, np.int64(10), torch.tensor(10), torch.tensor(10, dtype=torch.int32)):
        assert flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), mx, mx).shape == q.shape
    qd, kc = _m(2, 1, 8, 128), _m(2, 64, 2, 128)
    for ns in (0, 3, np.int32(2), torch.tensor(4)):
        assert flash_attn_with_kvcache(qd, kc, kc, num_splits=ns).shape == qd.shape
    assert flash_attn_with_kvcache(qd, kc, kc, cache_seqlens=np.int64(7)).shape == qd.shape


@pytest.mark.parametrize("mx", [2**31, 2**31 - 1, 2**40, -1])
def test_varlen_max_seqlen_range(mx):
    q, k = _m(30, 6, 64), _m(40, 2, 64)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, k, _cu(3), _cu(3), mx, 10)
    with pytest.raises(ValueError, match="max_seqlen"):
        flash_attn_varlen_qkvpacked_func(_m(30, 3, 6, 64), _cu(3), mx)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        torch.ops.flash_attn._flash_attn_varlen_forward(q, k, k, _cu(3), _cu(3), 10, mx, 0.0,
                                                        0.125, False)


# cu_seqlens values (q: 15 rows, sequences 5, 0, 7, 1 and 2 rows of tail)
CU_BAD = [
    ("cu_seqlens_q", _i32(1, 5, 5, 12, 13), None, "must start at 0"),
    ("cu_seqlens_q", _i32(0, 5, 4, 12, 13), None, "non-decreasing"),
    ("cu_seqlens_q", _i32(0, 5, 5, 12, 16), None, r"past the end .*q.shape\[0\] = 15"),
    ("cu_seqlens_q", _i32(0, -5, 5, 12, 13), None, "non-decreasing"),
    ("cu_seqlens_k", _i32(0, 5, 5, 12, 100), None, r"past the end .*k.shape\[0\] = 15"),
    ("cu_seqlens_k", _i32(0, 7, 5, 12, 13), None, "non-decreasing"),
    ("max_seqlen_q", None, 0, r"max_seqlen_q = 0 .*> 0 when a sequence is non-empty"),
    ("max_seqlen_q", None, 6, r"max_seqlen_q = 6 is less than the length of sequence 2"),
    ("max_seqlen_k", None, 3, r"max_seqlen_k = 3 is less than"),
]


@pytest.mark.parametrize("which, cu, mx, msg", CU_BAD, ids=[f"{c[0]}{i}" for i, c in enumerate(CU_BAD)])
def test_varlen_value_checks(cpu_ext, which, cu, mx, msg):
    q, k, v, good, longest = _varlen_data()
    cu_q = cu if which == "cu_seqlens_q" else good
    cu_k = cu if which == "cu_seqlens_k" else good
    max_q = mx if which == "max_seqlen_q" else longest
    max_k = mx if which == "max_seqlen_k" else longest
    with pytest.raises(ValueError, match=msg):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    kv = torch.stack([k, v], 1)
    with pytest.raises(ValueError, match=msg):
        flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k)
    # the private ops (ring-flash-attn calls them directly), forward and backward
    from fa_test_utils import _op_impl
    import flash_attn._varlen_kvcache as vk

    with pytest.raises(ValueError, match=msg):
        _op_impl(vk._flash_attn_varlen_forward)(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, 0.25, False)
    out, lse = q.detach(), torch.zeros(4, q.shape[0])
    with pytest.raises(ValueError, match=msg):
        _op_impl(vk._flash_attn_varlen_backward)(out, q, k, v, out, lse, None, None, None, cu_q,
                                                 cu_k, max_q, max_k, 0.0, 0.25, False, -1, -1,
                                                 0.0, None, False)
    assert cpu_ext.calls == []
    # the same call with good values runs (and passes CpuExt's asserts)
    flash_attn_varlen_func(q, k, v, good, good, longest, longest)


def test_varlen_backward_reuses_the_forwards_check(cpu_ext, monkeypatch):
    from flash_attn import _checks

    q, k, v, cu, mx = _varlen_data()
    seen = []
    real = _checks.check_varlen_values
    monkeypatch.setattr(_checks, "check_varlen_values",
                        lambda *a, **kw: (seen.append(_checks.value_checks_apply(a[0], a[1])),
                                          real(*a, **kw)))
    out = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert seen == [True, False]  # the backward trusts the forward's check
    # cu_seqlens are saved for backward: autograd itself rejects an in-place change in between
    out = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx)
    cu.add_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    # the private backward op called directly checks
    out = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx)
    assert seen == [True, False, True, True]


def _paged_varlen(page=16):
    lens = [20, 0, 33]
    from test_varlen_kvcache import cu_from

    cu_k = cu_from(lens, "cpu")
    cu_q = cu_from([3, 1, 2], "cpu")
    q = torch.randn(6, 4, 16)
    kp = torch.randn(8, page, 2, 16)
    bt = torch.tensor([[0, 1, 7], [2, 3, 4], [5, 6, 3]], dtype=torch.int32)
    return q, kp, cu_q, cu_k, bt


def test_varlen_paged_value_checks(cpu_ext):
    q, kp, cu_q, cu_k, bt = _paged_varlen()
    flash_attn_varlen_func(q, kp, kp, cu_q, cu_k, 3, 33, block_table=bt)
    bad = bt.clone()
    bad[2, 2] = 8
    with pytest.raises(ValueError, match=r"block_table\[2, 2\] = 8 .*num_blocks=8"):
        flash_attn_varlen_func(q, kp, kp, cu_q, cu_k, 3, 33, block_table=bad)
    bad = bt.clone()
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -1"):
        flash_attn_varlen_func(q, kp, kp, cu_q, cu_k, 3, 33, block_table=bad)
    # entries a sequence does not use are not looked at (sequence 0 uses 2 pages, 1 none)
    unused = bt.clone()
    unused[0, 2] = -1
    unused[1] = 99
    flash_attn_varlen_func(q, kp, kp, cu_q, cu_k, 3, 33, block_table=unused)
    with pytest.raises(ValueError, match=r"key sequence 2 has 33 rows .*2 pages of 16 = 32"):
        flash_attn_varlen_func(q, kp, kp, cu_q, cu_k, 3, 33, block_table=bt[:, :2].contiguous())


def _kv_setup(b=2, s=32, hk=2, d=16, page=None):
    q = torch.randn(b, 1, 4, d)
    if page is None:
        kc = torch.randn(b + 1, s, hk, d)
        bt = None
    else:
        kc = torch.randn(6, page, hk, d)
        bt = torch.tensor([[0, 3], [5, 1]], dtype=torch.int32)
    vc = torch.randn_like(kc)
    kn = torch.randn(b, 1, hk, d)
    return q, kc, vc, kn, bt


KV_BAD = [
    (dict(cache_seqlens=_i32(3, 32)), r"cache_seqlens\[1\] = 32 \+ seqlen_new .* past the end .*= 32"),
    (dict(cache_seqlens=_i32(3, -1)), r"cache_seqlens must be >= 0, got cache_seqlens\[1\] = -1"),
    (dict(cache_seqlens=_i32(3, 33), new=False), r"cache_seqlens\[1\] = 33 is past the end"),
    (dict(cache_seqlens=32), r"cache_seqlens = 32 out of range"),
    (dict(cache_seqlens=33, new=False), r"cache_seqlens = 33 out of range"),
    (dict(cache_seqlens=-2), r"cache_seqlens = -2 out of range"),
    (dict(cache_batch_idx=_i32(0, 3)), r"cache_batch_idx\[1\] = 3 .*k_cache.shape\[0\] = 3"),
    (dict(cache_batch_idx=_i32(-1, 0)), r"cache_batch_idx\[0\] = -1"),
    (dict(cache_seqlens=_i32(3, 4), cache_leftpad=_i32(0, 5)),
     r"cache_leftpad\[1\] = 5 must be in \[0, cache_seqlens\[1\] = 4\]"),
    (dict(cache_seqlens=_i32(3, 4), cache_leftpad=_i32(-1, 0)), r"cache_leftpad\[0\] = -1"),
    (dict(cache_seqlens=4, cache_leftpad=_i32(0, 5)), r"cache_leftpad\[1\] = 5"),
    (dict(cache_leftpad=_i32(0, 1)), r"cache_leftpad\[1\] = 1 .*appending at row 0"),
    (dict(num_splits=2**31), r"num_splits"),
    (dict(num_splits=-3), r"num_splits"),
    (dict(page=16, cache_seqlens=_i32(3, 40)), r"cache_seqlens\[1\] = 40 .*block_table.shape\[1\]"),
    (dict(page=16, cache_seqlens=_i32(3, 31), table=[[0, 3], [5, 6]]),
     r"block_table\[1, 1\] = 6 .*num_blocks=6"),
    (dict(page=16, cache_seqlens=_i32(20, 31), table=[[0, -3], [5, 1]]), r"block_table\[0, 1\] = -3"),
    (dict(page=16, new=False, table=[[0, 3], [5, 9]]), r"block_table\[1, 1\] = 9"),
    (dict(softcap="1.0"), "softcap"),
    (dict(unaligned=True), "k_cache needs 16-byte aligned rows"),
]


@pytest.mark.parametrize("kw, msg", KV_BAD, ids=[f"{'-'.join(k)}{i}" for i, (k, _) in enumerate(KV_BAD)])
def test_kvcache_bad_values_change_nothing(cpu_ext, kw, msg):
    """Every bad value raises, naming the argument, before anything is written; a valid call
    afterwards works."""
    kw = dict(kw)
    page = kw.pop("page", None)
    new = kw.pop("new", True)
    table = kw.pop("table", None)
    unaligned = kw.pop("unaligned", False)
    q, kc, vc, kn, good_bt = _kv_setup(page=page)
    bt = good_bt if table is None else torch.tensor(table, dtype=torch.int32)
    if unaligned:  # rows of 20 elements: not 16-byte aligned, and updated in place
        kc = torch.randn(3, 32, 2, 20)[..., :16]
        vc = torch.randn(3, 32, 2, 20)[..., :16]
    before = kc.clone(), vc.clone()
    kv = (kn, kn.clone()) if new else (None, None)
    with pytest.raises((ValueError, TypeError), match=msg):
        flash_attn_with_kvcache(q, kc, vc, *kv, block_table=bt, **kw)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]), "a rejected call wrote the cache"
    assert cpu_ext.calls == []
    if not unaligned:
        out = flash_attn_with_kvcache(q, kc, vc, *kv, block_table=good_bt,
                                      cache_seqlens=_i32(3, 5) if new else None)
        assert out.shape == q.shape and cpu_ext.calls


def test_kvcache_int_cache_seqlens_with_leftpad_and_pages(cpu_ext):
    """An int cache_seqlens is checked on the host; cache_leftpad and block_table against it."""
    q, kc, vc, kn, bt = _kv_setup()
    flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=4, cache_leftpad=_i32(0, 4))
    with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 5 must be in \[0, cache_seqlens\[1\] = 4\]"):
        flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=4, cache_leftpad=_i32(0, 5))
    q, kc, vc, kn, bt = _kv_setup(page=16)
    bad = _i32(0, 3, 5, 7).view(2, 2)  # second pages out of range, used only past row 16
    flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=10, block_table=bad)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 7"):
        flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=16, block_table=bad)


def test_kvcache_block_table_strided_column():
    """A (batch, 1) block_table view with another last stride is fine (copied), as C++ needs a
    unit stride; a wider non-contiguous one is rejected before anything is written."""
    q, kc = _m(2, 1, 8, 128), _m(10, 16, 2, 128)
    col = torch.empty(1, 2, dtype=torch.int32, device="meta").t()
    assert col.shape == (2, 1) and col.stride(-1) != 1
    assert flash_attn_with_kvcache(q, kc, kc, block_table=col).shape == q.shape
    wide = torch.empty(4, 2, dtype=torch.int32, device="meta").t()
    with pytest.raises(ValueError, match="block_table must have a contiguous last dimension"):
        flash_attn_with_kvcache(q, kc, kc, block_table=wide)


def test_value_checks_skip_meta_and_follow_strict_flag():
    from flash_attn import _checks

    cpu, meta = _i32(0, 1), torch.empty(2, dtype=torch.int32, device="meta")
    assert _checks.value_checks_apply(cpu) and not _checks.value_checks_apply(meta)
    assert not _checks.value_checks_apply(None)
    prev = flash_attn.set_strict_checks(False)
    try:
        assert _checks.value_checks_apply(cpu)  # host values cost nothing: always checked
    finally:
        flash_attn.set_strict_checks(prev)
    with _checks.trusted_values():
        assert not _checks.value_checks_apply(cpu)
    assert _checks.value_checks_apply(cpu)


def test_device_guard_error_messages_name_the_argument():
    """Every code of csrc/api/index_guard.h words an error naming its argument and value."""
    from flash_attn._checks import index_error_message

    names = {1: "cache_seqlens", 2: "cache_seqlens", 3: "cache_batch_idx", 4: "cache_leftpad",
             5: "block_table", 6: "cu_seqlens_q", 7: "cu_seqlens_q", 8: "cu_seqlens_q",
             9: "max_seqlen_q", 10: "cu_seqlens_k", 11: "cu_seqlens_k", 12: "cu_seqlens_k",
             13: "max_seqlen_k", 14: "cu_seqlens_k", 15: "block_table"}
    for code, name in names.items():
        msg = index_error_message(code, 3, 1, 123456, 99)
        assert msg.startswith("flash_attn: ") and name in msg and "123456" in msg, msg
    assert "guard code 77" in index_error_message(77, 0, 0, 0, 0)
