"""flash_attn.sdpa: our kernels behind torch.nn.functional.scaled_dot_product_attention.

CPU tests: the registry plumbing, the errors, and the schema binding, the last through the real
dispatcher by registering the kernels for the CPU key over the CPU stand-in of the extension
(fa_test_utils.CpuExt).  GPU tests: F.scaled_dot_product_attention with the flash backend forced
after activate(), against the naive reference with the error rule of tests/test_flash_attn.py.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

import flash_attn._varlen_kvcache as vk
import flash_attn.flash_attn_interface as fi
from flash_attn import flash_attn_func, flash_attn_varlen_func, sdpa

from fa_test_utils import (CpuExt, attention_ref, check_against_ref, cu_seqlens, install_cpu_ext,
                           require_config, require_gpu)

HAS_REGISTRY = hasattr(torch.nn.attention, "register_flash_attention_impl")
needs_registry = pytest.mark.skipif(not HAS_REGISTRY, reason="torch has no flash-attention registry")


def _dump(op):
    return torch._C._dispatch_dump(f"aten::{op}")


def _ours_registered(op, key="CUDA"):
    # flash_attn/sdpa.py's kernels, or csrc/api/sdpa.cpp's (SDPA's forward op)
    return any(line.startswith(f"{key}:") and re.search(r"sdpa\.(py|cpp)", line)
               for line in _dump(op).splitlines())


def _bhsd_leaves(b, h, hk, sq, sk, d, dtype, device):
    return [torch.randn(b, n, s, d, dtype=dtype, device=device, requires_grad=True)
            for n, s in ((h, sq), (hk, sk), (hk, sk))]


def _bshd(*xs):
    return [x.detach().transpose(1, 2).requires_grad_() for x in xs]


# ---------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------


def test_import_registers_nothing():
    assert not sdpa.is_active()
    assert not any(_ours_registered(op) for op in sdpa._OPS)


def test_activate_without_registry_raises(monkeypatch):
    monkeypatch.delattr(torch.nn.attention, "register_flash_attention_impl", raising=False)
    with pytest.raises(RuntimeError, match=rf"torch {re.escape(torch.__version__)}.*register_flash_attention_impl"):
        sdpa.activate()
    assert not sdpa.is_active()


def test_missing_op_raises_before_registering(monkeypatch):
    monkeypatch.setitem(sdpa._OPS, "_no_such_flash_op", sdpa._OPS["_flash_attention_forward"])
    with pytest.raises(RuntimeError, match=rf"torch {re.escape(torch.__version__)} has no aten op.*_no_such_flash_op"):
        sdpa.register_kernels()
    assert not _ours_registered("_flash_attention_forward")


@needs_registry
def test_activate_and_deactivate_swap_the_cuda_kernels():
    sdpa.activate()
    try:
        assert sdpa.is_active()
        assert torch.nn.attention.current_flash_attention_impl() == sdpa.IMPL_NAME
        assert all(_ours_registered(op) for op in sdpa._OPS)
        # The C++ kernels wherever the extension is built for this torch's schemas.
        ext, ops = sdpa._extension_with_cpp_kernels()
        assert sdpa.cpp_kernels_active() == tuple(op in ops for op in sdpa._CPP_OPS)
    finally:
        sdpa.deactivate()
    assert not sdpa.is_active() and sdpa.cpp_kernels_active() == (False, False)
    assert not any(_ours_registered(op) for op in list(sdpa._OPS) + list(sdpa._OPTIONAL_OPS))
    sdpa.deactivate()  # a no-op when not active


# _flash_attention_forward as torch 2.11 defines it (no block_table / num_splits).
SCHEMA_2_11 = ("aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, "
               "Tensor? cum_seq_q, Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, "
               "bool is_causal, bool return_debug_mask, *, float? scale=None, "
               "SymInt? window_size_left=None, SymInt? window_size_right=None, "
               "Tensor? seqused_k=None, Tensor? alibi_slopes=None) -> (Tensor output, "
               "Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)")


def test_bind_by_name_with_defaults():
    schema = torch._C.parse_schema(SCHEMA_2_11)
    a = sdpa.bind(schema, ("q", "k", "v", None, None, 5, 7, 0.1, True, False),
                  {"window_size_left": 3})
    assert a["max_q"] == 5 and a["max_k"] == 7 and a["dropout_p"] == 0.1 and a["is_causal"]
    assert a["window_size_left"] == 3 and a["window_size_right"] is None and a["scale"] is None
    with pytest.raises(TypeError, match="missing argument max_k"):
        sdpa.bind(schema, ("q", "k", "v", None, None, 5), {})


def test_kernel_for_each_schema_of_the_running_torch_and_2_11():
    assert set(sdpa.kernels()) >= set(sdpa._OPS)
    impl, needed, optional = sdpa._OPS["_flash_attention_forward"]
    sdpa.make_kernel(torch._C.parse_schema(SCHEMA_2_11), impl, needed, optional)


def test_schema_it_does_not_know_raises():
    impl, needed, optional = sdpa._OPS["_flash_attention_forward"]
    no_scale = torch._C.parse_schema(SCHEMA_2_11.replace("float? scale=None, ", ""))
    with pytest.raises(RuntimeError, match=r"missing \['scale'\]"):
        sdpa.make_kernel(no_scale, impl, needed, optional)
    extra = torch._C.parse_schema(SCHEMA_2_11.replace("*,", "int new_arg, *,"))
    with pytest.raises(RuntimeError, match=r"without defaults \['new_arg'\]"):
        sdpa.make_kernel(extra, impl, needed, optional)


def test_unknown_argument_must_keep_its_default():
    schema = torch._C.parse_schema(SCHEMA_2_11)
    kernel = sdpa.make_kernel(schema, lambda a: "ran", *sdpa._OPS["_flash_attention_forward"][1:])
    args = ("q", "k", "v", None, None, 5, 5, 0.0, False, False)
    assert kernel(*args, alibi_slopes=None) == "ran"
    with pytest.raises(RuntimeError, match="unsupported: alibi_slopes=a tensor"):
        kernel(*args, alibi_slopes=torch.ones(2))


class _CpuExtBelowAutograd(CpuExt):
    """CpuExt, whose backwards differentiate the reference with autograd: run below aten's
    autograd kernel, where the dispatcher leaves autograd out, they run on a fresh thread."""

    def bwd(self, *args):
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(super().bwd, *args).result()

    def varlen_bwd(self, *args):
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(super().varlen_bwd, *args).result()


@pytest.fixture
def cpu_kernels(monkeypatch):
    """Our kernels registered for aten's ops on the CPU key, over the CPU stand-in extension
    (fp32 allowed), so that the dispatcher itself passes the arguments."""
    ext = install_cpu_ext(monkeypatch, ext=_CpuExtBelowAutograd(), fp32=True)
    handle = sdpa.register_kernels("CPU")
    yield ext
    handle.remove()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk,d,scale", [(77, 77, 4, 4, 64, None), (33, 50, 6, 2, 20, 0.3),
                                                 (50, 33, 2, 1, 32, None)])
def test_sdpa_op_through_the_dispatcher(cpu_kernels, causal, sq, sk, h, hk, d, scale):
    q, k, v = _bhsd_leaves(2, h, hk, sq, sk, d, torch.float32, "cpu")
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal,
                                                             scale=scale)
    meta = torch.ops.aten._scaled_dot_product_flash_attention(
        *(x.detach().to("meta") for x in (q, k, v)), is_causal=causal, scale=scale)
    for ours, theirs in zip(res, meta):  # the layout torch's meta function promises
        if isinstance(theirs, torch.Tensor):
            assert (ours.shape, ours.stride(), ours.dtype) == (theirs.shape, theirs.stride(),
                                                               theirs.dtype)
        else:
            assert ours == theirs
    out, lse = res[:2]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert [g.stride() for g in grads] == [x.stride() for x in (q, k, v)]  # as meta's empty_like
    qr, kr, vr = _bshd(q, k, v)
    # Bottom-right causal, as aten's flash kernels (top-left only in F.sdpa's docs; F.sdpa
    # sends causal calls with seqlen_q != seqlen_k elsewhere).
    out_ref, lse_ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=scale)
    grads_ref = torch.autograd.grad(out_ref, (qr, kr, vr), dout.transpose(1, 2))
    torch.testing.assert_close(out.transpose(1, 2), out_ref)
    rows = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[rows], lse_ref[rows])
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g.transpose(1, 2), g_ref)
    if sq == sk and hk == h:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale))
    assert [c[0] for c in cpu_kernels.calls] == ["fwd", "bwd"]


def test_flash_attention_forward_dense_and_varlen(cpu_kernels):
    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))
    res = torch.ops.aten._flash_attention_forward(q, k, v, None, None, 9, 9, 0.0, True, False,
                                                  window_size_left=3)
    torch.testing.assert_close(res[0], attention_ref(q, k, v, causal=True, window_size=(3, 0))[0])
    assert res[2].dtype == torch.uint64 and res[2].shape == (2,)
    lengths = [5, 0, 9]
    cu = cu_seqlens(lengths, device="cpu")
    qp, kp, vp = (torch.randn(14, 4, 16, requires_grad=True) for _ in range(3))
    out, lse = torch.ops.aten._flash_attention_forward(qp, kp, vp, cu, cu, 9, 9, 0.0, True,
                                                       False)[:2]
    assert lse.shape == (4, 14)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (qp, kp, vp), dout)
    leaves = [x.detach().requires_grad_() for x in (qp, kp, vp)]
    out_ref = torch.cat([attention_ref(*(x[None, a:b] for x in leaves), causal=True)[0][0]
                         for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    torch.testing.assert_close(out, out_ref)
    for g, g_ref in zip(grads, torch.autograd.grad(out_ref, leaves, dout)):
        torch.testing.assert_close(g, g_ref)


def test_unsupported_calls_raise_as_torch_providers_do(cpu_kernels):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="unsupported: return_debug_mask must be False"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False, True)
    qd = q.transpose(1, 2)
    with pytest.raises(RuntimeError, match="unsupported: alibi_slopes"):
        torch.ops.aten._flash_attention_forward(qd, qd, qd, None, None, 8, 8, 0.0, False, False,
                                                alibi_slopes=torch.ones(2))
    with pytest.raises(RuntimeError, match="unsupported: cum_seq_k and seqused_k need cum_seq_q"):
        torch.ops.aten._flash_attention_forward(qd, qd, qd, None, None, 8, 8, 0.0, False, False,
                                                seqused_k=torch.ones(1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="unsupported: value must have query's head dim"):
        torch.ops.aten._flash_attention_forward(qd, qd, qd[..., :8], None, None, 8, 8, 0.0,
                                                False, False)
    with pytest.raises(ValueError, match="must be divisible"):  # heads our kernels reject
        kv = torch.randn(1, 3, 8, 16)
        torch.ops.aten._scaled_dot_product_flash_attention(q, kv, kv)


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------


@pytest.fixture
def active():
    require_gpu()
    if not HAS_REGISTRY:
        pytest.skip("torch has no flash-attention registry")
    sdpa.activate()
    yield
    sdpa.deactivate()


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls of our dense and varlen forward / backward implementations."""
    calls = []
    for mod, name in ((fi, "_flash_attn_forward_impl"), (fi, "_flash_attn_backward_impl"),
                      (vk, "_wrapped_flash_attn_varlen_forward"),
                      (vk, "_wrapped_flash_attn_varlen_backward")):
        def counted(*args, _fn=getattr(mod, name), _name=name, **kwargs):
            calls.append(_name)
            return _fn(*args, **kwargs)
        monkeypatch.setattr(mod, name, counted)
    return calls


