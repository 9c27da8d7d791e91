"""Pieces shared by the dense (flash_attn_interface) and the varlen / KV-cache
(_varlen_kvcache) entry points: loading the extension, the custom-op shims, head-dim padding
and the softmax_scale transform in front of the kernels.  Imports only flash_attn._checks."""

import functools
import importlib
import inspect

import torch
import torch.nn.functional as F

from flash_attn._checks import FlashAttnValueError, MAX_SOFTMAX_SCALE, check_softmax_scale_value

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# "meta" is accepted so that shape inference (meta device, fake tensors) works; the op's
# fake implementation handles it.  Real computation needs CUDA.
_ALLOWED_DEVICE_TYPES = ("cuda", "meta")
_MAX_HEADDIM = 256
# The dense and varlen forwards without pages (flash_attn_func, its packed forms,
# flash_attn_varlen_func and the private forward ops) take head dims up to this, the ones above
# _MAX_HEADDIM on the sm_90a forward alone: plain attention, no backward (check_forward_only).
_MAX_HEADDIM_FWD = 512


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


def register_fake_for(op_name, op_fn):
    """Decorator: register the function as the fake (meta) implementation of the custom op
    op_name, whose Python signature is op_fn's (a plain function, or the custom op made from
    one).  The signature is written once, on op_fn: the fake is called with the op's arguments
    bound to op_fn's parameter names, defaults filled in, and takes the ones it reads by name
    (the rest in **_).  The function returned takes the arguments as op_fn does."""
    # A CustomOpDef keeps the function it was made from; its own signature is (*args, **kwargs).
    signature = inspect.signature(getattr(op_fn, "_init_fn", op_fn))

    def wrap(fake):
        @functools.wraps(fake)
        def bound_fake(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return fake(**bound.arguments)

        bound_fake.__signature__ = signature
        return _torch_register_fake_wrapper(op_name)(bound_fake)

    return wrap


def registered_op(name, fn):
    """What the entry points call for the custom op flash_attn::<name> made from fn: the op
    (so that torch.compile sees it), or fn itself on torch without custom ops."""
    return getattr(torch.ops.flash_attn, name) if _HAS_CUSTOM_OP else fn


def _is_compiling():
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def round_multiple(x, m):
    return (x + m - 1) // m * m


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride()[-1] != 1 else x


def kernel_head_dim(head_dim_qk, head_dim_v):
    """The one head dim the kernels run q, k and v at: the larger of q/k's and v's, rounded up
    to a multiple of 8 (the kernels move 16-byte vectors).  Zero columns appended to q and k add
    nothing to the scores; zero columns appended to v give zero output columns, cut off after
    the kernel.  So a v head dim other than q/k's (MLA: 192 and 128) runs at the larger one."""
    return round_multiple(max(head_dim_qk, head_dim_v), 8)


def pad_head_dim(x, head_dim):
    """x zero-padded in its last dimension to head_dim; x itself (no copy) when it has it."""
    if x is None or x.shape[-1] == head_dim:
        return x
    return F.pad(x, [0, head_dim - x.shape[-1]])


def _pad_to_multiple_of_8(x, head_size_og):
    """The kernels need headdim % 8 == 0: zero-pad the last dimension by what head_size_og
    lacks of a multiple of 8 (as upstream)."""
    return pad_head_dim(x, x.shape[-1] + (-head_size_og) % 8)


def check_head_dims(q, k, v, names=("q", "k", "v"), max_headdim=_MAX_HEADDIM):
    """The head dims (last dimension) of q, k, v: k's must be q's, each of q's and v's in
    [1, max_headdim]; v's may differ from q's (see kernel_head_dim)."""
    qn, kn, vn = names
    for x, name in ((q, qn), (v, vn)):
        if not (1 <= x.shape[-1] <= max_headdim):
            raise FlashAttnValueError(
                f"flash_attn: {name} has headdim {x.shape[-1]}; headdim must be between 1 and "
                f"{max_headdim}"
                + (f" (up to {_MAX_HEADDIM_FWD} in the forward without a KV cache or pages)"
                   if max_headdim < _MAX_HEADDIM_FWD else "")
            )
    if k.shape[-1] != q.shape[-1]:
        raise FlashAttnValueError(
            f"flash_attn: {kn} has headdim {k.shape[-1]} but {qn} has headdim {q.shape[-1]}; q "
            "and k must have the same headdim (v's may differ)"
        )


def _forward_takes_head_dim_v(q, v):
    """Whether the forward kernel call (dense, or varlen without pages) takes v at its own head
    dim (a multiple of 8 below q's: DeepSeek MLA's 192 / 128), running a kernel with that V width
    where one is built and serves the call, else padding V itself (csrc/api/dense.cpp, varlen.cpp)."""
    dq, dv = q.shape[-1], v.shape[-1]
    if not (dv < dq and dq % 8 == 0 and dv % 8 == 0 and q.is_cuda):
        return False
    try:
        return bool(getattr(_get_ext(), "fwd_takes_head_dim_v", False))
    except ImportError:
        return False


def _backward_takes_head_dim_v(q, v, dropout_p):
    """Whether the backward kernel call (dense, or varlen without deterministic) should get v, out,
    dout and dv at v's own head dim:
    where the extension takes them (bwd_takes_head_dim_v) and its kernel with that V width serves
    the call: the sm_90a warp-specialised split-d backward (csrc/dispatch/flash_bwd_ws_launch_sm90.h,
    run_mha_bwd_ws_sm90_head_dim_v) at q / k head dims 129-192 (tile 192) with v's a multiple of 8
    up to 128, without dropout, on a compute capability 9.0 device. Elsewhere the tensors are
    padded here as before (the binding would pad them itself: same cost, one more copy path)."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if not (q.is_cuda and dropout_p == 0.0 and d_v < d_qk and 128 < d_qk <= 192 and d_qk % 8 == 0
            and d_v % 8 == 0 and d_v <= 128):
        return False
    try:
        ext = _get_ext()
    except ImportError:
        return False
    if not getattr(ext, "bwd_takes_head_dim_v", False):
        return False
    return torch.cuda.get_device_capability(q.device) == (9, 0)


def check_forward_only(q, v, dropout_p, softcap, alibi_slopes, needs_backward, paged=False):
    """Head dims above _MAX_HEADDIM (up to _MAX_HEADDIM_FWD) run on a plain forward of their
    own: no pages, dropout, softcap or ALiBi, and no backward (needs_backward: an autograd graph
    would be recorded).  One comparison for the head dims up to _MAX_HEADDIM."""
    d = max(q.shape[-1], v.shape[-1])
    if d <= _MAX_HEADDIM:
        return
    if d > _MAX_HEADDIM_FWD:
        raise FlashAttnValueError(
            f"flash_attn: q and v have headdims {q.shape[-1]} and {v.shape[-1]}; headdim must be "
            f"between 1 and {_MAX_HEADDIM_FWD}")
    where = f"flash_attn: head dims above {_MAX_HEADDIM} (here {d})"
    if paged:
        raise FlashAttnValueError(f"{where} have no paged-KV kernel: block_table must be None")
    if dropout_p > 0.0 or softcap > 0.0 or alibi_slopes is not None:
        raise FlashAttnValueError(
            f"{where} run plain attention only: dropout_p must be 0, softcap 0 and alibi_slopes "
            "None")
    if needs_backward:
        raise FlashAttnValueError(
            f"{where} have a forward only, and these inputs require grad: call under "
            "torch.no_grad() or torch.inference_mode(), or detach them")


def pad_qkv(q, k, v, names=("q", "k", "v"), keep_v=False, takes_head_dim_v=None):
    """(q, k, v) at kernel_head_dim: the tensors themselves when the head dims of q and v are
    equal and a multiple of 8 (the callers that pad already pay nothing more), else padded
    copies, after check_head_dims (padding must not hide a k whose head dim is not q's).
    keep_v (the forwards without pages): v keeps a smaller head dim where the kernel call takes it
    (takes_head_dim_v(q, v): by default _forward_takes_head_dim_v)."""
    d = kernel_head_dim(q.shape[-1], v.shape[-1])
    if q.shape[-1] == v.shape[-1] == d:
        return q, k, v
    # (Each entry point has checked its own, lower, limit.)
    check_head_dims(q, k, v, names, max_headdim=_MAX_HEADDIM_FWD)
    if keep_v and (takes_head_dim_v or _forward_takes_head_dim_v)(q, v):
        return q, k, v
    return pad_head_dim(q, d), pad_head_dim(k, d), pad_head_dim(v, d)


def out_at_head_dim(out, head_dim_v):
    """The forward ops' out cut back to v's head dim: out itself when the kernel ran at it, else
    a contiguous copy (the ops' fakes promise a contiguous out)."""
    return out if out.shape[-1] == head_dim_v else out[..., :head_dim_v].contiguous()


def grads_at_kernel_head_dim(dout, q, k, v, out, dq, dk, dv, dropout_p=None):
    """The backward ops' tensors at kernel_head_dim (see pad_qkv): (dout, q, k, v, out, grads),
    grads the buffers for the kernel to write dq, dk, dv into: the given ones where the kernel
    runs at their head dim, else new ones, which copy_grads_back writes back.
    dropout_p (None: always pad): v, out, dout and dv keep v's head dim where the
    backward kernel takes it (_backward_takes_head_dim_v)."""
    grads = [dq, dk, dv]
    keep_v = dropout_p is not None and out.shape[-1] == v.shape[-1] and dout.shape[-1] == v.shape[-1]
    q_p, k_p, v_p = pad_qkv(q, k, v, keep_v=keep_v,
                            takes_head_dim_v=lambda q_, v_: _backward_takes_head_dim_v(q_, v_, dropout_p))
    d = q_p.shape[-1]
    if q_p is q and v_p is v:
        return dout, q, k, v, out, grads
    for i, (g, x, name) in enumerate(((dq, q, "q"), (dk, k, "k"), (dv, v, "v"))):
        if g is None:
            continue
        if g.shape != x.shape:
            raise FlashAttnValueError(
                f"flash_attn: d{name} must have {name}'s shape {tuple(x.shape)}, got "
                f"{tuple(g.shape)}"
            )
        if g.shape[-1] != d:
            grads[i] = g.new_empty(g.shape[:-1] + (d,))
    return pad_head_dim(dout, d), q_p, k_p, v_p, pad_head_dim(out, d), grads


def copy_grads_back(given, grads):
    """Write the gradients the kernel wrote into new buffers (grads_at_kernel_head_dim) into the
    caller's dq, dk, dv, cut to their head dims."""
    for g, buf in zip(given, grads):
        if g is not None and buf is not g:
            g.copy_(buf[..., :g.shape[-1]])


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


# ---------------------------------------------------------------------------------------
# Pieces of the ops and autograd Functions, shared by the dense and the varlen entry points.
# The callers pass their op (or its implementation) in, so that what each module exposes
# (its _wrapped_* ops, _ext_for) is looked up there, at call time.
# ---------------------------------------------------------------------------------------


def check_backward_head_dims(q, k, v):
    """The backward's head dims: up to _MAX_HEADDIM (one comparison when they are)."""
    if max(q.shape[-1], v.shape[-1]) > _MAX_HEADDIM:
        check_head_dims(q, k, v)


def check_rng_state(dropout_p, rng_state):
    """The backward with dropout replays the forward's mask: it needs the forward's rng_state."""
    if dropout_p > 0.0 and rng_state is None:
        raise FlashAttnValueError(
            "flash_attn: the backward with dropout_p > 0 needs rng_state from the forward"
        )


def _kernel_aligned(t):
    # csrc/api/params.cpp is_aligned, for 16-bit elements: 16-byte rows and start.
    return (t.stride(-1) == 1 and t.storage_offset() % 8 == 0
            and all(t.stride(i) % 8 == 0 or t.shape[i] <= 1 for i in range(t.dim() - 1)))


def kernel_output_like(q):
    """An uninitialised tensor of q's shape in the layout the extension gives a fresh output
    (csrc/api/params.cpp output_or_new): q's own where q is aligned and empty_like keeps it,
    else contiguous."""
    if _kernel_aligned(q):
        out = torch.empty_like(q)
        if _kernel_aligned(out):
            return out
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def fake_forward_outputs(q, v, lse_shape, return_softmax, batch_size, seqlen_q, seqlen_k):
    """(out, softmax_lse, S_dmask, rng_state) as the forward ops return them, for the fakes: out
    has q's shape with v's head dim, in q's layout where the kernel writes it as it is (no
    padding, see kernel_output_like), else contiguous (out_at_head_dim); S_dmask
    (return_softmax) is (batch, nheads, round128(seqlen_q), round128(seqlen_k))."""
    num_heads = q.shape[-2]
    if q.shape[-1] == v.shape[-1] == kernel_head_dim(q.shape[-1], v.shape[-1]):
        out = kernel_output_like(q)
    else:
        out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    softmax_lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if return_softmax:
        S_dmask = torch.empty((batch_size, num_heads, round_multiple(seqlen_q, 128),
                               round_multiple(seqlen_k, 128)), dtype=q.dtype, device=q.device)
    else:
        S_dmask = torch.empty((0,), dtype=q.dtype, device=q.device)
    rng_state = torch.empty((2,), dtype=torch.int64, device=q.device)
    return out, softmax_lse, S_dmask, rng_state


def sink_kwargs(learnable_sink):
    """The keyword the ops and the extension take the learnable sink by, only when there is one
    (calls without a sink are the upstream calls, argument for argument)."""
    return {} if learnable_sink is None else {"learnable_sink": learnable_sink}


def padded_forward(ctx, forward_fn, q, k, v, index_args, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, deterministic, return_softmax, is_grad,
                   packed=0, saved_index=(), learnable_sink=None, **op_kwargs):
    """The forward of every autograd Function: pad the head dim, run forward_fn (the op, called
    as forward_fn(q, k, v, *index_args, dropout_p, softmax_scale, ...)), save for backward.
    q, k, v are unpacked (views into a packed tensor are fine); packed: how the Function got
    them (see attention_grads).  The saved tensors are (q, k, v, out, softmax_lse,
    *saved_index, [learnable_sink,] rng_state), all at kernel_head_dim: v's head dim may differ
    from q's and k's (checked by the caller), and out gets v's."""
    head_dim_qk, head_dim_v = q.shape[-1], v.shape[-1]
    softmax_scale = _default_softmax_scale(softmax_scale, head_dim_qk)
    # A paged call's kernels read K and V at one head dim.
    q, k, v = pad_qkv(q, k, v, keep_v=op_kwargs.get("block_table") is None)
    out_padded, softmax_lse, S_dmask, rng_state = forward_fn(
        q, k, v, *index_args, dropout_p, softmax_scale, causal=causal,
        window_size_left=window_size[0], window_size_right=window_size[1], softcap=softcap,
        alibi_slopes=alibi_slopes, return_softmax=return_softmax and dropout_p > 0, **op_kwargs,
        **sink_kwargs(learnable_sink),
    )
    if is_grad:
        sink_saved = () if learnable_sink is None else (learnable_sink,)
        ctx.save_for_backward(q, k, v, out_padded, softmax_lse, *saved_index, *sink_saved,
                              rng_state)
        ctx.has_sink = learnable_sink is not None
        ctx.dropout_p = dropout_p
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.window_size = window_size
        ctx.softcap = softcap
        ctx.alibi_slopes = alibi_slopes
        ctx.deterministic = deterministic
        ctx.packed = packed
        ctx.head_dim_qk = head_dim_qk
    out = out_padded if out_padded.shape[-1] == head_dim_v else out_padded[..., :head_dim_v]
    return out if not return_softmax else (out, softmax_lse, S_dmask)


def padded_backward(ctx, backward_fn, dout, dq, dk, dv, index_args=()):
    """The backward of every autograd Function (see padded_forward): runs backward_fn, which
    writes the padded gradients into dq, dk, dv (which may be views into one packed gradient),
    called as backward_fn(dout, q, k, v, out, softmax_lse, dq, dk, dv, *index_args, dropout_p,
    ...).  Returns what backward_fn does: softmax_d, rowsum(dO * O) per row."""
    saved = ctx.saved_tensors
    q, k, v, out, softmax_lse, rng_state = saved[:5] + saved[-1:]
    return backward_fn(
        pad_head_dim(dout, out.shape[-1]), q, k, v, out, softmax_lse, dq, dk, dv,
        *index_args, ctx.dropout_p, ctx.softmax_scale, ctx.causal, ctx.window_size[0],
        ctx.window_size[1], ctx.softcap, ctx.alibi_slopes, ctx.deterministic,
        rng_state=rng_state,
    )


def saved_sink(ctx):
    """The learnable sink padded_forward saved (None without one)."""
    return ctx.saved_tensors[-2] if ctx.has_sink else None


def _sink_grad_rows(learnable_sink, softmax_lse, row_d, head_shape):
    """-sum over rows of exp(sink[h] - lse) * D: softmax_lse and row_d hold the same rows, the
    sink broadcast to them as head_shape."""
    p_sink = torch.exp(learnable_sink.float().view(head_shape) - softmax_lse)
    return -(p_sink * row_d).sum(dim=[i for i in range(softmax_lse.dim()) if head_shape[i] == 1])


def _sink_grad_kernel(learnable_sink, softmax_lse, softmax_d, cu_seqlens_q=None):
    """dsink from the extension's one-launch kernel (api/sink_grad.h) on eager CUDA calls, else
    None (the torch form then runs: CPU, meta and traced tensors)."""
    if not softmax_lse.is_cuda or _is_compiling():
        return None
    ext = _get_ext()
    if not hasattr(ext, "learnable_sink_grad"):
        return None
    cu = None if cu_seqlens_q is None else cu_seqlens_q.to(torch.int32)
    grad = ext.learnable_sink_grad(learnable_sink.detach().float().contiguous(), softmax_lse.contiguous(),
                                   softmax_d.contiguous(), cu)
    return grad.to(learnable_sink.dtype)


def learnable_sink_grad(learnable_sink, softmax_lse, softmax_d):
    """The gradient of the learnable sink of a dense call from the forward's softmax_lse (b, h,
    seqlen_q), sink included, and the backward's softmax_d (b, h, round128(seqlen_q)) =
    rowsum(dO * O): the sink's probability in row r is exp(sink[h] - lse[r]) and carries no
    value, so dsink[h] = -sum_r exp(sink[h] - lse[r]) D[r].  In the sink's dtype."""
    grad = _sink_grad_kernel(learnable_sink, softmax_lse, softmax_d)
    if grad is not None:
        return grad
    seqlen_q = softmax_lse.shape[-1]
    grad = _sink_grad_rows(learnable_sink, softmax_lse, softmax_d[..., :seqlen_q], (1, -1, 1))
    return grad.to(learnable_sink.dtype)


def learnable_sink_grad_varlen(learnable_sink, softmax_lse, softmax_d, cu_seqlens_q):
    """As learnable_sink_grad for a varlen call: softmax_lse (h, total_q) holds row r of
    sequence b at column r; softmax_d (h, total_q + 128 * batch_size) at column r + 128 b
    (api/varlen.cpp).  Rows past cu_seqlens_q[-1] belong to no sequence and are left out."""
    grad = _sink_grad_kernel(learnable_sink, softmax_lse, softmax_d, cu_seqlens_q)
    if grad is not None:
        return grad
    total_q = softmax_lse.shape[-1]
    batch_size = cu_seqlens_q.shape[0] - 1
    rows = torch.arange(total_q, device=softmax_lse.device, dtype=torch.int32)
    # Sequence of row r: the number of sequence ends <= r (empty sequences end where they start).
    seq = torch.searchsorted(cu_seqlens_q[1:].to(torch.int32).contiguous(), rows, right=True)
    in_seq = seq < batch_size
    cols = torch.where(in_seq, rows.long() + 128 * seq.long(), torch.zeros_like(seq, dtype=torch.long))
    row_d = torch.where(in_seq, softmax_d.index_select(-1, cols), torch.zeros((), device=softmax_d.device))
    # A tail row's lse is +inf (exp(sink - inf) = 0) but a -inf sink would make it NaN: mask both.
    lse = torch.where(in_seq, softmax_lse, torch.zeros((), device=softmax_lse.device))
    grad = _sink_grad_rows(learnable_sink, lse, row_d, (-1, 1))
    return grad.to(learnable_sink.dtype)


def split_inputs(inputs):
    """(q, k, v, qkv, kv, packed) from an autograd Function's tensor inputs (q, k, v), (q, kv) or
    (qkv,), the ones it did not get None; packed: 0, 2 or 3 (see attention_grads)."""
    if len(inputs) == 1:
        return None, None, None, inputs[0], None, 3
    if len(inputs) == 2:
        return inputs[0], None, None, None, inputs[1], 2
    q, k, v = inputs
    return q, k, v, None, None, 0


def _empty_packed(x, n):
    """An empty gradient of n tensors shaped like x, stacked at dim -3 (as qkv / kv are)."""
    return torch.empty(x.shape[:-2] + (n, *x.shape[-2:]), dtype=x.dtype, device=x.device)


def attention_grads(ctx, dout, run_backward):
    """The gradients an autograd Function returns, its tensor inputs' cut back to the head dims
    the caller passed (q's for dq and dk, v's = dout's for dv; the packed inputs have one head
    dim): (dqkv,) for one packed qkv (ctx.packed == 3), (dq, dkv) for q and a
    packed kv (2), else (dq, dk, dv); the learnable sink's for the Function's last input; None
    for every other input.  run_backward(ctx, dout, dq, dk, dv) writes them (through views for
    the packed ones) and returns the sink's gradient (None without a sink)."""
    q, k, v = ctx.saved_tensors[:3]
    if ctx.packed == 3:
        dqkv = _empty_packed(q, 3)
        dsink = run_backward(ctx, dout, *dqkv.unbind(-3))
        grads = (dqkv,)
    elif ctx.packed == 2:
        dq, dkv = torch.empty_like(q), _empty_packed(k, 2)
        dsink = run_backward(ctx, dout, dq, *dkv.unbind(-3))
        grads = (dq, dkv)
    else:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        dsink = run_backward(ctx, dout, *grads)
    # The last gradient holds v's (dv, dkv or dqkv); the ones before it q's or k's.
    head_dims = (ctx.head_dim_qk,) * (len(grads) - 1) + (dout.shape[-1],)
    rest = (None,) * (len(ctx.needs_input_grad) - len(grads) - 1) + (dsink,)
    return tuple(g if g.shape[-1] == d else g[..., :d] for g, d in zip(grads, head_dims)) + rest


def attention_function(run_backward):
    """A base class for the autograd Functions whose forward ends in padded_forward: their
    backward is attention_grads with run_backward."""

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def backward(ctx, dout, *args):
            return attention_grads(ctx, dout, run_backward)

    return AttentionFunction
