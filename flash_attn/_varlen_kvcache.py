"""Variable-length batches and KV-cache inference (upstream flash-attn 2.8.x surface).

    flash_attn_varlen_func / flash_attn_varlen_qkvpacked_func / flash_attn_varlen_kvpacked_func
    -> FlashAttnVarlenFunc / FlashAttnVarlenQKVPackedFunc / FlashAttnVarlenKVPackedFunc
    -> custom ops flash_attn::_flash_attn_varlen_forward / _flash_attn_varlen_backward
    -> flash_attn._C.varlen_fwd / varlen_bwd

    flash_attn_with_kvcache
    -> custom op flash_attn::_flash_attn_kvcache (appends k/v into the cache in place, applies
       the rotary embedding, then attends)
    -> flash_attn._C.fwd_kvcache (the split-KV / paged / GQA-packed kernel for decoding, the
       prefill kernels for long query blocks)

Re-exported by flash_attn.flash_attn_interface, where upstream defines them.  Every argument is
validated here, with errors naming the argument: shapes, dtypes and devices from metadata; the
scalar arguments and the values of the index tensors (cu_seqlens, cache_seqlens, ...) by
flash_attn._checks, shared with the dense path (see flash_attn.set_strict_checks for when the
values are looked at and what that costs).
"""

import contextlib
from typing import Optional, Tuple, Union

import torch

from flash_attn import _checks, _common
from flash_attn._checks import (
    FlashAttnTypeError,
    FlashAttnValueError,
    check_alibi as _check_alibi,
    check_dropout_softcap as _check_dropout_softcap,
    check_return_softmax as _check_return_softmax,
    fmt_shape as _fmt_shape,
)
from flash_attn._common import (
    _ALLOWED_DEVICE_TYPES, _HAS_CUSTOM_OP, _MAX_HEADDIM, _MAX_HEADDIM_FWD, _SUPPORTED_DTYPES,
    _default_softmax_scale,
    _ext_for, _get_ext, _is_compiling, _torch_custom_op_wrapper,
    _torch_register_fake_wrapper, check_index_errors, fix_dq as _fix_dq,
    kernel_q_and_scale as _kernel_q_and_scale,
    maybe_contiguous,
)

__all__ = [
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "FlashAttnVarlenFunc",
    "FlashAttnVarlenQKVPackedFunc",
    "FlashAttnVarlenKVPackedFunc",
]

# Paged KV: any page size that is a multiple of this (upstream needs multiples of 256).
PAGE_BLOCK_MULTIPLE = 16


# ---------------------------------------------------------------------------------------
# Validation (metadata only)
# ---------------------------------------------------------------------------------------


def _check_varlen_features(dropout_p, softcap, alibi_slopes, batch_size, nheads, device,
                           paged=False):
    """The feature arguments of the varlen functions, checked as the dense path checks them."""
    _check_dropout_softcap(dropout_p, softcap)
    _check_alibi(alibi_slopes, batch_size, nheads, device)
    if paged and dropout_p > 0.0:
        raise NotImplementedError(
            f"flash_attn: dropout (dropout_p={dropout_p}) is not implemented with block_table "
            "(paged KV) in this build; use dropout_p=0.0"
        )


def _check_tensor(x, name, dims, shape_doc):
    if not isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != dims:
        raise FlashAttnValueError(
            f"flash_attn: {name} must have {dims} dimensions {shape_doc}, got {x.dim()} "
            f"dimensions with shape {_fmt_shape(x)}"
        )
    if x.dtype not in _SUPPORTED_DTYPES:
        raise FlashAttnTypeError(
            f"flash_attn: {name} has dtype {x.dtype}; FlashAttention only supports torch.float16 "
            "and torch.bfloat16"
        )
    # is_cuda first: a torch.device is built for every .device read (these checks run on every
    # decoding step).
    if not x.is_cuda and x.device.type not in _ALLOWED_DEVICE_TYPES:
        raise FlashAttnValueError(f"flash_attn: {name} must be on a CUDA device, got device {x.device}")
    if x.shape[-1] != 1 and x.stride()[-1] != 1:
        raise FlashAttnValueError(
            f"flash_attn: {name} must have a contiguous last dimension ({name}.stride(-1) == 1), "
            f"got strides {tuple(x.stride())}; call {name}.contiguous() first"
        )


def _check_int_tensor(x, name, shape, device, shape_doc=None):
    if not isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise FlashAttnTypeError(f"flash_attn: {name} must have dtype torch.int32, got {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise FlashAttnValueError(
            f"flash_attn: {name} must have shape {shape_doc or tuple(shape)}, got {_fmt_shape(x)}"
        )
    if x.device != device:
        raise FlashAttnValueError(
            f"flash_attn: {name} is on device {x.device} but q is on device {device}"
        )


def _check_same(x, ref, name, ref_name):
    if x.dtype != ref.dtype:
        raise FlashAttnTypeError(
            f"flash_attn: {name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}; "
            "they must have the same dtype"
        )
    if not _checks.same_device(x, ref):
        raise FlashAttnValueError(
            f"flash_attn: {name} is on device {x.device} but {ref_name} is on device {ref.device}"
        )


