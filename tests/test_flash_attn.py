"""GPU tests of flash_attn against a naive reference.

Every test here skips cleanly without a CUDA GPU, without the compiled extension, or when
the build left out the (dtype, head-dim tile) it needs.  The error rule (fa_test_utils):
|ours - ref_fp32|_max <= 2 * |ref_lowprec - ref_fp32|_max + tiny slack, for out, dq, dk, dv;
softmax_lse against the fp32 logsumexp.

Default set: the sweep over dtype x headdim x (seqlen_q, seqlen_k) x causal with batch and
MHA/GQA/MQA crossed partially, long sequences for a few head dims, and the feature tests.
The full product (batch x head layout) is marked slow: FLASH_ATTN_TEST_FULL=1.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import flash_attn.flash_attn_interface as fi
from flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

from fa_test_utils import (DTYPE_NAMES, GRAD_SLACK, OUT_SLACK, assert_close_to_ref,
                           assert_lse_close, attention_ref, built_configs, check_against_ref,
                           cuda_qkv, debug_kernel, load_extension, max_err, ref_fwd_bwd,
                           require_config, require_gpu)

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [(1, 1), (17, 113), (113, 203), (128, 217), (239, 1), (512, 256), (1023, 1024)]
LONG_SEQLENS = [(2048, 2048), (4096, 4096)]
# (batch, nheads, nheads_k): MHA, GQA and MQA, each with batch 1 and 3.
HEAD_LAYOUTS = [(1, 4, 4), (3, 6, 2), (1, 4, 1), (3, 2, 2), (1, 6, 3), (3, 3, 1)]


def _layout_id(b, h, hk):
    kind = "mha" if h == hk else ("mqa" if hk == 1 else "gqa")
    return f"b{b}-{kind}{h}x{hk}"


def _case_id(dtype, d, sq, sk, causal, b, h, hk):
    return (f"{DTYPE_NAMES[dtype]}-d{d}-sq{sq}-sk{sk}-{'causal' if causal else 'full'}-"
            f"{_layout_id(b, h, hk)}")


def _fast_cases():
    """The product dtype x headdim x seqlens x causal, with the head layout rotated so that
    every (dtype, causal) pair meets every layout, each headdim meets every layout, and each
    seqlen pair meets every layout."""
    cases = []
    for di, dtype in enumerate(DTYPES):
        for hi, d in enumerate(HEAD_DIMS):
            for si, (sq, sk) in enumerate(SEQLENS):
                for causal in (False, True):
                    b, h, hk = HEAD_LAYOUTS[(hi + si + 2 * causal + 3 * di) % len(HEAD_LAYOUTS)]
                    cases.append(pytest.param(dtype, d, sq, sk, causal, b, h, hk,
                                              id=_case_id(dtype, d, sq, sk, causal, b, h, hk)))
    return cases


def _long_cases():
    cases = []
    for dtype in DTYPES:
        for d in (64, 128):
            for sq, sk in LONG_SEQLENS:
                for causal in (False, True):
                    b, h, hk = (1, 2, 2) if causal else (1, 2, 1)
                    cases.append(pytest.param(dtype, d, sq, sk, causal, b, h, hk,
                                              id=_case_id(dtype, d, sq, sk, causal, b, h, hk)))
    return cases


def _full_cases():
    cases = []
    layouts = [(b, h, hk) for b in (1, 3) for (h, hk) in ((4, 4), (6, 2), (4, 1))]
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            for sq, sk in SEQLENS:
                for causal in (False, True):
                    for b, h, hk in layouts:
                        cases.append(pytest.param(dtype, d, sq, sk, causal, b, h, hk,
                                                  id=_case_id(dtype, d, sq, sk, causal, b, h, hk)))
            for sq, sk in LONG_SEQLENS:
                for causal in (False, True):
                    for h, hk in ((4, 4), (6, 2), (4, 1)):
                        cases.append(pytest.param(dtype, d, sq, sk, causal, 1, h, hk,
                                                  id=_case_id(dtype, d, sq, sk, causal, 1, h, hk)))
    return cases


def _run_case(dtype, d, sq, sk, causal, b, h, hk, softmax_scale=None):
    require_config(dtype, d)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    out, lse, S_dmask = flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                        return_attn_probs=True)
    assert S_dmask.numel() == 0
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, lse, grads, q, k, v, dout, causal, softmax_scale)


# ---------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk", _fast_cases())
def test_flash_attn_output(dtype, d, sq, sk, causal, b, h, hk):
    _run_case(dtype, d, sq, sk, causal, b, h, hk)


@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk", _long_cases())
def test_flash_attn_output_long(dtype, d, sq, sk, causal, b, h, hk):
    _run_case(dtype, d, sq, sk, causal, b, h, hk)


# The sm_90a backward has two kernels for plain calls: the warp-specialised one (the default, dQ
# through a bulk reduce-add) and the lock-step one (it serves the feature calls the WS kernel
# declines and the strides the TMA cannot address; forced here with set_debug_kernel). Elsewhere
# than sm_90 both run the SM80-class kernel.
BWD_PATHS = {"ws": 0, "lockstep": 1}
BWD_PATH_CASES = [
    (torch.bfloat16, 64, 113, 203, False, 3, 6, 2),
    (torch.float16, 64, 1023, 1024, True, 1, 4, 1),
    (torch.bfloat16, 128, 17, 113, True, 1, 4, 4),
    (torch.float16, 128, 239, 1, False, 3, 3, 1),
    (torch.bfloat16, 128, 1023, 1024, False, 1, 6, 3),
]


@pytest.mark.parametrize("path", list(BWD_PATHS))
@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk",
                         [pytest.param(*c, id=_case_id(*c)) for c in BWD_PATH_CASES])
def test_flash_attn_backward_paths(path, dtype, d, sq, sk, causal, b, h, hk):
    with debug_kernel("bwd_lockstep", BWD_PATHS[path]):
        _run_case(dtype, d, sq, sk, causal, b, h, hk)


# The WS backward's launch order (set_debug_kernel "bwd_ws_head_group": heads whose key blocks are
# interleaved, longest first on causal calls; 0 = the heuristic): every (key block, batch, head)
# exactly once whatever the group, including a last group of fewer heads (3 into 2 x 5 heads).
@pytest.mark.parametrize("group", [1, 3, 64])
@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk", [
    pytest.param(torch.bfloat16, 128, 1023, 1024, True, 2, 5, 5, id="d128-causal"),
    pytest.param(torch.bfloat16, 64, 300, 777, True, 3, 4, 2, id="d64-causal-gqa"),
    pytest.param(torch.float16, 256, 257, 257, True, 2, 3, 1, id="d256-causal-mqa"),
])
def test_flash_attn_backward_launch_order(group, dtype, d, sq, sk, causal, b, h, hk):
    with debug_kernel("bwd_ws_head_group", group):
        _run_case(dtype, d, sq, sk, causal, b, h, hk)


# The plain d128 WS backward without a window runs 80-row query blocks (dQ^T swapped, one dQ
# buffer), 64-row blocks under a mask: both forms, over odd sizes (a last block of 1-79 rows,
# sequences shorter than a block), GQA / MQA, fp16 and bf16.
@pytest.mark.parametrize("block_m", [64, 80])
@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk", [
    pytest.param(torch.bfloat16, 128, 1023, 1024, False, 2, 5, 5, id="d128"),
    pytest.param(torch.float16, 128, 77, 300, False, 3, 4, 2, id="d128-gqa-fp16"),
    pytest.param(torch.bfloat16, 113, 161, 17, False, 2, 3, 1, id="d113-mqa"),
    pytest.param(torch.bfloat16, 128, 1, 1, False, 1, 2, 2, id="d128-1x1"),
])
def test_flash_attn_backward_d128_block_m(block_m, dtype, d, sq, sk, causal, b, h, hk):
    with debug_kernel("bwd_ws_d128_block_m", block_m):
        _run_case(dtype, d, sq, sk, causal, b, h, hk)


# The sm_90a forward's plain calls run the persistent warp-specialised kernel (one CTA per SM
# walking the tiles; dynamic tile order for causal / window calls) for head-dim tiles 64 / 128 up
# to 8k keys, one CTA per tile elsewhere. Both forms do the same per-tile math in the same order:
# out and lse must be bitwise equal, with the persistent kernel forced on and off (set_debug_kernel), over tile counts below and far above the SM count,
# causal / window / GQA / seqlen_q != seqlen_k (tiles without work) shapes.
FWD_PERSISTENT_CASES = [
    # (dtype, d, b, sq, sk, h, hk, causal, window)
    (torch.bfloat16, 64, 2, 1023, 1024, 8, 8, False, (-1, -1)),
    (torch.float16, 64, 3, 777, 513, 6, 2, True, (-1, -1)),
    (torch.bfloat16, 40, 16, 512, 512, 32, 32, True, (-1, -1)),
    (torch.bfloat16, 128, 8, 1000, 1000, 16, 4, True, (-1, -1)),
    (torch.float16, 128, 1, 900, 600, 4, 1, True, (100, 0)),
    (torch.bfloat16, 128, 4, 300, 2000, 8, 8, False, (256, 64)),
    (torch.bfloat16, 111, 2, 17, 9000, 4, 4, False, (-1, -1)),
    (torch.bfloat16, 128, 1, 1, 1, 2, 2, True, (-1, -1)),
]


def fwd_case_id(c):
    """Test id of a (dtype, d, b, sq, sk, h, hk, causal, window) case."""
    return (f"{DTYPE_NAMES[c[0]]}-d{c[1]}-b{c[2]}-{c[3]}x{c[4]}-h{c[5]}/{c[6]}"
            f"{'-causal' if c[7] else ''}-w{c[8][0]},{c[8][1]}")


def _random_fwd_inputs(dtype, d, b, sq, sk, h, hk):
    """Fresh q (b, sq, h, d) and k, v (b, sk, hk, d)."""
    return (torch.randn(b, sq, h, d, device="cuda", dtype=dtype),
            torch.randn(b, sk, hk, d, device="cuda", dtype=dtype),
            torch.randn(b, sk, hk, d, device="cuda", dtype=dtype))


def _check_fwd_against_ref(q, k, v, out, lse, causal, window):
    """Out (2x rule) and LSE of one forward against the fp32 reference."""
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window, upcast=True)
    out_pt, _ = attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
    assert_close_to_ref("out", out, out_ref, out_pt, OUT_SLACK)
    assert_lse_close(lse, lse_ref, q.shape[1], k.shape[1], causal, window)


def _fwd_debug_modes_bitwise(name, modes, q, k, v, causal, window, calls=1):
    """The forward under each value of the debug kernel choice `name` (the last of `calls`
    back-to-back calls each): out and LSE bitwise equal across the modes, no NaN; returns the
    first mode's."""
    res = {}
    for mode in modes:
        with debug_kernel(name, mode):
            for _ in range(calls):
                out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
        res[mode] = (out, lse)
    first, other = res[modes[0]], res[modes[1]]
    assert not torch.isnan(first[0]).any()
    assert torch.equal(first[0], other[0]), (first[0] - other[0]).abs().max().item()
    assert torch.equal(first[1], other[1])
    return first


