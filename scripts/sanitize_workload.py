"""A small workload that calls every entry point once or twice, for compute-sanitizer:

    compute-sanitizer --tool memcheck python3 scripts/sanitize_workload.py
    (also --tool racecheck, --tool initcheck; scripts/device_session.sh's `sanitize` stage runs all three)

Covered: flash_attn_func forward + backward (plain, causal, GQA, softcap, ALiBi, local window,
dropout, deterministic), the SM80-class kernels (sm_90a kernels switched off), the packed
variants, flash_attn_varlen_func forward + backward (empty sequences, rows past the last
sequence), paged varlen, flash_attn_with_kvcache (append + rotary, paged, cache_batch_idx,
cache_leftpad, split-KV), learnable sinks (dense forward + backward, varlen, split-KV), and the
device-side index guard rejecting a call.  Small odd sizes,
so that it finishes under the sanitizers' slowdown.  Each result is checked to be finite.
initcheck does not count TMA bulk-tensor stores as initialisation, so with the forward's TMA store
of O on it reports every read of `out` by the backward's preprocess; run it with
--debug-kernel fwd_tma_o_off=1 (O through ordinary stores), as device_session.sh does.
"""

import argparse

import torch

import flash_attn
from flash_attn import (
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from flash_attn.flash_attn_interface import _get_ext


def finite(*ts):
    for t in ts:
        if t is not None:
            assert torch.isfinite(t.float()).all(), "non-finite output"


def dense(d, dtype):
    for kw in (dict(), dict(causal=True), dict(softcap=5.0, causal=True),
               dict(window_size=(32, 8)), dict(dropout_p=0.1), dict(deterministic=True)):
        q = torch.randn(2, 77, 4, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(2, 113, 2, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(2, 113, 2, d, device="cuda", dtype=dtype, requires_grad=True)
        out = flash_attn_func(q, k, v, **kw)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        finite(out, dq, dk, dv)
    slopes = torch.rand(2, 4, device="cuda", dtype=torch.float32)
    q, k, v = [torch.randn(2, 65, 4, d, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3)]
    out = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    finite(out, *torch.autograd.grad(out, (q, k, v), torch.randn_like(out)))
    sink = torch.randn(4, device="cuda", dtype=torch.float32, requires_grad=True)
    out = flash_attn_func(q, k, v, window_size=(16, 0), learnable_sink=sink)
    finite(out, *torch.autograd.grad(out, (q, k, v, sink), torch.randn_like(out)))
    qkv = torch.randn(1, 47, 3, 2, d, device="cuda", dtype=dtype, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    finite(out, *torch.autograd.grad(out, (qkv,), torch.randn_like(out)))


def varlen(d, dtype):
    lens_q, lens_k = [17, 0, 50], [30, 5, 50]
    cu_q = torch.tensor([0, 17, 17, 67], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 30, 35, 85], dtype=torch.int32, device="cuda")
    q = torch.randn(70, 4, d, device="cuda", dtype=dtype, requires_grad=True)  # 3 rows past the end
    k = torch.randn(85, 2, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(85, 2, d, device="cuda", dtype=dtype, requires_grad=True)
    sink = torch.randn(4, device="cuda", dtype=torch.float32, requires_grad=True)
    for kw in (dict(), dict(learnable_sink=sink)):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, **kw)
        finite(out, *torch.autograd.grad(out, (q, k, v) + tuple(kw.values()), torch.randn_like(out)))
    kc = torch.randn(8, 16, 2, d, device="cuda", dtype=dtype)
    table = torch.arange(8, dtype=torch.int32, device="cuda").flip(0).view(2, 4)
    cu_q2 = torch.tensor([0, 10, 30], dtype=torch.int32, device="cuda")
    cu_k2 = torch.tensor([0, 40, 100], dtype=torch.int32, device="cuda")
    qp = torch.randn(30, 4, d, device="cuda", dtype=dtype)
    finite(flash_attn_varlen_func(qp, kc, kc, cu_q2, cu_k2, 20, 60, block_table=table))


def kvcache(d, dtype):
    b, h, hk, sc = 3, 8, 2, 200
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype)
    kc = torch.randn(b + 1, sc, hk, d, device="cuda", dtype=dtype)
    vc = torch.randn_like(kc)
    kn = torch.randn(b, 1, hk, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([5, 100, 199], dtype=torch.int32, device="cuda")
    cos = torch.randn(sc, d // 2, device="cuda", dtype=dtype)
    sin = torch.randn(sc, d // 2, device="cuda", dtype=dtype)
    finite(flash_attn_with_kvcache(q, kc, vc, kn, kn, rotary_cos=cos, rotary_sin=sin,
                                   cache_seqlens=seqlens, causal=True))
    idx = torch.tensor([3, 0, 1], dtype=torch.int32, device="cuda")
    pad = torch.tensor([0, 7, 30], dtype=torch.int32, device="cuda")
    finite(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, cache_batch_idx=idx,
                                   cache_leftpad=pad, num_splits=3))
    finite(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=3,
                                   learnable_sink=torch.randn(h, device="cuda", dtype=dtype)))
    q4 = torch.randn(b, 4, h, d, device="cuda", dtype=dtype)
    finite(flash_attn_with_kvcache(q4, kc, vc, cache_seqlens=seqlens, softcap=10.0, causal=True))
    pages = torch.randn(20, 16, hk, d, device="cuda", dtype=dtype)
    table = torch.randperm(20, device="cuda").to(torch.int32)[:18].view(b, 6)
    for dd in (d,):
        finite(flash_attn_with_kvcache(q, pages, pages.clone(), kn, kn,
                                       cache_seqlens=torch.tensor([3, 50, 95], dtype=torch.int32,
                                                                  device="cuda"),
                                       block_table=table))
    # A call the device-side guard rejects: nothing appended, the error raised afterwards.
    before = kc.clone()
    bad = torch.tensor([5, 100, 200], dtype=torch.int32, device="cuda")
    flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=bad)
    torch.cuda.synchronize()
    assert torch.equal(kc, before), "a rejected call wrote the cache"
    try:
        flash_attn.check_index_errors()
        raise AssertionError("the guard did not report cache_seqlens")
    except ValueError as e:
        assert "cache_seqlens" in str(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--debug-kernel", action="append", default=[], metavar="NAME=VALUE",
                    help="flash_attn._C.set_debug_kernel(NAME, VALUE) first, e.g. fwd_tma_o_off=1")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    ext = _get_ext()
    for item in args.debug_kernel:
        name, value = item.split("=")
        err = ext.set_debug_kernel(name, int(value))
        assert not err, err
    for d in [int(x) for x in args.head_dims.split(",")]:
        for sm90 in ([True, False] if ext.sm90_kernels_built() else [False]):
            ext.set_sm90_kernels(sm90)
            dense(d, dtype)
            varlen(d, dtype)
            kvcache(d, dtype)
    ext.set_sm90_kernels(True)
    torch.cuda.synchronize()
    print("sanitize workload: ok")


if __name__ == "__main__":
    main()
