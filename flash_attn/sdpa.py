"""torch.nn.functional.scaled_dot_product_attention on flash_attn's kernels.

``flash_attn.sdpa.activate()`` registers this package's kernels for aten's flash-attention ops
on CUDA through torch's flash-attention registry (torch.nn.attention.register_flash_attention_impl
and activate_flash_attention_impl, under the name "flash_attn"): SDPA calls that take the flash
backend, and torch.nn.attention.varlen, then run them.  ``deactivate()`` restores torch's own
kernels.  Importing this module registers nothing with the dispatcher (torch asks providers for an
explicit opt-in).

The kernels are written against each op's schema as the running torch defines it: arguments are
bound by name, arguments this module does not know must keep their defaults, and calls it cannot
serve raise RuntimeError, as torch's own FA3 / FA4 providers do (torch/nn/attention/_fa4.py):
return_debug_mask=True, alibi_slopes (the backward op never sees them), and anything our kernels
reject (dtype, head dim, heads, a configuration this build left out).

SDPA's own pair, _scaled_dot_product_flash_attention and its backward, run on C++ kernels
(csrc/api/sdpa.cpp) where the extension has them for the running torch's schemas: at short
sequences a forward takes less GPU time than the host takes to run a Python kernel.  They hand
the calls they do not take (head dims that need padding, scales <= 0, return_debug_mask, inputs
the checks reject) to the Python kernels here, with the same results and errors.

Dropout: the forward returns our Philox (seed, offset) as the ``rng_state`` (uint64, (2,)) and an
empty ``unused`` tensor, and the backward reads them back.  The mask is our kernels' own, so a
forward and a backward only agree when both run here, not across torch's kernels and ours.
"""

import warnings

import torch

from flash_attn import _common, _varlen_kvcache
from flash_attn import flash_attn_interface as _fai
from flash_attn._common import _default_softmax_scale, _pad_to_multiple_of_8

__all__ = ["IMPL_NAME", "activate", "deactivate", "is_active"]

IMPL_NAME = "flash_attn"

_REGISTRY_FUNCTIONS = ("register_flash_attention_impl", "activate_flash_attention_impl",
                       "restore_flash_attention_impl", "current_flash_attention_impl")


class _Unsupported(RuntimeError):
    """A call the kernels here cannot serve (see the module docstring)."""


def _window(size):
    # aten's None (unbounded) is -1 for our kernels.
    return -1 if size is None else int(size)


def _in_layout_of(x, ref):
    """x with ref's strides: torch's meta functions promise empty_like(ref), and torch.compile's
    generated code asserts those strides."""
    return x if x.stride() == ref.stride() else torch.empty_like(ref).copy_(x)


def _forward(a):
    """(out, softmax_lse, rng_state) for the bound arguments a of _flash_attention_forward:
    (batch, seqlen, nheads, headdim) tensors, or packed (total, nheads, headdim) ones with
    cum_seq_q / cum_seq_k (our varlen kernels)."""
    if a["return_debug_mask"]:
        raise _Unsupported("return_debug_mask must be False")
    q, k, v, cu_q, cu_k = a["query"], a["key"], a["value"], a["cum_seq_q"], a["cum_seq_k"]
    d = q.shape[-1]
    if v.shape[-1] != d:
        # aten's flash ops give out query's shape; torch's own flash kernels take one head dim.
        raise _Unsupported("value must have query's head dim")
    scale = _default_softmax_scale(a["scale"], d)
    window = (_window(a.get("window_size_left")), _window(a.get("window_size_right")))
    common = (a["dropout_p"], scale, a["is_causal"], *window)
    if cu_q is None:
        if cu_k is not None or a.get("seqused_k") is not None:
            raise _Unsupported("cum_seq_k and seqused_k need cum_seq_q (the varlen path)")
        _fai._check_inputs(q, k, v, a["dropout_p"], a["is_causal"], window, 0.0, None, False,
                           softmax_scale=scale)
        q, k, v = (_pad_to_multiple_of_8(x, d) for x in (q, k, v))
        out, lse, _, rng_state = _fai._flash_attn_forward_impl(q, k, v, *common, 0.0, None, False)
    else:
        q, k, v = (_pad_to_multiple_of_8(x, d) for x in (q, k, v))
        out, lse, _, rng_state = _varlen_kvcache._wrapped_flash_attn_varlen_forward(
            q, k, v, cu_q, cu_k, a["max_q"], a["max_k"], *common, seqused_k=a.get("seqused_k"))
    if out.shape[-1] != d:
        out = out[..., :d]
    return _in_layout_of(out, a["query"]), lse, rng_state


