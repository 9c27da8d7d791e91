"""Shared helpers for the flash_attn tests: the naive reference, the error rule, and the
checks that decide whether a GPU test can run here."""

import contextlib
import math

import pytest
import torch

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}

# Absolute slack added to the "2x the PyTorch low-precision error" rule.  It only matters
# where the reference is exact (e.g. one key per query), and is kept tiny.
OUT_SLACK = 1e-5
GRAD_SLACK = 1e-4
# softmax_lse is fp32 in both the kernel and the fp32 reference.
LSE_ATOL = 2e-3
LSE_RTOL = 1e-3


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------


def causal_visible(seqlen_q, seqlen_k, device=None):
    """(seqlen_q, seqlen_k) bool: query i sees key j iff j <= i + seqlen_k - seqlen_q
    (the causal mask aligned to the bottom-right corner)."""
    row = torch.arange(seqlen_q, device=device).view(-1, 1)
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    return col <= row + (seqlen_k - seqlen_q)


def local_visible(seqlen_q, seqlen_k, window_size=(-1, -1), causal=False, device=None):
    """(seqlen_q, seqlen_k) bool, or None when everything is visible: query i sees key j iff
    i + sk - sq - left <= j <= i + sk - sq + right (a negative side is unbounded; causal means
    right = 0)."""
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    row = torch.arange(seqlen_q, device=device).view(-1, 1)
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    diag = row + (seqlen_k - seqlen_q)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= col <= diag + right
    if left >= 0:
        visible &= col >= diag - left
    return visible


def alibi_bias(alibi_slopes, seqlen_q, seqlen_k, batch, nheads, device=None):
    """(batch, nheads, seqlen_q, seqlen_k) fp32: -slope * |i + sk - sq - j|."""
    slopes = alibi_slopes.float().to(device)
    if slopes.dim() == 1:
        slopes = slopes.view(1, nheads).expand(batch, nheads)
    row = torch.arange(seqlen_q, device=device).view(-1, 1)
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    dist = (row + seqlen_k - seqlen_q - col).abs().float()
    return -slopes.view(batch, nheads, 1, 1) * dist


def attention_ref(q, k, v, causal=False, upcast=True, softmax_scale=None, window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_mask=None,
                  learnable_sink=None):
    """Naive attention softmax(score + mask) V with the flash_attn features.

    score = Q K^T * scale, then softcap * tanh(score / softcap) if softcap > 0, then the ALiBi
    bias -slope * |i + sk - sq - j| if alibi_slopes is given; keys outside the causal / sliding
    window mask are dropped. dropout_mask (b, h, sq, sk) bool, True = kept, applies dropout with
    probability dropout_p after the softmax (kept probabilities scaled by 1 / (1 - p)).

    q: (b, sq, h, d); k, v: (b, sk, hk, d) with h % hk == 0 (GQA/MQA by repeating k/v heads).
    upcast=True computes in fp32, upcast=False in the input dtype.  Returns
    (out in q's dtype, lse fp32 (b, h, sq)).  A query row that sees no key gets out = 0 and
    lse = +inf (the kernel's convention); no NaN is produced, in the forward or the backward.

    learnable_sink (h,): one more logit per row of head h (after the scaling, softcap, ALiBi and
    masks), in the softmax and not in the output: the column is appended, the softmax taken and
    the column dropped; lse includes it, and a row with no visible key gets out 0, lse sink[h].
    Differentiable in the sink.
    """
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** (-0.5) if softmax_scale is None else softmax_scale
    if h != hk:
        k = k.repeat_interleave(h // hk, dim=2)
        v = v.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, sq, sk, b, h, device=q.device).to(scores.dtype)
    visible = local_visible(sq, sk, window_size, causal, device=q.device)
    if learnable_sink is not None:
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        sink = learnable_sink.to(scores.dtype).view(1, h, 1, 1).expand(b, h, sq, 1)
        scores = torch.cat([scores, sink], dim=-1)
        lse = torch.logsumexp(scores.float(), dim=-1)
        attn = torch.softmax(scores, dim=-1)[..., :-1]
    elif visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
        row_valid = visible.any(dim=-1, keepdim=True)  # (sq, 1)
        lse = torch.logsumexp(scores.float(), dim=-1)
        lse = lse.masked_fill(~row_valid.squeeze(-1), float("inf"))
        # Rows with no visible key: softmax over zeros (finite), then zeroed.
        scores = torch.where(row_valid, scores, torch.zeros_like(scores))
        attn = torch.softmax(scores, dim=-1) * row_valid.to(scores.dtype)
    else:
        lse = torch.logsumexp(scores.float(), dim=-1)
        attn = torch.softmax(scores, dim=-1)
    if dropout_mask is not None:
        attn = attn.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhts,bshd->bthd", attn.to(v.dtype), v)
    return out.to(dtype_og), lse