def _python_calls(backward=True):
    """The Python kernel calls of one SDPA forward (and backward) on our kernels: none on the
    C++ kernels."""
    fwd, bwd = sdpa.cpp_kernels_active()
    return (([] if fwd else ["_flash_attn_forward_impl"])
            + ([] if bwd or not backward else ["_flash_attn_backward_impl"]))


def _flash_sdpa(q, k, v, **kwargs):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,hk,sq,sk,scale", [(2, 4, 4, 77, 77, None), (1, 6, 2, 113, 113, 0.2),
                                                 (3, 4, 1, 77, 113, None)])
def test_sdpa_flash_backend_runs_our_kernels(active, kernel_calls, dtype, d, causal, b, h, hk,
                                             sq, sk, scale):
    require_config(dtype, d)
    if causal and sq != sk:
        pytest.skip("F.sdpa sends causal calls with seqlen_q != seqlen_k to other backends")
    q, k, v = _bhsd_leaves(b, h, hk, sq, sk, d, dtype, "cuda")
    out = _flash_sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=hk != h)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert kernel_calls == _python_calls()
    assert grads[1].shape == k.shape
    qr, kr, vr = _bshd(q, k, v)
    assert torch.equal(out.transpose(1, 2), flash_attn_func(qr, kr, vr, causal=causal,
                                                            softmax_scale=scale))
    check_against_ref(out.transpose(1, 2), None, [g.transpose(1, 2) for g in grads],
                      *_bshd(q, k, v), dout.transpose(1, 2), causal, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("sq,sk", [(77, 113), (113, 77)])
def test_op_causal_alignment_matches_torchs_kernel(sq, sk):
    require_config(torch.bfloat16, 64)
    q, k, v = (torch.randn(2, s, 4, 64, device="cuda", dtype=torch.bfloat16) for s in (sq, sk, sk))
    args = (q, k, v, None, None, sq, sk, 0.0, True, False)
    theirs = torch.ops.aten._flash_attention_forward(*args)[0]
    sdpa.activate()
    try:
        ours = torch.ops.aten._flash_attention_forward(*args)[0]
    finally:
        sdpa.deactivate()
    torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=0)
    torch.testing.assert_close(ours, flash_attn_func(q, k, v, causal=True), atol=0, rtol=0)


