"""CPU tests of the learnable attention sink in the Python layer: the argument checks, the fake
(meta) implementations and torch.compile tracing with the sink, and - with the kernels replaced
by fa_test_utils.CpuExt - the sink's gradient from softmax_lse and softmax_d in the dense and the
varlen layouts, against autograd through the reference."""

import pytest
import torch

import flash_attn.flash_attn_interface as fi
from flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_with_kvcache)

from fa_test_utils import attention_ref, install_cpu_ext


def _m(*shape, dtype=torch.float16, requires_grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=requires_grad)


def _cu(lengths, device="meta"):
    if device == "meta":
        return torch.empty(len(lengths) + 1, device="meta", dtype=torch.int32)
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


# ---------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------

BAD_SINKS = [
    (lambda h: [0.0] * h, TypeError, r"learnable_sink must be a torch.Tensor"),
    (lambda h: _m(h, dtype=torch.float64), TypeError, r"learnable_sink must have dtype"),
    (lambda h: _m(h, dtype=torch.int32), TypeError, r"learnable_sink must have dtype"),
    (lambda h: _m(h + 1, dtype=torch.float32), ValueError, r"learnable_sink must have shape \(nheads,\) = \(6,\)"),
    (lambda h: _m(1, h, dtype=torch.float32), ValueError, r"learnable_sink must have shape"),
    (lambda h: torch.zeros(h), ValueError, r"learnable_sink is on device cpu but q is on device meta"),
]


@pytest.mark.parametrize("make, exc, match", BAD_SINKS)
@pytest.mark.parametrize("entry", ["func", "qkvpacked", "kvpacked", "varlen", "kvcache"])
def test_bad_learnable_sink(entry, make, exc, match):
    h = 6
    sink = make(h)
    with pytest.raises(exc, match=match):
        if entry == "func":
            flash_attn_func(_m(2, 17, h, 64), _m(2, 33, 2, 64), _m(2, 33, 2, 64), learnable_sink=sink)
        elif entry == "qkvpacked":
            flash_attn_qkvpacked_func(_m(2, 17, 3, h, 64), learnable_sink=sink)
        elif entry == "kvpacked":
            flash_attn_kvpacked_func(_m(2, 17, h, 64), _m(2, 33, 2, 2, 64), learnable_sink=sink)
        elif entry == "varlen":
            flash_attn_varlen_func(_m(40, h, 64), _m(50, 2, 64), _m(50, 2, 64), _cu([20, 20]),
                                   _cu([25, 25]), 20, 25, learnable_sink=sink)
        else:
            flash_attn_with_kvcache(_m(2, 1, h, 64), _m(2, 64, 2, 64), _m(2, 64, 2, 64),
                                    learnable_sink=sink)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_learnable_sink_dtypes_accepted(dtype):
    out = flash_attn_func(_m(2, 17, 6, 64), _m(2, 33, 2, 64), _m(2, 33, 2, 64),
                          learnable_sink=_m(6, dtype=dtype))
    assert out.shape == (2, 17, 6, 64)


def test_learnable_sink_is_keyword_only():
    with pytest.raises(TypeError):
        flash_attn_func(_m(2, 17, 6, 64), _m(2, 33, 2, 64), _m(2, 33, 2, 64), 0.0, None, False,
                        (-1, -1), 0.0, None, False, False, _m(6, dtype=torch.float32))


# ---------------------------------------------------------------------------------------
# Fakes (meta tensors) and torch.compile
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_dense_meta_shapes_with_sink(variant, sink_dtype):
    sink = _m(4, dtype=sink_dtype, requires_grad=True)
    if variant == "func":
        inputs = (_m(2, 17, 4, 59, requires_grad=True), _m(2, 23, 2, 59, requires_grad=True),
                  _m(2, 23, 2, 59, requires_grad=True))
        out, lse, _ = flash_attn_func(*inputs, causal=True, return_attn_probs=True,
                                      learnable_sink=sink)
    elif variant == "qkvpacked":
        inputs = (_m(2, 17, 3, 4, 59, requires_grad=True),)
        out, lse, _ = flash_attn_qkvpacked_func(*inputs, return_attn_probs=True,
                                                learnable_sink=sink)
    else:
        inputs = (_m(2, 17, 4, 59, requires_grad=True), _m(2, 23, 2, 2, 59, requires_grad=True))
        out, lse, _ = flash_attn_kvpacked_func(*inputs, return_attn_probs=True,
                                               learnable_sink=sink)
    assert out.shape == (2, 17, 4, 59) and lse.shape == (2, 4, 17)
    grads = torch.autograd.grad(out, inputs + (sink,), torch.empty_like(out))
    for g, x in zip(grads, inputs + (sink,)):
        assert g.shape == x.shape and g.dtype == x.dtype and g.device.type == "meta"