@pytest.mark.parametrize("dtype, d, b, sq, sk, h, hk, causal, window",
                         [pytest.param(*c, id=fwd_case_id(c)) for c in FWD_PERSISTENT_CASES])
def test_flash_attn_forward_persistent_bitwise(dtype, d, b, sq, sk, h, hk, causal, window):
    require_config(dtype, d)
    q, k, v = _random_fwd_inputs(dtype, d, b, sq, sk, h, hk)
    out, lse = _fwd_debug_modes_bitwise("fwd_ws_persistent", (1, 2), q, k, v, causal, window)
    _check_fwd_against_ref(q, k, v, out, lse, causal, window)


# The warp-specialised forward's plain kernels write each warpgroup's O tile with one TMA store on
# dense calls (forced off with set_debug_kernel: 16-byte stores by every thread, the path varlen
# calls take). Both write the same values: bitwise equal over the persistent cases
# (partial last tiles, d < tile, one-row shapes), a head dim 256 case (O staged in the Q tile,
# released after the store), an out tensor with padded rows (TMA-able strides) and, persistent
# and not, back-to-back calls into the same buffers.
TMA_O_CASES = FWD_PERSISTENT_CASES + [
    (torch.bfloat16, 256, 2, 333, 333, 4, 2, True, (-1, -1)),
    (torch.float16, 256, 1, 64, 1000, 2, 2, False, (-1, -1)),
]


