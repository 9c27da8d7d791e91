"""Public FlashAttention-2 interface.

Layers (see docs/design.md):

    flash_attn_func / flash_attn_qkvpacked_func / flash_attn_kvpacked_func
    -> FlashAttnFunc / FlashAttnQKVPackedFunc / FlashAttnKVPackedFunc (torch.autograd.Function)
    -> torch.library custom ops flash_attn::_flash_attn_forward / _flash_attn_backward
    -> the extension module flash_attn._C (fwd / bwd)

The public functions, the autograd Functions and the two private ops keep the names,
argument order, defaults and return values of upstream flash-attn 2.8.x, so code written
against upstream runs unchanged, including dropout, sliding-window attention, softcapping,
ALiBi and the deterministic backward (all computed in the kernels).
"""

from typing import Optional, Tuple

import torch

from flash_attn import _checks, _common, _varlen_kvcache
from flash_attn._checks import (  # noqa: F401 (re-exported names)
    FlashAttnTypeError,
    FlashAttnValueError,
    check_alibi as _check_alibi,
    check_return_softmax as _check_return_softmax,
    fmt_shape as _fmt_shape,
    set_strict_checks,
    strict_checks_enabled,
    window_pair as _window_pair,
)
from flash_attn._common import (  # noqa: F401 (re-exported names)
    _ALLOWED_DEVICE_TYPES,
    _HAS_CUSTOM_OP,
    _MAX_HEADDIM,
    _MAX_HEADDIM_FWD,
    _SUPPORTED_DTYPES,
    _default_softmax_scale,
    _ext_for,
    _get_ext,
    _is_compiling,
    _pad_to_multiple_of_8,
    _torch_custom_op_wrapper,
    _torch_register_fake_wrapper,
    check_index_errors,
    fix_dq as _fix_dq,
    kernel_q_and_scale as _kernel_q_and_scale,
    maybe_contiguous,
    round_multiple,
)
# Variable-length batches and KV-cache inference live in flash_attn/_varlen_kvcache.py;
# re-exported here, where upstream defines them.
from flash_attn._varlen_kvcache import (  # noqa: F401 (re-exported names)
    FlashAttnVarlenFunc,
    FlashAttnVarlenKVPackedFunc,
    FlashAttnVarlenQKVPackedFunc,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
    _wrapped_flash_attn_varlen_backward,
    _wrapped_flash_attn_varlen_forward,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "FlashAttnFunc",
    "FlashAttnQKVPackedFunc",
    "FlashAttnKVPackedFunc",
    "FlashAttnValueError",
    "FlashAttnTypeError",
    "set_strict_checks",
    "strict_checks_enabled",
    "check_index_errors",
] + _varlen_kvcache.__all__


def __getattr__(name):
    # The extension module and its built configs live in flash_attn._common (loaded on first
    # use); read through here so flash_attn_interface._C shows the current state.
    if name in ("_C", "_BUILT_CONFIGS"):
        return getattr(_common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------
# Input validation: one function, used by every entry point.  It looks only at metadata
# (type, rank, dtype, shape, strides, device), never at values, so it works on CPU, meta
# and fake tensors and does not break torch.compile graphs.  The scalar arguments and the
# index-tensor values are checked by flash_attn._checks, shared with the varlen and KV-cache
# entry points.
# ---------------------------------------------------------------------------------------


def _resolve_window(causal, window_size_left, window_size_right, seqlen_q, seqlen_k, has_alibi):
    """Resolve (causal, window_size) exactly as upstream's C++ does.

    Returns (is_causal, left, right) with -1 for an unbounded side: a side at least seqlen_k
    long is unbounded, causal means right = 0, and one query row without ALiBi is never causal
    (the bottom-right-aligned causal mask hides nothing then)."""
    wl, wr = int(window_size_left), int(window_size_right)
    if wl >= seqlen_k or wl < 0:
        wl = -1
    if wr >= seqlen_k or wr < 0:
        wr = -1
    if seqlen_q == 1 and not has_alibi:
        causal = False
    if causal:
        wr = 0
    return (wl < 0 and wr == 0), wl, wr


def _effective_causal(causal, window_size_left, window_size_right, seqlen_q, seqlen_k, has_alibi):
    """Whether (causal, window_size) amount to plain causal attention (see _resolve_window)."""
    return _resolve_window(causal, window_size_left, window_size_right, seqlen_q, seqlen_k,
                           has_alibi)[0]


def _check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, deterministic, seqlen_q, seqlen_k):
    """Check the feature arguments as upstream does and return the effective causal flag."""
    _checks.check_dropout_softcap(dropout_p, softcap)
    return _effective_causal(causal, window_size_left, window_size_right, seqlen_q, seqlen_k,
                             alibi_slopes is not None)