def _backward(a, rng_state):
    """(dq, dk, dv) for the bound arguments a of _flash_attention_backward (see _forward)."""
    q, cu_q, cu_k = a["query"], a["cum_seq_q"], a["cum_seq_k"]
    d = q.shape[-1]
    dout, q, k, v, out = (_pad_to_multiple_of_8(a[n], d)
                          for n in ("grad_out", "query", "key", "value", "out"))
    # empty_like keeps a transposed view's strides, so SDPA's gradients come back in its layout.
    grads = [torch.empty_like(x) for x in (q, k, v)]
    window = (_window(a.get("window_size_left")), _window(a.get("window_size_right")))
    common = (a["dropout_p"], _default_softmax_scale(a["scale"], d), a["is_causal"], *window,
              0.0, None, torch.are_deterministic_algorithms_enabled())
    if rng_state is not None and rng_state.dtype == torch.uint64:
        rng_state = rng_state.view(torch.int64)
    if cu_q is None:
        _fai._flash_attn_backward_impl(dout, q, k, v, out, a["logsumexp"], *grads, *common,
                                       rng_state=rng_state)
    else:
        _varlen_kvcache._wrapped_flash_attn_varlen_backward(
            dout, q, k, v, out, a["logsumexp"], *grads, cu_q, cu_k, a["max_q"], a["max_k"],
            *common, rng_state=rng_state)
    if grads[0].shape[-1] != d:
        grads = [g[..., :d] for g in grads]
    return tuple(_in_layout_of(g, a[n]) for g, n in zip(grads, ("query", "key", "value")))


def _aux(q, rng_state):
    """aten's rng_state, unused and debug_attn_mask outputs for our rng_state."""
    return (rng_state.view(torch.uint64), torch.empty((), dtype=torch.uint64, device=q.device),
            torch.empty(0, dtype=q.dtype, device=q.device))


def _flash_attention_forward(a):
    out, lse, rng_state = _forward(a)
    return (out, lse, *_aux(a["query"], rng_state))


def _flash_attention_forward_no_dropout_inplace(a):
    out, lse, _ = _forward(a)
    a["out"].copy_(out)
    return lse


def _flash_attention_backward(a):
    return _backward(a, a["rng_state"])


def _transposed(a, names):
    # SDPA's (batch, nheads, seqlen, headdim) as the (batch, seqlen, nheads, headdim) views
    # the kernels take.
    return {**a, **{n: a[n].transpose(1, 2) for n in names}, "cum_seq_q": None,
            "cum_seq_k": None}


def _scaled_dot_product_flash_attention(a):
    t = _transposed(a, ("query", "key", "value"))
    out, lse, rng_state = _forward(t)
    q, k = a["query"], a["key"]
    return (out.transpose(1, 2), lse, None, None, q.shape[2], k.shape[2],
            *_aux(q, rng_state))


def _scaled_dot_product_flash_attention_backward(a):
    t = _transposed(a, ("grad_out", "query", "key", "value", "out"))
    return tuple(g.transpose(1, 2) for g in _backward(t, a["philox_seed"]))


_FORWARD_ARGS = ("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
                 "dropout_p", "is_causal", "return_debug_mask", "scale")
