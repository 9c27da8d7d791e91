"""Tests of flash_attn.layers.rotary (pure PyTorch: run on the CPU, and on CUDA when present).

The reference rotates each channel pair as a complex number: (x1 + i x2) * (cos + i sin),
with the pairs and the table row of every token spelled out explicitly.
"""

import math

import pytest
import torch

from flash_attn.layers.rotary import (RotaryEmbedding, apply_rotary_emb, apply_rotary_emb_func,
                                     apply_rotary_emb_kv_, apply_rotary_emb_qkv_,
                                     apply_rotary_emb_torch)

from fa_test_utils import DEVICES


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------


def pair_channels(rotary_dim, interleaved):
    """Channel indices (first, second) of every rotation pair."""
    half = rotary_dim // 2
    if interleaved:
        return [2 * j for j in range(half)], [2 * j + 1 for j in range(half)]
    return list(range(half)), [half + j for j in range(half)]


def rotate_tokens_ref(x, cos, sin, rows, interleaved):
    """x: (n, nheads, headdim); rows: list of n table rows (None: leave the token alone).
    Returns the rotated copy, computed in float64 with complex numbers."""
    rotary_dim = 2 * cos.shape[1]
    a, b = pair_channels(rotary_dim, interleaved)
    out = x.detach().to(torch.float64).clone()
    for t, row in enumerate(rows):
        if row is None or not (0 <= row < cos.shape[0]):
            continue
        w = torch.complex(cos[row].double(), sin[row].double())  # (rotary_dim / 2,)
        z = torch.complex(out[t][:, a], out[t][:, b]) * w  # broadcast over heads
        out[t][:, a], out[t][:, b] = z.real, z.imag
    return out