@pytest.mark.parametrize("persistent", [1, 2], ids=["persistent", "per-tile"])
@pytest.mark.parametrize("dtype, d, b, sq, sk, h, hk, causal, window",
                         [pytest.param(*c, id=fwd_case_id(c)) for c in TMA_O_CASES])
def test_flash_attn_forward_tma_o_bitwise(dtype, d, b, sq, sk, h, hk, causal, window, persistent):
    require_config(dtype, d)
    q, k, v = _random_fwd_inputs(dtype, d, b, sq, sk, h, hk)
    with debug_kernel("fwd_ws_persistent", persistent):
        out, lse = _fwd_debug_modes_bitwise("fwd_tma_o_off", (0, 1), q, k, v, causal, window, calls=2)
    _check_fwd_against_ref(q, k, v, out, lse, causal, window)


def test_flash_attn_forward_tma_o_strided_out():
    """A caller's out with padded rows and heads: the TMA store honours its strides and leaves the
    padding alone."""
    require_config(torch.bfloat16, 128)
    from flash_attn.flash_attn_interface import _ext_for
    b, s, h, d = 2, 300, 4, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    big = torch.full((b, s, h + 1, d + 64), 7.0, device="cuda", dtype=torch.bfloat16)
    out = big[:, :, :h, :d]  # row stride (h + 1) (d + 64), head stride d + 64: 16-byte multiples
    with debug_kernel("fwd_tma_o_off", 1):
        ref = flash_attn_func(q, k, v, causal=True)
    # The binding's fwd(q, k, v, out, softmax_scale, causal, window_left, window_right, softcap,
    # alibi_slopes, dropout_p, return_softmax) writes into an aligned out in place.
    _ext_for(q).fwd(q, k, v, out, d ** -0.5, True, -1, 0, 0.0, None, 0.0, False)
    assert torch.equal(out, ref)
    assert (big[:, :, h:, :] == 7).all() and (big[:, :, :, d:] == 7).all()


