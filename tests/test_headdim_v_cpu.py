"""A v head dim other than q's and k's (DeepSeek MLA prefill: 192 / 128), without a GPU: the
argument checks, the fake (meta) shapes of the public functions and the custom ops, torch.compile
on meta tensors, and the zero-padding around the kernels, with the extension replaced by the CPU
stand-in (fa_test_utils.CpuExt), which asserts that the kernels only ever see one head dim, a
multiple of 8."""

import pytest
import torch

import flash_attn._common as common
import flash_attn._varlen_kvcache as vk
import flash_attn.flash_attn_interface as fi
from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

from fa_test_utils import _op_impl, attention_ref, check_against_ref, install_cpu_ext

# (q/k head dim, v head dim): MLA's, v smaller, v larger, and neither a multiple of 8.
HEAD_DIMS = [(192, 128), (128, 64), (64, 128), (59, 13)]
HEAD_DIM_IDS = [f"{a}-{b}" for a, b in HEAD_DIMS]
DEVICES = ["cpu", "meta"]


def _t(*shape, device="meta", dtype=torch.bfloat16, requires_grad=False):
    x = torch.empty(*shape, device=device, dtype=dtype)
    if device != "meta":
        x.normal_()
    return x.requires_grad_(requires_grad)


def _dense(d_qk, d_v, b=2, sq=17, sk=23, h=6, hk=2, **kw):
    return _t(b, sq, h, d_qk, **kw), _t(b, sk, hk, d_qk, **kw), _t(b, sk, hk, d_v, **kw)


def _cu(lengths, device="meta"):
    if device == "meta":
        return torch.empty(len(lengths) + 1, dtype=torch.int32, device="meta")
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _varlen(d_qk, d_v, lens_q=(5, 0, 9), lens_k=(7, 3, 9), h=6, hk=2, **kw):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) with an empty query
    sequence and two rows past cu_seqlens_q[-1]."""
    device = kw.get("device", "meta")
    q = _t(sum(lens_q) + 2, h, d_qk, **kw)
    k, v = _t(sum(lens_k), hk, d_qk, **kw), _t(sum(lens_k), hk, d_v, **kw)
    return q, k, v, _cu(lens_q, device), _cu(lens_k, device), max(lens_q), max(lens_k)


# ---------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------


def _bad_dense(case, device):
    q, k, v = _dense(192, 128, device=device)
    return {
        "k_headdim": ((q, k[..., :128], v),
                      r"^flash_attn: k has headdim 128 but q has headdim 192"),
        "v_headdim_too_large": ((q, k, _t(2, 23, 2, 520, device=device)),
                                r"^flash_attn: v has headdim 520; headdim must be between 1 and "
                                r"512"),
        "v_headdim_zero": ((q, k, v[..., :0]), r"^flash_attn: v has headdim 0"),
        "v_seqlen": ((q, k, v[:, :5]), r"^flash_attn: v must have the same shape as k but for "
                                        r"the head dim"),
        "v_nheads": ((q, k, _t(2, 23, 1, 128, device=device)), r"^flash_attn: v must have the "
                                                               r"same shape as k"),
    }[case]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["k_headdim", "v_headdim_too_large", "v_headdim_zero",
                                  "v_seqlen", "v_nheads"])
def test_dense_head_dim_errors(case, device):
    args, match = _bad_dense(case, device)
    with pytest.raises(fi.FlashAttnValueError, match=match):
        flash_attn_func(*args)


def test_varlen_head_dim_errors():
    device = "meta"
    q, k, v, cu_q, cu_k, mq, mk = _varlen(192, 128, device=device)
    cases = [
        ((q, k[..., :128], v), r"^flash_attn: k has headdim 128 but q has headdim 192"),
        ((q, k, _t(v.shape[0], 2, 520, device=device)), r"^flash_attn: v has headdim 520"),
        ((q, k, v[:4]), r"^flash_attn: v must have the same shape as k but for the head dim"),
    ]
    for (qq, kk, vv), match in cases:
        with pytest.raises(fi.FlashAttnValueError, match=match):
            flash_attn_varlen_func(qq, kk, vv, cu_q, cu_k, mq, mk)


def test_packed_functions_keep_one_head_dim():
    """qkv- and kv-packing give q, k and v one head dim: nothing to check beyond the shape."""
    out = fi.flash_attn_kvpacked_func(_t(2, 9, 4, 72), _t(2, 9, 2, 2, 72))
    assert out.shape == (2, 9, 4, 72)
    with pytest.raises(fi.FlashAttnValueError, match=r"^flash_attn: kv has headdim 64 but q has "
                                                     r"headdim 72"):
        fi.flash_attn_kvpacked_func(_t(2, 9, 4, 72), _t(2, 9, 2, 2, 64))


def test_kvcache_rejects_a_v_head_dim_of_its_own():
    q, kc = _t(2, 1, 8, 192), _t(2, 64, 2, 192)
    with pytest.raises(fi.FlashAttnValueError, match=r"^flash_attn: v_cache has headdim 128 but "
                                                     r"k_cache has headdim 192"):
        flash_attn_with_kvcache(q, kc, _t(2, 64, 2, 128))
    with pytest.raises(fi.FlashAttnValueError, match=r"^flash_attn: v has headdim 128 but k has "
                                                     r"headdim 192"):
        flash_attn_with_kvcache(q, kc, kc, k=_t(2, 1, 2, 192), v=_t(2, 1, 2, 128),
                                cache_seqlens=3)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_ops_reject_a_k_head_dim_other_than_qs():
    """Padding must not hide a k whose head dim is not q's, in the ops (here their fakes) too."""
    q, k, v = _dense(192, 128)
    with pytest.raises(fi.FlashAttnValueError, match=r"k has headdim 128 but q has headdim 192"):
        torch.ops.flash_attn._flash_attn_forward(q, v, v, 0.0, 0.1, False, -1, -1, 0.0, None,
                                                 False)
    q, k, v, cu_q, cu_k, mq, mk = _varlen(192, 128)
    with pytest.raises(fi.FlashAttnValueError, match=r"k has headdim 128 but q has headdim 192"):
        torch.ops.flash_attn._flash_attn_varlen_forward(q, v, v, cu_q, cu_k, mq, mk, 0.0, 0.1,
                                                        False)