def _valid_qkv(q, k, v):
    """Whether unpacked q, k, v pass every check of _check_inputs, read with as few tensor
    attribute reads as possible (the checks run on every call, and on a short call their host
    time is the call's); False sends the call through the checks that name what is wrong."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return False
    dtype = q.dtype
    if dtype not in _SUPPORTED_DTYPES or k.dtype != dtype or v.dtype != dtype:
        return False
    b, sq, h, d = qs
    _, sk, hk, dk = ks
    dv = vs[3]
    if not (b >= 1 and sq >= 1 and sk >= 1 and hk >= 1 and h % hk == 0 and ks[0] == b
            and vs[:3] == ks[:3] and dk == d and 1 <= d <= _MAX_HEADDIM_FWD
            and 1 <= dv <= _MAX_HEADDIM_FWD):
        return False
    if ((d != 1 and q.stride(3) != 1) or (d != 1 and k.stride(3) != 1)
            or (dv != 1 and v.stride(3) != 1)):
        return False
    if not q.is_cuda and q.device.type not in _ALLOWED_DEVICE_TYPES:
        return False
    return _checks.same_device(k, q) and _checks.same_device(v, q)


def _check_inputs(q, k, v, dropout_p, causal, window_size, softcap, alibi_slopes,
                  deterministic, qkv=None, kv=None, softmax_scale=None, return_softmax=False):
    """Validate the arguments of every public entry point and return the scalar arguments
    normalised (see flash_attn._checks.common_args): (dropout_p, softmax_scale or None, causal,
    (left, right), softcap, deterministic, return_softmax).

    Unpacked: pass q, k, v.  QKV-packed: pass q = k = v = None and qkv.  KV-packed: pass q,
    k = v = None and kv.  Raises FlashAttnTypeError / FlashAttnValueError (which are also
    TypeError / ValueError and RuntimeError) naming the offending argument.
    """
    if qkv is None and kv is None and _valid_qkv(q, k, v):
        args = _checks.common_args(dropout_p, softmax_scale, causal, window_size, softcap,
                                   deterministic, return_softmax)
        _check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device)
        return args
    if qkv is not None:
        _checks.check_packed(qkv, "qkv", 5, 3, "(batch_size, seqlen, 3, nheads, headdim)")
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        names = ("qkv", "qkv", "qkv")
    elif kv is not None:
        _checks.check_packed(kv, "kv", 5, 2, "(batch_size, seqlen_k, 2, nheads_k, headdim)")
        k, v = kv[:, :, 0], kv[:, :, 1]
        names = ("q", "kv", "kv")
    else:
        names = ("q", "k", "v")
    tensors = (q, k, v)
    qn, kn, vn = names

    for x, name in zip(tensors, names):
        if not isinstance(x, torch.Tensor):
            raise FlashAttnTypeError(
                f"flash_attn: {name} must be a torch.Tensor, got {type(x).__name__}"
            )
    for x, name in zip(tensors, names):
        if x.dim() != 4:
            raise FlashAttnValueError(
                f"flash_attn: {name} must have 4 dimensions (batch_size, seqlen, nheads, "
                f"headdim), got {x.dim()} dimensions with shape {_fmt_shape(x)}"
            )
    for x, name in zip(tensors, names):
        if x.dtype not in _SUPPORTED_DTYPES:
            raise FlashAttnTypeError(
                f"flash_attn: {name} has dtype {x.dtype}; FlashAttention only supports "
                "torch.float16 and torch.bfloat16"
            )
    for x, name in zip(tensors[1:], names[1:]):
        if x.dtype != q.dtype:
            raise FlashAttnTypeError(
                f"flash_attn: {name} has dtype {x.dtype} but {qn} has dtype {q.dtype}; "
                "q, k and v must have the same dtype"
            )

    batch_size, seqlen_q, nheads, headdim = q.shape
    _, seqlen_k, nheads_k, _ = k.shape
    if batch_size < 1:
        raise FlashAttnValueError(
            f"flash_attn: {qn} has batch size {batch_size}; batch size must be >= 1"
        )
    for x, name in zip(tensors[1:], names[1:]):
        if x.shape[0] != batch_size:
            raise FlashAttnValueError(
                f"flash_attn: {name} has batch size {x.shape[0]} but {qn} has batch size "
                f"{batch_size}; q, k and v must have the same batch size"
            )
    # v's head dim may differ from q's and k's (MLA); the packed forms have one head dim. Above
    # _MAX_HEADDIM: the forward alone (_common.check_forward_only, once is_grad is known).
    _common.check_head_dims(q, k, v, names, max_headdim=_MAX_HEADDIM_FWD)
    if v.shape[:3] != k.shape[:3]:
        raise FlashAttnValueError(
            f"flash_attn: v must have the same shape as k but for the head dim (batch_size, "
            f"seqlen_k, nheads_k, headdim_v), got {vn} shape {_fmt_shape(v)} and {kn} shape "
            f"{_fmt_shape(k)}"
        )
    if seqlen_q < 1:
        raise FlashAttnValueError(
            f"flash_attn: {qn} has seqlen {seqlen_q}; seqlen must be >= 1"
        )
    if seqlen_k < 1:
        raise FlashAttnValueError(
            f"flash_attn: {kn} has seqlen {seqlen_k}; seqlen must be >= 1"
        )
    if nheads < 1 or nheads_k < 1:
        raise FlashAttnValueError(
            f"flash_attn: nheads must be >= 1, got nheads={nheads} ({qn}) and "
            f"nheads_k={nheads_k} ({kn})"
        )
    if nheads % nheads_k != 0:
        raise FlashAttnValueError(
            f"flash_attn: the number of heads in {qn} ({nheads}) must be divisible by the "
            f"number of heads in {kn} and {vn} (nheads_k={nheads_k})"
        )
    # The kernels need a contiguous last dimension.  Checked before the head-dim padding,
    # which would otherwise hide a bad layout behind a padded copy.
    for x, name in zip(tensors, names):
        if x.shape[-1] != 1 and x.stride()[-1] != 1:
            raise FlashAttnValueError(
                f"flash_attn: {name} must have a contiguous last dimension "
                f"({name}.stride(-1) == 1), got strides {tuple(x.stride())}; "
                f"call {name}.contiguous() first"
            )

    args = _checks.common_args(dropout_p, softmax_scale, causal, window_size, softcap,
                               deterministic, return_softmax)
    _check_alibi(alibi_slopes, batch_size, nheads, q.device)

    # is_cuda first: a torch.device is built for every .device read.
    if not q.is_cuda and q.device.type not in _ALLOWED_DEVICE_TYPES:
        raise FlashAttnValueError(
            f"flash_attn: {qn} must be on a CUDA device, got device {q.device}"
        )
    for x, name in zip(tensors[1:], names[1:]):
        if not _checks.same_device(x, q):
            raise FlashAttnValueError(
                f"flash_attn: {name} is on device {x.device} but {qn} is on device {q.device}; "
                "q, k and v must be on the same CUDA device"
            )
    return args


# ---------------------------------------------------------------------------------------
# Custom ops (torch >= 2.4; plain functions on older torch, see flash_attn._common)
# ---------------------------------------------------------------------------------------


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key-block width of the forward kernel that produces S_dmask (as upstream's helper):
    calls with dropout run the SM80-class forward, 128 keys per block up to head dim 64, else 64."""
    assert head_dim <= _MAX_HEADDIM
    return 128 if head_dim <= 64 else 64


