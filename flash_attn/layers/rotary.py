"""Rotary position embeddings (upstream flash-attn 2.8.x ``flash_attn.layers.rotary``).

Upstream runs the rotation in a Triton kernel; here it is a pure PyTorch reference
implementation (any device, any floating dtype, no Triton), with the same functions,
arguments, return values and autograd behaviour.

Conventions.  cos and sin are tables of shape (seqlen_ro, rotary_dim / 2): row p holds
cos(p * theta_j) and sin(p * theta_j) for the rotary_dim / 2 frequencies.  Only the first
rotary_dim channels of the head dimension are rotated; the others pass through.  The rotary
channels are split into rotary_dim / 2 pairs (x1, x2) that rotate by the angle of their
frequency:

    x1' = x1 * cos - x2 * sin,        x2' = x1 * sin + x2 * cos

* non-interleaved (GPT-NeoX style): pair j is channels (j, j + rotary_dim / 2);
* interleaved (GPT-J style): pair j is channels (2j, 2j + 1).

The token at position s of sequence b uses row ``s + seqlen_offsets[b]`` of the tables
(seqlen_offsets is an int, or an integer tensor with one offset per sequence: the number of
tokens already in a KV cache, typically).  A row outside the table (only possible with tensor
offsets) leaves the token unrotated, as upstream's kernel does.
"""

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "rotate_half",
    "apply_rotary_emb_torch",
    "apply_rotary",
    "ApplyRotaryEmb",
    "apply_rotary_emb",
    "apply_rotary_emb_func",
    "ApplyRotaryEmbQKV_",
    "apply_rotary_emb_qkv_",
    "ApplyRotaryEmbKV_",
    "apply_rotary_emb_kv_",
    "RotaryEmbedding",
]


def _require(cond, msg):
    # AssertionError like upstream's asserts, but not stripped by `python -O`.
    if not cond:
        raise AssertionError(msg)


# ---------------------------------------------------------------------------------------
# Plain-formula helpers (upstream exports these as the PyTorch reference)
# ---------------------------------------------------------------------------------------


def _split_pairs(x, interleaved):
    """The (x1, x2) halves of every rotation pair in the last dim of x."""
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _merge_pairs(x1, x2, interleaved):
    """Inverse of _split_pairs."""
    if interleaved:
        return torch.stack((x1, x2), dim=-1).flatten(-2)
    return torch.cat((x1, x2), dim=-1)


def rotate_half(x, interleaved=False):
    """Maps every rotation pair (x1, x2) of the last dim of x to (-x2, x1)."""
    x1, x2 = _split_pairs(x, interleaved)
    return _merge_pairs(-x2, x1, interleaved)


def apply_rotary_emb_torch(x, cos, sin, interleaved=False):
    """Differentiable reference written with plain tensor ops.

    x: (batch_size, seqlen, nheads, headdim)
    cos, sin: (seqlen, rotary_dim / 2) or (batch_size, seqlen, rotary_dim / 2)
    """
    ro_dim = cos.shape[-1] * 2
    assert ro_dim <= x.shape[-1], "rotary_dim must be <= headdim"

    def per_channel(t):
        # (..., seqlen, rotary_dim / 2) -> (..., seqlen, 1, rotary_dim): the value of each
        # pair on both of its channels, broadcast over the heads.
        t = t.unsqueeze(-2)
        return t.repeat_interleave(2, dim=-1) if interleaved else torch.cat((t, t), dim=-1)

    x_rot = x[..., :ro_dim]
    rotated = x_rot * per_channel(cos) + rotate_half(x_rot, interleaved) * per_channel(sin)
    return torch.cat((rotated, x[..., ro_dim:]), dim=-1)


# ---------------------------------------------------------------------------------------
# The rotation (what upstream's Triton kernel `flash_attn.ops.triton.rotary.apply_rotary` does)
# ---------------------------------------------------------------------------------------