@pytest.mark.gpu
def test_varlen_op_matches_flash_attn_varlen_func(active, kernel_calls):
    require_config(torch.bfloat16, 128)
    cu = cu_seqlens([77, 113, 5])
    q, k, v = (torch.randn(195, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 113, 113, 0.0, True, False)[0]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert kernel_calls == ["_wrapped_flash_attn_varlen_forward",
                            "_wrapped_flash_attn_varlen_backward"]
    out_ref = flash_attn_varlen_func(q, k, v, cu, cu, 113, 113, causal=True)
    torch.testing.assert_close(out, out_ref, atol=0, rtol=0)
    for g, g_ref in zip(grads, torch.autograd.grad(out_ref, (q, k, v), dout)):
        torch.testing.assert_close(g, g_ref, atol=0, rtol=0)


@pytest.mark.gpu
def test_dropout_forward_and_backward_replay_one_mask(active):
    require_config(torch.float16, 64)
    q, k, v = _bhsd_leaves(2, 4, 4, 113, 113, 64, torch.float16, "cuda")
    torch.manual_seed(7)
    out = _flash_sdpa(q, k, v, dropout_p=0.3)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qr, kr, vr = _bshd(q, k, v)
    torch.manual_seed(7)
    out_ref = flash_attn_func(qr, kr, vr, dropout_p=0.3)
    grads_ref = torch.autograd.grad(out_ref, (qr, kr, vr), dout.transpose(1, 2))
    torch.testing.assert_close(out.transpose(1, 2), out_ref, atol=0, rtol=0)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g.transpose(1, 2), g_ref, atol=0, rtol=0)