def _check_block_table(block_table, batch_size, k, device, kname="k"):
    """Check block_table's metadata; returns it with a unit last stride (what the kernels read:
    a (batch_size, 1) view with another stride is copied, a wider one is rejected)."""
    _check_int_tensor(block_table, "block_table", (batch_size, block_table.shape[-1])
                      if isinstance(block_table, torch.Tensor) and block_table.dim() == 2
                      else (batch_size, -1), device, "(batch_size, max_num_blocks_per_seq)")
    if block_table.stride(-1) != 1:
        if block_table.shape[-1] > 1:
            raise FlashAttnValueError(
                "flash_attn: block_table must have a contiguous last dimension "
                f"(block_table.stride(-1) == 1), got strides {tuple(block_table.stride())}"
            )
        block_table = block_table.clone(memory_format=torch.contiguous_format)
    page = k.shape[1]
    if page % PAGE_BLOCK_MULTIPLE != 0 or page == 0:
        raise FlashAttnValueError(
            f"flash_attn: with block_table (paged KV), {kname} must be (num_blocks, page_block_size, "
            f"nheads_k, headdim) with page_block_size a multiple of {PAGE_BLOCK_MULTIPLE}, got "
            f"page_block_size={page} ({kname} shape {_fmt_shape(k)})"
        )
    return block_table


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         dropout_p, window_size, softcap, alibi_slopes, deterministic,
                         block_table=None, names=("q", "k", "v"), softmax_scale=None,
                         causal=False, return_attn_probs=False,
                         max_names=("max_seqlen_q", "max_seqlen_k")):
    """Validate flash_attn_varlen_* arguments (q, k, v already unpacked, from metadata; the
    values of cu_seqlens are checked by the op, see _flash_attn_varlen_forward).

    Returns the normalised arguments: (max_seqlen_q, max_seqlen_k, block_table, dropout_p,
    softmax_scale or None, causal, (left, right), softcap, deterministic, return_attn_probs)."""
    qn, kn, vn = names
    _check_tensor(q, qn, 3, "(total_q, nheads, headdim)")
    paged = block_table is not None
    kv_dims = 4 if paged else 3
    kv_doc = "(num_blocks, page_block_size, nheads_k, headdim)" if paged else "(total_k, nheads_k, headdim)"
    _check_tensor(k, kn, kv_dims, kv_doc)
    _check_tensor(v, vn, kv_dims, kv_doc)
    _check_same(k, q, kn, qn)
    _check_same(v, q, vn, qn)
    _, nheads, _ = q.shape
    nheads_k = k.shape[-2]
    # v's head dim may differ from q's and k's (MLA); the packed forms have one head dim. Above
    # _MAX_HEADDIM, without pages: the forward alone (_common.check_forward_only).
    _common.check_head_dims(q, k, v, names, max_headdim=_MAX_HEADDIM if paged else _MAX_HEADDIM_FWD)
    if v.shape[:-1] != k.shape[:-1]:
        raise FlashAttnValueError(
            f"flash_attn: {vn} must have the same shape as {kn} but for the head dim, got "
            f"{_fmt_shape(v)} and {_fmt_shape(k)}"
        )
    if nheads < 1 or nheads_k < 1 or nheads % nheads_k != 0:
        raise FlashAttnValueError(
            f"flash_attn: the number of heads in {qn} ({nheads}) must be a positive multiple of the "
            f"number of heads in {kn} and {vn} (nheads_k={nheads_k})"
        )
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(cu, torch.Tensor):
            raise FlashAttnTypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise FlashAttnValueError(
                f"flash_attn: {name} must have shape (batch_size + 1,) with batch_size >= 1, got "
                f"{_fmt_shape(cu)}"
            )
    batch_size = cu_seqlens_q.shape[0] - 1
    _check_int_tensor(cu_seqlens_q, "cu_seqlens_q", (batch_size + 1,), q.device)
    _check_int_tensor(cu_seqlens_k, "cu_seqlens_k", (batch_size + 1,), q.device,
                      f"({batch_size + 1},) like cu_seqlens_q")
    max_seqlen_q = _checks.max_seqlen_arg(max_seqlen_q, max_names[0])
    max_seqlen_k = _checks.max_seqlen_arg(max_seqlen_k, max_names[1])
    if paged:
        block_table = _check_block_table(block_table, batch_size, k, q.device, kn)
    args = _checks.common_args(dropout_p, softmax_scale, causal, window_size, softcap,
                               deterministic, return_attn_probs)
    _check_varlen_features(args[0], args[4], alibi_slopes, batch_size, nheads, q.device, paged)
    return (max_seqlen_q, max_seqlen_k, block_table) + args


def _check_varlen_op_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            block_table=None):
    """The checks the varlen ops run before the kernels: max_seqlen in range (before C++
    narrows it) and the values of cu_seqlens / block_table, on the host (flash_attn._checks: a
    host sync on CUDA, see set_strict_checks) or by the device-side guard.  Returns
    (max_seqlen_q, max_seqlen_k, cu_seqlens_q, cu_seqlens_k): the cu_seqlens for the kernels,
    the guard's copies (all zeros, so that nothing is computed, when a value is bad)."""
    check_index_errors()
    max_seqlen_q = _checks.max_seqlen_arg(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _checks.max_seqlen_arg(max_seqlen_k, "max_seqlen_k")
    paged = block_table is not None
    if _checks.device_guard_applies(cu_seqlens_q, cu_seqlens_k, block_table):
        _, cu_seqlens_q, cu_seqlens_k = _get_ext().varlen_guard(
            q, cu_seqlens_q, cu_seqlens_k, q.shape[0], -1 if paged else k.shape[0], max_seqlen_q,
            max_seqlen_k, block_table, k.shape[1] if paged else 0, k.shape[0] if paged else 0)
    elif not paged:
        _checks.check_varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                    max_seqlen_q, max_seqlen_k)
    else:
        _checks.check_varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], None, max_seqlen_q,
                                    max_seqlen_k, block_table, k.shape[1], k.shape[0])
    return max_seqlen_q, max_seqlen_k, cu_seqlens_q, cu_seqlens_k


def _varlen_window(causal, window_size_left, window_size_right, max_seqlen_q, has_alibi=False):
    """(causal, left, right) as the kernels take them: a single query row sees everything a
    bottom-right aligned causal mask would allow, so causal is dropped there unless ALiBi is on
    (as upstream)."""
    if max_seqlen_q == 1 and not has_alibi:
        causal = False
    return causal, window_size_left, window_size_right


# ---------------------------------------------------------------------------------------
# Custom ops
# ---------------------------------------------------------------------------------------


@_torch_custom_op_wrapper("flash_attn::_flash_attn_varlen_forward", mutates_args=(),
                          device_types="cuda")