PHILOX_ROUNDS = 7  # the kernels' dropout mask (csrc/attn_mods.h kPhiloxRounds)


def philox4x32(ctr, key, rounds=PHILOX_ROUNDS):
    """Philox4x32 with `rounds` rounds on numpy uint64 arrays holding 32-bit words: ctr (4, ...),
    key (2, ...)."""
    import numpy as np

    M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = [np.asarray(c, dtype=np.uint64) & mask for c in ctr]
    k0, k1 = [np.asarray(k, dtype=np.uint64) & mask for k in key]
    for _ in range(rounds):
        p0, p1 = M0 * c0, M1 * c2  # < 2^64: exact
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask)
        k0, k1 = (k0 + W0) & mask, (k1 + W1) & mask
    return c0, c1, c2, c3


def dropout_keep_ref(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """(batch, nheads, seqlen_q, seqlen_k) bool CPU tensor: the kernels' dropout keep-mask for the
    Philox (seed, offset) in rng_state (the function documented in csrc/attn_mods.h)."""
    import numpy as np

    threshold = min(255, int(round((1.0 - dropout_p) * 256)))
    b = np.arange(batch, dtype=np.uint64).reshape(-1, 1, 1, 1)
    h = np.arange(nheads, dtype=np.uint64).reshape(1, -1, 1, 1)
    row = np.arange(seqlen_q, dtype=np.uint64).reshape(1, 1, -1, 1)
    col = np.arange(seqlen_k, dtype=np.uint64).reshape(1, 1, 1, -1)
    x = np.uint64(offset // 4) + np.uint64(4) * (col // np.uint64(128)) + (col // np.uint64(8)) % np.uint64(4)
    z = (row // np.uint64(16)) * np.uint64(32) + (row % np.uint64(8)) * np.uint64(4) + (col % np.uint64(8)) // np.uint64(2)
    w = b * np.uint64(nheads) + h
    shape = (batch, nheads, seqlen_q, seqlen_k)
    x, z, w = [np.broadcast_to(a, shape) for a in (x, z, w)]
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    words = philox4x32((x & np.uint64(0xFFFFFFFF), x >> np.uint64(32), z, w),
                       (np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)))
    byte = ((col % np.uint64(128)) // np.uint64(32)) * np.uint64(4) + \
        ((row % np.uint64(16)) // np.uint64(8)) * np.uint64(2) + col % np.uint64(2)
    byte = np.broadcast_to(byte, shape)
    word = np.select([byte < 4, byte < 8, byte < 12], list(words[:3]), words[3])
    rand = (word >> (np.uint64(8) * (byte % np.uint64(4)))) & np.uint64(0xFF)
    return torch.from_numpy(rand < np.uint64(threshold))


def visible_rows(seqlen_q, seqlen_k, causal, device=None, window_size=(-1, -1)):
    """(seqlen_q,) bool: the query rows that see at least one key."""
    visible = local_visible(seqlen_q, seqlen_k, window_size, causal, device=device)
    if visible is None:
        return torch.ones(seqlen_q, dtype=torch.bool, device=device)
    return visible.any(dim=-1)


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def assert_close_to_ref(name, ours, ref, ref_lowprec, slack, factor=2):
    """The error rule: |ours - ref_fp32|_max <= factor * |ref_lowprec - ref_fp32|_max + slack."""
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ours).any(), f"{name} contains NaN"
    assert torch.isfinite(ours).all(), f"{name} contains inf"
    err = max_err(ours, ref)
    pt_err = max_err(ref_lowprec, ref)
    bound = factor * pt_err + slack
    assert err <= bound, (
        f"{name}: max abs error vs fp32 reference {err:.3e} > bound {bound:.3e} "
        f"({factor} x PyTorch {ref_lowprec.dtype} error {pt_err:.3e} + {slack:.0e})"
    )


def assert_lse_close(lse, lse_ref, seqlen_q, seqlen_k, causal, window_size=(-1, -1)):
    assert lse.dtype == torch.float32, f"softmax_lse dtype {lse.dtype}, expected float32"
    assert lse.shape == lse_ref.shape, f"softmax_lse shape {tuple(lse.shape)} != {tuple(lse_ref.shape)}"
    assert not torch.isnan(lse).any(), "softmax_lse contains NaN"
    rows = visible_rows(seqlen_q, seqlen_k, causal, device=lse.device, window_size=window_size)
    torch.testing.assert_close(
        lse[..., rows], lse_ref[..., rows], atol=LSE_ATOL, rtol=LSE_RTOL,
        msg=lambda m: "softmax_lse mismatch on rows with visible keys:\n" + m,
    )
    if not rows.all():
        masked = lse[..., ~rows]
        assert torch.isposinf(masked).all(), (
            "softmax_lse of fully masked rows must be +inf, got values like "
            f"{masked.flatten()[:4].tolist()}"
        )


def ref_fwd_bwd(q, k, v, dout, causal, softmax_scale=None, **features):
    """fp32 and low-precision references: ((out, lse, dq, dk, dv), (out_pt, dq_pt, dk_pt, dv_pt)).

    q, k, v must be leaves with requires_grad=True; features: attention_ref's window_size,
    softcap, alibi_slopes, dropout_p, dropout_mask."""
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=True,
                                     softmax_scale=softmax_scale, **features)
    grads_ref = torch.autograd.grad(out_ref, (q, k, v), dout)
    out_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False, softmax_scale=softmax_scale,
                              **features)
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), dout)
    return (out_ref, lse_ref, *grads_ref), (out_pt, *grads_pt)