def _flash_attn_forward_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
    causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], return_softmax: bool,
    learnable_sink: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward op (flash_attn::_flash_attn_forward) as a plain function: eager CUDA calls
    of the autograd Functions call it directly (see _eager_direct).  learnable_sink (beyond
    upstream's arguments): see flash_attn_func; softmax_lse then includes the sink.  v's head
    dim may differ from q's and k's (out gets v's), as may a head dim that is not a multiple of
    8: the kernels then run on padded copies (_common.pad_qkv)."""
    _check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, False, q.shape[1], k.shape[1])
    _common.check_forward_only(q, v, dropout_p, softcap, alibi_slopes, False)
    _checks.check_learnable_sink(learnable_sink, q.shape[2], q.device)
    is_causal, wl, wr = _resolve_window(causal, window_size_left, window_size_right, q.shape[1],
                                        k.shape[1], alibi_slopes is not None)
    _check_return_softmax(return_softmax, dropout_p)
    _check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device)
    head_dim_v = v.shape[-1]
    q, k, v = _common.pad_qkv(*[maybe_contiguous(x) for x in (q, k, v)], keep_v=True)
    ext = _ext_for(q)
    # The kernels need softmax_scale > 0: 0 and negative scales run on a transformed q.
    q, softmax_scale, _ = _kernel_q_and_scale(q, softmax_scale)
    # rng_state: the Philox (seed, offset) of the dropout mask; zeros without dropout.
    out, softmax_lse, S_dmask, rng_state = ext.fwd(
        q, k, v, None, softmax_scale, is_causal, wl, wr, softcap, alibi_slopes, dropout_p,
        return_softmax, **_common.sink_kwargs(learnable_sink)
    )
    return _common.out_at_head_dim(out, head_dim_v), softmax_lse, S_dmask, rng_state


_flash_attn_forward = _torch_custom_op_wrapper(
    "flash_attn::_flash_attn_forward", _flash_attn_forward_impl, mutates_args=(),
    device_types="cuda")


@_common.register_fake_for("flash_attn::_flash_attn_forward", _flash_attn_forward_impl)
def _flash_attn_forward_fake(q, k, v, dropout_p, causal, window_size_left, window_size_right,
                             softcap, alibi_slopes, return_softmax, learnable_sink, **_):
    _common.check_head_dims(q, k, v, max_headdim=_MAX_HEADDIM_FWD)
    _common.check_forward_only(q, v, dropout_p, softcap, alibi_slopes, False)
    _check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, False, q.shape[1], k.shape[1])
    _checks.check_learnable_sink(learnable_sink, q.shape[2], q.device)
    _check_return_softmax(return_softmax, dropout_p)
    batch_size, seqlen_q, num_heads, _ = q.shape
    return _common.fake_forward_outputs(q, v, (batch_size, num_heads, seqlen_q), return_softmax,
                                        batch_size, seqlen_q, k.shape[1])


def _flash_attn_backward_impl(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: Optional[torch.Tensor], dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor], dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], deterministic: bool,
    rng_state: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The backward op (flash_attn::_flash_attn_backward) as a plain function: eager CUDA calls
    of the autograd Functions call it directly (see _eager_direct).  Head dims as the forward's:
    dout and out have v's, dq and dk q's, dv v's."""
    _check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, deterministic, q.shape[1], k.shape[1])
    _common.check_backward_head_dims(q, k, v)
    is_causal, wl, wr = _resolve_window(causal, window_size_left, window_size_right, q.shape[1],
                                        k.shape[1], alibi_slopes is not None)
    _check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device)
    _common.check_rng_state(dropout_p, rng_state)
    # dq, dk, dv are written in place (they may be strided views, e.g. into dqkv).
    # v, out, dout, dv at v's head dim where the backward kernel takes it (MLA 192 / 128, sm_90a).
    dout, q, k, v, out, grads = _common.grads_at_kernel_head_dim(
        *[maybe_contiguous(x) for x in (dout, q, k, v, out)], dq, dk, dv, dropout_p=dropout_p)
    ext = _ext_for(q)
    # As the forward: the kernel differentiates w.r.t. q', and dq follows from dq' (fix_dq).
    q, softmax_scale, sign = _kernel_q_and_scale(q, softmax_scale)
    _, _, _, softmax_d = ext.bwd(
        dout, q, k, v, out, softmax_lse, *grads, softmax_scale, is_causal, deterministic,
        wl, wr, softcap, alibi_slopes, dropout_p,
        rng_state if dropout_p > 0.0 else None
    )
    _fix_dq(grads[0], sign)
    _common.copy_grads_back((dq, dk, dv), grads)
    return softmax_d