def _flash_attn_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_softmax: bool = False,
    block_table: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    zero_tensors: bool = False,
    learnable_sink: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_dropout_softcap(dropout_p, softcap)
    _check_return_softmax(return_softmax, dropout_p)
    _common.check_forward_only(q, v, dropout_p, softcap, alibi_slopes, False,
                               paged=block_table is not None)
    _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1], q.device)
    _checks.check_learnable_sink(learnable_sink, q.shape[1], q.device)
    max_seqlen_q, max_seqlen_k, cu_seqlens_q, cu_seqlens_k = _check_varlen_op_values(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table)
    # v's head dim may differ from q's and k's (out gets v's): see _common.pad_qkv.
    head_dim_v = v.shape[-1]
    q, k, v = _common.pad_qkv(*[maybe_contiguous(x) for x in (q, k, v)], keep_v=block_table is None)
    causal, wl, wr = _varlen_window(causal, window_size_left, window_size_right, max_seqlen_q,
                                    alibi_slopes is not None)
    ext = _ext_for(q)
    # The kernels need softmax_scale > 0: 0 and negative scales run on a transformed q.
    q, softmax_scale, _ = _kernel_q_and_scale(q, softmax_scale)
    # rng_state: the Philox (seed, offset) of the dropout mask; zeros without dropout. S_dmask
    # (return_softmax): (batch, nheads, round128(max_seqlen_q), round128(max_seqlen_k)).
    out, softmax_lse, S_dmask, rng_state = ext.varlen_fwd(
        q, k, v, None, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
        max_seqlen_q, max_seqlen_k, softmax_scale, zero_tensors, causal, wl, wr, softcap,
        alibi_slopes, dropout_p, return_softmax, **_common.sink_kwargs(learnable_sink),
    )
    return _common.out_at_head_dim(out, head_dim_v), softmax_lse, S_dmask, rng_state


@_common.register_fake_for("flash_attn::_flash_attn_varlen_forward", _flash_attn_varlen_forward)
def _flash_attn_varlen_forward_fake(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, dropout_p,
                                    softcap, return_softmax, learnable_sink, **_):
    _common.check_head_dims(q, k, v, max_headdim=_MAX_HEADDIM_FWD)
    _common.check_forward_only(q, v, dropout_p, softcap, None, False)
    _check_dropout_softcap(dropout_p, softcap)
    _checks.check_learnable_sink(learnable_sink, q.shape[1], q.device)
    _check_return_softmax(return_softmax, dropout_p)
    max_seqlen_q = _checks.max_seqlen_arg(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _checks.max_seqlen_arg(max_seqlen_k, "max_seqlen_k")
    total_q, num_heads, _ = q.shape
    return _common.fake_forward_outputs(q, v, (num_heads, total_q), return_softmax,
                                        cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k)


@_torch_custom_op_wrapper("flash_attn::_flash_attn_varlen_backward",
                          mutates_args=("dq", "dk", "dv"), device_types="cuda")
def _flash_attn_varlen_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: Optional[torch.Tensor], dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], deterministic: bool,
    rng_state: Optional[torch.Tensor] = None, zero_tensors: bool = False,
) -> torch.Tensor:
    _check_dropout_softcap(dropout_p, softcap)
    _common.check_backward_head_dims(q, k, v)
    _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1], q.device)
    _common.check_rng_state(dropout_p, rng_state)
    max_seqlen_q, max_seqlen_k, cu_seqlens_q, cu_seqlens_k = _check_varlen_op_values(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    # dq, dk, dv are written in place (they may be strided views, e.g. into dqkv); head dims as
    # the forward's (see _common.grads_at_kernel_head_dim).
    # v, out, dout, dv at v's head dim where the backward kernel takes it (MLA 192 / 128, sm_90a;
    # not deterministic: the varlen deterministic mode is not on that kernel).
    dout, q, k, v, out, grads = _common.grads_at_kernel_head_dim(
        *[maybe_contiguous(x) for x in (dout, q, k, v, out)], dq, dk, dv,
        dropout_p=None if deterministic else dropout_p)
    causal, wl, wr = _varlen_window(causal, window_size_left, window_size_right, max_seqlen_q,
                                    alibi_slopes is not None)
    ext = _ext_for(q)
    # As the forward: the kernel differentiates w.r.t. q', and dq follows from dq' (fix_dq).
    q, softmax_scale, sign = _kernel_q_and_scale(q, softmax_scale)
    _, _, _, softmax_d = ext.varlen_bwd(
        dout, q, k, v, out, softmax_lse, *grads, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, softmax_scale, zero_tensors, causal, deterministic, wl, wr,
        softcap, alibi_slopes, dropout_p, rng_state if dropout_p > 0.0 else None,
    )
    _fix_dq(grads[0], sign)
    _common.copy_grads_back((dq, dk, dv), grads)
    return softmax_d


@_common.register_fake_for("flash_attn::_flash_attn_varlen_backward", _flash_attn_varlen_backward)
def _flash_attn_varlen_backward_fake(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                     dropout_p, softcap, **_):
    _common.check_head_dims(q, k, v)
    _check_dropout_softcap(dropout_p, softcap)
    _checks.max_seqlen_arg(max_seqlen_q, "max_seqlen_q")
    _checks.max_seqlen_arg(max_seqlen_k, "max_seqlen_k")
    batch_size = cu_seqlens_q.shape[0] - 1
    total_q, num_heads, _ = q.shape
    return torch.empty((num_heads, total_q + 128 * batch_size), dtype=torch.float32,
                       device=q.device)


_wrapped_flash_attn_varlen_forward = _common.registered_op("_flash_attn_varlen_forward",
                                                           _flash_attn_varlen_forward)
_wrapped_flash_attn_varlen_backward = _common.registered_op("_flash_attn_varlen_backward",
                                                            _flash_attn_varlen_backward)


# ---------------------------------------------------------------------------------------
# Autograd Functions
# ---------------------------------------------------------------------------------------


def _varlen_forward(ctx, inputs, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, return_softmax, block_table, is_grad_enabled,
                    learnable_sink=None):
    """The forward every varlen autograd Function shares.  inputs: its tensor inputs, (q, k, v),
    (q, kv) or (qkv,) (then cu_seqlens_q is cu_seqlens_k and max_seqlen_q max_seqlen_k):
    checked (_check_varlen_inputs) and unpacked, then _common.padded_forward."""
    q, k, v, qkv, kv, packed = _common.split_inputs(inputs)
    names, max_names = ("q", "k", "v"), ("max_seqlen_q", "max_seqlen_k")
    if qkv is not None:
        _checks.check_packed(qkv, "qkv", 4, 3, "(total, 3, nheads, headdim)")
        q, k, v = qkv[:, 0].detach(), qkv[:, 1].detach(), qkv[:, 2].detach()
        names, max_names = ("qkv", "qkv", "qkv"), ("max_seqlen", "max_seqlen")
    elif kv is not None:
        _checks.check_packed(kv, "kv", 4, 2, "(total_k, 2, nheads_k, headdim)")
        k, v = kv[:, 0].detach(), kv[:, 1].detach()
        names = ("q", "kv", "kv")
    (max_seqlen_q, max_seqlen_k, block_table, dropout_p, softmax_scale, causal, window_size,
     softcap, deterministic, return_softmax) = _check_varlen_inputs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, window_size,
        softcap, alibi_slopes, deterministic, block_table=block_table, names=names,
        softmax_scale=softmax_scale, causal=causal, return_attn_probs=return_softmax,
        max_names=max_names)
    _checks.check_learnable_sink(learnable_sink, q.shape[1], q.device)
    is_grad = is_grad_enabled and (any(x.requires_grad for x in inputs) or (
        learnable_sink is not None and learnable_sink.requires_grad))
    _common.check_forward_only(q, v, dropout_p, softcap, alibi_slopes, is_grad,
                               paged=block_table is not None)
    # Whether the op checks the values of cu_seqlens now: then the backward need not again.
    values_checked = is_grad and _checks.value_checks_apply(cu_seqlens_q, cu_seqlens_k)
    result = _common.padded_forward(
        ctx, _wrapped_flash_attn_varlen_forward, q, k, v,
        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_softmax, is_grad, packed,
        saved_index=(cu_seqlens_q, cu_seqlens_k), learnable_sink=learnable_sink,
        block_table=block_table)
    if is_grad:
        ctx.max_seqlen_q = max_seqlen_q
        ctx.max_seqlen_k = max_seqlen_k
        ctx.paged = block_table is not None
        ctx.checked_versions = ((_checks.tensor_version(cu_seqlens_q),
                                 _checks.tensor_version(cu_seqlens_k)) if values_checked
                                else None)
    return result