def _table_rows(x, cu_seqlens, seqlen_offsets):
    """Row of the cos/sin tables for every token of x, and whether the token is rotated at all.

    Returns (rows, valid), both shaped like x's token dims: (batch, seqlen) - or (1, seqlen)
    for an int offset - without cu_seqlens, (total_seqlen,) with it.
    """
    device = x.device
    if cu_seqlens is None:
        seqlen = x.shape[1]
        pos = torch.arange(seqlen, device=device, dtype=torch.long).unsqueeze(0)
        if isinstance(seqlen_offsets, Tensor):
            pos = pos + seqlen_offsets.to(device=device, dtype=torch.long).unsqueeze(1)
        else:
            pos = pos + seqlen_offsets
        return pos, None
    # Variable length: token t belongs to sequence b with cu[b] <= t < cu[b + 1].
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    batch = cu.numel() - 1
    t = torch.arange(x.shape[0], device=device, dtype=torch.long)
    if batch == 0:
        return torch.zeros_like(t), torch.zeros_like(t, dtype=torch.bool)
    seq = torch.searchsorted(cu[1:], t, right=True)
    in_seq = (t >= cu[0]) & (seq < batch)
    seq = seq.clamp(max=max(batch - 1, 0))
    pos = t - cu[seq]
    if isinstance(seqlen_offsets, Tensor):
        pos = pos + seqlen_offsets.to(device=device, dtype=torch.long)[seq]
    else:
        pos = pos + seqlen_offsets
    return pos, in_seq


def apply_rotary(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    seqlen_offsets: Union[int, Tensor] = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
    interleaved=False,
    inplace=False,
    conjugate=False,
) -> Tensor:
    """Rotate the first rotary_dim channels of x (no autograd of its own).

    Arguments:
        x: (batch, seqlen, nheads, headdim) if cu_seqlens is None
            else (total_seqlen, nheads, headdim).
        cos, sin: (seqlen_ro, rotary_dim / 2), same dtype as x.
        seqlen_offsets: int, or int32/int64 tensor of shape (batch,).
        cu_seqlens: (batch + 1,) int tensor or None.
        max_seqlen: int, required with cu_seqlens.
        interleaved: GPT-J style pairs (2j, 2j+1) instead of GPT-NeoX halves.
        inplace: write the result into x and return x.
        conjugate: rotate by the opposite angle (the inverse rotation; used by the backward).
    Returns:
        y: shaped like x.
    """
    is_varlen = cu_seqlens is not None
    if not is_varlen:
        _require(x.ndim == 4, "x must be (batch, seqlen, nheads, headdim)")
        batch, seqlen = x.shape[0], x.shape[1]
    else:
        _require(max_seqlen is not None,
                 "If cu_seqlens is passed in, then max_seqlen must be passed")
        _require(x.ndim == 3, "x must be (total_seqlen, nheads, headdim) when cu_seqlens is given")
        _require(cu_seqlens.ndim == 1 and cu_seqlens.numel() >= 1,
                 "cu_seqlens must be (batch + 1,)")
        batch, seqlen = cu_seqlens.shape[0] - 1, max_seqlen
    headdim = x.shape[-1]
    _require(cos.ndim == 2, "cos must be (seqlen_ro, rotary_dim / 2)")
    _require(sin.shape == cos.shape, "sin and cos must have the same shape")
    seqlen_ro, rotary_dim = cos.shape[0], 2 * cos.shape[1]
    _require(rotary_dim <= headdim, "rotary_dim must be <= headdim")
    _require(seqlen_ro >= seqlen, "seqlen_ro must be >= seqlen")
    _require(cos.dtype == sin.dtype,
             f"cos and sin must have the same dtype, got {cos.dtype} and {sin.dtype}")
    _require(x.dtype == cos.dtype,
             f"Input and cos/sin must have the same dtype, got {x.dtype} and {cos.dtype}")
    if isinstance(seqlen_offsets, Tensor):
        _require(
            tuple(seqlen_offsets.shape) == (batch,),
            f"seqlen_offsets must have shape ({batch},), got {tuple(seqlen_offsets.shape)}",
        )
        _require(seqlen_offsets.dtype in (torch.int32, torch.int64),
                 "seqlen_offsets must be int32 or int64")
    else:
        _require(seqlen_offsets + seqlen <= seqlen_ro,
                 "seqlen_offsets + seqlen must be <= seqlen_ro")

    out = x if inplace else torch.empty_like(x)
    if rotary_dim > 0:
        rows, in_seq = _table_rows(x, cu_seqlens, seqlen_offsets)
        valid = (rows >= 0) & (rows < seqlen_ro)
        if in_seq is not None:
            valid = valid & in_seq
        # Compute in fp32 at least (fp64 stays fp64), like the kernel, then cast back.
        cdtype = torch.promote_types(x.dtype, torch.float32)
        idx = rows.clamp(0, seqlen_ro - 1)
        keep = valid.unsqueeze(-1)
        c = torch.where(keep, cos.to(device=x.device, dtype=cdtype)[idx], 1.0).unsqueeze(-2)
        s = torch.where(keep, sin.to(device=x.device, dtype=cdtype)[idx], 0.0).unsqueeze(-2)
        if conjugate:
            s = -s
        x1, x2 = _split_pairs(x[..., :rotary_dim].to(cdtype), interleaved)
        rotated = _merge_pairs(x1 * c - x2 * s, x1 * s + x2 * c, interleaved)
        out[..., :rotary_dim] = rotated
    if not inplace and rotary_dim < headdim:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    return out