_flash_attn_backward = _torch_custom_op_wrapper(
    "flash_attn::_flash_attn_backward", _flash_attn_backward_impl,
    mutates_args=("dq", "dk", "dv"), device_types="cuda")


@_common.register_fake_for("flash_attn::_flash_attn_backward", _flash_attn_backward_impl)
def _flash_attn_backward_fake(q, k, v, dropout_p, causal, window_size_left, window_size_right,
                              softcap, alibi_slopes, deterministic, **_):
    _common.check_head_dims(q, k, v)
    _check_features(dropout_p, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, deterministic, q.shape[1], k.shape[1])
    batch_size, seqlen_q, num_heads, _ = q.shape
    return torch.empty((batch_size, num_heads, round_multiple(seqlen_q, 128)),
                       dtype=torch.float32, device=q.device)


_wrapped_flash_attn_forward = _common.registered_op("_flash_attn_forward", _flash_attn_forward)
_wrapped_flash_attn_backward = _common.registered_op("_flash_attn_backward", _flash_attn_backward)


# ---------------------------------------------------------------------------------------
# Autograd Functions
# ---------------------------------------------------------------------------------------


def _eager_direct(q):
    """Eager CUDA calls skip the custom-op dispatch (as flash_attn_with_kvcache does): the
    autograd Function already handles autograd, and the dispatch costs tens of microseconds per
    call, which shows at short sequences and in windowed calls. Under torch.compile and on meta /
    fake tensors the registered ops run instead."""
    return q.device.type == "cuda" and not _is_compiling()