def check_against_ref(out, lse, grads, q, k, v, dout, causal, softmax_scale=None,
                      grad_factor=2, **features):
    """Check out, softmax_lse (if not None) and grads (dq, dk, dv; or None) of our kernel
    against the references computed from the same q, k, v (leaves requiring grad).

    features go to attention_ref (window_size, softcap, alibi_slopes, dropout_p,
    dropout_mask); grad_factor is the multiple of the low-precision error the gradients may
    have (2 for the plain kernels, 3 for the feature tests)."""
    (out_ref, lse_ref, dq_ref, dk_ref, dv_ref), (out_pt, dq_pt, dk_pt, dv_pt) = ref_fwd_bwd(
        q, k, v, dout, causal, softmax_scale, **features
    )
    assert out.dtype == q.dtype
    assert_close_to_ref("out", out, out_ref, out_pt, OUT_SLACK)
    if lse is not None:
        assert_lse_close(lse, lse_ref, q.shape[1], k.shape[1], causal,
                         features.get("window_size", (-1, -1)))
    if grads is not None:
        dq, dk, dv = grads
        assert_close_to_ref("dq", dq, dq_ref, dq_pt, GRAD_SLACK, grad_factor)
        assert_close_to_ref("dk", dk, dk_ref, dk_pt, GRAD_SLACK, grad_factor)
        assert_close_to_ref("dv", dv, dv_ref, dv_pt, GRAD_SLACK, grad_factor)


# ---------------------------------------------------------------------------------------
# What can run here
# ---------------------------------------------------------------------------------------

_EXT = None
_EXT_ERROR = None
_EXT_TRIED = False


def load_extension():
    """(module or None, error or None); imports flash_attn._C once."""
    global _EXT, _EXT_ERROR, _EXT_TRIED
    if not _EXT_TRIED:
        _EXT_TRIED = True
        try:
            import flash_attn._C as ext  # noqa: F401

            _EXT = ext
        except ImportError as e:
            _EXT_ERROR = e
    return _EXT, _EXT_ERROR


def built_configs():
    ext, _ = load_extension()
    if ext is None:
        return set()
    return {(str(name), int(tile)) for name, tile in ext.built_configs()}


def extension_summary():
    ext, err = load_extension()
    if ext is None:
        return f"flash_attn._C: not importable ({err})"
    return f"flash_attn._C built configs: {sorted(built_configs())}"


def round8(d):
    return (d + 7) // 8 * 8