def test_sink_only_requiring_grad_gets_a_gradient():
    q, k, v = _m(2, 17, 4, 64), _m(2, 23, 2, 64), _m(2, 23, 2, 64)
    sink = _m(4, dtype=torch.float32, requires_grad=True)
    out = flash_attn_func(q, k, v, learnable_sink=sink)
    (dsink,) = torch.autograd.grad(out, (sink,), torch.empty_like(out))
    assert dsink.shape == (4,) and dsink.dtype == torch.float32


def test_varlen_meta_shapes_with_sink():
    q = _m(40, 6, 64, requires_grad=True)
    k, v = _m(50, 2, 64, requires_grad=True), _m(50, 2, 64, requires_grad=True)
    sink = _m(6, dtype=torch.float16, requires_grad=True)
    out, lse, _ = flash_attn_varlen_func(q, k, v, _cu([20, 20]), _cu([25, 25]), 20, 25,
                                         return_attn_probs=True, learnable_sink=sink)
    assert out.shape == (40, 6, 64) and lse.shape == (6, 40)
    grads = torch.autograd.grad(out, (q, k, v, sink), torch.empty_like(out))
    assert [tuple(g.shape) for g in grads] == [(40, 6, 64), (50, 2, 64), (50, 2, 64), (6,)]
    assert grads[3].dtype == torch.float16


def test_kvcache_meta_shapes_with_sink():
    out, lse = flash_attn_with_kvcache(_m(2, 1, 6, 64), _m(2, 64, 2, 64), _m(2, 64, 2, 64),
                                       return_softmax_lse=True,
                                       learnable_sink=_m(6, dtype=torch.float32))
    assert out.shape == (2, 1, 6, 64) and lse.shape == (2, 6, 1)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_forward_op_takes_the_sink_on_meta():
    q, k, v = _m(2, 17, 6, 64), _m(2, 33, 2, 64), _m(2, 33, 2, 64)
    sink = _m(6, dtype=torch.float32)
    out, lse, _, _ = torch.ops.flash_attn._flash_attn_forward(
        q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, False, learnable_sink=sink)
    assert out.shape == q.shape and lse.shape == (2, 6, 17)
    torch.library.opcheck(torch.ops.flash_attn._flash_attn_forward.default,
                          (q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, False, sink))
    with pytest.raises(ValueError, match="learnable_sink must have shape"):
        torch.ops.flash_attn._flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None,
                                                 False, learnable_sink=_m(5, dtype=torch.float32))


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("variant", ["func", "varlen"])
def test_compile_fullgraph_on_meta_with_sink(variant):
    """torch.compile(fullgraph=True) traces forward and backward (dsink included) without graph
    breaks; aot_eager runs the graphs on meta tensors through the fakes."""
    torch._dynamo.reset()
    sink = _m(4, dtype=torch.bfloat16, requires_grad=True)
    if variant == "func":
        inputs = (_m(2, 17, 4, 64, requires_grad=True), _m(2, 23, 2, 64, requires_grad=True),
                  _m(2, 23, 2, 64, requires_grad=True))

        def fn(q, k, v, s):
            return flash_attn_func(q, k, v, causal=True, learnable_sink=s)
    else:
        inputs = (_m(40, 4, 64, requires_grad=True), _m(50, 2, 64, requires_grad=True),
                  _m(50, 2, 64, requires_grad=True))
        cu_q, cu_k = _cu([20, 20]), _cu([25, 25])

        def fn(q, k, v, s):
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 25, learnable_sink=s)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(*inputs, sink)
    grads = torch.autograd.grad(out, inputs + (sink,), torch.empty_like(out))
    assert grads[-1].shape == (4,) and grads[-1].dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------
