"""Argument checks shared by every entry point (dense, varlen, KV cache).

Two kinds of checks live here:

- Argument forms and types (always, metadata only): bool, float and int arguments in the forms
  upstream flash-attn accepts (Python scalars, numpy scalars, 0-d tensors; window_size as a
  tuple, a list or a 2-element integer tensor), finite softmax_scale / softcap, every int that
  reaches C++ range-checked before it is narrowed to int32.  Errors are FlashAttnTypeError /
  FlashAttnValueError naming the argument.

- Values of the index tensors (cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad,
  block_table).  Out-of-range values make the kernels (or the KV-cache append) read or write
  out of bounds, which poisons the CUDA context, so they are checked before anything is launched
  or written.  These values live on the device, so looking at them costs one device-to-host copy
  and a stream synchronisation: see set_strict_checks for when that happens.  When the host does
  not look at them (the default for CUDA tensors), a device-side guard does: one small kernel
  checks them, and a bad value makes the call compute and write nothing; the error is raised,
  naming the argument, by the next call (or by flash_attn.check_index_errors).

This module imports nothing else from the package (no import cycles).
"""

import math
import numbers
import os
import threading

import torch

__all__ = [
    "FlashAttnValueError",
    "FlashAttnTypeError",
    "set_strict_checks",
    "strict_checks_enabled",
]


class FlashAttnValueError(ValueError, RuntimeError):
    """Bad shape, stride, device or argument value.

    Subclasses RuntimeError too, since upstream's C++ checks raise RuntimeError."""


class FlashAttnTypeError(TypeError, RuntimeError):
    """Bad tensor type or dtype.  Subclasses RuntimeError too, like upstream's checks."""


INT32_MAX = 2**31 - 1
# max_seqlen_q / max_seqlen_k: the C++ side rounds them up to a multiple of 128 in int32.
MAX_SEQLEN = INT32_MAX - 127
# |softmax_scale| above this overflows float32 once multiplied by log2(e) in the kernels.
MAX_SOFTMAX_SCALE = 3.4028234663852886e38 / math.log2(math.e)

_SYM_INT = (torch.SymInt,)
_SYM_FLOAT = (torch.SymFloat, torch.SymInt)
_SYM_BOOL = (torch.SymBool,)


def fmt_shape(x):
    return "(" + ", ".join(str(s) for s in x.shape) + ")"


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of dtype {x.dtype} and shape {fmt_shape(x)}"
    return f"{type(x).__name__} {x!r}"


def _is_numpy_bool(x):
    return type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool")


# ---------------------------------------------------------------------------------------
# Scalars
# ---------------------------------------------------------------------------------------


def as_bool(x, name):
    """A bool argument: Python / numpy bool, the ints 0 and 1, or a 0-d bool / integer tensor
    holding 0 or 1 (what upstream's op schema accepts).  Strings, None and floats are rejected:
    causal="False" is a TypeError, not causal attention."""
    if x is True or x is False:
        return x
    if isinstance(x, _SYM_BOOL):
        return x
    if _is_numpy_bool(x):
        return bool(x)
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and (x.dtype == torch.bool or not (x.dtype.is_floating_point
                                                           or x.dtype.is_complex)):
            v = int(x)
            if v in (0, 1):
                return bool(v)
    elif isinstance(x, numbers.Integral) and int(x) in (0, 1):
        return bool(int(x))
    raise FlashAttnTypeError(f"flash_attn: {name} must be a bool, got {_describe(x)}")


def as_float(x, name):
    """A float argument: a Python / numpy real number or a 0-d real tensor (not bool)."""
    if type(x) is float:
        return x
    if isinstance(x, bool) or _is_numpy_bool(x) or isinstance(x, _SYM_BOOL):
        raise FlashAttnTypeError(f"flash_attn: {name} must be a float, got {_describe(x)}")
    if isinstance(x, float):
        return x
    if isinstance(x, _SYM_FLOAT):
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.dtype != torch.bool and not x.dtype.is_complex:
            return float(x)
    elif isinstance(x, numbers.Real):
        return float(x)
    raise FlashAttnTypeError(f"flash_attn: {name} must be a float, got {_describe(x)}")