@pytest.mark.gpu
def test_deactivate_restores_torchs_kernels(kernel_calls):
    require_config(torch.bfloat16, 64)
    if not HAS_REGISTRY:
        pytest.skip("torch has no flash-attention registry")
    q, k, v = _bhsd_leaves(1, 2, 2, 77, 77, 64, torch.bfloat16, "cuda")
    sdpa.activate()
    ours = _flash_sdpa(q, k, v)
    calls = _python_calls(backward=False)
    sdpa.deactivate()
    assert kernel_calls == calls and sdpa.cpp_kernels_active() == (False, False)
    theirs = _flash_sdpa(q, k, v)
    assert kernel_calls == calls
    torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=0)
    assert torch.equal(ours.transpose(1, 2), flash_attn_func(*_bshd(q, k, v)))


@pytest.mark.gpu
@pytest.mark.parametrize("d,scale", [(20, None), (64, -0.3), (72, 0.0)])
def test_calls_the_cpp_kernel_hands_to_python(active, kernel_calls, d, scale):
    """Head dims that need padding and scales <= 0 run on the Python kernel (the C++ one hands
    them over), with its errors."""
    require_config(torch.bfloat16, d)
    q, k, v = _bhsd_leaves(2, 4, 2, 77, 77, d, torch.bfloat16, "cuda")
    out = _flash_sdpa(q, k, v, scale=scale, enable_gqa=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert kernel_calls == ["_flash_attn_forward_impl", "_flash_attn_backward_impl"]
    check_against_ref(out.transpose(1, 2), None, [g.transpose(1, 2) for g in grads],
                      *_bshd(q, k, v), dout.transpose(1, 2), False, scale)
    with pytest.raises(RuntimeError, match="unsupported: return_debug_mask must be False"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, True)