# ---------------------------------------------------------------------------------------
# Autograd Functions and the public functions
# ---------------------------------------------------------------------------------------
#
# The rotation is linear in x and orthogonal, so its backward is the same rotation with the
# opposite angle applied to the incoming gradient.  cos and sin get no gradient (as upstream).
# The backward never writes into the incoming gradient (upstream's does for the in-place
# variants); it works on a fresh tensor.


def _save_offsets(ctx, seqlen_offsets, *tensors):
    if isinstance(seqlen_offsets, Tensor):
        ctx.save_for_backward(*tensors, seqlen_offsets)
        ctx.seqlen_offsets = None
    else:
        ctx.save_for_backward(*tensors)
        ctx.seqlen_offsets = seqlen_offsets


def _load_offsets(ctx):
    saved = ctx.saved_tensors
    if ctx.seqlen_offsets is None:
        return saved[:-1], saved[-1]
    return saved, ctx.seqlen_offsets


class ApplyRotaryEmb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved=False, inplace=False,
                seqlen_offsets: Union[int, Tensor] = 0, cu_seqlens: Optional[Tensor] = None,
                max_seqlen: Optional[int] = None):
        out = apply_rotary(
            x,
            cos,
            sin,
            seqlen_offsets=seqlen_offsets,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            interleaved=interleaved,
            inplace=inplace,
        )
        _save_offsets(ctx, seqlen_offsets, cos, sin, cu_seqlens)
        ctx.interleaved = interleaved
        ctx.max_seqlen = max_seqlen
        return out

    @staticmethod
    def backward(ctx, dout):
        (cos, sin, cu_seqlens), seqlen_offsets = _load_offsets(ctx)
        dx = apply_rotary(
            dout,
            cos,
            sin,
            seqlen_offsets=seqlen_offsets,
            cu_seqlens=cu_seqlens,
            max_seqlen=ctx.max_seqlen,
            interleaved=ctx.interleaved,
            inplace=False,
            conjugate=True,
        )
        return dx, None, None, None, None, None, None, None


def apply_rotary_emb(
    x,
    cos,
    sin,
    interleaved=False,
    inplace=False,
    seqlen_offsets: Union[int, Tensor] = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
):
    """Apply rotary embedding to the first rotary_dim channels of x.

    Arguments:
        x: (batch_size, seqlen, nheads, headdim) if cu_seqlens is None
            else (total_seqlen, nheads, headdim).
        cos, sin: (seqlen_rotary, rotary_dim / 2), same dtype as x; rotary_dim <= headdim.
        interleaved: if True, rotate pairs of even and odd channels (GPT-J style) instead of
            the 1st half against the 2nd half (GPT-NeoX style).
        inplace: if True, write the result into x (and return it).
        seqlen_offsets: int or (batch_size,) int tensor; sequence b is shifted by this many
            positions (typically the number of tokens already in a KV cache).
        cu_seqlens: (batch + 1,) int32 cumulative sequence lengths, or None.
        max_seqlen: int, the longest sequence; required with cu_seqlens.
    Return:
        out: shaped like x.
    """
    return ApplyRotaryEmb.apply(
        x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen
    )


# For backward compatibility (upstream keeps this alias).
apply_rotary_emb_func = apply_rotary_emb


def _qk_views(qkv, num_heads_q):
    """Views of the q and k parts of a packed qkv tensor."""
    if qkv.dim() == 5:
        _require(qkv.shape[2] == 3, "qkv must be (batch, seqlen, 3, nheads, headdim)")
        return qkv[:, :, 0], qkv[:, :, 1]
    _require(qkv.dim() == 4, "qkv must be 5-D (b, s, 3, h, d) or 4-D (b, s, hq + 2 * hk, d)")
    _require(num_heads_q is not None, "num_heads_q must be given when qkv is 4-D")
    num_heads_k = (qkv.shape[2] - num_heads_q) // 2
    _require(
        qkv.shape[2] == num_heads_q + 2 * num_heads_k,
        "qkv.shape[2] must be num_heads_q + 2 * num_heads_k",
    )
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q : num_heads_q + num_heads_k]