def _dense_forward(ctx, inputs, dropout_p, softmax_scale, causal, window_size, softcap,
                   alibi_slopes, deterministic, return_softmax, is_grad_enabled,
                   learnable_sink=None):
    """The forward every dense autograd Function shares.  inputs: its tensor inputs, (q, k, v),
    (q, kv) or (qkv,): checked (_check_inputs) and unpacked, then _common.padded_forward."""
    q, k, v, qkv, kv, packed = _common.split_inputs(inputs)
    (dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
     return_softmax) = _check_inputs(q, k, v, dropout_p, causal, window_size, softcap,
                                     alibi_slopes, deterministic, qkv=qkv, kv=kv,
                                     softmax_scale=softmax_scale, return_softmax=return_softmax)
    nheads = (qkv.shape[3] if qkv is not None else q.shape[2])
    _checks.check_learnable_sink(learnable_sink, nheads,
                                 qkv.device if qkv is not None else q.device)
    is_grad = is_grad_enabled and (any(x.requires_grad for x in inputs) or (
        learnable_sink is not None and learnable_sink.requires_grad))
    if qkv is not None:
        q, k, v = qkv[:, :, 0].detach(), qkv[:, :, 1].detach(), qkv[:, :, 2].detach()
    elif kv is not None:
        k, v = kv[:, :, 0].detach(), kv[:, :, 1].detach()
    _common.check_forward_only(q, v, dropout_p, softcap, alibi_slopes, is_grad)
    forward_fn = _flash_attn_forward_impl if _eager_direct(q) else _wrapped_flash_attn_forward
    return _common.padded_forward(ctx, forward_fn, q, k, v, (), dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_softmax, is_grad, packed,
                                  learnable_sink=learnable_sink)