def _varlen_backward(ctx, dout, dq, dk, dv):
    """The backward every varlen autograd Function shares (see _common.padded_backward); returns
    the learnable sink's gradient (None without a sink)."""
    if ctx.paged:
        raise NotImplementedError(
            "flash_attn: the backward pass of flash_attn_varlen_func with block_table (paged KV) "
            "is not implemented (upstream has none either)"
        )
    cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors[5:7]
    checked = ctx.checked_versions
    # Trusted when the forward checked these cu_seqlens and they have not been modified since
    # (autograd also refuses saved tensors modified in place).
    trusted = checked is not None and None not in checked and checked == (
        _checks.tensor_version(cu_seqlens_q), _checks.tensor_version(cu_seqlens_k))
    with _checks.trusted_values() if trusted else contextlib.nullcontext():
        softmax_d = _common.padded_backward(
            ctx, _wrapped_flash_attn_varlen_backward, dout, dq, dk, dv,
            (cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_q, ctx.max_seqlen_k))
    sink = _common.saved_sink(ctx)
    if sink is None or not ctx.needs_input_grad[-1]:
        return None
    return _common.learnable_sink_grad_varlen(sink, ctx.saved_tensors[4], softmax_d, cu_seqlens_q)


_VarlenAttnFunc = _common.attention_function(_varlen_backward)


class FlashAttnVarlenQKVPackedFunc(_VarlenAttnFunc):
    @staticmethod
    def forward(ctx, qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size,
                softcap, alibi_slopes, deterministic, return_softmax, is_grad_enabled,
                learnable_sink=None):
        return _varlen_forward(ctx, (qkv,), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                               dropout_p, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, deterministic, return_softmax, None, is_grad_enabled,
                               learnable_sink)


class FlashAttnVarlenKVPackedFunc(_VarlenAttnFunc):
    @staticmethod
    def forward(ctx, q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                return_softmax, is_grad_enabled, learnable_sink=None):
        return _varlen_forward(ctx, (q, kv), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                               softcap, alibi_slopes, deterministic, return_softmax, None,
                               is_grad_enabled, learnable_sink)