_BACKWARD_ARGS = ("grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q",
                  "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "scale")
_FORWARD_OPTIONAL = ("window_size_left", "window_size_right", "seqused_k", "num_splits")
# op -> (implementation, the arguments it needs, the ones it reads or ignores where the running
# schema has them).  Every other argument must keep its default: alibi_slopes and block_table
# are among those, as torch's FA3 / FA4 providers leave them out on Hopper.
_OPS = {
    "_scaled_dot_product_flash_attention": (
        _scaled_dot_product_flash_attention,
        ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale"), ()),
    "_scaled_dot_product_flash_attention_backward": (
        _scaled_dot_product_flash_attention_backward, _BACKWARD_ARGS + ("philox_seed",),
        ("philox_offset",)),
    "_flash_attention_forward": (_flash_attention_forward, _FORWARD_ARGS, _FORWARD_OPTIONAL),
    "_flash_attention_backward": (
        _flash_attention_backward, _BACKWARD_ARGS + ("rng_state",),
        ("unused", "window_size_left", "window_size_right")),
}
# Registered where the running torch has them.
_OPTIONAL_OPS = {
    "_flash_attention_forward_no_dropout_inplace": (
        _flash_attention_forward_no_dropout_inplace, ("out",) + _FORWARD_ARGS, _FORWARD_OPTIONAL),
}


class _Binder:
    """Binds the arguments of one op's calls by name, defaults filled in (the dispatcher leaves
    out arguments equal to their defaults).  The schema is read once: its accessors are pybind
    calls, too slow for every call at short sequences, where SDPA's host time shows."""

    def __init__(self, schema):
        self.name = schema.name
        self.names = tuple(arg.name for arg in schema.arguments)
        self.defaults = tuple(arg.default_value if arg.has_default_value() else _REQUIRED
                              for arg in schema.arguments)

    def __call__(self, args, kwargs):
        n = len(args)
        bound = dict(zip(self.names, args))
        for name, default in zip(self.names[n:], self.defaults[n:]):
            value = kwargs.get(name, default)
            if value is _REQUIRED:
                raise TypeError(f"{self.name}: missing argument {name}")
            bound[name] = value
        return bound


_REQUIRED = object()


def bind(schema, args, kwargs):
    """The arguments of one call of the op with this schema, by name, defaults filled in."""
    return _Binder(schema)(args, kwargs)


def _is_default(value, default):
    return value is default or (not isinstance(value, torch.Tensor) and value == default)


def make_kernel(schema, impl, needed, optional):
    """The kernel for the op with this schema: binds its arguments by name and calls impl.
    Raises RuntimeError here if the schema lacks an argument in needed or has one without a
    default that impl does not know; the kernel raises one for a call that sets an unknown
    argument to anything but its default."""
    names = [arg.name for arg in schema.arguments]
    missing = [n for n in needed if n not in names]
    unknown = [arg for arg in schema.arguments if arg.name not in needed + optional]
    no_default = [arg.name for arg in unknown if not arg.has_default_value()]
    if missing or no_default:
        raise RuntimeError(
            f"flash_attn.sdpa: torch {torch.__version__}'s {schema.name} has a schema this "
            f"module does not know ({schema}): "
            + "; ".join(([f"missing {missing}"] if missing else [])
                        + ([f"unknown arguments without defaults {no_default}"]
                           if no_default else [])))

    binder = _Binder(schema)
    checked = tuple((arg.name, arg.default_value) for arg in unknown)

    def kernel(*args, **kwargs):
        a = binder(args, kwargs)
        for name, default in checked:
            value = a[name]
            if not _is_default(value, default):
                shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
                raise RuntimeError(f"flash_attn SDPA kernel for {schema.name} unsupported: "
                                   f"{name}={shown} (only {default!r})")
        try:
            return impl(a)
        except _Unsupported as e:
            raise RuntimeError(f"flash_attn SDPA kernel for {schema.name} unsupported: {e}") \
                from None

    kernel.__name__ = f"flash_attn_{schema.name.split('::')[-1]}"
    return kernel


def _schema(op):
    packet = getattr(torch.ops.aten, op, None)
    overload = getattr(packet, "default", None) if packet is not None else None
    return None if overload is None else overload._schema


def kernels():
    """{op name: kernel} for the running torch's aten ops; RuntimeError naming the torch version
    and what is missing if an op this module needs does not exist."""
    missing = [op for op in _OPS if _schema(op) is None]
    if missing:
        raise RuntimeError(
            f"flash_attn.sdpa: torch {torch.__version__} has no aten op(s) "
            f"{', '.join(missing)}.default, which flash_attn's SDPA kernels replace")
    ops = {**_OPS, **{op: v for op, v in _OPTIONAL_OPS.items() if _schema(op) is not None}}
    return {op: make_kernel(_schema(op), *v) for op, v in ops.items()}


# SDPA's ops whose CUDA kernels are C++ (csrc/api/sdpa.cpp) where the extension has them and the
# running torch's schema is the one they read (argument names in order): a forward at short
# sequences takes less GPU time than a Python kernel takes on the host.  Their Python kernels
# then serve, as CUDA kernels of ops of our own (aten's schema under the flash_attn namespace,
# the name + "_fallback"), the calls the C++ ones hand over.
_CPP_OPS = {
    "_scaled_dot_product_flash_attention": (
        "query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale"),
    "_scaled_dot_product_flash_attention_backward": (
        "grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q", "cum_seq_k", "max_q",
        "max_k", "dropout_p", "is_causal", "philox_seed", "philox_offset", "scale"),
}


def _extension_with_cpp_kernels():
    """(the extension, the ops of _CPP_OPS it has C++ kernels for under this torch's schemas), or
    (None, ()) where it has none."""
    try:
        ext = _common._get_ext()
    except (ImportError, RuntimeError):
        return None, ()
    if not hasattr(ext, "sdpa_register"):
        return None, ()
    ops = tuple(op for op, names in _CPP_OPS.items()
                if _schema(op) is not None
                and tuple(arg.name for arg in _schema(op).arguments) == names)
    return (ext, ops) if ops else (None, ())


class _Handle:
    """What torch's registry keeps while our kernels are active; remove() unregisters them."""

    def __init__(self, libraries, ext=None):
        self.libraries = libraries
        self.ext = ext

    def remove(self):
        if self.ext is not None:
            self.ext.sdpa_unregister()
            self.ext = None
        for library in self.libraries:
            library._destroy()
        self.libraries = []


def register_kernels(dispatch_key="CUDA"):
    """Register the kernels for aten's ops under dispatch_key; returns the handle that removes
    them.  activate() is the way in: this is the registry's register_fn."""
    ks = kernels()
    ext, cpp_ops = _extension_with_cpp_kernels() if dispatch_key == "CUDA" else (None, ())
    handle = _Handle([torch.library.Library("aten", "IMPL", dispatch_key)])
    try:
        with warnings.catch_warnings():
            # Replacing torch's kernel is the point; the dispatcher warns about it.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered")
            for op, kernel in ks.items():
                if op not in cpp_ops:
                    handle.libraries[0].impl(op, kernel, dispatch_key)
            if cpp_ops:
                fallbacks = torch.library.Library("flash_attn", "FRAGMENT")
                handle.libraries.append(fallbacks)
                handle.ext = ext
                for op in cpp_ops:
                    fallbacks.define(str(_schema(op)).replace(f"aten::{op}(", f"{op}_fallback(", 1))
                    fallbacks.impl(f"{op}_fallback", ks[op], dispatch_key)
                    ext.sdpa_register(op, f"flash_attn::{op}_fallback")
    except BaseException:
        handle.remove()
        raise
    return handle


def cpp_kernels_active():
    """(forward, backward): whether SDPA's flash ops run on the C++ kernels (while our kernels
    are active)."""
    ext, _ = _extension_with_cpp_kernels()
    return (False, False) if ext is None else tuple(bool(x) for x in ext.sdpa_registered())


def _registry():
    attention = torch.nn.attention
    missing = [n for n in _REGISTRY_FUNCTIONS if not hasattr(attention, n)]
    if missing:
        raise RuntimeError(
            f"flash_attn.sdpa: torch {torch.__version__} has no torch.nn.attention."
            f"{', '.join(missing)} (the flash-attention implementation registry), so "
            "scaled_dot_product_attention cannot be routed to flash_attn; use a torch that has "
            "it, or call flash_attn_func directly")
    return attention


def activate():
    """Route aten's flash-attention ops on CUDA (and so F.scaled_dot_product_attention's flash
    backend) to flash_attn's kernels, through torch's registry under IMPL_NAME."""
    attention = _registry()
    attention.register_flash_attention_impl(IMPL_NAME, register_fn=register_kernels)
    attention.activate_flash_attention_impl(IMPL_NAME)


def deactivate():
    """Restore torch's own flash-attention kernels if ours are active."""
    if is_active():
        torch.nn.attention.restore_flash_attention_impl()


def is_active():
    current = getattr(torch.nn.attention, "current_flash_attention_impl", None)
    return current is not None and current() == IMPL_NAME