def _dense_backward(ctx, dout, dq, dk, dv):
    """The backward every dense autograd Function shares (see _common.padded_backward); returns
    the learnable sink's gradient (None without a sink)."""
    q = ctx.saved_tensors[0]
    backward_fn = _flash_attn_backward_impl if _eager_direct(q) else _wrapped_flash_attn_backward
    softmax_d = _common.padded_backward(ctx, backward_fn, dout, dq, dk, dv)
    sink = _common.saved_sink(ctx)
    if sink is None or not ctx.needs_input_grad[-1]:
        return None
    return _common.learnable_sink_grad(sink, ctx.saved_tensors[4], softmax_d)


_DenseAttnFunc = _common.attention_function(_dense_backward)


class FlashAttnQKVPackedFunc(_DenseAttnFunc):
    @staticmethod
    def forward(ctx, qkv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_softmax, is_grad_enabled, learnable_sink=None):
        return _dense_forward(ctx, (qkv,), dropout_p, softmax_scale, causal, window_size, softcap,
                              alibi_slopes, deterministic, return_softmax, is_grad_enabled,
                              learnable_sink)


class FlashAttnKVPackedFunc(_DenseAttnFunc):
    @staticmethod
    def forward(ctx, q, kv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_softmax, is_grad_enabled, learnable_sink=None):
        return _dense_forward(ctx, (q, kv), dropout_p, softmax_scale, causal, window_size,
                              softcap, alibi_slopes, deterministic, return_softmax, is_grad_enabled,
                              learnable_sink)


class FlashAttnFunc(_DenseAttnFunc):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_softmax, is_grad_enabled, learnable_sink=None):
        return _dense_forward(ctx, (q, k, v), dropout_p, softmax_scale, causal, window_size,
                              softcap, alibi_slopes, deterministic, return_softmax, is_grad_enabled,
                              learnable_sink)


# ---------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------

_MASK_DOC = """
    If causal=True, the causal mask is aligned to the bottom-right corner of the attention
    matrix: query i sees key j iff j <= i + seqlen_k - seqlen_q.  With seqlen_q = 2 and
    seqlen_k = 5 the mask (1 = keep, 0 = masked) is
        1 1 1 1 0
        1 1 1 1 1
    and with seqlen_q = 5 and seqlen_k = 2 it is
        0 0
        0 0
        0 0
        1 0
        1 1
    With window_size=(left, right), query i sees keys
    [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right] (-1: unbounded side).
    A query row that sees no key gets output 0 (and softmax_lse +inf, or the sink's logit
    with learnable_sink).
"""