def as_int(x, name, lo=None, hi=None):
    """An int argument: a Python / numpy integer or a 0-d integer tensor (not bool, not float),
    range-checked to [lo, hi] when those are given (before C++ narrows it)."""
    if type(x) is int:
        if (lo is None or x >= lo) and (hi is None or x <= hi):
            return x
    elif isinstance(x, bool) or _is_numpy_bool(x):
        raise FlashAttnTypeError(f"flash_attn: {name} must be an int, got {_describe(x)}")
    if isinstance(x, _SYM_INT):
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.dtype != torch.bool and not (x.dtype.is_floating_point
                                                           or x.dtype.is_complex):
            x = int(x)
        else:
            raise FlashAttnTypeError(f"flash_attn: {name} must be an int, got {_describe(x)}")
    elif isinstance(x, numbers.Integral):
        x = int(x)
    else:
        raise FlashAttnTypeError(f"flash_attn: {name} must be an int, got {_describe(x)}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        lo_s = "" if lo is None else f"{lo} <= "
        hi_s = "" if hi is None else f" <= {hi}"
        raise FlashAttnValueError(f"flash_attn: {name} must satisfy {lo_s}{name}{hi_s}, got {x}")
    return x


def window_pair(window_size):
    """window_size as a pair of ints (left, right): a tuple, a list or a 2-element integer
    tensor on any device, as upstream accepts.  Elements must be integers (2.5 is a TypeError,
    not 2); a negative side means unbounded and becomes -1, and a side past int32 becomes
    INT32_MAX (as unbounded as any seqlen allows), so the values always fit the kernels."""
    if type(window_size) in (tuple, list) and len(window_size) == 2:
        left, right = window_size
        if type(left) is int and type(right) is int:
            return (-1 if left < 0 else min(left, INT32_MAX),
                    -1 if right < 0 else min(right, INT32_MAX))
    if isinstance(window_size, torch.Tensor):
        if window_size.numel() != 2:
            raise FlashAttnValueError(
                "flash_attn: window_size must be a pair (left, right), got a tensor of shape "
                f"{fmt_shape(window_size)}"
            )
        if window_size.dtype == torch.bool or window_size.dtype.is_floating_point \
                or window_size.dtype.is_complex:
            raise FlashAttnTypeError(
                f"flash_attn: window_size must hold two ints, got a tensor of dtype "
                f"{window_size.dtype}"
            )
        pair = window_size.flatten().tolist()
    else:
        if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") \
                or len(window_size) != 2:
            raise FlashAttnValueError(
                f"flash_attn: window_size must be a pair (left, right), got {window_size!r}"
            )
        pair = list(window_size)
    out = []
    for w in pair:
        try:
            w = as_int(w, "window_size")
        except FlashAttnTypeError:
            raise FlashAttnTypeError(
                f"flash_attn: window_size must hold two ints, got {window_size!r}"
            ) from None
        if not isinstance(w, _SYM_INT):
            w = -1 if w < 0 else min(w, INT32_MAX)
        out.append(w)
    return out[0], out[1]


def softmax_scale_arg(softmax_scale):
    """None (the default 1 / sqrt(headdim)) or a finite float; 0 and negative values are
    valid (see flash_attn._common.kernel_q_and_scale)."""
    if softmax_scale is None:
        return None
    s = as_float(softmax_scale, "softmax_scale")
    if not isinstance(s, _SYM_FLOAT):
        check_softmax_scale_value(s)
    return s


def _finite(x):
    # x - x is 0 exactly for finite x, NaN for NaN and +-Inf (a comparison, which torch.compile
    # can guard on, unlike math.isfinite).
    return x - x == 0.0


def check_softmax_scale_value(s):
    if not _finite(s):
        raise FlashAttnValueError(
            f"flash_attn: softmax_scale must be a finite number, got softmax_scale={s}"
        )
    if abs(s) > MAX_SOFTMAX_SCALE:
        raise FlashAttnValueError(
            f"flash_attn: |softmax_scale| must be at most {MAX_SOFTMAX_SCALE:.4g} (the kernels "
            f"compute in float32), got softmax_scale={s}"
        )


def softcap_arg(softcap):
    """A finite float; <= 0 means off (as upstream).  None is a TypeError (upstream's default is
    0.0 and its C++ takes a float)."""
    s = as_float(softcap, "softcap")
    if not isinstance(s, _SYM_FLOAT) and not _finite(s):
        raise FlashAttnValueError(f"flash_attn: softcap must be a finite number, got softcap={s}")
    return s


def dropout_arg(dropout_p):
    p = as_float(dropout_p, "dropout_p")
    if not isinstance(p, _SYM_FLOAT):
        check_dropout_softcap(p, 0.0)
    return p


def check_dropout_softcap(dropout_p, softcap):
    """dropout_p range and softcap with dropout, with upstream's rules."""
    if not (0.0 <= dropout_p < 1.0):
        raise FlashAttnValueError(
            f"flash_attn: dropout_p must be in [0, 1), got dropout_p={dropout_p}"
        )
    if softcap > 0.0 and dropout_p > 0.0:
        # Upstream: "Softcapping does not support dropout for now".
        raise FlashAttnValueError(
            f"flash_attn: softcap > 0 (softcap={softcap}) does not support dropout "
            f"(dropout_p={dropout_p}); softcapping does not support dropout for now, as upstream"
        )


def check_return_softmax(return_softmax, dropout_p):
    if return_softmax and dropout_p == 0.0:
        # Upstream: "return_softmax is only supported when p_dropout > 0.0".
        raise FlashAttnValueError(
            "flash_attn: return_softmax=True is only supported when dropout_p > 0 (S_dmask "
            "encodes the dropout mask)"
        )


def common_args(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                return_attn_probs):
    """The scalar arguments every attention function shares, checked and normalised:
    (dropout_p, softmax_scale or None, causal, (left, right), softcap, deterministic,
    return_attn_probs)."""
    dropout_p = dropout_arg(dropout_p)
    softmax_scale = softmax_scale_arg(softmax_scale)
    causal = as_bool(causal, "causal")
    window = window_pair(window_size)
    softcap = softcap_arg(softcap)
    deterministic = as_bool(deterministic, "deterministic")
    return_attn_probs = as_bool(return_attn_probs, "return_attn_probs")
    check_dropout_softcap(dropout_p, softcap)
    return dropout_p, softmax_scale, causal, window, softcap, deterministic, return_attn_probs


def require_optional_tensor(x, name):
    """x (not None) is a torch.Tensor, else a type error naming the argument."""
    if not isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(f"flash_attn: {name} must be a torch.Tensor or None, got {type(x).__name__}")


def check_alibi(alibi_slopes, batch_size, nheads, device):
    if alibi_slopes is None:
        return
    require_optional_tensor(alibi_slopes, "alibi_slopes")
    if alibi_slopes.dtype != torch.float32:
        raise FlashAttnTypeError(
            f"flash_attn: alibi_slopes must have dtype torch.float32, got {alibi_slopes.dtype}"
        )
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch_size, nheads)):
        raise FlashAttnValueError(
            f"flash_attn: alibi_slopes must have shape (nheads,) = ({nheads},) or (batch_size, "
            f"nheads) = ({batch_size}, {nheads}), got {fmt_shape(alibi_slopes)}"
        )
    if alibi_slopes.numel() > 0 and alibi_slopes.stride(-1) != 1:
        raise FlashAttnValueError(
            "flash_attn: alibi_slopes must have a contiguous last dimension"
        )
    if alibi_slopes.device != device:
        raise FlashAttnValueError(
            f"flash_attn: alibi_slopes is on device {alibi_slopes.device} but q is on device "
            f"{device}"
        )


_SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_learnable_sink(learnable_sink, nheads, device):
    """learnable_sink: None, or one logit per query head, (nheads,) fp32 / bf16 / fp16 on q's
    device (its values may be anything, -inf included)."""
    if learnable_sink is None:
        return
    require_optional_tensor(learnable_sink, "learnable_sink")
    if learnable_sink.dtype not in _SINK_DTYPES:
        raise FlashAttnTypeError(
            f"flash_attn: learnable_sink must have dtype torch.float32, torch.bfloat16 or "
            f"torch.float16, got {learnable_sink.dtype}"
        )
    if tuple(learnable_sink.shape) != (nheads,):
        raise FlashAttnValueError(
            f"flash_attn: learnable_sink must have shape (nheads,) = ({nheads},), got "
            f"{fmt_shape(learnable_sink)}"
        )
    if learnable_sink.device != device:
        raise FlashAttnValueError(
            f"flash_attn: learnable_sink is on device {learnable_sink.device} but q is on device "
            f"{device}"
        )


def check_packed(x, name, dims, n, shape_doc):
    """A packed argument (qkv, kv): a tensor of dims dimensions stacking n tensors at dim -3."""
    if not isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(f"flash_attn: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != dims or x.shape[-3] != n:
        raise FlashAttnValueError(
            f"flash_attn: {name} must have shape {shape_doc}, got shape {fmt_shape(x)}"
        )


def max_seqlen_arg(x, name):
    """max_seqlen_q / max_seqlen_k: an int in [0, MAX_SEQLEN] (C++ rounds it up to a multiple
    of 128 in int32)."""
    return as_int(x, name, 0, MAX_SEQLEN)


def num_splits_arg(x):
    return as_int(x, "num_splits", 0, INT32_MAX)


# ---------------------------------------------------------------------------------------
# Index-tensor values
# ---------------------------------------------------------------------------------------


def _env_default():
    return os.environ.get("FLASH_ATTN_STRICT_CHECKS", "0").strip().lower() in ("1", "true", "on", "yes")


_strict = _env_default()
_local = threading.local()


def set_strict_checks(enabled):
    """Turn the value checks of CUDA index tensors on or off (the default); returns the previous
    setting.  The environment variable FLASH_ATTN_STRICT_CHECKS=1 sets the default to on.  Index
    tensors on the CPU, and Python ints, are always checked.

    What is checked, before anything is launched or written (a rejected call changes nothing):

    - flash_attn_varlen_* and the private ops _flash_attn_varlen_forward / _backward:
      cu_seqlens_q / cu_seqlens_k start at 0, are non-decreasing and end at most at q.shape[0] /
      k.shape[0] (paged: each key sequence fits its block_table row); max_seqlen_q /
      max_seqlen_k are at least the longest sequence (so > 0 where a sequence is non-empty);
      with block_table, the pages each sequence uses are in [0, num_blocks).
    - flash_attn_with_kvcache: cache_seqlens >= 0 and cache_seqlens + seqlen_new within the
      cache (k_cache.shape[1], or block_table.shape[1] * page_block_size); cache_batch_idx in
      [0, k_cache.shape[0]); cache_leftpad in [0, cache_seqlens]; the block_table entries each
      sequence uses in [0, num_blocks).

    Cost: the values live on the GPU, so a call whose index tensors are CUDA tensors copies them
    (the block table reduced on the device to one flag per row) to the host in one transfer,
    which synchronises the current stream once per call: the host waits until the GPU has
    finished the work queued so far, so the CPU can no longer run ahead of the GPU.  The
    backward of the varlen autograd Functions reuses the forward's check while cu_seqlens are
    unchanged (same tensor version), so training pays one synchronisation per forward call.
    Index tensors on the CPU are checked for free.  Measured on the H200 (bf16 d128 decode, 32 q /
    8 kv heads, one query token): with the checks on, b16 x 4k reads 1748 GB/s instead of 3553 and
    b16 x 32k 3741 instead of 4435 (a 16-token paged cache at 4k: 769 instead of 3431), which is
    why they are off by default.

    The host checks are skipped, whatever this setting, while the current CUDA stream is being
    captured into a CUDA graph (a synchronisation is not allowed there) and while torch.compile
    traces the call.

    Whenever the host does not check CUDA index tensors (strict checks off, the default, or
    graph capture), a device-side guard does, without a synchronisation: one small kernel reads
    the same values and checks the same conditions.  A bad value makes that call compute
    nothing (its outputs are zeros) and append nothing to the caches, and records the error;
    the next varlen or KV-cache call raises it (FlashAttnValueError naming the argument and the
    value), as does flash_attn.check_index_errors().  The guard is captured into CUDA graphs with
    the call, so a graph replayed with bad values is caught too.  Its cost is one launch of a
    one-block kernel per call (more blocks, and a 16-byte memset, above 64 paged sequences)."""
    global _strict
    previous = _strict
    _strict = bool(as_bool(enabled, "enabled"))
    return previous


def _device_kind(t):
    return "cuda" if t.is_cuda else t.device.type


def same_device(a, b):
    """a.device == b.device without building torch.device objects (the argument checks run on
    every call, decoding steps included)."""
    return (a.get_device() == b.get_device() and a.is_cuda == b.is_cuda
            and a.is_meta == b.is_meta)


def strict_checks_enabled():
    """Whether the value checks of the index tensors are on (see set_strict_checks)."""
    return _strict


if hasattr(getattr(torch, "compiler", None), "is_compiling"):
    _is_compiling = torch.compiler.is_compiling
else:  # older torch: no torch.compile support here

    def _is_compiling():
        return False


def _capturing(device):
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


class trusted_values:
    """Within this block the value checks are skipped: the caller has checked the same tensors
    already (the varlen backward after its forward)."""

    def __enter__(self):
        _local.trusted = getattr(_local, "trusted", 0) + 1

    def __exit__(self, *exc):
        _local.trusted -= 1


def value_checks_apply(*tensors):
    """Whether the values of these index tensors are checked now (see set_strict_checks):
    always on the CPU, never on meta tensors or inside trusted_values, on CUDA only with strict
    checks on and outside graph capture and torch.compile tracing."""
    if _is_compiling() or getattr(_local, "trusted", 0):
        return False
    first = kind = None
    for t in tensors:
        if t is not None:
            if first is None:
                first, kind = t, _device_kind(t)
            elif _device_kind(t) != kind:
                return False
    if first is None:
        return False
    if kind == "cpu":
        return True
    if kind != "cuda" or not _strict:
        return False
    return not _capturing(first.device)


def device_guard_applies(*tensors):
    """Whether the device-side guard checks these index tensors: CUDA tensors whose values the
    host does not check now (strict checks off, or graph capture), outside trusted_values."""
    if getattr(_local, "trusted", 0):
        return False
    present = [t for t in tensors if t is not None]
    if not present or not all(t.is_cuda for t in present):
        return False
    return not value_checks_apply(*present)


# The codes of csrc/api/index_guard.h (what a device-side guard found wrong) and their wording;
# i: the sequence (or row), j: i + 1, c: the column, v: the value, n: the limit.
_INDEX_ERRORS = {
    1: "cache_seqlens must be >= 0, got cache_seqlens[{i}] = {v}",
    2: "cache_seqlens[{i}] = {v} plus the {c} new rows (k.shape[1]) is past the end of the cache "
       "({n} rows)",
    3: "cache_batch_idx[{i}] = {v} is not an entry of k_cache (must be in [0, k_cache.shape[0] = "
       "{n}))",
    4: "cache_leftpad[{i}] = {v} must be in [0, cache_seqlens[{i}] = {n}]",
    5: "block_table[{i}, {c}] = {v} is not a page index in [0, num_blocks = {n}); sequence {i} "
       "uses that entry",
    14: "key sequence {i} has {v} rows (cu_seqlens_k) but its block_table row holds {n} rows",
}
_INDEX_ERRORS[15] = _INDEX_ERRORS[5]
for _code, (_cu, _max, _total) in ((6, ("cu_seqlens_q", "max_seqlen_q", "q.shape[0]")),
                                   (10, ("cu_seqlens_k", "max_seqlen_k", "k.shape[0]"))):
    _INDEX_ERRORS[_code] = f"{_cu} must start at 0, got {_cu}[0] = {{v}}"
    _INDEX_ERRORS[_code + 1] = (f"{_cu} must be non-decreasing, got {_cu}[{{i}}] = {{v}} > "
                                f"{_cu}[{{j}}] = {{n}}")
    _INDEX_ERRORS[_code + 2] = (f"{_cu}[-1] = {{v}} is past the end of the packed tensor "
                                f"({_total} = {{n}})")
    _INDEX_ERRORS[_code + 3] = (f"{_max} = {{n}} is less than the length of sequence {{i}} "
                                f"({{v}}); {_max} must be at least the longest sequence")


def index_error_message(code, index, column, value, limit):
    """The error for a bad index value that a device-side guard recorded (take_index_error)."""
    template = _INDEX_ERRORS.get(code, "an index tensor held a bad value (guard code {code})")
    what = template.format(i=index, j=index + 1, c=column, v=value, n=limit, code=code)
    return (f"flash_attn: {what}. Found by the device-side check of an earlier call, which "
            "computed nothing and changed no cache (see flash_attn.set_strict_checks to have the "
            "call itself raise)")


def tensor_version(t):
    """t._version, or None where there is none (inference tensors)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _to_host(parts):
    """The int32 tensors in parts (any shapes, one device) on the host, in one transfer."""
    if parts[0].device.type == "cpu":
        return [p.reshape(-1).to(torch.int64) for p in parts]
    sizes = [p.numel() for p in parts]
    flat = parts[0].reshape(-1) if len(parts) == 1 else torch.cat([p.reshape(-1) for p in parts])
    flat = flat.cpu().to(torch.int64)
    return list(torch.split(flat, sizes))


def _used_pages_bad_rows(block_table, lengths, page_block_size, num_blocks):
    """(b,) int32 on block_table's device: 1 where a page that sequence uses (the first
    ceil(lengths[i] / page_block_size) columns) is outside [0, num_blocks)."""
    ncols = block_table.shape[1]
    lengths = lengths.to(torch.int64).clamp(0, ncols * page_block_size)
    need = (lengths + page_block_size - 1) // page_block_size
    used = torch.arange(ncols, device=block_table.device).unsqueeze(0) < need.unsqueeze(1)
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    return bad.any(dim=1).to(torch.int32)


def _first(mask):
    return int(mask.nonzero()[0, 0])


def _raise_first(bad, message):
    """FlashAttnValueError("flash_attn: " + message(i)) for the first i where bad[i], if any."""
    if bool(bad.any()):
        raise FlashAttnValueError("flash_attn: " + message(_first(bad)))


def _block_table_error(block_table, lengths, page_block_size, num_blocks, row, seq_what):
    lengths = lengths.to(torch.int64).clamp(0, block_table.shape[1] * page_block_size)
    need = int((lengths[row] + page_block_size - 1) // page_block_size)
    entries = block_table[row, :need].to(torch.int64).cpu()
    col = _first((entries < 0) | (entries >= num_blocks))
    raise FlashAttnValueError(
        f"flash_attn: block_table[{row}, {col}] = {int(entries[col])} is not a page index in "
        f"[0, num_blocks={num_blocks}); sequence {row} ({seq_what} {int(lengths[row])} rows) "
        f"uses the first {need} entries of its block_table row"
    )


def _check_cu_seqlens(cu, name, total, max_seqlen, max_name, total_what):
    if cu.numel() == 0:
        return
    if int(cu[0]) != 0:
        raise FlashAttnValueError(f"flash_attn: {name} must start at 0, got {name}[0] = {int(cu[0])}")
    lens = cu[1:] - cu[:-1]
    if lens.numel() == 0:
        return
    neg = lens < 0
    if bool(neg.any()):
        i = _first(neg)
        raise FlashAttnValueError(
            f"flash_attn: {name} must be non-decreasing, got {name}[{i}] = {int(cu[i])} > "
            f"{name}[{i + 1}] = {int(cu[i + 1])}"
        )
    if total is not None and int(cu[-1]) > total:
        raise FlashAttnValueError(
            f"flash_attn: {name}[-1] = {int(cu[-1])} is past the end of the packed tensor "
            f"({total_what} = {total})"
        )
    longest = int(lens.max())
    if longest > max_seqlen:
        i = _first(lens == longest)
        raise FlashAttnValueError(
            f"flash_attn: {max_name} = {max_seqlen} is less than the length of sequence {i} "
            f"({name}[{i + 1}] - {name}[{i}] = {longest}); {max_name} must be at least the longest "
            "sequence (> 0 when a sequence is non-empty)"
        )


def check_varlen_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q,
                        max_seqlen_k, block_table=None, page_block_size=0, num_blocks=0):
    """The values of cu_seqlens_q / cu_seqlens_k (and block_table) against the packed totals and
    max_seqlen (see set_strict_checks).  total_k is None with block_table (paged keys)."""
    if not value_checks_apply(cu_seqlens_q, cu_seqlens_k, block_table):
        return
    parts = [cu_seqlens_q, cu_seqlens_k]
    if block_table is not None:
        lens_k = cu_seqlens_k[1:].to(torch.int64) - cu_seqlens_k[:-1].to(torch.int64)
        parts.append(_used_pages_bad_rows(block_table, lens_k, page_block_size, num_blocks))
    host = _to_host(parts)
    _check_cu_seqlens(host[0], "cu_seqlens_q", total_q, max_seqlen_q, "max_seqlen_q",
                      "q.shape[0]")
    _check_cu_seqlens(host[1], "cu_seqlens_k", total_k, max_seqlen_k, "max_seqlen_k",
                      "k.shape[0]")
    if block_table is not None:
        cu_k = host[1]
        lens_k = cu_k[1:] - cu_k[:-1]
        rows = block_table.shape[1] * page_block_size
        over = lens_k > rows
        if bool(over.any()):
            i = _first(over)
            raise FlashAttnValueError(
                f"flash_attn: key sequence {i} has {int(lens_k[i])} rows (cu_seqlens_k) but its "
                f"block_table row holds {block_table.shape[1]} pages of {page_block_size} = "
                f"{rows} rows"
            )
        bad = host[2] != 0
        if bool(bad.any()):
            _block_table_error(block_table, lens_k.to(block_table.device), page_block_size,
                               num_blocks, _first(bad), "key length")


def check_kvcache_values(cache_seqlens, seqlen_new, seqlen_cache, batch_cache, cache_batch_idx,
                         cache_leftpad, block_table=None, page_block_size=0, num_blocks=0,
                         lengths_hint=None):
    """The values of the KV-cache index tensors (see set_strict_checks).  cache_seqlens: (b,)
    int32 or None (the whole cache; zeros with new k/v); seqlen_new: k.shape[1] (0 without new
    k/v); seqlen_cache: the rows a sequence can hold; batch_cache: k_cache.shape[0];
    lengths_hint: cache_seqlens as the int it was made from (then pass cache_seqlens=None)."""
    if not value_checks_apply(cache_seqlens, cache_batch_idx, cache_leftpad, block_table):
        return

    def lengths():  # the rows each sequence has after the append, on block_table's device
        if cache_seqlens is not None:
            return cache_seqlens.to(torch.int64) + seqlen_new
        if lengths_hint is not None:
            full = lengths_hint + seqlen_new
        else:
            full = seqlen_new if seqlen_new > 0 else seqlen_cache
        return torch.full((block_table.shape[0],), full, dtype=torch.int64,
                          device=block_table.device)

    names, parts = [], []
    for t, name in ((cache_seqlens, "cache_seqlens"), (cache_batch_idx, "cache_batch_idx"),
                    (cache_leftpad, "cache_leftpad")):
        if t is not None:
            names.append(name)
            parts.append(t)
    if block_table is not None:
        names.append("block_table")
        parts.append(_used_pages_bad_rows(block_table, lengths(), page_block_size, num_blocks))
    host = dict(zip(names, _to_host(parts)))
    new_s = f" + seqlen_new ({seqlen_new}, k.shape[1])" if seqlen_new else ""
    where = (f"block_table.shape[1] * page_block_size = {seqlen_cache}" if block_table is not None
             else f"k_cache.shape[1] = {seqlen_cache}")
    seqlens = host.get("cache_seqlens")
    if seqlens is not None:
        _raise_first(seqlens < 0, lambda i: f"cache_seqlens must be >= 0, got cache_seqlens[{i}] = "
                                            f"{int(seqlens[i])}")
        _raise_first(seqlens + seqlen_new > seqlen_cache,
                     lambda i: f"cache_seqlens[{i}] = {int(seqlens[i])}{new_s} is past the end of "
                               f"the cache ({where} rows)")
    bidx = host.get("cache_batch_idx")
    if bidx is not None:
        _raise_first((bidx < 0) | (bidx >= batch_cache),
                     lambda i: f"cache_batch_idx[{i}] = {int(bidx[i])} is not an entry of k_cache "
                               f"(must be in [0, k_cache.shape[0] = {batch_cache}))")
    leftpad = host.get("cache_leftpad")
    if leftpad is not None:
        if seqlens is not None:
            limit, limit_s = seqlens, "cache_seqlens[{i}] = {v}"
        else:
            full = 0 if seqlen_new > 0 else seqlen_cache
            limit = torch.full_like(leftpad, full)
            limit_s = ("the cache's rows in use ({v}; cache_seqlens is None)" if not seqlen_new
                       else "cache_seqlens[{i}] = {v} (None: appending at row 0)")
        bad = (leftpad < 0) | (leftpad > limit)
        if bool(bad.any()):
            i = _first(bad)
            raise FlashAttnValueError(
                f"flash_attn: cache_leftpad[{i}] = {int(leftpad[i])} must be in [0, "
                + limit_s.format(i=i, v=int(limit[i])) + "]"
            )
    rows = host.get("block_table")
    if rows is not None:
        bad = rows != 0
        if bool(bad.any()):
            _block_table_error(block_table, lengths(), page_block_size, num_blocks, _first(bad),
                               "cache length after the append" if seqlen_new else "cache length")