# ---------------------------------------------------------------------------------------
# Fake / meta shapes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_qk,d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_meta_shapes(d_qk, d_v, causal):
    q, k, v = _dense(d_qk, d_v, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == (2, 17, 6, d_v) and lse.shape == (2, 6, 17)
    grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]

    q, k, v, cu_q, cu_k, mq, mk = _varlen(d_qk, d_v, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    assert out.shape == (q.shape[0], 6, d_v)
    grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("d_qk,d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_fake_ops_on_meta(d_qk, d_v):
    """The ops' fakes: out with v's head dim (contiguous, as the ops return it), the backward's
    softmax_d as for one head dim; opcheck compares the fakes with the schemas."""
    q, k, v = _dense(d_qk, d_v)
    fwd_args = (q, k, v, 0.0, 0.1, True, -1, -1, 0.0, None, False)
    out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(*fwd_args)
    assert out.shape == (2, 17, 6, d_v) and out.is_contiguous() and lse.shape == (2, 6, 17)
    bwd_args = (out, q, k, v, out, lse, torch.empty_like(q), torch.empty_like(k),
                torch.empty_like(v), 0.0, 0.1, True, -1, -1, 0.0, None, False, rng)
    assert torch.ops.flash_attn._flash_attn_backward(*bwd_args).shape == (2, 6, 128)
    torch.library.opcheck(torch.ops.flash_attn._flash_attn_forward.default, fwd_args)
    torch.library.opcheck(torch.ops.flash_attn._flash_attn_backward.default, bwd_args)
    # A q in another layout: the kernel's out is cut to v's head dim, a contiguous copy.
    q_t = _t(2, 6, 17, d_qk).transpose(1, 2)
    out_t = torch.ops.flash_attn._flash_attn_forward(q_t, *fwd_args[1:])[0]
    assert out_t.shape == (2, 17, 6, d_v) and out_t.is_contiguous()

    q, k, v, cu_q, cu_k, mq, mk = _varlen(d_qk, d_v)
    out, lse, _, rng = torch.ops.flash_attn._flash_attn_varlen_forward(
        q, k, v, cu_q, cu_k, mq, mk, 0.0, 0.1, True)
    assert out.shape == (q.shape[0], 6, d_v) and out.is_contiguous() and lse.shape == (6, 16)
    sd = torch.ops.flash_attn._flash_attn_varlen_backward(
        out, q, k, v, out, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
        cu_q, cu_k, mq, mk, 0.0, 0.1, True, -1, -1, 0.0, None, False, rng)
    assert sd.shape == (6, q.shape[0] + 128 * 3)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("variant", ["func", "varlen"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_on_meta(variant, dynamic):
    """torch.compile(fullgraph=True) traces the padding and the custom ops, forward and
    backward, without graph breaks; aot_eager runs the graphs through the fakes."""
    torch._dynamo.reset()
    fn = flash_attn_func if variant == "func" else flash_attn_varlen_func
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for d_qk, d_v in [(192, 128), (64, 128)]:
        make = _dense if variant == "func" else _varlen
        args = make(d_qk, d_v, requires_grad=True)
        out = compiled(*args, causal=True)
        assert out.shape == args[0].shape[:-1] + (d_v,)
        grads = torch.autograd.grad(out, args[:3], torch.empty_like(out))
        assert [g.shape for g in grads] == [a.shape for a in args[:3]]


# ---------------------------------------------------------------------------------------
# The padding around the kernels, on CPU (the stand-in asserts one head dim, a multiple of 8)
# ---------------------------------------------------------------------------------------


@pytest.fixture
def cpu_ext(monkeypatch):
    return install_cpu_ext(monkeypatch)


@pytest.mark.parametrize("d_qk,d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softmax_scale", [None, -0.2])
def test_dense_numerics(cpu_ext, d_qk, d_v, causal, softmax_scale):
    q, k, v = _dense(d_qk, d_v, device="cpu", requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                  return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, lse, grads, q, k, v, dout, causal, softmax_scale=softmax_scale)
    # The default scale is that of q's head dim, not of the padded one.
    expected = d_qk ** -0.5 if softmax_scale is None else -softmax_scale
    assert [c for c in cpu_ext.calls] == [("fwd", expected), ("bwd", expected)]


@pytest.mark.parametrize("d_qk,d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_numerics(cpu_ext, d_qk, d_v, causal):
    from test_varlen_kvcache import varlen_ref

    q, k, v, cu_q, cu_k, mq, mk = _varlen(d_qk, d_v, device="cpu", requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref, _ = varlen_ref(*leaves, cu_q, cu_k, causal, (-1, -1), d_qk ** -0.5, True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, torch.autograd.grad(ref, leaves, dout.float())):
        assert g.shape == r.shape
        torch.testing.assert_close(g.float(), r, atol=3e-2, rtol=3e-2)
    assert torch.all(out[-2:] == 0)  # rows past cu_seqlens_q[-1]


@pytest.mark.parametrize("d_qk,d_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_private_ops_take_a_v_head_dim_of_its_own(cpu_ext, d_qk, d_v):
    """_flash_attn_forward / _backward and the varlen ones, as ring-flash-attn calls them:
    out of v's head dim, gradients written into the caller's dq, dk, dv."""
    q, k, v = [x.float() for x in _dense(d_qk, d_v, device="cpu")]
    scale = 0.3
    out, lse, _, rng = fi._flash_attn_forward_impl(q, k, v, 0.0, scale, True, -1, -1, 0.0,
                                                   None, False)
    ref, lse_ref = attention_ref(q, k, v, causal=True, softmax_scale=scale)
    assert out.is_contiguous()  # as the fake promises
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, lse_ref)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fi._flash_attn_backward_impl(dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq,
                                 dk=dk, dv=dv, dropout_p=0.0, softmax_scale=scale, causal=True,
                                 window_size_left=-1, window_size_right=-1, softcap=0.0,
                                 alibi_slopes=None, deterministic=False, rng_state=rng)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o, _ = attention_ref(*leaves, causal=True, softmax_scale=scale)
    for g, r in zip((dq, dk, dv), torch.autograd.grad(o, leaves, dout)):
        torch.testing.assert_close(g, r)

    q, k, v, cu_q, cu_k, mq, mk = _varlen(d_qk, d_v, device="cpu")
    q, k, v = q.float(), k.float(), v.float()
    out, lse, _, rng = _op_impl(vk._flash_attn_varlen_forward)(q, k, v, cu_q, cu_k, mq, mk,
                                                               0.0, scale, False)
    assert out.shape == (q.shape[0], 6, d_v)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _op_impl(vk._flash_attn_varlen_backward)(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, mq,
                                             mk, 0.0, scale, False, -1, -1, 0.0, None, False)
    from test_varlen_kvcache import varlen_ref

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o, _ = varlen_ref(*leaves, cu_q, cu_k, False, (-1, -1), scale, True)
    torch.testing.assert_close(out, o.detach())
    for g, r in zip((dq, dk, dv), torch.autograd.grad(o, leaves, dout)):
        torch.testing.assert_close(g, r)


def test_private_backward_checks_the_gradient_buffers(cpu_ext):
    q, k, v = [x.float() for x in _dense(192, 128, device="cpu")]
    out, lse, _, _ = fi._flash_attn_forward_impl(q, k, v, 0.0, 0.1, False, -1, -1, 0.0, None,
                                                 False)
    with pytest.raises(fi.FlashAttnValueError, match=r"^flash_attn: dv must have v's shape"):
        fi._flash_attn_backward_impl(out, q, k, v, out, lse, torch.empty_like(q),
                                     torch.empty_like(k), torch.empty_like(k), 0.0, 0.1, False,
                                     -1, -1, 0.0, None, False)


def test_equal_head_dims_are_not_copied(monkeypatch):
    """Equal head dims that are a multiple of 8 reach the op as the caller's tensors, and the
    backward's buffers are the autograd Function's own (no padding, no copy back)."""
    seen = {}

    def fwd(q, k, v, *args, **kwargs):
        seen["fwd"] = (q, k, v)
        return (torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2], q.shape[1]),
                torch.empty(0), torch.zeros(2, dtype=torch.int64))

    def bwd(dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs):
        seen["bwd"] = (dout, dq, dk, dv)
        for g in (dq, dk, dv):
            g.zero_()
        return torch.zeros(1)

    monkeypatch.setattr(fi, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(fi, "_wrapped_flash_attn_forward", fwd)
    monkeypatch.setattr(fi, "_wrapped_flash_attn_backward", bwd)
    q, k, v = _dense(64, 64, device="cpu", requires_grad=True)
    out = flash_attn_func(q, k, v)
    assert all(a is b for a, b in zip(seen["fwd"], (q, k, v)))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert seen["bwd"][0].data_ptr() == dout.data_ptr()
    assert all(g.data_ptr() == buf.data_ptr() for g, buf in zip(grads, seen["bwd"][1:]))
    assert all(a is b for a, b in zip(common.pad_qkv(q, k, v), (q, k, v)))
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    given = (dout, q, k, v, out, [dq, dk, dv])
    taken = common.grads_at_kernel_head_dim(dout, q, k, v, out, dq, dk, dv)
    assert all(a is b for a, b in zip(taken[:5], given[:5]))
    assert all(a is b for a, b in zip(taken[5], given[5]))


def test_kernel_head_dim():
    assert common.kernel_head_dim(192, 128) == 192
    assert common.kernel_head_dim(64, 128) == 128
    assert common.kernel_head_dim(59, 13) == 64
    assert common.kernel_head_dim(64, 64) == 64
    x = torch.randn(2, 3, 5)
    assert common.pad_head_dim(x, 5) is x
    assert torch.equal(common.pad_head_dim(x, 8)[..., 5:], torch.zeros(2, 3, 3))