# Conditional rescaling (the plain sm_90a forward keeps a row's running max until a tile raises
# it by more than 2^8 in the exp2 domain; softmax.h): scores that grow towards the keys the kernel
# visits last (it walks key blocks from the right) make rows both keep a stale max (exponentials
# up to 256) and adopt a new one, several times per row; outliers of +-40 standard deviations in
# a few keys make single jumps. Out and LSE against the fp32 reference.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_forward_growing_scores(dtype, d, causal):
    require_config(dtype, d)
    b, sq, sk, h = 2, 700, 1500, 4
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    ramp = 1.0 + 5.0 * torch.linspace(1.0, 0.0, sk, device="cuda").view(1, sk, 1, 1)
    k = (torch.randn(b, sk, h, d, device="cuda") * ramp).to(dtype)
    k[:, 100] *= 8
    k[:, 900] *= -8
    v = torch.randn(b, sk, h, d, device="cuda", dtype=dtype)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=True)
    out_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_to_ref("out", out, out_ref, out_pt, OUT_SLACK)
    assert_lse_close(lse, lse_ref, sq, sk, causal, (-1, -1))


# The d64 warp-specialised forward's two tile shapes, each forced (set_debug_kernel):
# 128 x 128 with 2 consumer warpgroups (the default for causal calls up to 1024 queries and keys
# and for windows of at most 513 keys) and FA3's 192 x 128 with 3 (the default otherwise): the
# persistent cases' d64 ones plus odd lengths, one-row shapes, MQA, windows.
D64_TILE_CASES = [c for c in FWD_PERSISTENT_CASES if c[1] <= 64] + [
    # (dtype, d, b, sq, sk, h, hk, causal, window)
    (torch.bfloat16, 64, 4, 113, 113, 4, 1, True, (-1, -1)),
    (torch.float16, 64, 2, 1, 17, 4, 4, True, (-1, -1)),
    (torch.bfloat16, 56, 1, 1000, 2000, 4, 2, True, (100, 0)),
    (torch.bfloat16, 64, 2, 300, 301, 2, 2, False, (64, 32)),
]


@pytest.mark.parametrize("rows", ["128", "192"])
@pytest.mark.parametrize("dtype, d, b, sq, sk, h, hk, causal, window",
                         [pytest.param(*c, id=fwd_case_id(c)) for c in D64_TILE_CASES])
def test_flash_attn_forward_d64_tile_rows(dtype, d, b, sq, sk, h, hk, causal, window, rows):
    require_config(dtype, d)
    q, k, v = _random_fwd_inputs(dtype, d, b, sq, sk, h, hk)
    with debug_kernel("fwd_ws_d64_rows", int(rows)):
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    _check_fwd_against_ref(q, k, v, out, lse, causal, window)


def test_set_debug_kernel_rejects_unknown():
    ext = require_gpu()
    assert "128 or 192" in ext.set_debug_kernel("fwd_ws_d64_rows", 64)
    assert "unknown name" in ext.set_debug_kernel("no_such_kernel", 1)
    assert ext.set_debug_kernel("fwd_ws_d64_rows", 0) == ""


# The head-dim-64 warp-specialised backward on 128-row query blocks (FA3's d64 tiles). Odd and
# tile-boundary lengths, one-row and one-key shapes, GQA / MQA, d < 64.
M128_CASES = BWD_PATH_CASES[:2] + [
    (torch.bfloat16, 64, 1, 300, True, 2, 4, 4),
    (torch.float16, 64, 300, 1, False, 2, 4, 2),
    (torch.bfloat16, 40, 257, 129, True, 2, 4, 4),
    (torch.bfloat16, 64, 2048, 2048, True, 1, 2, 1),
    (torch.float16, 59, 17, 17, False, 2, 2, 2),
    (torch.bfloat16, 64, 128, 256, False, 2, 4, 4),
    (torch.bfloat16, 64, 384, 130, True, 1, 4, 2),
]


@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk",
                         [pytest.param(*c, id=_case_id(*c)) for c in M128_CASES])
def test_flash_attn_backward_m128(dtype, d, sq, sk, causal, b, h, hk):
    _run_case(dtype, d, sq, sk, causal, b, h, hk)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, d, sq, sk, causal, b, h, hk", _full_cases())
def test_flash_attn_output_full(dtype, d, sq, sk, causal, b, h, hk):
    _run_case(dtype, d, sq, sk, causal, b, h, hk)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "sq, sk",
    [(1, 1024), (1024, 1), (3, 1000), (128, 128), (256, 128), (64, 2048)],
)
def test_flash_attn_edge_shapes(sq, sk, causal):
    # Decoding (one query), one key, tile-aligned and tile-boundary shapes.
    _run_case(torch.bfloat16, 128, sq, sk, causal, 2, 4, 2)


@pytest.mark.parametrize("d", [59, 128])
@pytest.mark.parametrize("softmax_scale", [0.3, 1.0])
def test_flash_attn_softmax_scale(d, softmax_scale):
    _run_case(torch.float16, d, 97, 131, True, 2, 4, 4, softmax_scale=softmax_scale)


