"""Shared pieces of the GPU check scripts of the warp-specialised backward
(check_bwd_ws_det.py, check_bwd_ws_dropout.py).

run_cases_in_processes: each case in its own Python process under a timeout, so that a kernel that
hangs (a wrong barrier or counter order) shows up as a FAIL line instead of stopping the whole
check; the script re-runs itself with `--case i`.

env_set: a context manager that sets environment variables (the kernels' run-time switches, read
by the binding at each call) and restores them after; interleaved_env_medians: do_bench medians of
one call under each value of such a switch, the arms interleaved (scripts/fwd_*_ab.py).

check_main: the command line shared by those scripts ([--no-bench] [--bench-only] [--timeout s],
`--case i` for the per-process runs, plus the script's own options).

random_qkv_dout: fresh random q, k, v (leaves requiring grad) and dout of a case's shape.

custom_op_fwd_bwd: the forward through the flash_attn custom ops (dense, or varlen with every
sequence at full length) and a function that runs the backward through them under an environment.

bench_backward_variants: backward times at bf16 8k (batch 2, hidden 2048), d64 / d128 (or the
given head dims), causal or not, for a list of (tag, forward keyword arguments, environment for
the backward) variants; the first variant is the baseline of the printed ratios.
"""

import argparse
import contextlib
import os
import subprocess
import sys


def event_median_ms(fn, reps=30, warmup=5, before=None):
    import statistics

    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


@contextlib.contextmanager
def env_set(env):
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def interleaved_env_medians(var, arms, fn, rounds=3):
    """Median do_bench time (ms) of fn under each value in `arms` of the run-time switch `var` (read
    by the binding at each call), the arms interleaved over `rounds`; one median per arm."""
    import statistics

    from triton.testing import do_bench
    times = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm in arms:
            with env_set({var: arm}):
                times[arm].append(do_bench(fn, warmup=25, rep=100))
    return [statistics.median(times[arm]) for arm in arms]


def grid_fwd_cells(head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 8192)):
    """The standard grid's forward cells for A/B scripts: (d, causal, seqlen, flops, q, k, v) with
    fresh bf16 inputs (16k tokens, hidden 2048), for the head dims built for bf16."""
    import torch

    import flash_attn._C as ext
    built = {tuple(c) for c in ext.built_configs()}
    for d in head_dims:
        if ("bf16", d) not in built:
            continue
        for causal in (False, True):
            for s in seqlens:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                yield d, causal, s, 4 * b * h * s * s * d / (2 if causal else 1), q, k, v


def run_cases_in_processes(script, cases, timeout, label_width=60):
    failed = 0
    for i, case in enumerate(cases):
        label = " ".join(str(x) for x in case)
        try:
            r = subprocess.run([sys.executable, script, "--case", str(i)], capture_output=True, text=True,
                               timeout=timeout)
            ok = r.returncode == 0
            msg = (r.stdout.strip().splitlines() or [""])[-1] if ok else (r.stdout + r.stderr).strip()[-600:]
        except subprocess.TimeoutExpired:
            ok, msg = False, f"TIMEOUT after {timeout:.0f} s (hang?)"
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {label:<{label_width}} {msg}", flush=True)
    print("ALL PASS" if not failed else f"{failed} FAILED")
    return failed


def cases_of_built_head_dims(cases, d_index=1):
    """The cases whose head-dim tile (64 / 128 / 256) a build restricted by FLASH_ATTN_HEAD_DIMS has
    (all of them otherwise). The per-case processes inherit the variable, so indices agree."""
    built = os.environ.get("FLASH_ATTN_HEAD_DIMS")
    if not built:
        return cases
    tiles = {int(x) for x in built.split(",") if x}
    return [c for c in cases if (64 if c[d_index] <= 64 else 128 if c[d_index] <= 128 else 256) in tiles]


def random_qkv_dout(dtype, b, sq, sk, h, hk, d, seed):
    """q (b, sq, h, d), k and v (b, sk, hk, d) requiring grad, dout like q; seeded."""
    import torch

    torch.manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    return q, k, v, dout