class FlashAttnVarlenFunc(_VarlenAttnFunc):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                return_softmax, block_table, is_grad_enabled, learnable_sink=None):
        return _varlen_forward(ctx, (q, k, v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                               softcap, alibi_slopes, deterministic, return_softmax, block_table,
                               is_grad_enabled, learnable_sink)


# ---------------------------------------------------------------------------------------
# Public varlen functions
# ---------------------------------------------------------------------------------------


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, learnable_sink=None):
    """Attention on a packed variable-length batch with Q, K, V stacked: qkv (total, 3, nheads,
    headdim); cu_seqlens int32 (batch_size + 1,); max_seqlen the longest sequence (a Python int).
    Sequence b is rows cu_seqlens[b]:cu_seqlens[b + 1]; causal masks and windows apply within
    each sequence. Returns out (total, nheads, headdim) [, softmax_lse (nheads, total), S_dmask].
    Rows past cu_seqlens[-1] get zeros. dropout_p, softcap, alibi_slopes, deterministic and
    return_attn_probs and learnable_sink as flash_attn_func / flash_attn_varlen_func."""
    return FlashAttnVarlenQKVPackedFunc.apply(
        qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs, torch.is_grad_enabled(), learnable_sink,
    )


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False, *,
                                    learnable_sink=None):
    """Variable-length attention with K and V stacked: q (total_q, nheads, headdim), kv
    (total_k, 2, nheads_k, headdim). MQA/GQA when nheads_k divides nheads. Causal is aligned to
    the bottom-right corner of each sequence's own (seqlen_q, seqlen_k) block. See
    flash_attn_varlen_func."""
    return FlashAttnVarlenKVPackedFunc.apply(
        q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        torch.is_grad_enabled(), learnable_sink,
    )


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, learnable_sink=None):
    """Attention on a packed variable-length batch.

    Arguments:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), or with block_table
            (num_blocks, page_block_size, nheads_k, headdim), page_block_size a multiple of 16.
            v's head dim headdim_v <= 256 may differ from headdim (as flash_attn_func).
        cu_seqlens_q, cu_seqlens_k: (batch_size + 1,) int32 cumulative lengths.
        max_seqlen_q, max_seqlen_k: ints (or 0-d integer tensors), at least the longest query /
            key sequence. cu_seqlens must start at 0, be non-decreasing and end at most at
            total_q / total_k (checked, see flash_attn.set_strict_checks).
        causal: bottom-right aligned within each sequence: query i of a sequence sees key j iff
            j <= i + seqlen_k - seqlen_q (that sequence's lengths).
        window_size: (left, right): query i sees keys [i + seqlen_k - seqlen_q - left,
            i + seqlen_k - seqlen_q + right]; -1 is unbounded.
        block_table: (batch_size, max_num_blocks_per_seq) int32, the pages of each sequence's
            keys (forward only).
        dropout_p: float in [0, 1) (not with block_table); softcap: > 0 turns softcapping on
            (not with dropout); alibi_slopes: (nheads,) or (batch_size, nheads) fp32, bias
            -slope * |i + seqlen_k - seqlen_q - j| with each sequence's own lengths;
            deterministic: deterministic backward. As flash_attn_func.
        return_attn_probs: also return softmax_lse and S_dmask (testing only): with dropout,
            (batch_size, nheads, round128(max_seqlen_q), round128(max_seqlen_k)) holding row i /
            column j of sequence b's own block, dropped elements negated; else empty.
        learnable_sink (keyword only): (nheads,) fp32 / bf16 / fp16 attention-sink logits, as
            flash_attn_func.
    Returns out (total_q, nheads, headdim_v) [, softmax_lse (nheads, total_q) fp32, S_dmask].
    Rows past cu_seqlens_q[-1] get zeros (and zero gradients); a query row that sees no key gets
    out = 0 and lse = +inf (the sink's logit with learnable_sink).
    """
    return FlashAttnVarlenFunc.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
        torch.is_grad_enabled(), learnable_sink,
    )


# ---------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------


def _rotary(x, cos, sin, offsets, interleaved, same_position=False):
    """x (b, s, h, d) rotated at positions offsets[b] + i (or offsets[b] for every i)."""
    from flash_attn.layers.rotary import apply_rotary

    if same_position:
        b, s, h, d = x.shape
        y = apply_rotary(x.reshape(b, 1, s * h, d), cos, sin, seqlen_offsets=offsets,
                         interleaved=interleaved)
        return y.reshape(b, s, h, d)
    return apply_rotary(x, cos, sin, seqlen_offsets=offsets, interleaved=interleaved)


def _append_kv(ext, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
               skip_flag=None):
    """k_cache[batch, cache_seqlens[b] + j] = k[b, j] (and v), in place, through block_table when
    paged; nothing when skip_flag (the device-side guard's) is set."""
    ext.append_kv(k_cache, v_cache, maybe_contiguous(k), maybe_contiguous(v), cache_seqlens,
                  cache_batch_idx, block_table, skip_flag)


def _kvcache_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor],
    v: Optional[torch.Tensor],
    rotary_cos: Optional[torch.Tensor],
    rotary_sin: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    cache_batch_idx: Optional[torch.Tensor],
    cache_leftpad: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    rotary_interleaved: bool,
    num_splits: int,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    learnable_sink: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    b, seqlen_q = q.shape[0], q.shape[1]
    # Everything that can fail runs before the append below (a rejected call changes nothing):
    # flash_attn_with_kvcache has checked the arguments, this checks the build has the kernels.
    check_index_errors()
    ext = _ext_for(q)
    local = causal or window_size_left >= 0 or window_size_right >= 0
    seqlen_new = 0 if k is None else k.shape[1]
    if k is not None and cache_seqlens is None:
        cache_seqlens = torch.zeros((b,), dtype=torch.int32, device=q.device)
    paged = block_table is not None
    seqused = cache_seqlens if k is None else None
    skip_flag = None
    # Values the host does not check go to the device-side guard, whose copies the kernels read
    # (zeros when one is out of range: no key rows, nothing appended). Without new keys,
    # fwd_kvcache runs it itself; with them it runs here, before the append.
    device_guard = _checks.device_guard_applies(cache_seqlens, cache_batch_idx, cache_leftpad,
                                                block_table)
    guard_in_kernel_call = device_guard and k is None
    if device_guard and k is not None:
        seqlen_cache = (block_table.shape[1] * k_cache.shape[1]) if paged else k_cache.shape[1]
        skip_flag, safe_seqlens, safe_seqused, safe_batch_idx, safe_leftpad = ext.kvcache_guard(
            q, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, seqlen_cache,
            seqlen_new, seqlen_cache, k_cache.shape[0], k_cache.shape[1] if paged else 0,
            k_cache.shape[0] if paged else 0)
        if cache_seqlens is not None or paged:
            seqused = safe_seqused
        cache_seqlens = safe_seqlens if cache_seqlens is not None else None
        cache_batch_idx = safe_batch_idx if cache_batch_idx is not None else None
        cache_leftpad = safe_leftpad if cache_leftpad is not None else None
    elif not device_guard:
        if _checks.value_checks_apply(cache_seqlens, cache_batch_idx, cache_leftpad, block_table):
            # Reached through the registered op (torch.compile), which skipped the host checks of
            # flash_attn_with_kvcache while tracing.
            _checks.check_kvcache_values(
                cache_seqlens, seqlen_new,
                (block_table.shape[1] * k_cache.shape[1]) if paged else k_cache.shape[1],
                k_cache.shape[0], cache_batch_idx, cache_leftpad, block_table, k_cache.shape[1],
                k_cache.shape[0])
        if k is not None:
            seqused = cache_seqlens + seqlen_new
    if k is not None:
        if rotary_cos is not None:
            k = _rotary(k, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved)
        _append_kv(ext, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                   skip_flag)
    if rotary_cos is not None and k is not None:
        # Query i sits at position cache_seqlens + i when causal/local, else at cache_seqlens.
        q = _rotary(q, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved,
                    same_position=not local)
    if seqused is None and block_table is not None and not guard_in_kernel_call:
        seqused = torch.full((b,), block_table.shape[1] * k_cache.shape[1], dtype=torch.int32,
                             device=q.device)
    if seqused is not None:
        seqused = seqused.to(torch.int32)
    if seqlen_q == 1 and alibi_slopes is None:
        causal = False  # one query row sees every key a bottom-right causal mask allows (upstream)
    # The kernel reads 16-byte chunks: a head dim that is not a multiple of 8 attends on padded
    # copies (out with v_cache's head dim, as the other ops' out has v's).
    q, kc, vc = _common.pad_qkv(q, k_cache, v_cache, ("q", "k_cache", "v_cache"))
    # The kernels need softmax_scale > 0: 0 and negative scales run on a transformed q.
    q, softmax_scale, _ = _kernel_q_and_scale(maybe_contiguous(q), softmax_scale)
    out, softmax_lse = ext.fwd_kvcache(
        q, kc, vc, seqused, cache_leftpad, cache_batch_idx, block_table, softmax_scale, causal,
        window_size_left, window_size_right, num_splits, softcap, alibi_slopes,
        **_common.sink_kwargs(learnable_sink), guard_indices=guard_in_kernel_call,
    )
    return _common.out_at_head_dim(out, v_cache.shape[-1]), softmax_lse