# ---------------------------------------------------------------------------------------
# Packed variants against the unpacked function
# ---------------------------------------------------------------------------------------


def _assert_matches_unpacked(name, ours, unpacked, ref, ref_lowprec, slack):
    """Packed results must pass the reference rule and agree with the unpacked function to
    within the same bound."""
    assert_close_to_ref(name, ours, ref, ref_lowprec, slack)
    bound = 2 * max_err(ref_lowprec, ref) + slack
    err = max_err(ours, unpacked)
    assert err <= bound, f"{name}: packed vs unpacked differ by {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [59, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_qkvpacked(dtype, d, causal):
    require_config(dtype, d)
    b, s, h = 2, 203, 4
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=dtype, requires_grad=True)
    out, lse, S = flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
    assert S.numel() == 0
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    assert dqkv.shape == qkv.shape

    q, k, v = [x.detach().clone().requires_grad_() for x in qkv.unbind(2)]
    out_u = flash_attn_func(q, k, v, causal=causal)
    grads_u = torch.autograd.grad(out_u, (q, k, v), dout)
    (out_ref, lse_ref, *grads_ref), (out_pt, *grads_pt) = ref_fwd_bwd(q, k, v, dout, causal)
    _assert_matches_unpacked("out", out, out_u, out_ref, out_pt, OUT_SLACK)
    assert_lse_close(lse, lse_ref, s, s, causal)
    for i, name in enumerate(("dq", "dk", "dv")):
        _assert_matches_unpacked(name, dqkv[:, :, i], grads_u[i], grads_ref[i], grads_pt[i],
                                 GRAD_SLACK)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [59, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_kvpacked(dtype, d, causal):
    require_config(dtype, d)
    b, sq, sk, h, hk = 2, 113, 203, 6, 2
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    kv = torch.randn(b, sk, 2, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    out, lse, S = flash_attn_kvpacked_func(q, kv, causal=causal, return_attn_probs=True)
    assert S.numel() == 0
    dout = torch.randn_like(out)
    dq, dkv = torch.autograd.grad(out, (q, kv), dout)
    assert dq.shape == q.shape and dkv.shape == kv.shape

    q2 = q.detach().clone().requires_grad_()
    k, v = [x.detach().clone().requires_grad_() for x in kv.unbind(2)]
    out_u = flash_attn_func(q2, k, v, causal=causal)
    grads_u = torch.autograd.grad(out_u, (q2, k, v), dout)
    (out_ref, lse_ref, *grads_ref), (out_pt, *grads_pt) = ref_fwd_bwd(q2, k, v, dout, causal)
    _assert_matches_unpacked("out", out, out_u, out_ref, out_pt, OUT_SLACK)
    for ours, i, name in ((dq, 0, "dq"), (dkv[:, :, 0], 1, "dk"), (dkv[:, :, 1], 2, "dv")):
        _assert_matches_unpacked(name, ours, grads_u[i], grads_ref[i], grads_pt[i], GRAD_SLACK)


# ---------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------


def _strided(shape, layout, dtype):
    """A leaf tensor of `shape` (b, s, h, d) with the given non-contiguous layout and a
    contiguous last dimension."""
    b, s, h, d = shape
    if layout == "batch":
        big = torch.randn(2 * b, s, h, d, device="cuda", dtype=dtype)[::2]
    elif layout == "seq":
        big = torch.randn(b, 2 * s, h, d, device="cuda", dtype=dtype)[:, ::2]
    elif layout == "heads":
        big = torch.randn(b, s, 2 * h, d, device="cuda", dtype=dtype)[:, :, ::2]
    elif layout == "headdim_slice":
        big = torch.randn(b, s, h, d + 16, device="cuda", dtype=dtype)[..., :d]
    elif layout == "bhsd_transposed":
        big = torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2)
    else:
        raise AssertionError(layout)
    x = big.detach().requires_grad_()  # detach keeps the strides
    assert x.shape == shape and x.stride(-1) == 1 and not x.is_contiguous()
    return x


@pytest.mark.parametrize("layout", ["batch", "seq", "heads", "headdim_slice", "bhsd_transposed"])
@pytest.mark.parametrize("d", [59, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_noncontiguous(layout, d, causal):
    dtype = torch.bfloat16
    require_config(dtype, d)
    b, sq, sk, h, hk = 2, 113, 203, 4, 2
    q = _strided((b, sq, h, d), layout, dtype)
    k = _strided((b, sk, hk, d), layout, dtype)
    v = _strided((b, sk, hk, d), layout, dtype)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, lse, grads, q, k, v, dout, causal)


@pytest.mark.parametrize("dout_layout", ["expanded", "transposed"])
@pytest.mark.parametrize("d", [59, 64])
def test_flash_attn_noncontiguous_dout(dout_layout, d):
    dtype = torch.float16
    require_config(dtype, d)
    b, s, h = 2, 129, 4
    q, k, v = [torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3)]
    out = flash_attn_func(q, k, v, causal=True)
    if dout_layout == "expanded":  # what out.sum().backward() produces: all strides 0
        dout = torch.ones((), device="cuda", dtype=dtype).expand_as(out)
    else:
        dout = torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, None, grads, q, k, v, dout, True)