def _rotate_qk_inplace(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q,
                       conjugate=False):
    q, k = _qk_views(qkv, num_heads_q)
    cos_k = cos if cos_k is None else cos_k
    sin_k = sin if sin_k is None else sin_k
    for part, c, s in ((q, cos, sin), (k, cos_k, sin_k)):
        apply_rotary(part, c, s, seqlen_offsets=seqlen_offsets, interleaved=interleaved,
                     inplace=True, conjugate=conjugate)
    return qkv


class ApplyRotaryEmbQKV_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False,
                seqlen_offsets: Union[int, Tensor] = 0, num_heads_q: Optional[int] = None):
        _rotate_qk_inplace(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q)
        _save_offsets(ctx, seqlen_offsets, cos, sin, cos_k, sin_k)
        ctx.interleaved = interleaved
        ctx.num_heads_q = num_heads_q
        return qkv

    @staticmethod
    def backward(ctx, dqkv):
        (cos, sin, cos_k, sin_k), seqlen_offsets = _load_offsets(ctx)
        dqkv = _rotate_qk_inplace(
            dqkv.clone(), cos, sin, cos_k, sin_k, ctx.interleaved, seqlen_offsets,
            ctx.num_heads_q, conjugate=True,
        )
        return dqkv, None, None, None, None, None, None, None


def apply_rotary_emb_qkv_(
    qkv,
    cos,
    sin,
    cos_k=None,
    sin_k=None,
    interleaved=False,
    seqlen_offsets: Union[int, Tensor] = 0,
    num_heads_q: Optional[int] = None,
):
    """Apply rotary embedding *in place* to the first rotary_dim channels of Q and K.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim), or
            (batch_size, seqlen, num_heads_q + 2 * num_heads_k, headdim) for MQA / GQA, in
            which case num_heads_q must be given.
        cos, sin: (seqlen, rotary_dim / 2), for Q (and K unless cos_k / sin_k are given).
        cos_k, sin_k: (seqlen, rotary_dim / 2), optional, for K.
        interleaved: if True, rotate pairs of even and odd channels (GPT-J style) instead of
            the 1st half against the 2nd half (GPT-NeoX style).
        seqlen_offsets: int or (batch_size,) int tensor; each sequence of Q and K is shifted
            by this many positions.
        num_heads_q: int, the number of query heads of a 4-D qkv.
    Return:
        qkv: the input, modified in place; V is untouched.
    """
    return ApplyRotaryEmbQKV_.apply(
        qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q
    )


class ApplyRotaryEmbKV_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kv, cos, sin, interleaved=False, seqlen_offsets: Union[int, Tensor] = 0):
        _require(kv.dim() == 5 and kv.shape[2] == 2,
                 "kv must be (batch, seqlen, 2, nheads, headdim)")
        apply_rotary(kv[:, :, 0], cos, sin, seqlen_offsets=seqlen_offsets,
                     interleaved=interleaved, inplace=True)
        _save_offsets(ctx, seqlen_offsets, cos, sin)
        ctx.interleaved = interleaved
        return kv

    @staticmethod
    def backward(ctx, dkv):
        (cos, sin), seqlen_offsets = _load_offsets(ctx)
        dkv = dkv.clone()
        apply_rotary(dkv[:, :, 0], cos, sin, seqlen_offsets=seqlen_offsets,
                     interleaved=ctx.interleaved, inplace=True, conjugate=True)
        return dkv, None, None, None, None


def apply_rotary_emb_kv_(
    kv,
    cos,
    sin,
    interleaved=False,
    seqlen_offsets: Union[int, Tensor] = 0,
):
    """Apply rotary embedding *in place* to the first rotary_dim channels of K.

    Arguments:
        kv: (batch_size, seqlen, 2, nheads, headdim)
        cos, sin: (seqlen, rotary_dim / 2)
        interleaved: if True, rotate pairs of even and odd channels (GPT-J style) instead of
            the 1st half against the 2nd half (GPT-NeoX style).
        seqlen_offsets: int or (batch_size,) int tensor; each sequence is shifted by this many
            positions.
    Return:
        kv: the input, modified in place; V is untouched.
    """
    return ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets)


