#!/usr/bin/env python3
"""GPU check of the dropout variant of the warp-specialised sm_90a backward (branch ws-bwd-dropout:
Traits::kDropout in csrc/hopper/flash_bwd_ws_kernel_sm90.h, run_mha_bwd_ws_sm90_dropout).

Each case runs in its own process under a timeout (a named-barrier mistake hangs rather than fails):
  * the forward once with dropout (rng_state from the custom op), then the backward through the
    custom op on the WS kernel (default) and on the lock-step kernel (FLASH_ATTN_BWD_WS_DROPOUT=0);
  * both against the fp32 naive reference with the documented Philox keep-mask
    (fa_test_utils.dropout_keep_ref; the suite's rule, gradients within 3x; NaN fails);
  * the profiler shows the WS kernel on the default path;
  * WS vs lock-step: dk / dv bitwise equal or extremely close (same GEMMs, same order), dq within
    the rule (bulk reduce-add vs atomics: another summation order).
Cases: d64 / d128, fp16 / bf16, causal and not, windows, GQA / MQA, ALiBi, odd lengths, one query
block (the d128 kernel keeps a single dQ buffer), varlen. Head dim 256 (session 11): the split-d
exchange kernel's dropout variant (FLASH_ATTN_BWD_WS_D256_MOD=1) against the SM80-class dropout
kernel (=0); cases of head-dim tiles that FLASH_ATTN_HEAD_DIMS leaves out are not run.

Then times the backward at bf16 8k: default (no dropout) vs dropout 0.1 on the WS kernel vs on the
lock-step kernel.

    python scripts/check_bwd_ws_dropout.py [--no-bench] [--bench-only] [--timeout 60]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from gpu_check_common import (  # noqa: E402
    bench_backward_variants, cases_of_built_head_dims, check_main, custom_op_fwd_bwd, random_qkv_dout)

# (dtype, d, b, sq, sk, h, hk, causal, window, alibi, p, varlen)
CASES = [
    ("bf16", 128, 2, 1024, 1024, 4, 4, False, (-1, -1), False, 0.1, False),
    ("bf16", 128, 2, 1024, 1024, 4, 4, True, (-1, -1), False, 0.1, False),
    ("fp16", 64, 1, 1000, 1300, 6, 2, False, (-1, -1), False, 0.17, False),
    ("fp16", 64, 1, 1300, 1000, 6, 2, True, (-1, -1), False, 0.3, False),
    ("bf16", 64, 3, 113, 203, 4, 1, True, (-1, -1), False, 0.5, False),
    ("bf16", 128, 1, 17, 1023, 2, 2, False, (-1, -1), False, 0.1, False),
    ("fp16", 128, 2, 64, 200, 4, 2, False, (-1, -1), False, 0.2, False),   # one query block
    ("bf16", 128, 1, 777, 900, 2, 1, False, (100, 20), True, 0.25, False),
    ("bf16", 64, 1, 640, 640, 4, 4, False, (32, 0), True, 0.1, False),
    ("fp16", 128, 3, 300, 257, 4, 2, True, (-1, -1), True, 0.4, True),
    ("bf16", 64, 3, 1, 77, 4, 4, False, (-1, -1), False, 0.1, True),
    # Head dim 256: 64-key CTAs (odd and even key blocks use the two halves of a Philox group).
    ("bf16", 256, 2, 1024, 1024, 4, 4, False, (-1, -1), False, 0.1, False),
    ("bf16", 256, 2, 1024, 1024, 4, 4, True, (-1, -1), False, 0.1, False),
    ("fp16", 256, 1, 1000, 1300, 6, 2, False, (-1, -1), False, 0.17, False),
    ("fp16", 256, 1, 1300, 1000, 6, 2, True, (-1, -1), False, 0.3, False),
    ("bf16", 200, 3, 113, 203, 4, 1, True, (-1, -1), False, 0.5, False),
    ("bf16", 256, 1, 17, 1023, 2, 2, False, (-1, -1), False, 0.1, False),
    ("fp16", 256, 2, 64, 200, 4, 2, False, (-1, -1), False, 0.2, False),   # one query block
    ("bf16", 256, 1, 777, 900, 2, 1, False, (100, 20), True, 0.25, False),
    ("fp16", 256, 3, 300, 257, 4, 2, True, (-1, -1), True, 0.4, True),
    ("bf16", 256, 3, 1, 77, 4, 4, False, (-1, -1), False, 0.1, True),
]
CASES = cases_of_built_head_dims(CASES)
# The environments of the WS kernel and of the reference kernel it is compared with, per head dim.
WS_ENV = {256: {"FLASH_ATTN_BWD_WS_D256_MOD": "1"}}
LOCK_ENV = {256: {"FLASH_ATTN_BWD_WS_D256_MOD": "0"}}


def run_case(idx):
    import torch

    import fa_test_utils as U
    import flash_attn

    assert hasattr(torch.ops.flash_attn, "_flash_attn_varlen_forward"), f"custom ops not registered by {flash_attn}"

    dtype_name, d, b, sq, sk, h, hk, causal, window, alibi, p, varlen = CASES[idx]
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    q, k, v, dout = random_qkv_dout(dtype, b, sq, sk, h, hk, d, seed=2000 + idx)
    slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.5 if alibi else None
    try:
        out, lse, rng_state, bwd = custom_op_fwd_bwd(q, k, v, dout, causal, window, p, slopes, varlen)
    except RuntimeError as e:
        if "this build has no kernels" in str(e):
            return f"skipped: {dtype_name} head dim {d} not built"
        raise
    wl, wr = window
    seed, offset = rng_state.tolist()
    mask = U.dropout_keep_ref(seed, offset, b, h, sq, sk, p).cuda()

    tile = 256 if d > 128 else 128
    ws_env = WS_ENV.get(tile, {})
    ws = bwd(ws_env)
    lock = bwd(LOCK_ENV.get(tile, {"FLASH_ATTN_BWD_WS_DROPOUT": "0"}))
    feats = dict(window_size=(wl, wr) if not causal else (wl, 0), alibi_slopes=slopes, dropout_p=p,
                 dropout_mask=mask)
    (out_ref, _, *g_ref), (out_pt, *g_pt) = U.ref_fwd_bwd(q, k, v, dout, causal, **feats)
    U.assert_close_to_ref("out", out, out_ref, out_pt, U.OUT_SLACK)
    notes = []
    for i, n in enumerate(("dq", "dk", "dv")):
        U.assert_close_to_ref(f"{n} ws", ws[i], g_ref[i], g_pt[i], U.GRAD_SLACK, factor=3)
        U.assert_close_to_ref(f"{n} lock-step", lock[i], g_ref[i], g_pt[i], U.GRAD_SLACK, factor=3)
        diff = U.max_err(ws[i], lock[i])
        notes.append(f"{n} {'==' if torch.equal(ws[i], lock[i]) else f'~{diff:.1e}'}")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bwd(ws_env)
    names = [e.key for e in prof.key_averages()]
    assert any("flash_bwd_ws_kernel_sm90" in n for n in names), \
        f"WS kernel did not run: {[n for n in names if 'bwd' in n]}"
    return "WS vs lock-step: " + ", ".join(notes)


def bench():
    built = os.environ.get("FLASH_ATTN_HEAD_DIMS")
    dims = [d for d in (64, 128) if not built or str(d) in built.split(",")]
    if dims:
        bench_backward_variants([("plain", {}, {}), ("dropout WS", {"dropout_p": 0.1}, {}),
                                 ("dropout lock-step", {"dropout_p": 0.1}, {"FLASH_ATTN_BWD_WS_DROPOUT": "0"})],
                                head_dims=tuple(dims))
    if not built or "256" in built.split(","):
        bench_backward_variants([("plain", {}, {}), ("dropout WS", {"dropout_p": 0.1}, WS_ENV[256]),
                                 ("dropout SM80-class", {"dropout_p": 0.1}, LOCK_ENV[256])], head_dims=(256,))


def main():
    return check_main(__file__, CASES, run_case, lambda args: bench(), default_timeout=60, label_width=66)


if __name__ == "__main__":
    sys.exit(main())