# ---------------------------------------------------------------------------------------
# Streams and devices
# ---------------------------------------------------------------------------------------


def _fwd_bwd(q, k, v, dout, **kw):
    q, k, v = [x.detach().requires_grad_() for x in (q, k, v)]
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, lse, dq, dk, dv


def _run_in_fresh_process(code):
    """python -c code in a new process that imports this flash_attn package."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(fi.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=env)


# TMA descriptors are encoded on the calling thread, which needs the device's context current: torch's
# autograd worker (the backward) and a fresh Python thread (the forward) select the device without
# binding one, and when the caching allocator serves every allocation nothing else binds it. A fresh
# process, so that no earlier test has bound the context on those threads.
def test_tma_kernels_on_threads_without_a_current_context():
    require_config(torch.bfloat16, 64)
    code = textwrap.dedent("""
        import threading, torch
        from flash_attn import flash_attn_func
        def run():
            for shape in [(2, 128, 4, 64), (2, 77, 4, 64)]:
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
                out = flash_attn_func(q, k, v, causal=True)
                out.backward(torch.randn_like(out))
                assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
            torch.cuda.synchronize()
        run()
        errors = []
        def guarded():
            try:
                run()
            except Exception as e:
                errors.append(repr(e))
        t = threading.Thread(target=guarded); t.start(); t.join()
        assert not errors, errors
        print("ok")
    """)
    res = _run_in_fresh_process(code)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), (res.returncode, res.stdout[-2000:], res.stderr[-2000:])


# The valid calls that killed the process (the TMA descriptor encode on a thread without a current
# context), each run in one fresh process after the others, checked by the 2x rule.
def test_calls_that_crashed_are_right_in_a_fresh_process():
    require_config(torch.bfloat16, 64)
    require_config(torch.bfloat16, 128)
    code = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, %r)
        from fa_test_utils import check_against_ref
        from flash_attn import flash_attn_func
        import test_varlen_kvcache as tv
        torch.manual_seed(0)
        def dense(sq, sk, h, hk, d, **kw):
            q = torch.randn(2, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(2, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
            out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v), dout)
            causal = kw.pop("causal", False)
            check_against_ref(out, lse, grads, q, k, v, dout, causal, **kw)
        dense(77, 91, 4, 4, 64, window_size=(0, 0))
        dense(65, 65, 4, 4, 128, softcap=3.0, causal=True)
        dense(47, 95, 4, 2, 64, causal=True,
              alibi_slopes=torch.rand(2, 4, device="cuda", dtype=torch.float32))
        # varlen, GQA, causal, a zero-length sequence and rows past cu_seqlens_q[-1]
        tv._run_varlen(torch.bfloat16, 64, 130, 130, "edge", ("causal", True, (-1, -1)), 4, 2)
        torch.cuda.synchronize()
        print("ok")
    """) % os.path.dirname(os.path.abspath(__file__))
    res = _run_in_fresh_process(code)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), (res.returncode, res.stdout[-2000:], res.stderr[-3000:])