_COMMON_ARGS_DOC = """
        dropout_p: float in [0, 1). Dropout probability; use 0.0 for evaluation. The mask
            comes from PyTorch's CUDA generator (Philox), so torch.manual_seed reproduces it.
        softmax_scale: float. The scaling of QK^T before the softmax: any finite value,
            0 (uniform attention over the visible keys) and negative ones included.
            Defaults to 1 / sqrt(headdim), q's head dim.
        causal: bool. Whether to apply the causal (auto-regressive) mask.
        window_size: (left, right) ints, as a tuple, a list or a 2-element integer tensor.
            If not (-1, -1), implements sliding-window local attention (see above); a
            negative side is unbounded.
        softcap: float. A value > 0 turns on softcapping of the scores:
            softcap * tanh(QK^T * softmax_scale / softcap). 0.0 means off. Not with dropout.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. ALiBi bias
            -alibi_slope * |i + seqlen_k - seqlen_q - j| added to the score of query i and
            key j.
        deterministic: bool. Whether to use the deterministic backward pass, which is
            slower and uses more memory; the forward pass is always deterministic.
        return_attn_probs: bool. Whether to also return softmax_lse and S_dmask; for testing
            only. S_dmask is an empty tensor unless dropout is on.
        learnable_sink (keyword only): (nheads,) fp32, bf16 or fp16 on q's device, or None.
            Attention sinks: each query row of head h gets one more logit sink[h], in the
            units of the scaled scores (not scaled, softcapped or biased), that enters the
            softmax denominator and carries no value, so
            out = sum_j exp(s_j - lse) v_j with lse = log(exp(sink[h]) + sum_j exp(s_j)).
            Differentiable (its gradient has its dtype).
    Return:
        out: (batch_size, seqlen, nheads, headdim_v), v's head dim (headdim when packed).
        softmax_lse [if return_attn_probs=True]: (batch_size, nheads, seqlen), fp32. The
            logsumexp of each row of QK^T * softmax_scale (the log of the softmax
            normalizer, the sink's term included).
        S_dmask [if return_attn_probs=True]: the attention probabilities with the dropout
            pattern encoded in the sign; an empty tensor when dropout_p == 0.
"""


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *,
                              learnable_sink=None):
    return FlashAttnQKVPackedFunc.apply(qkv, dropout_p, softmax_scale, causal, window_size,
                                        softcap, alibi_slopes, deterministic, return_attn_probs,
                                        torch.is_grad_enabled(), learnable_sink)


flash_attn_qkvpacked_func.__doc__ = (
    """Attention on Q, K, V stacked into one tensor.

    Faster than flash_attn_func on separate Q, K, V in the backward pass, since the
    gradients of Q, K and V are written into one tensor with no concatenation.  For
    multi-query and grouped-query attention (MQA/GQA) see flash_attn_kvpacked_func and
    flash_attn_func.
"""
    + _MASK_DOC
    + """
    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim), fp16 or bf16, on a CUDA device.
"""
    + _COMMON_ARGS_DOC
)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *,
                             learnable_sink=None):
    return FlashAttnKVPackedFunc.apply(q, kv, dropout_p, softmax_scale, causal, window_size,
                                       softcap, alibi_slopes, deterministic, return_attn_probs,
                                       torch.is_grad_enabled(), learnable_sink)


flash_attn_kvpacked_func.__doc__ = (
    """Attention with K and V stacked into one tensor.

    Faster than flash_attn_func on separate K, V in the backward pass, since the gradients
    of K and V are written into one tensor with no concatenation.  Supports multi-query and
    grouped-query attention (MQA/GQA): KV may have fewer heads than Q, as long as nheads is
    divisible by nheads_k.  With 6 query heads and 2 KV heads, query heads 0, 1, 2 use KV
    head 0 and query heads 3, 4, 5 use KV head 1.
"""
    + _MASK_DOC
    + """
    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim), fp16 or bf16, on a CUDA device.
        kv: (batch_size, seqlen_k, 2, nheads_k, headdim), same dtype and device as q.
"""
    + _COMMON_ARGS_DOC
)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    *, learnable_sink=None):
    return FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, deterministic, return_attn_probs,
                               torch.is_grad_enabled(), learnable_sink)


flash_attn_func.__doc__ = (
    """Scaled dot-product attention softmax(Q K^T * softmax_scale) V, computed without
    materialising the attention matrix.

    Supports multi-query and grouped-query attention (MQA/GQA): K and V may have fewer heads
    than Q, as long as nheads is divisible by nheads_k.  With 6 query heads and 2 KV heads,
    query heads 0, 1, 2 use KV head 0 and query heads 3, 4, 5 use KV head 1.
"""
    + _MASK_DOC
    + """
    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim), fp16 or bf16, on a CUDA device, with a
            contiguous last dimension; headdim <= 256.
        k: (batch_size, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch_size, seqlen_k, nheads_k, headdim_v), same dtype and device as q.
            headdim_v <= 256 may differ from headdim (DeepSeek MLA: 192 and 128), as in
            upstream FA3; the kernels then run at the larger head dim on zero-padded copies.
"""
    + _COMMON_ARGS_DOC
)
