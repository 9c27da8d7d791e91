#!/usr/bin/env python3
"""GPU check of the deterministic mode of the warp-specialised sm_90a backward (branch ws-bwd-det:
BwdParams::bwd_ws_det, BwdWsDqOrder in csrc/hopper/flash_bwd_ws_kernel_sm90.h).

Each case runs in its own process under a timeout (a wrong counter order hangs rather than fails):
  * the forward once, then the deterministic backward RERUNS times: dq / dk / dv bitwise equal
    across the reruns;
  * the gradients against the fp32 naive reference (the suite's rule: max error <= 2 x the error
    of the same naive attention in the input dtype + slack; NaN fails);
  * the profiler shows the WS kernel (flash_bwd_ws_kernel_sm90), not the lock-step one;
  * against the lock-step deterministic backward (FLASH_ATTN_BWD_WS_DET=0): dk / dv bitwise equal
    or extremely close, dq within the rule.
Cases cover d64 / d128 / d256 (the split-d exchange kernel, session 11: its consumers order their dQ
atomics; cases of head dims not built are skipped), fp16 / bf16, causal (descending order, reversed grid walk) and not,
left / right / two-sided windows, GQA, odd lengths, seqlen_q != seqlen_k, ALiBi and softcap (d128),
and 20k keys (157 key blocks: more CTAs per (b, h) than SMs, the deadlock case for a wrong walk).

Then times default vs deterministic (WS) vs deterministic (lock-step) backwards at bf16 8k.

    python scripts/check_bwd_ws_det.py [--no-bench] [--bench-only] [--timeout 90] [--splits 1,2,4,8]
                                       [--bench-head-dims 64,128]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from gpu_check_common import (  # noqa: E402
    bench_backward_variants, cases_of_built_head_dims, check_main, env_set, random_qkv_dout)

# Head dim 256: its WS deterministic mode is the split-d kernel's kMod variant, opt-in.
os.environ.setdefault("FLASH_ATTN_BWD_WS_D256_MOD", "1")

RERUNS = 5
# (dtype, d, b, sq, sk, h, hk, causal, window, feature)
CASES = [
    ("bf16", 128, 2, 1024, 1024, 4, 4, False, (-1, -1), None),
    ("bf16", 128, 2, 1024, 1024, 4, 4, True, (-1, -1), None),
    ("fp16", 64, 1, 1000, 1300, 6, 2, False, (-1, -1), None),
    ("fp16", 64, 1, 1300, 1000, 6, 2, True, (-1, -1), None),
    ("bf16", 64, 3, 113, 203, 4, 1, True, (-1, -1), None),
    ("bf16", 128, 1, 17, 1023, 2, 2, False, (-1, -1), None),
    ("bf16", 128, 1, 777, 777, 2, 1, False, (100, -1), None),
    ("fp16", 128, 1, 777, 900, 2, 2, False, (-1, 50), None),
    ("bf16", 64, 1, 900, 777, 4, 2, False, (64, 64), None),
    ("bf16", 128, 1, 640, 640, 4, 4, True, (-1, -1), "alibi"),
    ("fp16", 128, 1, 640, 700, 4, 2, False, (-1, -1), "softcap"),
    ("bf16", 64, 1, 640, 640, 4, 4, False, (32, 0), "alibi"),
    ("bf16", 128, 1, 256, 20000, 2, 2, False, (-1, -1), None),
    ("bf16", 128, 1, 20000, 20000, 1, 1, True, (-1, -1), None),
    # Head dim 256 (64-key blocks; one slice by default).
    ("bf16", 256, 2, 1024, 1024, 4, 4, False, (-1, -1), None),
    ("bf16", 256, 2, 1024, 1024, 4, 4, True, (-1, -1), None),
    ("fp16", 256, 1, 1000, 1300, 6, 2, False, (-1, -1), None),
    ("fp16", 256, 1, 1300, 1000, 6, 2, True, (-1, -1), None),
    ("bf16", 200, 3, 113, 203, 4, 1, True, (-1, -1), None),
    ("bf16", 256, 1, 777, 900, 2, 1, False, (100, 20), None),
    ("bf16", 256, 1, 17, 1023, 2, 2, False, (-1, -1), "alibi"),
    ("bf16", 256, 1, 640, 640, 4, 4, True, (-1, -1), "alibi"),
    ("fp16", 256, 1, 640, 700, 4, 2, False, (-1, -1), "softcap"),
    ("bf16", 256, 1, 256, 20000, 2, 2, False, (-1, -1), None),
    ("bf16", 256, 1, 12000, 12000, 1, 1, True, (-1, -1), None),
]

CASES = cases_of_built_head_dims(CASES)


def run_case(idx):
    import torch

    import fa_test_utils as U
    from flash_attn import flash_attn_func

    dtype_name, d, b, sq, sk, h, hk, causal, window, feature = CASES[idx]
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    q, k, v, dout = random_qkv_dout(dtype, b, sq, sk, h, hk, d, seed=1000 + idx)
    feats = {}
    if feature == "alibi":
        feats["alibi_slopes"] = torch.rand(h, device="cuda", dtype=torch.float32) * 0.5
    elif feature == "softcap":
        feats["softcap"] = 20.0
    try:
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True, **feats)
    except RuntimeError as e:
        if "this build has no kernels" in str(e):
            return f"skipped: head dim {d} not built"
        raise

    def bwd(env):
        with env_set(env):
            g = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        return g

    ws = [bwd({}) for _ in range(RERUNS)]
    for r in range(1, RERUNS):
        for i, n in enumerate(("dq", "dk", "dv")):
            assert torch.equal(ws[r][i], ws[0][i]), f"{n} rerun {r} differs from rerun 0"
    (out_ref, _, *g_ref), (out_pt, *g_pt) = U.ref_fwd_bwd(q, k, v, dout, causal, window_size=window, **feats)
    U.assert_close_to_ref("out", out, out_ref, out_pt, U.OUT_SLACK)
    for i, n in enumerate(("dq", "dk", "dv")):
        U.assert_close_to_ref(n, ws[0][i], g_ref[i], g_pt[i], U.GRAD_SLACK)

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bwd({})
    names = [e.key for e in prof.key_averages()]
    assert any("flash_bwd_ws_kernel_sm90" in n for n in names), f"WS kernel did not run: {[n for n in names if 'bwd' in n]}"

    lock = bwd({"FLASH_ATTN_BWD_WS_DET": "0"})
    notes = []
    for i, n in enumerate(("dq", "dk", "dv")):
        U.assert_close_to_ref(f"{n} lock-step", lock[i], g_ref[i], g_pt[i], U.GRAD_SLACK)
        diff = U.max_err(ws[0][i], lock[i])
        notes.append(f"{n} {'==' if torch.equal(ws[0][i], lock[i]) else f'~{diff:.1e}'}")
    return "vs lock-step det: " + ", ".join(notes)


def bench(splits=(), head_dims=(64, 128)):
    variants = [("default", {}, {}), ("det WS", {"deterministic": True}, {})]
    # The slice count of the WS deterministic mode (shorter ordered chains vs more slices to zero
    # and to sum): FLASH_ATTN_BWD_WS_DET_SPLITS.
    variants += [(f"s={s}", {"deterministic": True}, {"FLASH_ATTN_BWD_WS_DET_SPLITS": str(s)}) for s in splits]
    variants += [("det lock-step", {"deterministic": True}, {"FLASH_ATTN_BWD_WS_DET": "0"})]
    bench_backward_variants(variants, head_dims=head_dims)


def main():
    def add_args(ap):
        ap.add_argument("--splits", default="", help="also time these WS slice counts, e.g. 1,2,4,8")
        ap.add_argument("--bench-head-dims", default="64,128", help="head dims to time, e.g. 256")

    return check_main(__file__, CASES, run_case,
                      lambda args: bench([int(x) for x in args.splits.split(",") if x],
                                         tuple(int(x) for x in args.bench_head_dims.split(","))),
                      default_timeout=90, label_width=60, add_args=add_args)


if __name__ == "__main__":
    sys.exit(main())