# ---------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embeddings from RoFormer (Su et al., https://arxiv.org/abs/2104.09864),
    as used by GPT-NeoX (non-interleaved) and GPT-J (interleaved).

    Frequency j (j = 0 .. dim/2 - 1) is base ** (-2j / dim); the cos/sin tables are computed
    in fp32, cached, and cast to the input's dtype.

    If scale_base is not None this is XPos (Sun et al., https://arxiv.org/abs/2212.10554):
    position p additionally scales Q by zeta_j ** ((p - L // 2) / scale_base) and K by its
    inverse, with zeta_j = (2j + 0.4 * dim) / (1.4 * dim) and L the cached table length.
    Upstream recommends scale_base = 512.
    """

    def __init__(
        self,
        dim: int,
        base=10000.0,
        interleaved=False,
        scale_base=None,
        device=None,
    ):
        """
        dim: rotary_dim, the number of rotated channels of each head (even).
        interleaved: if True, rotate pairs of even and odd channels (GPT-J style) instead of
            the 1st half against the 2nd half (GPT-NeoX style).
        """
        super().__init__()
        self.dim = dim
        self.base = float(base)
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        self.interleaved = interleaved
        self.scale_base = scale_base
        scale = self._compute_scale(device) if scale_base is not None else None
        self.register_buffer("scale", scale, persistent=False)

        self._seq_len_cached = 0
        self._cos_cached = None
        self._sin_cached = None
        self._cos_k_cached = None
        self._sin_k_cached = None

    def _compute_inv_freq(self, device=None):
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        return 1.0 / (self.base ** exponents)

    def _compute_scale(self, device=None):
        j2 = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
        return (j2 + 0.4 * self.dim) / (1.4 * self.dim)

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        # Rebuild the tables when they are too short, on another device or dtype, or were made
        # under inference mode while we are now training.
        stale = (
            seqlen > self._seq_len_cached
            or self._cos_cached is None
            or self._cos_cached.device != device
            or self._cos_cached.dtype != dtype
            or (self.training and self._cos_cached.is_inference())
        )
        if not stale:
            return
        self._seq_len_cached = seqlen
        # Positions times frequencies in fp32 whatever the module's dtype: positions are large
        # and bf16/fp16 would lose most of the angle.  (Recompute inv_freq if the buffer was
        # cast down by a module-wide .half()/.bfloat16().)  torch.outer, not einsum, so that
        # autocast does not downcast it.
        t = torch.arange(seqlen, device=device, dtype=torch.float32)
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:
            inv_freq = self._compute_inv_freq(device=device)
        freqs = torch.outer(t, inv_freq.to(device=device))
        cos, sin = torch.cos(freqs), torch.sin(freqs)
        if self.scale is None:
            self._cos_cached = cos.to(dtype)
            self._sin_cached = sin.to(dtype)
            return
        scale = self.scale
        if scale.dtype != torch.float32:
            scale = self._compute_scale(device=device)
        positions = torch.arange(seqlen, device=device, dtype=torch.float32)
        power = (positions - seqlen // 2) / self.scale_base
        scale = scale.to(device=device).unsqueeze(0) ** power.unsqueeze(1)
        self._cos_cached = (cos * scale).to(dtype)
        self._sin_cached = (sin * scale).to(dtype)
        self._cos_k_cached = (cos / scale).to(dtype)
        self._sin_k_cached = (sin / scale).to(dtype)

    def forward(
        self,
        qkv: Tensor,
        kv: Optional[Tensor] = None,
        seqlen_offset: Union[int, Tensor] = 0,
        max_seqlen: Optional[int] = None,
        num_heads_q: Optional[int] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Apply rotary embedding *in place* to qkv, or to q and kv.

        qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, num_heads_q + 2 * num_heads_k,
            headdim) for MQA / GQA (then num_heads_q must be given); if kv is given, qkv is just
            q of shape (batch, seqlen, nheads, headdim).
        kv: (batch, seqlen, 2, nheads, headdim), optional.
        seqlen_offset: int or (batch_size,) int tensor; each sequence is shifted by this many
            positions (typically the tokens already in the KV cache).  With a tensor offset,
            pass max_seqlen so that the cos/sin cache is grown to that length.
        Returns qkv, or (q, kv) when kv is given.
        """
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, device=qkv.device, dtype=qkv.dtype)
        xpos = self.scale is not None
        if kv is None:
            return apply_rotary_emb_qkv_(
                qkv,
                self._cos_cached,
                self._sin_cached,
                self._cos_k_cached if xpos else None,
                self._sin_k_cached if xpos else None,
                interleaved=self.interleaved,
                seqlen_offsets=seqlen_offset,
                num_heads_q=num_heads_q,
            )
        q = apply_rotary_emb_func(
            qkv,
            self._cos_cached,
            self._sin_cached,
            interleaved=self.interleaved,
            inplace=True,
            seqlen_offsets=seqlen_offset,
        )
        kv = apply_rotary_emb_kv_(
            kv,
            self._cos_k_cached if xpos else self._cos_cached,
            self._sin_k_cached if xpos else self._sin_cached,
            interleaved=self.interleaved,
            seqlen_offsets=seqlen_offset,
        )
        return q, kv