def test_side_stream():
    """The kernels run on the current stream: inputs written on a side stream after a long
    sleep must be seen, and the results match the default-stream ones."""
    dtype = torch.bfloat16
    require_config(dtype, 128)
    b, s, h, d = 2, 1024, 4, 128
    src = [torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4)]
    ref = _fwd_bwd(*src[:3], src[3], causal=True)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        bufs = [torch.empty_like(x) for x in src]
        torch.cuda._sleep(200_000_000)  # make a stream mix-up show as stale inputs
        for dst, x in zip(bufs, src):
            dst.copy_(x)
        res = _fwd_bwd(*bufs[:3], bufs[3], causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    names = ("out", "lse", "dq", "dk", "dv")
    for name, a, r in zip(names, res, ref):
        if name == "dq":  # dq may be accumulated with atomics
            assert max_err(a, r) <= 1e-2 * r.float().abs().max().item(), name
        else:
            assert torch.equal(a, r), f"{name} differs between the side stream and the default stream"


# The forward launches no zero fill: the kernel writes rng_state (zeros without dropout), and the
# persistent forward's tile counter is one per stream that each kernel's last CTA zeroes again (a
# per-call zero fill under graph capture, forced here with set_debug_kernel("fwd_zero_fill", 1)).
@pytest.mark.parametrize("fill", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
def test_forward_rng_state_zeros_without_fill(d, fill):
    dtype = torch.bfloat16
    require_config(dtype, d)
    with debug_kernel("fwd_zero_fill", fill):
        _rng_state_cases(d, dtype)


def _rng_state_cases(d, dtype):
    for causal in (False, True):
        for sk in (300, 0):
            q = torch.randn(2, 257, 4, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(2, sk, 2, d, device="cuda", dtype=dtype) for _ in range(2))
            # Freed small blocks full of -1: what an uninitialised rng_state would show.
            junk = [torch.full((64,), -1, device="cuda", dtype=torch.int64) for _ in range(256)]
            del junk
            _, _, _, rng_state = torch.ops.flash_attn._flash_attn_forward(
                q, k, v, 0.0, d ** -0.5, causal, -1, -1, 0.0, None, False)
            assert rng_state.tolist() == [0, 0], (causal, sk)


def test_forward_tile_counter_streams_and_graphs():
    """Causal forwards (the persistent kernel's dynamic tile order) of different shapes, many in a
    row on two streams at once and replayed from a CUDA graph between eager calls on the capture
    stream: each bitwise equal to the same call with a per-call zeroed counter."""
    dtype = torch.bfloat16
    require_config(dtype, 128)
    shapes = [(4, 1024, 8, 128), (2, 333, 4, 128), (8, 512, 16, 128), (1, 2000, 2, 128)]
    cases = []
    for b, s, h, d in shapes:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
        with debug_kernel("fwd_zero_fill", 1):
            ref = flash_attn_func(q, k, v, causal=True)
        cases.append((q, k, v, ref))
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[] for _ in streams]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    for rep in range(6):
        for i, (st, res) in enumerate(zip(streams, outs)):
            with torch.cuda.stream(st):
                q, k, v, _ = cases[(rep + 2 * i) % len(cases)]
                res.append(((rep + 2 * i) % len(cases), flash_attn_func(q, k, v, causal=True)))
    for st in streams:
        torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    for res in outs:
        for idx, out in res:
            assert torch.equal(out, cases[idx][3]), f"shape {shapes[idx]}: differs from the per-call counter"

    q, k, v, ref = cases[0]
    q2, k2, v2, ref2 = cases[1]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_func(q, k, v, causal=True)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            out_g = flash_attn_func(q, k, v, causal=True)
        for _ in range(3):
            graph.replay()
            eager = flash_attn_func(q2, k2, v2, causal=True)
            torch.cuda.current_stream().synchronize()
            assert torch.equal(out_g, ref) and torch.equal(eager, ref2)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def test_second_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs at least 2 CUDA devices")
    dtype = torch.float16
    require_config(dtype, 64)
    assert torch.cuda.current_device() == 0
    dev = torch.device("cuda:1")
    b, sq, sk, h, hk, d = 2, 257, 300, 4, 2, 64
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.device == dev and lse.device == dev
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert all(g.device == dev for g in grads)
    check_against_ref(out, lse, grads, q, k, v, dout, True)
    # Mixed devices are rejected with a clear error.
    with pytest.raises(ValueError, match=r"\bk\b is on device cuda:0 but q is on device cuda:1"):
        flash_attn_func(q, k.detach().to("cuda:0"), v.detach().to("cuda:0"))


# ---------------------------------------------------------------------------------------
# Determinism, options, autograd modes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hk", [4, 1], ids=["mha", "mqa"])
def test_repeated_runs_bitwise_equal(d, hk):
    dtype = torch.bfloat16
    require_config(dtype, d)
    b, s, h = 2, 1024, 4
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
    dout = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    first = _fwd_bwd(q, k, v, dout, causal=True)
    for _ in range(3):
        again = _fwd_bwd(q, k, v, dout, causal=True)
        for name, a, r in zip(("out", "lse", "dq", "dk", "dv"), again, first):
            if name == "dq":  # may be accumulated with atomics
                continue
            assert torch.equal(a, r), f"{name} differs between repeated runs"


def test_return_attn_probs():
    dtype = torch.float16
    require_config(dtype, 64)
    b, sq, sk, h, d = 2, 77, 129, 4, 64
    q, k, v = cuda_qkv(b, sq, sk, h, d, dtype)
    res = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3
    out, lse, S_dmask = res
    assert S_dmask.numel() == 0 and S_dmask.device == q.device
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    out_plain = flash_attn_func(q, k, v, causal=True)
    assert isinstance(out_plain, torch.Tensor) and torch.equal(out_plain, out)
    out_ref, lse_ref = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(lse, lse_ref, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize(
    "causal, window_size",
    [(False, (-1, 0)), (True, (-1, 5)), (False, (300, -1)), (True, (300, 300))],
)
def test_window_sizes_equivalent_to_full_or_causal(causal, window_size):
    dtype = torch.bfloat16
    require_config(dtype, 64)
    b, sq, sk, h, d = 2, 150, 200, 2, 64
    q, k, v = cuda_qkv(b, sq, sk, h, d, dtype)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    expect_causal = fi._effective_causal(causal, *window_size, sq, sk, False)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=expect_causal))