def rotary_ref(x, cos, sin, interleaved, offsets=0, cu_seqlens=None):
    """Reference for apply_rotary_emb, one sequence at a time."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offs = offsets.tolist() if torch.is_tensor(offsets) else [offsets] * batch
        return torch.stack([
            rotate_tokens_ref(x[b], cos, sin, [s + offs[b] for s in range(seqlen)], interleaved)
            for b in range(batch)
        ])
    cu = cu_seqlens.tolist()
    batch = len(cu) - 1
    offs = offsets.tolist() if torch.is_tensor(offsets) else [offsets] * batch
    rows = [None] * x.shape[0]
    for b in range(batch):
        for t in range(cu[b], cu[b + 1]):
            rows[t] = t - cu[b] + offs[b]
    return rotate_tokens_ref(x, cos, sin, rows, interleaved)


def cos_sin_table(seqlen_ro, rotary_dim, device, dtype, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angle = torch.outer(torch.arange(seqlen_ro, dtype=torch.float64), inv_freq)
    return angle.cos().to(device, dtype), angle.sin().to(device, dtype)


def make_offsets(kind, batch, seqlen, seqlen_ro, device):
    if kind == "zero":
        return 0
    if kind == "int":
        return seqlen_ro - seqlen
    return torch.randint(0, seqlen_ro - seqlen + 1, (batch,), device=device, dtype=torch.int32)


def tol(dtype):
    return {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[
        dtype
    ]


# ---------------------------------------------------------------------------------------
# apply_rotary_emb
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_matches_reference(device, interleaved, rotary_fraction, offsets, inplace):
    batch, seqlen, nheads, headdim, seqlen_ro = 3, 9, 2, 16, 20
    rotary_dim = int(headdim * rotary_fraction)
    dtype = torch.float32
    cos, sin = cos_sin_table(seqlen_ro, rotary_dim, device, dtype)
    x = torch.randn(batch, seqlen, nheads, headdim, device=device, dtype=dtype)
    x0 = x.clone()
    seqlen_offsets = make_offsets(offsets, batch, seqlen, seqlen_ro, device)

    out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets)
    ref = rotary_ref(x0, cos, sin, interleaved, seqlen_offsets)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=tol(dtype), rtol=tol(dtype))
    assert torch.equal(out[..., rotary_dim:], x0[..., rotary_dim:])  # passed through exactly
    if inplace:
        assert out.data_ptr() == x.data_ptr() and torch.equal(x, out)
    else:
        assert out.data_ptr() != x.data_ptr() and torch.equal(x, x0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_dtypes(device, dtype, interleaved):
    cos, sin = cos_sin_table(12, 8, device, dtype)
    x = torch.randn(2, 12, 3, 10, device=device, dtype=dtype)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
    assert out.dtype == dtype
    ref = rotary_ref(x, cos, sin, interleaved)
    torch.testing.assert_close(out.double(), ref, atol=tol(dtype), rtol=tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_vs_neox_layout(device):
    """The two layouts agree up to the channel permutation that maps one onto the other."""
    cos, sin = cos_sin_table(6, 8, device, torch.float32)
    x = torch.randn(2, 6, 2, 8, device=device)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7], device=device)  # neox -> interleaved order
    neox = apply_rotary_emb(x, cos, sin, interleaved=False)
    inter = apply_rotary_emb(x[..., perm], cos, sin, interleaved=True)
    torch.testing.assert_close(inter, neox[..., perm])


@pytest.mark.parametrize("device", DEVICES)
def test_apply_rotary_emb_explicit_formula(device):
    """One hand-checked case: headdim 4, rotary_dim 4, a single frequency pair angle."""
    cos = torch.tensor([[1.0, 1.0], [math.cos(0.3), math.cos(0.7)]], device=device)
    sin = torch.tensor([[0.0, 0.0], [math.sin(0.3), math.sin(0.7)]], device=device)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device).view(1, 1, 1, 4).expand(1, 2, 1, 4)
    neox = apply_rotary_emb(x.contiguous(), cos, sin)
    # pairs (0, 2) with angle 0.3 and (1, 3) with angle 0.7 at position 1
    c3, s3, c7, s7 = math.cos(0.3), math.sin(0.3), math.cos(0.7), math.sin(0.7)
    expect = [1 * c3 - 3 * s3, 2 * c7 - 4 * s7, 1 * s3 + 3 * c3, 2 * s7 + 4 * c7]
    torch.testing.assert_close(neox[0, 1, 0], torch.tensor(expect, device=device))
    torch.testing.assert_close(neox[0, 0, 0], x[0, 0, 0])
    inter = apply_rotary_emb(x.contiguous(), cos, sin, interleaved=True)
    # pairs (0, 1) with angle 0.3 and (2, 3) with angle 0.7
    expect = [1 * c3 - 2 * s3, 1 * s3 + 2 * c3, 3 * c7 - 4 * s7, 3 * s7 + 4 * c7]
    torch.testing.assert_close(inter[0, 1, 0], torch.tensor(expect, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rotary_emb_varlen(device, interleaved, offsets, inplace):
    lengths = [5, 0, 9, 1, 7]
    max_seqlen, seqlen_ro, nheads, headdim, rotary_dim = 9, 16, 3, 12, 8
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(),
                              device=device, dtype=torch.int32)
    total = sum(lengths)
    cos, sin = cos_sin_table(seqlen_ro, rotary_dim, device, torch.float32)
    x = torch.randn(total, nheads, headdim, device=device)
    x0 = x.clone()
    seqlen_offsets = make_offsets(offsets, len(lengths), max_seqlen, seqlen_ro, device)
    out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens,
                           max_seqlen)
    ref = rotary_ref(x0, cos, sin, interleaved, seqlen_offsets, cu_seqlens)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert (out.data_ptr() == x.data_ptr()) == inplace

    # Same as rotating each sequence on its own in the padded (batch, seqlen) form.
    offs = seqlen_offsets.tolist() if torch.is_tensor(seqlen_offsets) else [seqlen_offsets] * 5
    for b, n in enumerate(lengths):
        lo = cu_seqlens[b].item()
        one = apply_rotary_emb(x0[lo:lo + n].unsqueeze(0), cos, sin, interleaved,
                               seqlen_offsets=offs[b])
        torch.testing.assert_close(out[lo:lo + n], one[0])


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_offsets_beyond_table_leave_tokens_unrotated(device):
    cos, sin = cos_sin_table(8, 4, device, torch.float32)
    x = torch.randn(2, 4, 1, 6, device=device)
    offsets = torch.tensor([0, 6], device=device, dtype=torch.int32)  # rows 6..9 for seq 1
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
    torch.testing.assert_close(out.double(), rotary_ref(x, cos, sin, False, offsets))
    assert torch.equal(out[1, 2:], x[1, 2:])  # rows 8 and 9 are outside the table


@pytest.mark.parametrize("device", DEVICES)
def test_apply_rotary_emb_torch_matches(device):
    cos, sin = cos_sin_table(7, 6, device, torch.float64)
    x = torch.randn(2, 7, 3, 10, device=device, dtype=torch.float64)
    for interleaved in (False, True):
        expect = apply_rotary_emb(x, cos, sin, interleaved)
        torch.testing.assert_close(apply_rotary_emb_torch(x, cos, sin, interleaved), expect)
        # Per-batch tables (batch, seqlen, rotary_dim / 2) are accepted by the torch version.
        batched = (cos.expand(2, -1, -1), sin.expand(2, -1, -1))
        torch.testing.assert_close(apply_rotary_emb_torch(x, *batched, interleaved), expect)
    assert apply_rotary_emb_func is apply_rotary_emb


def test_apply_rotary_emb_argument_checks():
    cos, sin = cos_sin_table(8, 4, "cpu", torch.float32)
    x = torch.randn(1, 8, 1, 4)
    with pytest.raises(AssertionError):
        apply_rotary_emb(x.double(), cos, sin)  # dtype mismatch
    with pytest.raises(AssertionError):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=1)  # runs off the table
    with pytest.raises(AssertionError):
        apply_rotary_emb(torch.randn(1, 8, 1, 2), cos, sin)  # rotary_dim > headdim
    with pytest.raises(AssertionError):
        apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))
    with pytest.raises(AssertionError):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(2, dtype=torch.int32))


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_apply_rotary_emb_gradcheck(device, interleaved, varlen):
    dt = torch.float64
    cos, sin = cos_sin_table(7, 4, device, dt)
    if varlen:
        cu = torch.tensor([0, 3, 3, 5], device=device, dtype=torch.int32)
        x = torch.randn(5, 2, 6, device=device, dtype=dt, requires_grad=True)
        offs = torch.tensor([1, 0, 4], device=device, dtype=torch.int32)
        kw = dict(seqlen_offsets=offs, cu_seqlens=cu, max_seqlen=3)
    else:
        x = torch.randn(2, 4, 2, 6, device=device, dtype=dt, requires_grad=True)
        kw = dict(seqlen_offsets=torch.tensor([0, 3], device=device, dtype=torch.int32))
    fn = lambda t: apply_rotary_emb(t, cos, sin, interleaved, **kw)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    fn = lambda t: apply_rotary_emb(t.clone(), cos, sin, interleaved, inplace=True, **kw)  # noqa
    assert torch.autograd.gradcheck(fn, (x,))
    kw["seqlen_offsets"] = 2  # an int offset
    fn = lambda t: apply_rotary_emb(t, cos, sin, interleaved, **kw)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rotary_emb_backward_leaf(device, inplace):
    """As in upstream's tests: a leaf requiring grad may be rotated in place, and its grad is
    the inverse rotation of the output grad."""
    cos, sin = cos_sin_table(6, 8, device, torch.float32)
    x = torch.randn(2, 6, 2, 10, device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = apply_rotary_emb(x, cos, sin, inplace=inplace, seqlen_offsets=0)
    out_ref = apply_rotary_emb_torch(x_ref, cos, sin)
    torch.testing.assert_close(out, out_ref)
    g = torch.randn_like(out)
    out.backward(g)
    out_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    # The backward does not write into the incoming gradient.
    g2 = torch.ones((), device=device).expand(2, 6, 2, 10)
    (gx,) = torch.autograd.grad(apply_rotary_emb(x_ref * 1, cos, sin), x_ref, g2)
    assert torch.equal(g2, torch.ones(2, 6, 2, 10, device=device))


# ---------------------------------------------------------------------------------------
# qkv / kv in-place variants
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["packed5d", "gqa4d"])
@pytest.mark.parametrize("separate_k", [False, True])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_qkv_(device, layout, separate_k, offsets, interleaved):
    batch, seqlen, headdim, rotary_dim, seqlen_ro = 2, 5, 8, 6, 9
    cos, sin = cos_sin_table(seqlen_ro, rotary_dim, device, torch.float64)
    cos_k, sin_k = (cos * 0.5, sin * 0.5) if separate_k else (None, None)
    offs = make_offsets(offsets, batch, seqlen, seqlen_ro, device)
    if layout == "packed5d":
        hq = hk = 3
        qkv = torch.randn(batch, seqlen, 3, hq, headdim, device=device, dtype=torch.float64)
        parts = lambda t: (t[:, :, 0], t[:, :, 1], t[:, :, 2])  # noqa: E731
        num_heads_q = None
    else:
        hq, hk = 4, 2
        qkv = torch.randn(batch, seqlen, hq + 2 * hk, headdim, device=device, dtype=torch.float64)
        parts = lambda t: (t[:, :, :hq], t[:, :, hq:hq + hk], t[:, :, hq + hk:])  # noqa: E731
        num_heads_q = hq
    q0, k0, v0 = [p.clone() for p in parts(qkv)]
    out = apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved, offs, num_heads_q)
    assert out.data_ptr() == qkv.data_ptr() and torch.equal(out, qkv)
    q, k, v = parts(out)
    torch.testing.assert_close(q, rotary_ref(q0, cos, sin, interleaved, offs))
    ck, sk = (cos, sin) if cos_k is None else (cos_k, sin_k)
    torch.testing.assert_close(k, rotary_ref(k0, ck, sk, interleaved, offs))
    assert torch.equal(v, v0)

    x = torch.randn_like(qkv, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb_qkv_(t.clone(), cos, sin, cos_k, sin_k, interleaved, offs,
                                        num_heads_q),
        (x,),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offsets", ["int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_kv_(device, offsets, interleaved):
    batch, seqlen, nheads, headdim = 2, 5, 2, 8
    cos, sin = cos_sin_table(7, 8, device, torch.float64)
    offs = make_offsets(offsets, batch, seqlen, 7, device)
    kv = torch.randn(batch, seqlen, 2, nheads, headdim, device=device, dtype=torch.float64)
    k0, v0 = kv[:, :, 0].clone(), kv[:, :, 1].clone()
    out = apply_rotary_emb_kv_(kv, cos, sin, interleaved, offs)
    assert out.data_ptr() == kv.data_ptr()
    torch.testing.assert_close(out[:, :, 0], rotary_ref(k0, cos, sin, interleaved, offs))
    assert torch.equal(out[:, :, 1], v0)
    x = torch.randn_like(kv, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb_kv_(t.clone(), cos, sin, interleaved, offs), (x,)
    )


# ---------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------


def xpos_scale_ref(dim, seqlen_cached, scale_base):
    """(seqlen_cached, dim / 2) float64: the XPos factor applied to Q (K gets its inverse)."""
    zeta = (torch.arange(0, dim, 2, dtype=torch.float64) + 0.4 * dim) / (1.4 * dim)
    power = (torch.arange(seqlen_cached, dtype=torch.float64) - seqlen_cached // 2) / scale_base
    return zeta.unsqueeze(0) ** power.unsqueeze(1)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_cache(device):
    rot = RotaryEmbedding(8, base=500.0, device=device)
    assert rot.inv_freq.dtype == torch.float32 and len(rot.state_dict()) == 0
    qkv = torch.randn(1, 6, 3, 2, 8, device=device)
    rot(qkv)
    assert rot._seq_len_cached == 6
    cos_ref, sin_ref = cos_sin_table(6, 8, device, torch.float32, base=500.0)
    torch.testing.assert_close(rot._cos_cached, cos_ref)
    torch.testing.assert_close(rot._sin_cached, sin_ref)
    cached = rot._cos_cached
    rot(torch.randn(1, 4, 3, 2, 8, device=device))  # shorter: reuse
    assert rot._cos_cached is cached
    rot(torch.randn(1, 4, 3, 2, 8, device=device), seqlen_offset=5)  # needs 9 rows: rebuild
    assert rot._seq_len_cached == 9 and rot._cos_cached.shape == (9, 4)
    rot(torch.randn(1, 4, 3, 2, 8, device=device, dtype=torch.float64))  # new dtype: rebuild
    assert rot._cos_cached.dtype == torch.float64 and rot._seq_len_cached == 4
    rot(torch.randn(1, 2, 3, 2, 8, device=device), max_seqlen=12)
    assert rot._seq_len_cached == 12 and rot._cos_cached.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("xpos", [False, True])
@pytest.mark.parametrize("mode", ["qkv", "gqa", "q_kv"])
def test_rotary_embedding_forward(device, interleaved, xpos, mode):
    batch, seqlen, nheads, headdim, rotary_dim, offset = 2, 5, 2, 12, 8, 3
    scale_base = 16.0 if xpos else None
    rot = RotaryEmbedding(rotary_dim, interleaved=interleaved, scale_base=scale_base,
                          device=device)
    dt = torch.float64
    cos, sin = cos_sin_table(seqlen + offset, rotary_dim, device, dt)
    cos_k, sin_k = cos, sin
    if xpos:
        scale = xpos_scale_ref(rotary_dim, seqlen + offset, scale_base).to(device)
        cos, sin, cos_k, sin_k = cos * scale, sin * scale, cos_k / scale, sin_k / scale

    def check(q_out, k_out, q0, k0):
        torch.testing.assert_close(q_out, rotary_ref(q0, cos, sin, interleaved, offset),
                                   atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(k_out, rotary_ref(k0, cos_k, sin_k, interleaved, offset),
                                   atol=1e-6, rtol=1e-6)

    if mode == "qkv":
        qkv = torch.randn(batch, seqlen, 3, nheads, headdim, device=device, dtype=dt)
        q0, k0, v0 = qkv[:, :, 0].clone(), qkv[:, :, 1].clone(), qkv[:, :, 2].clone()
        out = rot(qkv, seqlen_offset=offset)
        assert out is qkv or out.data_ptr() == qkv.data_ptr()
        check(out[:, :, 0], out[:, :, 1], q0, k0)
        assert torch.equal(out[:, :, 2], v0)
    elif mode == "gqa":
        hq, hk = 4, 1
        qkv = torch.randn(batch, seqlen, hq + 2 * hk, headdim, device=device, dtype=dt)
        q0, k0, v0 = qkv[:, :, :hq].clone(), qkv[:, :, hq:hq + hk].clone(), qkv[:, :, -1:].clone()
        out = rot(qkv, seqlen_offset=offset, num_heads_q=hq)
        check(out[:, :, :hq], out[:, :, hq:hq + hk], q0, k0)
        assert torch.equal(out[:, :, -1:], v0)
    else:
        q = torch.randn(batch, seqlen, nheads, headdim, device=device, dtype=dt)
        kv = torch.randn(batch, seqlen, 2, nheads, headdim, device=device, dtype=dt)
        q0, k0, v0 = q.clone(), kv[:, :, 0].clone(), kv[:, :, 1].clone()
        q_out, kv_out = rot(q, kv, seqlen_offset=offset)
        assert q_out.data_ptr() == q.data_ptr() and kv_out.data_ptr() == kv.data_ptr()
        check(q_out, kv_out[:, :, 0], q0, k0)
        assert torch.equal(kv_out[:, :, 1], v0)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_tensor_offset(device):
    rot = RotaryEmbedding(8, device=device)
    qkv = torch.randn(2, 3, 3, 2, 8, device=device)
    offsets = torch.tensor([0, 5], device=device, dtype=torch.int32)
    q0, k0 = qkv[:, :, 0].clone(), qkv[:, :, 1].clone()
    rot(qkv, seqlen_offset=offsets, max_seqlen=8)
    cos, sin = cos_sin_table(8, 8, device, torch.float32)
    torch.testing.assert_close(qkv[:, :, 0].double(), rotary_ref(q0, cos, sin, False, offsets))
    torch.testing.assert_close(qkv[:, :, 1].double(), rotary_ref(k0, cos, sin, False, offsets))


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_backward(device):
    """Gradients flow through the in-place module (qkv produced by a differentiable op)."""
    rot = RotaryEmbedding(8, interleaved=True, device=device)
    w = torch.randn(2, 4, 3, 2, 8, device=device, dtype=torch.float64, requires_grad=True)
    out = rot(w * 2.0)
    g = torch.randn_like(out)
    (gw,) = torch.autograd.grad(out, w, g)
    cos, sin = rot._cos_cached, rot._sin_cached
    ref = g.clone()
    for i in (0, 1):  # the inverse rotation of q's and k's grads, times 2
        ref[:, :, i] = apply_rotary_emb_torch(g[:, :, i], cos, -sin, interleaved=True)
    torch.testing.assert_close(gw, 2.0 * ref)


def test_upstream_triton_import_path():
    # Libraries import the rotary kernel from upstream's Triton module path.
    from flash_attn.layers.rotary import apply_rotary as ours
    from flash_attn.ops.triton.rotary import apply_rotary

    assert apply_rotary is ours