# The op is made from _kvcache_impl, which eager calls run directly (see flash_attn_with_kvcache).
_flash_attn_kvcache = _torch_custom_op_wrapper(
    "flash_attn::_flash_attn_kvcache", mutates_args=("k_cache", "v_cache"),
    device_types="cuda")(_kvcache_impl)


@_common.register_fake_for("flash_attn::_flash_attn_kvcache", _kvcache_impl)
def _flash_attn_kvcache_fake(q, v_cache, **_):
    b, seqlen_q, nheads, _ = q.shape
    out = torch.empty((b, seqlen_q, nheads, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    softmax_lse = torch.empty((b, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    return out, softmax_lse


if _HAS_CUSTOM_OP:
    _wrapped_flash_attn_kvcache = torch.ops.flash_attn._flash_attn_kvcache
else:
    _wrapped_flash_attn_kvcache = _flash_attn_kvcache


def _check_kvcache_inputs(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                          cache_batch_idx, cache_leftpad, block_table, window_size, softcap,
                          alibi_slopes, num_splits, softmax_scale=None, causal=False,
                          rotary_interleaved=True, return_softmax_lse=False, learnable_sink=None):
    """Validate flash_attn_with_kvcache's arguments, all before anything is written: metadata,
    the scalar arguments, and the values of the index tensors (flash_attn._checks; see
    set_strict_checks).  Returns the normalised arguments: (cache_seqlens (an int becomes a
    (batch_size,) int32 tensor), block_table, softmax_scale or None, causal, (left, right),
    softcap, rotary_interleaved, num_splits, return_softmax_lse)."""
    _check_tensor(q, "q", 4, "(batch_size, seqlen, nheads, headdim)")
    paged = block_table is not None
    cache_doc = ("(num_blocks, page_block_size, nheads_k, headdim)" if paged
                 else "(batch_size_cache, seqlen_cache, nheads_k, headdim)")
    _check_tensor(k_cache, "k_cache", 4, cache_doc)
    _check_tensor(v_cache, "v_cache", 4, cache_doc)
    _check_same(k_cache, q, "k_cache", "q")
    _check_same(v_cache, q, "v_cache", "q")
    b, seqlen_q, nheads, headdim = q.shape
    if b < 1 or seqlen_q < 1:
        raise FlashAttnValueError(
            f"flash_attn: q must have batch size and seqlen >= 1, got shape {_fmt_shape(q)}"
        )
    if not (1 <= headdim <= _MAX_HEADDIM):
        raise FlashAttnValueError(
            f"flash_attn: q has headdim {headdim}; headdim must be between 1 and {_MAX_HEADDIM}"
        )
    if v_cache.shape[-1] != k_cache.shape[-1]:
        # flash_attn_func / flash_attn_varlen_func run such head dims on zero-padded copies; a
        # cache is appended to and read in place, and a padded copy of it every step would cost
        # more than the attention.
        raise FlashAttnValueError(
            f"flash_attn: v_cache has headdim {v_cache.shape[-1]} but k_cache has headdim "
            f"{k_cache.shape[-1]}; flash_attn_with_kvcache needs one head dim for q, k_cache and "
            "v_cache (flash_attn_func and flash_attn_varlen_func take a v head dim of its own)"
        )
    if v_cache.shape != k_cache.shape:
        raise FlashAttnValueError(
            f"flash_attn: v_cache must have the same shape as k_cache, got {_fmt_shape(v_cache)} and "
            f"{_fmt_shape(k_cache)}"
        )
    nheads_k = k_cache.shape[2]
    if k_cache.shape[3] != headdim:
        raise FlashAttnValueError(
            f"flash_attn: k_cache has headdim {k_cache.shape[3]} but q has headdim {headdim}"
        )
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise FlashAttnValueError(
            f"flash_attn: the number of heads in q ({nheads}) must be a multiple of the number of "
            f"heads in k_cache (nheads_k={nheads_k})"
        )
    if paged:
        block_table = _check_block_table(block_table, b, k_cache, q.device, "k_cache")
        if cache_batch_idx is not None:
            raise FlashAttnValueError(
                "flash_attn: cache_batch_idx cannot be combined with block_table (paged KV): the "
                "block table already maps each sequence to its pages"
            )
        seqlen_cache = block_table.shape[1] * k_cache.shape[1]
    else:
        seqlen_cache = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < b:
            raise FlashAttnValueError(
                f"flash_attn: k_cache has batch size {k_cache.shape[0]} < q's batch size {b}; pass "
                "cache_batch_idx to pick cache entries"
            )
    if (k is None) != (v is None):
        raise FlashAttnValueError("flash_attn: k and v must be given together (or both None)")
    if k is not None:
        _check_tensor(k, "k", 4, "(batch_size, seqlen_new, nheads_k, headdim)")
        _check_tensor(v, "v", 4, "(batch_size, seqlen_new, nheads_k, headdim)")
        _check_same(k, q, "k", "q")
        _check_same(v, q, "v", "q")
        if v.shape[-1] != k.shape[-1]:
            raise FlashAttnValueError(
                f"flash_attn: v has headdim {v.shape[-1]} but k has headdim {k.shape[-1]}; "
                "flash_attn_with_kvcache needs one head dim for q, k and v"
            )
        if k.shape != v.shape or k.shape[0] != b or k.shape[2] != nheads_k or k.shape[3] != headdim:
            raise FlashAttnValueError(
                f"flash_attn: k and v must have shape (batch_size={b}, seqlen_new, nheads_k={nheads_k}, "
                f"headdim={headdim}), got {_fmt_shape(k)} and {_fmt_shape(v)}"
            )
        if k.shape[1] > seqlen_cache:
            raise FlashAttnValueError(
                f"flash_attn: k has seqlen_new={k.shape[1]} > the cache's {seqlen_cache} rows"
            )
    if rotary_cos is not None and k is None:
        raise FlashAttnValueError(
            "flash_attn: rotary_cos / rotary_sin need the new k and v to append (as upstream): "
            "rotate q yourself when there is nothing to append"
        )
    if (rotary_cos is None) != (rotary_sin is None):
        raise FlashAttnValueError("flash_attn: rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        for t, name in ((rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin")):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise FlashAttnValueError(
                    f"flash_attn: {name} must be a (seqlen_ro, rotary_dim / 2) tensor"
                )
            _check_same(t, q, name, "q")
        if rotary_sin.shape != rotary_cos.shape:
            raise FlashAttnValueError("flash_attn: rotary_cos and rotary_sin must have the same shape")
        rotary_dim = 2 * rotary_cos.shape[1]
        if rotary_dim > headdim or rotary_dim % 16 != 0:
            raise FlashAttnValueError(
                f"flash_attn: rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be a multiple "
                f"of 16 and <= headdim ({headdim})"
            )
        if rotary_cos.shape[0] < seqlen_cache:
            raise FlashAttnValueError(
                f"flash_attn: rotary_cos has {rotary_cos.shape[0]} rows but the cache has "
                f"{seqlen_cache}; seqlen_ro must cover every cache position"
            )
    seqlen_new = k.shape[1] if k is not None else 0
    seqlens_int = None
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        # An int (as upstream: the same for every sequence); checked here, on the host.
        try:
            seqlens_int = _checks.as_int(cache_seqlens, "cache_seqlens", 0,
                                         seqlen_cache - seqlen_new)
        except FlashAttnTypeError:
            raise FlashAttnTypeError(
                "flash_attn: cache_seqlens must be an int or a (batch_size,) int32 tensor, got "
                f"{type(cache_seqlens).__name__}"
            ) from None
        except FlashAttnValueError:
            new_s = f" + seqlen_new (k.shape[1] = {seqlen_new})" if seqlen_new else ""
            raise FlashAttnValueError(
                f"flash_attn: cache_seqlens = {cache_seqlens} out of range: 0 <= "
                f"cache_seqlens{new_s} <= {seqlen_cache} (the cache's rows) must hold"
            ) from None
    elif cache_seqlens is not None:
        _check_int_tensor(cache_seqlens, "cache_seqlens", (b,), q.device, f"({b},)")
    if cache_batch_idx is not None:
        _check_int_tensor(cache_batch_idx, "cache_batch_idx", (b,), q.device, f"({b},)")
    if cache_leftpad is not None:
        _check_int_tensor(cache_leftpad, "cache_leftpad", (b,), q.device, f"({b},)")
    softmax_scale = _checks.softmax_scale_arg(softmax_scale)
    causal = _checks.as_bool(causal, "causal")
    window = _checks.window_pair(window_size)
    softcap = _checks.softcap_arg(softcap)
    rotary_interleaved = _checks.as_bool(rotary_interleaved, "rotary_interleaved")
    num_splits = _checks.num_splits_arg(num_splits)
    return_softmax_lse = _checks.as_bool(return_softmax_lse, "return_softmax_lse")
    _check_alibi(alibi_slopes, b, nheads, q.device)
    _checks.check_learnable_sink(learnable_sink, nheads, q.device)
    _check_cache_layout(k_cache, "k_cache")
    _check_cache_layout(v_cache, "v_cache")
    if seqlens_int is not None:
        cache_seqlens = torch.full((b,), seqlens_int, dtype=torch.int32, device=q.device)
    # The values, last: cache_seqlens made from an int is known to be in range already.
    if seqlens_int is None:
        _checks.check_kvcache_values(cache_seqlens, seqlen_new, seqlen_cache, k_cache.shape[0],
                                     cache_batch_idx, cache_leftpad, block_table,
                                     k_cache.shape[1], k_cache.shape[0])
    else:
        # cache_seqlens made from an int is in range already: the other index tensors only.
        _checks.check_kvcache_values(None, seqlen_new, seqlen_cache, k_cache.shape[0],
                                     cache_batch_idx, None, block_table, k_cache.shape[1],
                                     k_cache.shape[0], lengths_hint=seqlens_int)
        if cache_leftpad is not None:
            _checks.check_kvcache_values(cache_seqlens, seqlen_new, seqlen_cache,
                                         k_cache.shape[0], None, cache_leftpad)
    return (cache_seqlens, block_table, softmax_scale, causal, window, softcap,
            rotary_interleaved, num_splits, return_softmax_lse)


def _check_cache_layout(cache, name):
    """The caches are updated in place, so the kernels read them as they are: 16-byte aligned
    rows (every stride of a dimension longer than 1 a multiple of 8 elements, and the base
    16-byte aligned).  Checked here, before the append, rather than only in C++ after it.  A
    head dim that is not a multiple of 8 attends on padded copies (_kvcache_impl): any layout."""
    shape, strides = cache.shape, cache.stride()
    if shape[-1] % 8 != 0:
        return
    if any(n > 1 and st % 8 != 0 for n, st in zip(shape[:-1], strides[:-1])):
        raise FlashAttnValueError(
            f"flash_attn: {name} needs 16-byte aligned rows (every stride a multiple of 8 "
            f"elements), got strides {tuple(strides)}; it is updated in place, so it "
            "is not copied: pass a contiguous cache"
        )
    if (cache.is_cuda or cache.is_cpu) and cache.numel() > 0 and not _is_compiling() \
            and cache.data_ptr() % 16 != 0:
        raise FlashAttnValueError(
            f"flash_attn: {name} must start at a 16-byte aligned address; it is updated in place, "
            "so it is not copied: pass a cache that does not start mid-row"
        )


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens: Optional[Union[(int, torch.Tensor)]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    learnable_sink=None,
):
    """Attention of q against a KV cache, for incremental decoding (no backward).

    If k and v are given, they are written into k_cache / v_cache *in place* at positions
    cache_seqlens[b], cache_seqlens[b] + 1, ... (through block_table when paged) before the
    attention, which then covers the updated cache. With rotary_cos / rotary_sin, the new k is
    rotated at those positions, and q at cache_seqlens + i when causal or local (else all query
    rows at cache_seqlens).

    Arguments:
        q: (batch_size, seqlen, nheads, headdim).
        k_cache, v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim), or with
            block_table (num_blocks, page_block_size, nheads_k, headdim) where page_block_size is
            any multiple of 16.  One head dim for q and both caches: the caches are read and
            appended to in place, and a padded copy per call would cost more than the attention.
        k, v [optional]: (batch_size, seqlen_new, nheads_k, headdim).
        rotary_cos, rotary_sin [optional]: (seqlen_ro, rotary_dim / 2), rotary_dim a multiple
            of 16 and <= headdim.
        cache_seqlens: int, or (batch_size,) int32: the number of cache rows in use (before the
            append). None: the whole cache.
        cache_batch_idx: (batch_size,) int32: the cache entry of each sequence (default arange).
        cache_leftpad: (batch_size,) int32: the cache of sequence b starts at row cache_leftpad[b].
        block_table: (batch_size, max_num_blocks_per_seq) int32 page indices (paged KV).
        causal, window_size, softmax_scale: as flash_attn_func (window_size also as a list or a
            2-element tensor; softmax_scale any finite value), aligned to the bottom-right of the
            cache.
        rotary_interleaved: GPT-J style pairs (0, 1), (2, 3)... if True, else GPT-NeoX halves.
        num_splits: split the keys into this many chunks (more CTAs for long caches);
            0 = heuristic, 1 = no split.
        return_softmax_lse: also return the (batch_size, nheads, seqlen) fp32 logsumexp.
        learnable_sink (keyword only): (nheads,) fp32 / bf16 / fp16 attention-sink logits, as
            flash_attn_func (the logsumexp includes the sink; a row with no key gets out = 0
            and lse = sink).
        softcap: > 0 turns softcapping on, as flash_attn_func.
        alibi_slopes: (nheads,) or (batch_size, nheads) fp32: bias -slope * |i + seqlen_k -
            seqlen_q - j| with seqlen_k the sequence's keys after the append (from its
            cache_leftpad on).
    Return:
        out (batch_size, seqlen, nheads, headdim) [, softmax_lse].

    Every argument is checked before anything is written, so a rejected call leaves the caches
    unchanged: cache_seqlens (+ seqlen_new) within the cache and >= 0, cache_batch_idx in
    [0, k_cache.shape[0]), cache_leftpad in [0, cache_seqlens], the block_table entries each
    sequence uses in [0, num_blocks), num_splits in int32 (see flash_attn.set_strict_checks for
    what checking tensor values costs).
    """
    (cache_seqlens, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
     num_splits, return_softmax_lse) = _check_kvcache_inputs(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, window_size, softcap, alibi_slopes, num_splits,
        softmax_scale, causal, rotary_interleaved, return_softmax_lse, learnable_sink)
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    softmax_scale = _default_softmax_scale(softmax_scale, q.shape[-1])
    # Eager calls go straight to the implementation: decode steps are tens of microseconds, and
    # the custom-op dispatch alone costs about as much. Under torch.compile the registered op is
    # traced instead (it declares the in-place cache update), and meta tensors get its fake.
    direct = q.device.type == "cuda" and not _is_compiling()
    kvcache_fn = _kvcache_impl if direct else _wrapped_flash_attn_kvcache
    # The index values were checked on the host just now, or are left to the device-side guard.
    host_checked = direct and _checks.value_checks_apply(cache_seqlens, cache_batch_idx,
                                                          cache_leftpad, block_table)
    with _checks.trusted_values() if host_checked else contextlib.nullcontext():
        out, softmax_lse = kvcache_fn(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size[0], window_size[1],
            rotary_interleaved, num_splits, softcap, alibi_slopes,
            **_common.sink_kwargs(learnable_sink),
        )
    return (out, softmax_lse) if return_softmax_lse else out