def test_no_grad_and_inference_mode():
    dtype = torch.float16
    require_config(dtype, 64)
    q, k, v = [torch.randn(1, 64, 2, 64, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3)]
    with torch.no_grad():
        out = flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    with torch.inference_mode():
        out2 = flash_attn_func(q.detach(), k.detach(), v.detach())
    assert torch.equal(out, out2)


# ---------------------------------------------------------------------------------------
# torch.compile and the custom ops
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("d", [59, 128])
def test_torch_compile_fullgraph(d):
    dtype = torch.bfloat16
    require_config(dtype, d)
    torch._dynamo.reset()
    compiled = torch.compile(flash_attn_func, fullgraph=True)
    b, sq, sk, h, hk = 2, 113, 203, 6, 2
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    out, lse, _ = compiled(q, k, v, causal=True, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_against_ref(out, lse, grads, q, k, v, dout, True)
    out_eager = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, out_eager)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_torch_compile_qkvpacked_fullgraph():
    dtype = torch.float16
    d = 80
    require_config(dtype, d)
    torch._dynamo.reset()
    compiled = torch.compile(flash_attn_qkvpacked_func, fullgraph=True)
    qkv = torch.randn(2, 150, 3, 4, d, device="cuda", dtype=dtype, requires_grad=True)
    out = compiled(qkv, causal=True)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    q, k, v = [x.detach().clone().requires_grad_() for x in qkv.unbind(2)]
    (out_ref, _, *grads_ref), (out_pt, *grads_pt) = ref_fwd_bwd(q, k, v, dout, True)
    assert_close_to_ref("out", out, out_ref, out_pt, OUT_SLACK)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert_close_to_ref(name, dqkv[:, :, i], grads_ref[i], grads_pt[i], GRAD_SLACK)


@pytest.mark.skipif(not fi._HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_cuda(causal):
    dtype = torch.float16
    require_config(dtype, 64)
    b, sq, sk, h, hk, d = 2, 77, 129, 4, 2, 64
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    scale = d ** -0.5
    fwd_args = (q, k, v, 0.0, scale, causal, -1, -1, 0.0, None, False)
    torch.library.opcheck(torch.ops.flash_attn._flash_attn_forward.default, fwd_args)
    out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(*fwd_args)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    torch.library.opcheck(
        torch.ops.flash_attn._flash_attn_backward.default,
        (dout, q, k, v, out, lse, dq, dk, dv, 0.0, scale, causal, -1, -1, 0.0, None, False, rng),
        # dq is accumulated with atomics, so two runs may differ in the last bits.
        atol=1e-2, rtol=1e-2,
    )


# ---------------------------------------------------------------------------------------
# Memory, build configuration
# ---------------------------------------------------------------------------------------


def test_forward_memory_is_linear_in_seqlen():
    dtype = torch.float16
    require_config(dtype, 128)
    b, s, h, d = 1, 8192, 8, 128
    q, k, v = [torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3)]
    flash_attn_func(q, k, v, causal=True)  # warm up (workspace, lazy init)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    naive_scores = b * h * s * s * 2
    io = out.numel() * out.element_size() + b * h * s * 4  # out + softmax_lse
    # O(seqlen): out + lse and at most a few workspaces of that size; the naive O(seqlen^2)
    # score matrix alone would be 1 GiB here.
    assert extra <= 4 * io + (16 << 20), (
        f"forward at seqlen {s} allocated {extra / 2**20:.1f} MiB beyond its inputs; "
        f"out + lse are {io / 2**20:.1f} MiB, naive scores would be {naive_scores / 2**20:.0f} MiB"
    )


def test_unbuilt_config_raises_clear_error():
    ext = require_gpu()
    configs = built_configs()
    for dtype in DTYPES:
        for d in (32, 64, 96, 128, 192, 256, 512):
            tile = int(ext.head_dim_tile(d))
            if (DTYPE_NAMES[dtype], tile) not in configs:
                q = torch.randn(1, 8, 1, d, device="cuda", dtype=dtype)
                with pytest.raises(RuntimeError, match=r"FLASH_ATTN_(HEAD_DIMS|DTYPES)"):
                    flash_attn_func(q, q, q)
                return
    pytest.skip("every (dtype, head-dim tile) is built")


def test_extension_importable():
    """On a machine with a usable GPU the compiled extension must import: the GPU tests skip
    without it, so this is the one test that fails loudly."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    ext, err = load_extension()
    assert ext is not None, f"flash_attn._C failed to import: {err}"
    configs = built_configs()
    assert configs, "flash_attn._C.built_configs() is empty"
    for name, tile in configs:
        assert name in ("fp16", "bf16") and tile in (32, 64, 96, 128, 192, 256, 512), (name, tile)
    for d, tile in [(8, 32), (32, 32), (40, 64), (64, 64), (96, 96), (128, 128), (160, 192),
                    (192, 192), (224, 256), (256, 256), (264, 512), (512, 512), (520, -1)]:
        assert int(ext.head_dim_tile(d)) == tile, (d, ext.head_dim_tile(d))
