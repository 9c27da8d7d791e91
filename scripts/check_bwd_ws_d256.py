#!/usr/bin/env python3
"""GPU check of the warp-specialised sm_90a backward at head dim 256 (branch ws-bwd-d256: kSplitD in
csrc/hopper/kernel_traits_bwd_ws_sm90.h, run_mha_bwd_ws_sm90_d256; FLASH_ATTN_BWD_WS_D256=1, off
by default until this check passes on the H200).

Each case runs in its own process under a timeout (a named-barrier mistake hangs rather than fails):
the backward of plain calls (no softcap / ALiBi / dropout / deterministic) with the switch at 1
(the split-d WS kernel: 64-key CTAs, the two consumer warpgroups split the head dim, each computes
the whole S^T / dP^T), 2 (its exchange form: S^T / dP^T split by queries, P^T / dS^T through
shared memory) and 0 (the SM80-class kernel), all against the fp32 naive reference (the suite's
rule; NaN fails), and the profiler shows the WS kernel ran. Cases: fp16 / bf16, d256 and d below it (200, 232: zero-filled
columns), causal and not, windows, GQA / MQA, odd lengths (1, 17, 113, 1023), a single query or
key block, varlen.

Then times the d256 backward at bf16 8k: SM80-class kernel vs the two split-d WS forms.

    python scripts/check_bwd_ws_d256.py [--no-bench] [--bench-only] [--timeout 60]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from gpu_check_common import bench_backward_variants, check_main, custom_op_fwd_bwd, random_qkv_dout  # noqa: E402

ENV_ON = {"FLASH_ATTN_BWD_WS_D256": "1"}  # the split-d WS kernel (S^T / dP^T in both warpgroups)
ENV_EXCHANGE = {"FLASH_ATTN_BWD_WS_D256": "2"}  # its exchange form (S^T / dP^T split by queries)
ENV_OFF = {"FLASH_ATTN_BWD_WS_D256": "0"}
ENV_V4 = {"FLASH_ATTN_BWD_WS_DQ_V4": "1"}  # the exchange form with float4 dQ atomics (A/B-only kernel)


def ab_built():
    import flash_attn._C as ext

    return ext.ab_kernels_built()

# (dtype, d, b, sq, sk, h, hk, causal, window, varlen)
CASES = [
    ("bf16", 256, 2, 1024, 1024, 4, 4, False, (-1, -1), False),
    ("bf16", 256, 2, 1024, 1024, 4, 4, True, (-1, -1), False),
    ("fp16", 256, 1, 1000, 1300, 6, 2, False, (-1, -1), False),
    ("fp16", 256, 1, 1300, 1000, 6, 2, True, (-1, -1), False),
    ("bf16", 256, 3, 113, 203, 4, 1, True, (-1, -1), False),
    ("bf16", 256, 1, 17, 1023, 2, 2, False, (-1, -1), False),
    ("fp16", 256, 2, 64, 64, 4, 2, False, (-1, -1), False),    # one query block, one key block
    ("bf16", 256, 1, 1, 300, 2, 2, False, (-1, -1), False),
    ("bf16", 256, 1, 777, 900, 2, 1, False, (100, 20), False),
    ("bf16", 200, 2, 300, 257, 4, 2, True, (-1, -1), False),
    ("fp16", 232, 1, 129, 65, 2, 2, False, (-1, -1), False),
    ("fp16", 256, 3, 300, 257, 4, 2, True, (-1, -1), True),
    ("bf16", 256, 3, 1, 77, 4, 4, False, (-1, -1), True),
]


def run_case(idx):
    import torch

    import fa_test_utils as U
    import flash_attn

    assert hasattr(torch.ops.flash_attn, "_flash_attn_varlen_forward"), f"custom ops not registered by {flash_attn}"

    dtype_name, d, b, sq, sk, h, hk, causal, window, varlen = CASES[idx]
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    q, k, v, dout = random_qkv_dout(dtype, b, sq, sk, h, hk, d, seed=3000 + idx)
    _, _, _, bwd = custom_op_fwd_bwd(q, k, v, dout, causal, window, varlen=varlen)
    wl, wr = window

    try:
        ws = bwd(ENV_ON)  # the redundant form: an A/B-only kernel (FLASH_ATTN_AB_KERNELS=1 builds)
    except Exception as e:  # noqa: BLE001
        if "FLASH_ATTN_AB_KERNELS" not in str(e):
            raise
        ws = None
    ex = bwd(ENV_EXCHANGE)
    v4 = bwd(ENV_V4) if ab_built() else ex  # float4 dQ atomics: A/B-only as well
    sm80 = bwd(ENV_OFF)
    if ws is None:
        ws = ex
    feats = dict(window_size=(wl, wr) if not causal else (wl, 0))
    (out_ref, _, *g_ref), (out_pt, *g_pt) = U.ref_fwd_bwd(q, k, v, dout, causal, **feats)
    notes = []
    for i, n in enumerate(("dq", "dk", "dv")):
        U.assert_close_to_ref(f"{n} ws", ws[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        U.assert_close_to_ref(f"{n} ws exchange", ex[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        U.assert_close_to_ref(f"{n} ws exchange float4 dQ", v4[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        if n != "dq":
            assert torch.equal(v4[i], ex[i]), f"{n}: float4 dQ atomics changed {n}"
        U.assert_close_to_ref(f"{n} sm80", sm80[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        notes.append(f"{n} ~{U.max_err(ws[i], sm80[i]):.1e} / ~{U.max_err(ex[i], sm80[i]):.1e}")

    from torch.profiler import ProfilerActivity, profile

    for env in (ENV_EXCHANGE, ENV_V4) if ab_built() else (ENV_EXCHANGE,):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            bwd(env)
        names = [e.key for e in prof.key_averages()]
        assert any("flash_bwd_ws_kernel_sm90" in n for n in names), \
            f"WS kernel did not run ({env}): {[n for n in names if 'bwd' in n]}"
    return "WS / exchange vs SM80-class: " + ", ".join(notes)


def bench():
    variants = [("SM80-class", {}, ENV_OFF), ("WS exchange", {}, ENV_EXCHANGE)]
    if ab_built():
        variants += [("WS exchange float4 dQ", {}, ENV_V4)]
    bench_backward_variants(variants, head_dims=(256,))


def main():
    return check_main(__file__, CASES, run_case, lambda args: bench(), default_timeout=60, label_width=60)


if __name__ == "__main__":
    sys.exit(main())