def require_gpu():
    """Skip unless a CUDA GPU (sm80+) and the extension are available."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip(f"FlashAttention needs sm80 or newer, this GPU is sm{major}x")
    ext, err = load_extension()
    if ext is None:
        pytest.skip(f"flash_attn._C is not importable ({err}); see test_extension_importable")
    return ext


@contextlib.contextmanager
def debug_kernel(name, value):
    """Force one kernel choice (flash_attn._C.set_debug_kernel) for the block, then restore the
    heuristics (value 0)."""
    ext = require_gpu()
    err = ext.set_debug_kernel(name, int(value))
    if err:
        raise ValueError(err)
    try:
        yield
    finally:
        ext.set_debug_kernel(name, 0)


def require_config(dtype, headdim):
    """Skip unless the extension has kernels for (dtype, the tile of headdim)."""
    ext = require_gpu()
    tile = int(ext.head_dim_tile(round8(headdim)))
    name = DTYPE_NAMES[dtype]
    if (name, tile) not in built_configs():
        pytest.skip(
            f"this build has no kernels for dtype {name}, head-dim tile {tile} (headdim "
            f"{headdim}); built: {sorted(built_configs())}"
        )
    return ext


def cu_seqlens(lengths, device="cuda"):
    """int32 (len(lengths) + 1,) prefix sums [0, l0, l0 + l1, ...], as the varlen API wants them."""
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=device, dtype=torch.int32)


def randn(*shape, dtype, device="cuda", requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device=device, requires_grad=requires_grad)


def cuda_qkv(b, sq, sk, h, d, dtype, hk=None):
    """Random q (b, sq, h, d), then k and v (b, sk, hk (default h), d), on the GPU."""
    hk = h if hk is None else hk
    return (torch.randn(b, sq, h, d, device="cuda", dtype=dtype),
            *(torch.randn(b, sk, hk, d, device="cuda", dtype=dtype) for _ in range(2)))


def window_size_forms(left, right):
    """Parametrize a test's `window` over the forms window_size takes besides a tuple: int64
    tensors on the CPU and on the GPU (made in the test by window_size_form, after the GPU
    check), an int32 tensor, a list."""
    return pytest.mark.parametrize(
        "window", [torch.tensor([left, right]), "CUDA",
                   torch.tensor([left, right], dtype=torch.int32), [left, right]],
        ids=["cpu-int64", "cuda-int64", "cpu-int32", "list"])


def window_size_form(window, left, right):
    """A window from window_size_forms(left, right), "CUDA" made into the GPU tensor."""
    return torch.tensor([left, right], device="cuda") if isinstance(window, str) else window


# The devices of the pure-PyTorch tests: the CPU, and CUDA when present.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


def scale_default(d):
    return 1.0 / math.sqrt(d)


# ---------------------------------------------------------------------------------------
# A CPU stand-in for the extension (flash_attn._C) with the kernels' preconditions asserted
# ---------------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1


def with_sink(out, lse, learnable_sink, head_dim, valid_rows=None):
    """out and lse of attention without a sink made those with the learnable sink (the kernels'
    semantics): lse' = logaddexp(lse, sink[h]), out' = out exp(lse - lse'); a row with no key
    (lse +inf) gets out 0 and lse sink[h].  lse: fp32 with heads at head_dim; out (..., h, d)
    with the rows in lse's order after moving its head dim last.  valid_rows (a row count,
    varlen): rows past it keep +inf and zeros."""
    if learnable_sink is None:
        return out, lse
    shape = [1] * lse.dim()
    shape[head_dim] = -1
    sink = learnable_sink.float().view(shape).expand_as(lse)
    empty = lse == float("inf")
    new = torch.where(empty, sink, torch.logaddexp(torch.where(empty, sink, lse), sink))
    factor = torch.where(empty, torch.zeros_like(lse), torch.exp(lse - new))
    if valid_rows is not None:
        tail = torch.arange(lse.shape[-1]) >= valid_rows
        new = torch.where(tail, lse, new)
    factor_rows = factor.movedim(head_dim, -1)  # (..., rows, h) as out's (..., h)
    return (out.float() * factor_rows.unsqueeze(-1)).to(out.dtype), new


def softmax_d_dense(dout, out):
    """The backward's softmax_d of a dense call: rowsum(dO * O) as (b, h, round128(seqlen_q))."""
    b, sq, h, _ = out.shape
    d = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    return torch.nn.functional.pad(d, [0, (sq + 127) // 128 * 128 - sq])


def softmax_d_varlen(dout, out, cu_q):
    """The backward's softmax_d of a varlen call: (h, total_q + 128 b), row r of sequence b at
    column r + 128 b, padding 0 (api/varlen.cpp)."""
    total, h, _ = out.shape
    c = cu_q.tolist()
    rows = (dout.float() * out.float()).sum(-1).t()  # (h, total)
    d = torch.zeros(h, total + 128 * (len(c) - 1))
    for i in range(len(c) - 1):
        d[:, c[i] + 128 * i: c[i + 1] + 128 * i] = rows[:, c[i]:c[i + 1]]
    return d


class CpuExt:
    """flash_attn._C's fwd / bwd / varlen_fwd / varlen_bwd / fwd_kvcache on CPU tensors, with the
    C++ signatures, computed by the fp32 references.  Every precondition the kernels have is an
    assert here (softmax_scale > 0, ints within int32, index values in range), so a test that
    installs it finds anything the Python layer lets through: an AssertionError is a check the
    Python layer is missing.  The learnable sink enters out and lse (with_sink); the backward's
    dq / dk / dv are those of the sink-free reference, its softmax_d is rowsum(dO * O)."""

    def __init__(self):
        self.calls = []

    def built_configs(self):
        return [(n, t) for n in ("fp16", "bf16") for t in (32, 64, 96, 128, 192, 256, 512)]

    def head_dim_tile(self, d):
        return next((t for t in (32, 64, 96, 128, 192, 256, 512) if d <= t), -1)

    @staticmethod
    def _ints(*xs):
        for x in xs:
            assert isinstance(x, int) and not isinstance(x, bool), f"not an int: {x!r}"
            assert -INT32_MAX - 1 <= x <= INT32_MAX, f"int out of int32 range: {x}"

    @staticmethod
    def _scale(s):
        assert isinstance(s, float) and 0.0 < s < float("inf"), f"softmax_scale {s!r} <= 0"

    @staticmethod
    def _cu(cu, total, max_len):
        c = cu.tolist()
        assert c[0] == 0, f"cu_seqlens starts at {c[0]}"
        assert all(a <= b for a, b in zip(c, c[1:])), f"cu_seqlens decreasing: {c}"
        assert total is None or c[-1] <= total, f"cu_seqlens ends at {c[-1]} > {total}"
        assert all(b - a <= max_len for a, b in zip(c, c[1:])), f"max_seqlen {max_len} < {c}"

    @staticmethod
    def _head_dims(*tensors):
        """The kernels take one head dim, a multiple of 8 and at most 256 (the Python layer
        pads v's or q/k's when they differ, and any that is not a multiple of 8)."""
        dims = {x.shape[-1] for x in tensors}
        assert len(dims) == 1, f"head dims differ: {[x.shape[-1] for x in tensors]}"
        (d,) = dims
        assert d % 8 == 0 and 8 <= d <= 256, f"head dim {d}"

    @staticmethod
    def _sink(learnable_sink, h):
        if learnable_sink is not None:
            assert learnable_sink.shape == (h,), f"learnable_sink shape {learnable_sink.shape}"
            assert learnable_sink.dtype in (torch.float32, torch.bfloat16, torch.float16)

    def fwd(self, q, k, v, out, softmax_scale, is_causal, wl, wr, softcap, alibi, dropout_p,
            return_softmax, learnable_sink=None):
        self._scale(softmax_scale)
        self._ints(wl, wr)
        self._head_dims(q, k, v)
        self.calls.append(("fwd", softmax_scale))
        o, lse = attention_ref(q.float(), k.float(), v.float(), causal=is_causal,
                               softmax_scale=softmax_scale, window_size=(wl, wr),
                               softcap=softcap, alibi_slopes=alibi)
        self._sink(learnable_sink, q.shape[2])
        o, lse = with_sink(o, lse, learnable_sink, 1)
        b, sq, h, _ = q.shape
        r = lambda x: (x + 127) // 128 * 128  # noqa: E731
        s = (torch.zeros(b, h, r(sq), r(k.shape[1]), dtype=q.dtype) if return_softmax
             else torch.empty(0, dtype=q.dtype))
        return o.to(q.dtype).contiguous(), lse, s, torch.zeros(2, dtype=torch.int64)

    def bwd(self, dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, is_causal, deterministic,
            wl, wr, softcap, alibi, dropout_p, rng_state):
        self._scale(softmax_scale)
        self._ints(wl, wr)
        self._head_dims(dout, q, k, v, out, *[g for g in (dq, dk, dv) if g is not None])
        self.calls.append(("bwd", softmax_scale))
        with torch.enable_grad():
            leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
            o, _ = attention_ref(*leaves, causal=is_causal, softmax_scale=softmax_scale,
                                 window_size=(wl, wr), softcap=softcap, alibi_slopes=alibi)
            grads = torch.autograd.grad(o, leaves, dout.float())
        for dst, g in zip((dq, dk, dv), grads):
            if dst is not None:
                dst.copy_(g)
        return dq, dk, dv, softmax_d_dense(dout, out)

    def _varlen_keys(self, k, v, cu_k, block_table):
        """Dense (total_k, hk, d) keys for a paged k/v, and the matching cu_seqlens_k."""
        if block_table is None:
            return k, v
        nb, page = k.shape[0], k.shape[1]
        c = cu_k.tolist()
        ks, vs = [], []
        for i in range(len(c) - 1):
            n = c[i + 1] - c[i]
            pages = block_table[i, : (n + page - 1) // page].tolist()
            assert all(0 <= p < nb for p in pages), f"block_table row {i} has {pages}"
            ks.append(k[pages].reshape(-1, *k.shape[2:])[:n])
            vs.append(v[pages].reshape(-1, *v.shape[2:])[:n])
        return torch.cat(ks), torch.cat(vs)

    def varlen_fwd(self, q, k, v, out, cu_q, cu_k, seqused_k, leftpad_k, block_table, max_q,
                   max_k, softmax_scale, zero_tensors, causal, wl, wr, softcap, alibi, dropout_p,
                   return_softmax, learnable_sink=None):
        from test_varlen_kvcache import varlen_ref

        self._scale(softmax_scale)
        self._ints(max_q, max_k, wl, wr)
        self._cu(cu_q, q.shape[0], max_q)
        self._cu(cu_k, k.shape[0] if block_table is None else None, max_k)
        self._head_dims(q, k, v)
        self.calls.append(("varlen_fwd", softmax_scale))
        kd, vd = self._varlen_keys(k, v, cu_k, block_table)
        o, lse = varlen_ref(q, kd, vd, cu_q, cu_k, causal, (wl, wr), softmax_scale, True,
                            softcap, alibi)
        self._sink(learnable_sink, q.shape[1])
        o, lse = with_sink(o, lse, learnable_sink, 0, valid_rows=int(cu_q[-1]))
        b = cu_q.shape[0] - 1
        r = lambda x: (x + 127) // 128 * 128  # noqa: E731
        s = (torch.zeros(b, q.shape[1], r(max_q), r(max_k), dtype=q.dtype) if return_softmax
             else torch.empty(0, dtype=q.dtype))
        return o, lse, s, torch.zeros(2, dtype=torch.int64)

    def varlen_bwd(self, dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
                   softmax_scale, zero_tensors, causal, deterministic, wl, wr, softcap, alibi,
                   dropout_p, rng_state):
        from test_varlen_kvcache import varlen_ref

        self._scale(softmax_scale)
        self._ints(max_q, max_k, wl, wr)
        self._cu(cu_q, q.shape[0], max_q)
        self._cu(cu_k, k.shape[0], max_k)
        self._head_dims(dout, q, k, v, out, *[g for g in (dq, dk, dv) if g is not None])
        self.calls.append(("varlen_bwd", softmax_scale))
        with torch.enable_grad():
            leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
            o, _ = varlen_ref(*leaves, cu_q, cu_k, causal, (wl, wr), softmax_scale, True,
                              softcap, alibi)
            grads = torch.autograd.grad(o, leaves, dout.float())
        for dst, g in zip((dq, dk, dv), grads):
            if dst is not None:
                dst.copy_(g)
        return dq, dk, dv, softmax_d_varlen(dout, out, cu_q)

    def append_kv(self, k_cache, v_cache, k, v, cache_seqlens, batch_idx, block_table,
                  skip_flag):
        """The in-place append of _C.append_kv; its precondition: every row written in range."""
        if skip_flag is not None and int(skip_flag[0]) != 0:
            return
        b, s_new = k.shape[0], k.shape[1]
        pos = cache_seqlens.to(torch.long).unsqueeze(1) + torch.arange(s_new).unsqueeze(0)
        if block_table is not None:
            page_size = k_cache.shape[1]
            assert bool((pos >= 0).all()) and (int(pos.max()) if pos.numel() else -1) < block_table.shape[1] * page_size
            page = block_table.to(torch.long).gather(1, pos // page_size)
            assert bool(((page >= 0) & (page < k_cache.shape[0])).all()), f"pages {page}"
            row = pos % page_size
        else:
            page = (torch.arange(b) if batch_idx is None else batch_idx.to(torch.long))
            assert bool(((page >= 0) & (page < k_cache.shape[0])).all()), f"batch_idx {page}"
            page = page.unsqueeze(1).expand(b, s_new)
            assert bool((pos >= 0).all()) and (int(pos.max()) if pos.numel() else -1) < k_cache.shape[1]
            row = pos
        k_cache[page, row] = k
        v_cache[page, row] = v

    def take_index_error(self):
        return None

    def fwd_kvcache(self, q, kc, vc, seqused, leftpad, batch_idx, block_table, softmax_scale,
                    causal, wl, wr, num_splits, softcap=0.0, alibi_slopes=None,
                    learnable_sink=None, guard_indices=False):
        from test_varlen_kvcache import _slopes_of, attn_ref_one

        self._scale(softmax_scale)
        self._ints(wl, wr, num_splits)
        assert num_splits >= 0
        self._head_dims(q, kc, vc)
        self.calls.append(("fwd_kvcache", softmax_scale))
        b, sq, h, d = q.shape
        outs, lses = [], []
        for i in range(b):
            if block_table is not None:
                pages = block_table[i].tolist()
                hi = int(seqused[i]) if seqused is not None else len(pages) * kc.shape[1]
                need = (hi + kc.shape[1] - 1) // kc.shape[1]
                assert all(0 <= p < kc.shape[0] for p in pages[:need]), f"pages {pages[:need]}"
                kd = kc[pages[:need]].reshape(-1, *kc.shape[2:])
                vd = vc[pages[:need]].reshape(-1, *vc.shape[2:])
            else:
                j = int(batch_idx[i]) if batch_idx is not None else i
                assert 0 <= j < kc.shape[0], f"cache_batch_idx {j}"
                kd, vd = kc[j], vc[j]
            lo = int(leftpad[i]) if leftpad is not None else 0
            hi = int(seqused[i]) if seqused is not None else kd.shape[0]
            assert 0 <= lo <= hi <= kd.shape[0], f"keys [{lo}, {hi}) of {kd.shape[0]}"
            o, lse = attn_ref_one(q[i], kd[lo:hi], vd[lo:hi], causal, (wl, wr), softmax_scale,
                                  True, softcap, _slopes_of(alibi_slopes, i, h))
            outs.append(o)
            lses.append(lse)
        self._sink(learnable_sink, h)
        return with_sink(torch.stack(outs), torch.stack(lses), learnable_sink, 1)


def install_cpu_ext(monkeypatch, ext=None, fp32=False):
    """Route every entry point's CPU calls to a CpuExt through the real Python layer (the op
    implementations, not their fakes): CPU tensors allowed (fp32 too with fp32=True, for exact
    comparisons), the ops' impls called directly."""
    import flash_attn._varlen_kvcache as vk
    import flash_attn.flash_attn_interface as fi

    ext = CpuExt() if ext is None else ext
    for mod in (fi, vk):
        monkeypatch.setattr(mod, "_ALLOWED_DEVICE_TYPES", ("cuda", "meta", "cpu"))
        if fp32:
            monkeypatch.setattr(mod, "_SUPPORTED_DTYPES",
                                (torch.float16, torch.bfloat16, torch.float32))
        monkeypatch.setattr(mod, "_ext_for", lambda q: ext)
    monkeypatch.setattr(fi, "_wrapped_flash_attn_forward", fi._flash_attn_forward_impl)
    monkeypatch.setattr(fi, "_wrapped_flash_attn_backward", fi._flash_attn_backward_impl)
    monkeypatch.setattr(vk, "_wrapped_flash_attn_varlen_forward",
                        _op_impl(vk._flash_attn_varlen_forward))
    monkeypatch.setattr(vk, "_wrapped_flash_attn_varlen_backward",
                        _op_impl(vk._flash_attn_varlen_backward))
    monkeypatch.setattr(vk, "_wrapped_flash_attn_kvcache", vk._kvcache_impl)
    return ext


def _op_impl(op):
    """The Python function a torch.library.custom_op wraps (the op itself on old torch)."""
    return getattr(op, "_init_fn", op)
