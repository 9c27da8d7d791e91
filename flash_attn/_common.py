"""Pieces shared by the dense (flash_attn_interface) and the varlen / KV-cache
(_varlen_kvcache) entry points: loading the extension, the custom-op shims, head-dim padding
and the softmax_scale transform in front of the kernels.  Imports only flash_attn._checks."""

import importlib

import torch
import torch.nn.functional as F

from flash_attn._checks import MAX_SOFTMAX_SCALE, check_softmax_scale_value

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# "meta" is accepted so that shape inference (meta device, fake tensors) works; the op's
# fake implementation handles it.  Real computation needs CUDA.
_ALLOWED_DEVICE_TYPES = ("cuda", "meta")
_MAX_HEADDIM = 256


# ---------------------------------------------------------------------------------------
# The compiled extension, loaded on first use so that the package (and its input checks)
# import and work without it, e.g. on a machine without a GPU or with a pure-Python install.
# ---------------------------------------------------------------------------------------

_C = None


def _get_ext():
    """Return the extension module ``flash_attn._C``, importing it on first use."""
    global _C
    if _C is None:
        try:
            _C = importlib.import_module("flash_attn._C")
        except ImportError as e:
            raise ImportError(
                "flash_attn: the CUDA extension flash_attn._C could not be imported "
                f"({type(e).__name__}: {e}). GPU calls need the compiled kernels: build and "
                "install the package from source without FLASH_ATTN_SKIP_CUDA_BUILD=1 "
                "(e.g. `pip install --no-build-isolation .`)."
            ) from e
    return _C


def check_index_errors():
    """Raise FlashAttnValueError, naming the argument, if a device-side guard has rejected a call
    since the last check: index values (cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad,
    block_table) out of range, which made that call compute nothing and change no cache.  The
    varlen and KV-cache entry points run this check first; it reads pinned host memory and does
    not synchronise, so call torch.cuda.synchronize() before it to include calls still queued."""
    if _C is None:
        return
    taken = _C.take_index_error()
    if taken is not None:
        from flash_attn._checks import FlashAttnValueError, index_error_message

        raise FlashAttnValueError(index_error_message(*taken))


_BUILT_CONFIGS = None


def _ext_for(q):
    """The extension, after checking that this build has kernels for q's dtype and head dim.

    Checked here rather than in C++ so the error is a plain Python exception."""
    global _BUILT_CONFIGS
    ext = _get_ext()
    if _BUILT_CONFIGS is None:
        _BUILT_CONFIGS = {tuple(c) for c in ext.built_configs()}
    d = q.shape[-1]
    tile = int(ext.head_dim_tile(d))
    name = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    if (name, tile) not in _BUILT_CONFIGS:
        raise RuntimeError(
            f"flash_attn: this build has no kernels for dtype {name} with head dim {d} "
            f"(tile {tile}). Rebuild with FLASH_ATTN_HEAD_DIMS including {tile} and "
            f"FLASH_ATTN_DTYPES including {name}."
        )
    return ext


# ---------------------------------------------------------------------------------------
# Custom ops (torch >= 2.4); plain functions on older torch.
# ---------------------------------------------------------------------------------------

_HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

if _HAS_CUSTOM_OP:
    _torch_custom_op_wrapper = torch.library.custom_op
    _torch_register_fake_wrapper = torch.library.register_fake
else:  # torch < 2.4: no custom ops, no torch.compile support

    def _torch_custom_op_wrapper(name, fn=None, /, *, mutates_args, device_types=None,
                                 schema=None):
        def wrap(func):
            return func

        return wrap if fn is None else wrap(fn)

    def _torch_register_fake_wrapper(op, fn=None, /, *, lib=None, _stacklevel=1):
        def wrap(func):
            return func

        return wrap if fn is None else wrap(fn)


def _is_compiling():
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def round_multiple(x, m):
    return (x + m - 1) // m * m


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def _pad_to_multiple_of_8(x, head_size_og):
    """The kernels need headdim % 8 == 0: zero-pad the last dimension (as upstream)."""
    if head_size_og % 8 != 0:
        return F.pad(x, [0, 8 - head_size_og % 8])
    return x


def _default_softmax_scale(softmax_scale, head_size_og):
    # 1 / sqrt(headdim) of the head dim the caller passed, not the padded one.
    return head_size_og ** (-0.5) if softmax_scale is None else softmax_scale


# ---------------------------------------------------------------------------------------
# softmax_scale <= 0
# ---------------------------------------------------------------------------------------


def kernel_q_and_scale(q, softmax_scale):
    """(q', scale', sign) to hand the kernels, which need softmax_scale > 0.

    scale > 0: (q, scale, 1), no extra work.  scale < 0: (-q, -scale, -1): the same scores
    (-q) K^T (-scale) = Q K^T scale, so softcap (applied to the scaled score), ALiBi (added after
    scaling), out and softmax_lse are unchanged; the backward's dq is the negated gradient
    of -q.  scale == 0: (zeros, 1.0, 0): every score is 0 (ALiBi is still added); the backward's
    dk comes out 0 by itself (dS^T q' = 0) and dq must be set to 0.  See fix_dq."""
    if 0.0 < softmax_scale <= MAX_SOFTMAX_SCALE:
        return q, softmax_scale, 1
    check_softmax_scale_value(softmax_scale)
    if softmax_scale < 0.0:
        return torch.neg(q), -softmax_scale, -1
    return torch.zeros_like(q), 1.0, 0


def fix_dq(dq, sign):
    """The gradient of q from the gradient of the q' kernel_q_and_scale handed the kernel."""
    if sign == 1 or dq is None:
        return
    if sign == -1:
        dq.neg_()
    else:
        dq.zero_()