# The sink's gradient from softmax_lse / softmax_d (kernels replaced by CpuExt)
# ---------------------------------------------------------------------------------------


@pytest.fixture
def cpu_ext(monkeypatch):
    return install_cpu_ext(monkeypatch, fp32=True)


def _sink(h, dtype=torch.float32):
    s = torch.randn(h, dtype=torch.float64) * 1.5
    s[0] = -20.0
    return s.to(dtype).requires_grad_()


@pytest.mark.parametrize("causal, window, sq, sk", [(False, (-1, -1), 17, 33), (True, (-1, -1), 40, 23),
                                                     (False, (8, 0), 33, 33)])
@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_dense_sink_gradient(cpu_ext, variant, causal, window, sq, sk):
    torch.manual_seed(0)
    b, h, hk, d = 2, 4, 2, 16
    if variant == "qkvpacked":
        sk, hk = sq, h
    q = torch.randn(b, sq, h, d, requires_grad=True)
    k = torch.randn(b, sk, hk, d, requires_grad=True)
    v = torch.randn(b, sk, hk, d, requires_grad=True)
    sink = _sink(h)
    kw = dict(causal=causal, window_size=window, return_attn_probs=True, learnable_sink=sink)
    if variant == "func":
        out, lse, _ = flash_attn_func(q, k, v, **kw)
    elif variant == "qkvpacked":
        out, lse, _ = flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), **kw)
    else:
        out, lse, _ = flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw)
    dout = torch.randn_like(out)
    (dsink,) = torch.autograd.grad(out, (sink,), dout)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window,
                                     learnable_sink=sink)
    (dsink_ref,) = torch.autograd.grad(out_ref, (sink,), dout)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dsink, dsink_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
def test_varlen_sink_gradient(cpu_ext, sink_dtype):
    """Sequences with no query rows and no keys, and rows past cu_seqlens_q[-1] (in no
    sequence): softmax_d's row r of sequence b sits at r + 128 b."""
    torch.manual_seed(0)
    h, hk, d = 4, 2, 16
    lens_q, lens_k = [5, 0, 9, 1, 3], [7, 4, 9, 0, 12]
    cu_q, cu_k = _cu(lens_q, "cpu"), _cu(lens_k, "cpu")
    total_q = sum(lens_q) + 3  # three tail rows
    q = torch.randn(total_q, h, d, requires_grad=True)
    k = torch.randn(sum(lens_k), hk, d, requires_grad=True)
    v = torch.randn(sum(lens_k), hk, d, requires_grad=True)
    sink = _sink(h, sink_dtype)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                         causal=True, return_attn_probs=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    (dsink,) = torch.autograd.grad(out, (sink,), dout)
    assert dsink.dtype == sink_dtype
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lens_q)):
        o, _ = attention_ref(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]],
                             v[None, ck[i]:ck[i + 1]], causal=True, learnable_sink=sink)
        outs.append(o[0])
    out_ref = torch.cat(outs)
    (dsink_ref,) = torch.autograd.grad(out_ref, (sink,), dout[:cq[-1]])
    torch.testing.assert_close(out[:cq[-1]], out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[cq[-1]:], torch.zeros_like(out[cq[-1]:]))
    tol = 1e-4 if sink_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(dsink.float(), dsink_ref.float(), atol=tol, rtol=tol)
    # The sequence without keys: out 0, lse = sink.
    rows = slice(cq[3], cq[4])
    torch.testing.assert_close(lse[:, rows], sink.detach().float().view(h, 1).expand(h, 1))


def test_kvcache_sink_forward(cpu_ext):
    torch.manual_seed(0)
    b, h, hk, d, S = 3, 4, 2, 16, 32
    q = torch.randn(b, 2, h, d)
    kc, vc = torch.randn(b, S, hk, d), torch.randn(b, S, hk, d)
    seqlens = torch.tensor([20, 0, 32], dtype=torch.int32)
    sink = _sink(h).detach()
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True, learnable_sink=sink)
    for i, n in enumerate(seqlens.tolist()):
        o, l = attention_ref(q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], causal=True,
                             learnable_sink=sink)
        torch.testing.assert_close(out[i:i + 1], o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[i:i + 1], l, atol=1e-5, rtol=1e-5)