def custom_op_fwd_bwd(q, k, v, dout, causal, window, dropout_p=0.0, alibi_slopes=None, varlen=False):
    """Runs the forward of q (b, sq, h, d), k, v (b, sk, hk, d) through the custom op
    flash_attn::_flash_attn_forward, or (varlen) _flash_attn_varlen_forward on the packed
    (total, h, d) layout with every sequence at full length, so that the dense naive reference
    applies. Returns (out (b, sq, h, d), lse, rng_state, bwd): bwd(env) runs the matching backward
    custom op with the environment variables `env` set and returns (dq, dk, dv) in the dense shapes."""
    import torch

    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    wl, wr = window
    if causal:
        wr = 0
    scale = d ** -0.5
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    ops = torch.ops.flash_attn
    if varlen:
        cu_q = torch.arange(0, (b + 1) * sq, sq, device="cuda", dtype=torch.int32)
        cu_k = torch.arange(0, (b + 1) * sk, sk, device="cuda", dtype=torch.int32)
        flat = [t.reshape(-1, *t.shape[2:]) for t in (qd, kd, vd)]
        out, lse, _, rng_state = ops._flash_attn_varlen_forward(
            *flat, cu_q, cu_k, sq, sk, dropout_p, scale, causal, wl, wr, 0.0, alibi_slopes, False)
    else:
        out, lse, _, rng_state = ops._flash_attn_forward(
            qd, kd, vd, dropout_p, scale, causal, wl, wr, 0.0, alibi_slopes, False)

    def bwd(env):
        with env_set(env):
            if varlen:
                dq, dk, dv = (torch.empty_like(t) for t in flat)
                ops._flash_attn_varlen_backward(
                    dout.reshape(-1, h, d), *flat, out, lse, dq, dk, dv, cu_q, cu_k, sq, sk, dropout_p, scale,
                    causal, wl, wr, 0.0, alibi_slopes, False, rng_state)
                grads = (dq.view(b, sq, h, d), dk.view(b, sk, hk, d), dv.view(b, sk, hk, d))
            else:
                dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
                ops._flash_attn_backward(dout, qd, kd, vd, out, lse, dq, dk, dv, dropout_p, scale, causal, wl, wr,
                                         0.0, alibi_slopes, False, rng_state)
                grads = (dq, dk, dv)
            torch.cuda.synchronize()
        return grads

    return out.view(b, sq, h, d), lse, rng_state, bwd


def bench_backward_variants(variants, head_dims=(64, 128)):
    import torch
    import triton.testing

    from flash_attn import flash_attn_func

    print("\nbackward ms, bf16, batch 2 x seqlen 8192, hidden 2048 (do_bench median)")
    for d in head_dims:
        for causal in (False, True):
            h = 2048 // d
            q, k, v = (torch.randn(2, 8192, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            row = []
            for tag, fwd_kwargs, env in variants:
                out = flash_attn_func(q, k, v, causal=causal, **fwd_kwargs)
                with env_set(env):
                    ms = triton.testing.do_bench(
                        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=150)
                row.append((tag, ms))
            base = row[0][1]
            print(f"  d{d:<4} {'causal' if causal else 'full  '}  " +
                  "  ".join(f"{t} {ms:7.3f} ({ms / base:.3f}x)" for t, ms in row), flush=True)


def bench_forward_cells(tag, head_dims=(64, 128), seqlens=(512, 1024, 2048, 4096, 8192, 16384), features=False):
    """Forward TFLOP/s of the grid's cells (bf16, 16k tokens, hidden 2048, causal off / on), one
    parseable line per cell: `FWD <tag> d<D> <full|causal> s<S> <TFLOP/s>`; with `features`, also
    the 8k non-causal forward with dropout 0.1, ALiBi and softcap 30 (modes `dropout`, `alibi`,
    `softcap`). For A/B runs that swap the extension's .so between processes (compile-time
    changes): see fwd_so_ab_table."""
    import torch
    from triton.testing import do_bench

    from flash_attn import flash_attn_func

    def cell(d, mode, s, **kwargs):
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        if mode == "alibi":
            kwargs["alibi_slopes"] = torch.rand(h, device="cuda", dtype=torch.float32) * 0.3
        ms = do_bench(lambda: flash_attn_func(q, k, v, **kwargs), warmup=25, rep=100)
        tf = 4 * b * h * s * s * d / (2 if kwargs.get("causal") else 1) / ms * 1e-9
        print(f"FWD {tag} d{d} {mode} s{s} {tf:.1f}", flush=True)

    for d in head_dims:
        for causal in (False, True):
            for s in seqlens:
                cell(d, "causal" if causal else "full", s, causal=causal)
        if features:
            cell(d, "dropout", 8192, dropout_p=0.1)
            cell(d, "alibi", 8192)
            cell(d, "softcap", 8192, softcap=30.0)


def fwd_so_ab_table(lines, base="old"):
    """Median TFLOP/s per tag and cell from bench_forward_cells lines (several rounds), and each
    tag's ratio to `base`, as one text table."""
    import statistics
    cells = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 6 and parts[0] == "FWD":
            _, tag, d, mode, s, tf = parts
            cells.setdefault((d, mode), {}).setdefault(s, {}).setdefault(tag, []).append(float(tf))
    out = []
    for (d, mode), by_s in cells.items():
        row = []
        for s, by_tag in by_s.items():
            med = {t: statistics.median(v) for t, v in by_tag.items()}
            b = med.get(base)
            row.append(f"{s}: " + " ".join(f"{t} {m:.0f}" + (f" ({m / b:.3f}x)" if b and t != base else "")
                                           for t, m in med.items()))
        out.append(f"{d} {mode:<6} " + "  ".join(row))
    return "\n".join(out)


def check_main(script, cases, run_case, bench, default_timeout, label_width=60, add_args=None):
    """Runs `run_case(i)` (with --case i), or every case in its own process and then `bench(args)`
    unless a case failed; returns the exit status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", type=int)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--timeout", type=float, default=default_timeout)
    if add_args is not None:
        add_args(ap)
    args = ap.parse_args()
    if args.case is not None:
        print(run_case(args.case))
        return 0
    failed = 0
    if not args.bench_only:
        failed = run_cases_in_processes(script, cases, args.timeout, label_width=label_width)
    if not args.no_bench and not failed:
        bench(args)
    return 1 if failed else 0
