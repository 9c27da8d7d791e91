#!/usr/bin/env python3
"""Attention benchmark: flash_attn (ours) vs PyTorch SDPA backends vs naive attention.

Run on a machine with an NVIDIA GPU (built for H100/H200, sm90):

    python benchmarks/benchmark_attn.py --quick            # small smoke subset
    python benchmarks/benchmark_attn.py                    # standard grid, bf16
    python benchmarks/benchmark_attn.py --dtypes bf16,fp16 --check
    python benchmarks/benchmark_attn.py --decode           # 1 query token vs long KV cache
    python benchmarks/benchmark_attn.py --varlen           # packed variable-length batch
    python benchmarks/benchmark_attn.py --features         # cost of window/ALiBi/dropout/...
    python benchmarks/benchmark_attn.py --sinks            # cost of learnable_sink (gpt-oss shapes)
    python benchmarks/benchmark_attn.py --mla              # head dims 192 / 128 against SDPA-cuDNN
    python benchmarks/benchmark_attn.py --sdpa-ab          # SDPA on our kernels vs flash_attn_func, interleaved

Standard grid (as in the FlashAttention papers): total tokens 16384 (batch = 16384 // seqlen),
hidden 2048 (nheads = 2048 // headdim), headdim in {64, 128, 256},
seqlen in {512, ..., 16384}, causal off/on.

FLOPs: forward = 4 * batch * nheads * seqlen_q * seqlen_k * headdim, halved when causal;
backward = 2.5 x forward; forward+backward = 3.5 x forward.

Timing: median of triton.testing.do_bench (which flushes L2 before every timed call), or of
CUDA events with an explicit L2 flush when triton is missing; several input sets are rotated
when one set is smaller than ~3x L2. Backward is timed as torch.autograd.grad on a graph built
outside the timed region (retain_graph=True); nothing is subtracted.

Outputs (in --out, default bench_out/): attn.csv, attn.json, attn_tflops.png
(decode mode: decode.csv, decode.json, decode_bw.png; varlen mode: varlen.csv,
varlen.json). Decode times flash_attn_with_kvcache on a contiguous cache ("ours") and on a
paged cache with 16-token pages ("ours_paged16", same bytes), against SDPA flash / cuDNN.
Varlen times flash_attn_varlen_func on ~16k packed tokens of lengths 128..4096 and reports
TFLOP/s (sum over sequences) beside the dense kernel's at the same token count. A printed table, the ours/flash
ratio summary and the peak extra memory of forward+backward (ours vs naive) go to stdout.

Every backend failure is caught, printed once and recorded as 'n/a'; only a sticky CUDA
error (the context is unusable afterwards) stops the run, after saving partial results.
"""

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import platform
import statistics
import sys
import traceback

# "sdpa_ours": F.scaled_dot_product_attention's flash backend with flash_attn.sdpa activated, i.e.
# this package's kernels behind SDPA (the same kernels as "ours", plus SDPA's dispatch).
ALL_BACKENDS = ["ours", "sdpa_ours", "flash", "cudnn", "efficient", "naive"]
SDPA_BACKEND_NAMES = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
DEFAULT_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
DEFAULT_HEADDIMS = [64, 128, 256]
QUICK_SEQLENS = [2048, 8192]
QUICK_HEADDIMS = [64, 128]
# (batch, seqlen_k) for --decode; 32 query heads, 8 kv heads, headdim 128, bf16, seqlen_q 1.
DECODE_CONFIGS = [(16, 4096), (16, 32768), (4, 131072)]
DECODE_HEADS_Q, DECODE_HEADS_KV, DECODE_HEADDIM = 32, 8, 128
PHASES = ["fwd", "bwd", "fwdbwd"]
PHASE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; the device property is used when present
# Only for testing this script itself on a machine without a GPU (tiny shapes, wall-clock
# timings that mean nothing): FLASH_ATTN_BENCH_DEVICE=cpu.
DEVICE = os.environ.get("FLASH_ATTN_BENCH_DEVICE", "cuda")
ON_GPU = DEVICE == "cuda"


def _sync(torch):
    if ON_GPU:
        torch.cuda.synchronize()


def _empty_cache(torch):
    if ON_GPU:
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------
# Command line (no torch import here: --help works anywhere)
# --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _ours_behind_sdpa(kernel_ctx):
    from flash_attn import sdpa
    sdpa.activate()
    try:
        with kernel_ctx:
            yield
    finally:
        sdpa.deactivate()


def _int_list(s):
    try:
        return [int(x) for x in s.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % s)


def _str_list(choices):
    def parse(s):
        items = [x.strip().lower() for x in s.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                "unknown value(s) %s; choose from %s" % (bad or s, ",".join(choices)))
        return items
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark flash_attn (ours) against PyTorch SDPA backends "
                    "(flash, cuDNN, memory-efficient) and naive attention. Needs a CUDA GPU.",
        epilog="FLOPs: fwd = 4*batch*nheads*seqlen_q*seqlen_k*headdim (halved when causal), "
               "bwd = 2.5x fwd, fwd+bwd = 3.5x fwd. Outputs: attn.csv, attn.json, attn_tflops.png "
               "(decode: decode.csv, decode.json, decode_bw.png) in --out.")
    p.add_argument("--out", default="bench_out",
                   help="output directory for CSV/JSON/PNG (default: bench_out)")
    p.add_argument("--seqlens", type=_int_list, default=None,
                   help="comma-separated sequence lengths (default %s)" %
                        ",".join(map(str, DEFAULT_SEQLENS)))
    p.add_argument("--headdims", type=_int_list, default=None,
                   help="comma-separated head dims (default %s)" %
                        ",".join(map(str, DEFAULT_HEADDIMS)))
    p.add_argument("--causal", choices=["0", "1", "both"], default="both",
                   help="causal masking: off, on, or both (default: both)")
    p.add_argument("--dtypes", type=_str_list(["bf16", "fp16"]), default=["bf16"],
                   help="comma-separated dtypes: bf16,fp16 (default: bf16)")
    p.add_argument("--backends", type=_str_list(ALL_BACKENDS), default=[b for b in ALL_BACKENDS if b != "sdpa_ours"],
                   help="comma-separated subset of %s (default: all but sdpa_ours)" % ",".join(ALL_BACKENDS))
    p.add_argument("--quick", action="store_true",
                   help="small subset for smoke tests: seqlen %s, headdim %s (unless given)" %
                        (QUICK_SEQLENS, QUICK_HEADDIMS))
    p.add_argument("--check", action="store_true",
                   help="first check ours against SDPA math on one config; abort on mismatch")
    p.add_argument("--decode", action="store_true",
                   help="decode mode instead of the grid: 1 query token vs seqlen_k "
                        "4k/32k/128k, bf16, d=128, 32 q heads / 8 kv heads; reports GB/s")
    p.add_argument("--varlen", action="store_true",
                   help="varlen mode: a packed batch of ~total-tokens tokens with lengths "
                        "128..4096 (fixed seed); ours varlen vs ours dense, fwd/bwd TFLOP/s")
    p.add_argument("--decode-page", type=int, default=16,
                   help="page size of the paged-cache decode variant (default: 16)")
    p.add_argument("--decode-rounds", type=int, default=3,
                   help="decode: time every backend this many times, in interleaved rounds "
                        "(ours, paged, flash, cudnn, ..., then again), and report the median; "
                        "clock / thermal drift over a run then hits every backend alike (default: 3)")
    p.add_argument("--decode-clean", action="store_true",
                   help="decode: also time every backend with a read-only L2 flush (a 256 MB "
                        "buffer summed before each call) and print a second table: do_bench's "
                        "zero fill leaves ~50 MB of dirty L2 lines that are written back during "
                        "the timed call")
    p.add_argument("--features", action="store_true",
                   help="feature-cost mode instead of the grid: ours only, plain vs sliding "
                        "window (left=512), ALiBi, dropout 0.1, softcap and the deterministic "
                        "backward at seqlen 8192, headdim 128 (unless given), bf16")
    p.add_argument("--sinks", action="store_true",
                   help="learnable-sink cost mode: gpt-oss-20b-like shapes (64 q / 8 kv heads, d64, "
                        "seqlen 8192, causal, window (128, 0) and full), ours with a sink against "
                        "ours without, alternated over --sink-rounds rounds")
    p.add_argument("--mla", action="store_true",
                   help="MLA mode: Q / K head dim 192 with V head dim 128 (DeepSeek MLA prefill), "
                        "b2 16 heads seqlen 8192, causal and not, ours against SDPA-cuDNN, fwd / bwd "
                        "TFLOP/s on 2 b h s^2 (192 + 128) (halved causal; bwd 2.5x)")
    p.add_argument("--sdpa-ab", action="store_true",
                   help="SDPA-on-ours mode: over the grid, F.scaled_dot_product_attention with "
                        "flash_attn.sdpa activated (the flash backend) against flash_attn_func on "
                        "the same inputs, alternated over --ab-rounds rounds; fwd / bwd ratios")
    p.add_argument("--ab-rounds", type=int, default=3,
                   help="--sdpa-ab: rounds of (flash_attn_func, SDPA) timings, each round in the other order")
    p.add_argument("--sink-rounds", type=int, default=6,
                   help="--sinks: rounds of (plain, sink) timings, each round in the other order")
    p.add_argument("--total-tokens", type=int, default=16384,
                   help="batch = total_tokens // seqlen, at least 1 (default: 16384)")
    p.add_argument("--hidden", type=int, default=2048,
                   help="nheads = hidden // headdim (default: 2048)")
    p.add_argument("--naive-max-gb", type=float, default=40.0,
                   help="skip naive attention when its estimated memory exceeds this (default: 40)")
    p.add_argument("--skip-memory", action="store_true",
                   help="skip the peak-memory comparison (ours vs naive)")
    p.add_argument("--warmup-ms", type=int, default=25,
                   help="do_bench warm-up time per measurement (default: 25)")
    p.add_argument("--rep-ms", type=int, default=100,
                   help="do_bench repetition time per measurement (default: 100)")
    args = p.parse_args(argv)
    if args.features:
        if args.seqlens is None:
            args.seqlens = [8192]
        if args.headdims is None:
            args.headdims = [128]
    if args.seqlens is None:
        args.seqlens = list(QUICK_SEQLENS if args.quick else DEFAULT_SEQLENS)
    if args.headdims is None:
        args.headdims = list(QUICK_HEADDIMS if args.quick else DEFAULT_HEADDIMS)
    args.causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    for s in args.seqlens:
        if s <= 0:
            p.error("--seqlens must be positive")
    for d in args.headdims:
        if d <= 0 or args.hidden % d:
            p.error("--headdims: %d does not divide --hidden %d" % (d, args.hidden))
    return args


# --------------------------------------------------------------------------------------
# FLOPs and shapes
# --------------------------------------------------------------------------------------
def attn_fwd_flops(batch, nheads, seqlen_q, seqlen_k, headdim, causal):
    f = 4.0 * batch * nheads * seqlen_q * seqlen_k * headdim
    return f / 2 if causal else f


def grid_configs(args):
    for dtype in args.dtypes:
        for causal in args.causals:
            for d in args.headdims:
                for s in args.seqlens:
                    yield dict(dtype=dtype, causal=causal, headdim=d, seqlen_q=s, seqlen_k=s,
                               batch=max(1, args.total_tokens // s), nheads=args.hidden // d,
                               nheads_k=args.hidden // d)


def fmt_num(x, width=5):
    if x is None:
        return "n/a".rjust(width)
    return ("%.0f" % x).rjust(width)


# --------------------------------------------------------------------------------------
# The GPU part
# --------------------------------------------------------------------------------------

def _flushed_event_median_ms(torch, fn, flush, n):
    """Median ms of n calls of fn, each timed by CUDA events after flush() (an L2 flush)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for start, end in zip(starts, ends):
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends)))

class StickyCudaError(RuntimeError):
    pass


class Bench:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.failures_seen = set()
        self.failures_suppressed = 0
        if ON_GPU:
            props = torch.cuda.get_device_properties(0)
            self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
            self.device_name = props.name
            self.capability = "%d.%d" % (props.major, props.minor)
            self.total_mem = props.total_memory
        else:
            self.l2_bytes, self.device_name, self.capability, self.total_mem = (
                DEFAULT_L2_BYTES, "cpu (script self-test only)", "0.0", 0)
        self.timer_kind, self._bench = self._make_timer()
        self.ours = None
        self.ours_error = None
        self.built_configs = None
        try:  # also used by --check and the peak-memory comparison
            from flash_attn import flash_attn_func
            self.ours = flash_attn_func
            try:
                from flash_attn import _C  # noqa: F401
                self.built_configs = [list(c) for c in _C.built_configs()]
            except Exception:  # noqa: BLE001
                pass
        except Exception as e:  # noqa: BLE001
            self.ours_error = "%s: %s" % (type(e).__name__, e)
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            self.SDPBackend, self.sdpa_kernel = SDPBackend, sdpa_kernel
        except Exception:  # noqa: BLE001  (torch < 2.3)
            self.SDPBackend, self.sdpa_kernel = None, None

    # ---- timing ------------------------------------------------------------------------
    def _make_timer(self):
        torch = self.torch
        warmup, rep = self.args.warmup_ms, self.args.rep_ms
        if not ON_GPU:
            import time

            def bench(fn):
                fn()
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t0) * 1e3)
                return float(statistics.median(ts))
            return "wall clock (cpu self-test)", bench
        try:
            import triton.testing as tt

            def bench(fn):
                try:
                    r = tt.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
                except TypeError:  # older triton: no return_mode
                    r = tt.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])
                if isinstance(r, (list, tuple)):
                    r = r[0]
                return float(r)
            return "triton.testing.do_bench (median)", bench
        except Exception:  # noqa: BLE001
            pass

        def bench(fn):
            flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=DEVICE)
            fn()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(5):
                flush.zero_()
                fn()
            e.record()
            torch.cuda.synchronize()
            est = max(s.elapsed_time(e) / 5, 1e-3)
            for _ in range(max(1, int(warmup / est))):
                fn()
            n = max(5, min(10000, int(rep / est)))
            return _flushed_event_median_ms(torch, fn, flush.zero_, n)
        return "CUDA events (median, L2 flushed)", bench

    def clean_timer(self, fn, reps=40, warmup=3):
        """Median ms of fn over CUDA events, each call after an L2 flush that reads a 256 MB buffer
        (clean lines: nothing is written back during the timed call)."""
        torch = self.torch
        if getattr(self, "_read_flush", None) is None:
            self._read_flush = torch.randn(64 * 1024 * 1024, device=DEVICE)
        for _ in range(warmup):
            fn()
        return _flushed_event_median_ms(torch, fn, self._read_flush.sum, reps)

    @contextlib.contextmanager
    def timer_swapped(self, timer):
        saved, self._bench = self._bench, timer
        try:
            yield
        finally:
            self._bench = saved

    def n_rotations(self, set_bytes):
        """How many distinct input sets to rotate so one pass over them exceeds ~3x L2."""
        if set_bytes <= 0 or set_bytes >= 3 * self.l2_bytes:
            return 1
        return int(min(16, math.ceil(3 * self.l2_bytes / set_bytes)))

    # ---- error handling ----------------------------------------------------------------
    def context_alive(self):
        torch = self.torch
        try:
            _sync(torch)
            torch.ones(1, device=DEVICE).add_(1).item()
            return True
        except Exception:  # noqa: BLE001
            return False

    def report_failure(self, backend, what, exc):
        torch = self.torch
        msg = "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        msg = msg[:300]
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in msg:
            msg = "out of memory"
        key = (backend, msg)
        if key in self.failures_seen:
            self.failures_suppressed += 1
        else:
            self.failures_seen.add(key)
            print("  [n/a] %-9s %s: %s" % (backend, what, msg), flush=True)
        try:
            _empty_cache(torch)
        except Exception:  # noqa: BLE001
            pass
        if not self.context_alive():
            raise StickyCudaError("CUDA context unusable after %s %s failed: %s" % (backend, what, msg))
        return msg

    # ---- backends ----------------------------------------------------------------------
    def backend_fn(self, backend, causal, seqlen_q, seqlen_k, enable_gqa=False):
        """Returns (ctx_factory, fn(q, k, v) -> out) for inputs in (b, s, h, d) layout."""
        torch = self.torch
        causal = bool(causal)
        F = torch.nn.functional
        if backend == "ours":
            if self.ours is None:
                raise RuntimeError("flash_attn import failed: %s" % self.ours_error)
            f = self.ours
            return contextlib.nullcontext, (lambda q, k, v: f(q, k, v, causal=causal))
        if backend in SDPA_BACKEND_NAMES or backend == "sdpa_ours":
            if self.sdpa_kernel is None:
                raise RuntimeError("torch.nn.attention.sdpa_kernel not available in this torch")
            be = getattr(self.SDPBackend, SDPA_BACKEND_NAMES.get(backend, "FLASH_ATTENTION"))
            sdpa_causal = causal and seqlen_q > 1
            if sdpa_causal and seqlen_q != seqlen_k:
                raise RuntimeError("SDPA is_causal is top-left aligned; only seqlen_q == seqlen_k compared")
            kw = {"enable_gqa": True} if enable_gqa else {}

            def fn(q, k, v):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=sdpa_causal, **kw)
            if backend == "sdpa_ours":
                return (lambda: _ours_behind_sdpa(self.sdpa_kernel([be]))), fn
            return (lambda: self.sdpa_kernel([be])), fn
        if backend == "naive":
            mask = None
            if causal:  # bottom-right aligned: query i sees key j iff j <= i + sk - sq
                mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=DEVICE).triu(
                    seqlen_k - seqlen_q + 1)

            def fn(q, k, v):
                scale = q.shape[-1] ** -0.5
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                if kt.shape[1] != qt.shape[1]:
                    rep = qt.shape[1] // kt.shape[1]
                    kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
                s = torch.matmul(qt * scale, kt.transpose(-2, -1))
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                p = torch.softmax(s, dim=-1)
                return torch.matmul(p, vt)
            return contextlib.nullcontext, fn
        raise ValueError(backend)

    def naive_bytes(self, cfg, train):
        elt = 2
        m = cfg["batch"] * cfg["nheads"] * cfg["seqlen_q"] * cfg["seqlen_k"] * elt
        # forward: scores + probabilities; forward+backward: + dP, dS and a temporary
        return m * ((5 if cfg["causal"] else 4) if train else 2)

    def make_inputs(self, cfg, n_sets, dtype):
        torch = self.torch
        b, sq, sk = cfg["batch"], cfg["seqlen_q"], cfg["seqlen_k"]
        h, hk, d = cfg["nheads"], cfg["nheads_k"], cfg["headdim"]
        sets = []
        for _ in range(n_sets):
            q = torch.randn(b, sq, h, d, device=DEVICE, dtype=dtype)
            k = torch.randn(b, sk, hk, d, device=DEVICE, dtype=dtype)
            v = torch.randn(b, sk, hk, cfg.get("headdim_v", d), device=DEVICE, dtype=dtype)
            sets.append((q, k, v))
        return sets

    # ---- one measurement ---------------------------------------------------------------
    def time_phase(self, backend, phase, cfg, sets, enable_gqa=False, kv_transform=None, fn=None):
        """Median milliseconds of one phase, rotating over the input sets (fn(q, k, v) replaces
        the backend's function when given)."""
        torch = self.torch
        if fn is None:
            ctx_factory, fn = self.backend_fn(backend, cfg["causal"], cfg["seqlen_q"],
                                              cfg["seqlen_k"], enable_gqa=enable_gqa)
        else:
            ctx_factory = contextlib.nullcontext
        if kv_transform is not None:  # e.g. repeat kv heads, outside the timed region
            sets = [(q, kv_transform(k), kv_transform(v)) for q, k, v in sets]
        n = len(sets)
        it = [0]
        with ctx_factory():
            if phase == "fwd":
                def run():
                    q, k, v = sets[it[0] % n]
                    it[0] += 1
                    fn(q, k, v)
                with torch.no_grad():
                    return self._bench(run)

            leaves = [tuple(t.detach().requires_grad_() for t in s) for s in sets]
            with torch.no_grad():
                out_shape = fn(*sets[0]).shape
            douts = [torch.randn(out_shape, device=DEVICE, dtype=sets[0][0].dtype) for _ in range(n)]
            if phase == "fwdbwd":
                def run():
                    i = it[0] % n
                    it[0] += 1
                    q, k, v = leaves[i]
                    torch.autograd.grad(fn(q, k, v), (q, k, v), douts[i])
                return self._bench(run)

            # bwd: graphs built once, outside the timed region
            outs = [fn(*lv) for lv in leaves]

            def run():
                i = it[0] % n
                it[0] += 1
                torch.autograd.grad(outs[i], leaves[i], douts[i], retain_graph=True)
            try:
                return self._bench(run)
            finally:
                del outs

    # ---- correctness check -------------------------------------------------------------
    def check(self):
        torch = self.torch
        a = self.args
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtypes[0]]
        d = a.headdims[0]
        b, s, h = 2, 1024, 8
        print("== --check: ours vs SDPA math, %s b=%d s=%d h=%d d=%d" % (a.dtypes[0], b, s, h, d))
        if self.ours is None:
            print("CHECK FAILED: flash_attn import failed: %s" % self.ours_error)
            return False
        ok = True
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, s, h, d, device=DEVICE, dtype=dtype) for _ in range(3))
            dout = torch.randn(b, s, h, d, device=DEVICE, dtype=dtype)

            def math_attn(q, k, v):
                with self.sdpa_kernel([self.SDPBackend.MATH]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        is_causal=causal).transpose(1, 2)

            def run(f, cast):
                lv = [t.detach().to(cast).requires_grad_() for t in (q, k, v)]
                o = f(*lv)
                g = torch.autograd.grad(o, lv, dout.to(cast))
                return [o.float()] + [x.float() for x in g]

            try:
                ref = run(math_attn, torch.float32)
                low = run(math_attn, dtype)
                ours = run(lambda q, k, v: self.ours(q, k, v, causal=causal), dtype)
            except Exception as e:  # noqa: BLE001
                print("CHECK FAILED (causal=%s): %s: %s" % (causal, type(e).__name__, e))
                traceback.print_exc()
                return False
            for name, r, l, o in zip(["out", "dq", "dk", "dv"], ref, low, ours):
                err_o = (o - r).abs().max().item()
                err_l = (l - r).abs().max().item()
                # upstream's criterion: within 2x (out) / 3x (grads) of the low-precision
                # reference's own error, plus a small rounding allowance
                tol = (2 if name == "out" else 3) * err_l + 1e-3 * (r.abs().max().item() + 1e-6)
                good = math.isfinite(err_o) and err_o <= tol
                ok &= good
                print("  causal=%d %-3s max|ours-ref|=%.3e  max|math_%s-ref|=%.3e  %s" % (
                    causal, name, err_o, a.dtypes[0], err_l, "ok" if good else "MISMATCH"))
        print("== check %s" % ("passed" if ok else "FAILED"))
        return ok

    # ---- peak memory -------------------------------------------------------------------
    def peak_memory(self):
        torch = self.torch
        dtype_name = self.args.dtypes[0]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        b, s, d = 1, 8192, 128
        h = max(1, self.args.hidden // d)
        cfg = dict(batch=b, seqlen_q=s, seqlen_k=s, nheads=h, nheads_k=h, headdim=d, causal=False)
        res = {"config": "%s b=%d s=%d h=%d d=%d non-causal" % (dtype_name, b, s, h, d)}
        in_bytes = 4 * b * s * h * d * 2  # q, k, v, dout
        res["input_bytes"] = in_bytes
        print("== peak extra memory of forward+backward (%s; excludes q,k,v,dout = %.0f MiB; "
              "includes out and dq,dk,dv = %.0f MiB)" % (res["config"], in_bytes / 2**20,
                                                          4 * b * s * h * d * 2 / 2**20))
        for backend in ("ours", "naive"):
            if not ON_GPU:
                res[backend] = None
                continue
            try:
                _, fn = self.backend_fn(backend, False, s, s)
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                q, k, v, dout = (torch.randn(b, s, h, d, device=DEVICE, dtype=dtype) for _ in range(4))
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                out = fn(q, k, v)
                g = torch.autograd.grad(out, (q, k, v), dout.view(out.shape) if backend == "ours"
                                        else dout.transpose(1, 2))
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                del out, g, q, k, v, dout
                res[backend] = peak
                print("  %-6s %10.1f MiB" % (backend, peak / 2**20))
            except Exception as e:  # noqa: BLE001
                res[backend] = None
                print("  %-6s n/a (%s)" % (backend, self.report_failure(backend, "peak memory", e)))
        if res.get("ours") and res.get("naive"):
            print("  naive / ours = %.1fx" % (res["naive"] / res["ours"]))
        _empty_cache(torch)
        return res


# --------------------------------------------------------------------------------------
# Grid mode
# --------------------------------------------------------------------------------------
def run_grid(bench, args, rows):
    """Appends one record per (config, backend) to rows (kept on a fatal error)."""
    torch = bench.torch
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    hdr = "%-5s %-6s %4s %6s %5s %4s |" % ("dtype", "causal", "d", "seqlen", "batch", "nh")
    hdr += "".join(" %13s |" % b for b in args.backends)
    print("\nTFLOP/s, each cell fwd/bwd (fwd+bwd in the CSV); timer: %s" % bench.timer_kind)
    print(hdr)
    print("-" * len(hdr))
    for cfg in grid_configs(args):
        dtype = dtypes[cfg["dtype"]]
        flops = attn_fwd_flops(cfg["batch"], cfg["nheads"], cfg["seqlen_q"], cfg["seqlen_k"],
                               cfg["headdim"], cfg["causal"])
        set_bytes = 5 * cfg["batch"] * cfg["seqlen_q"] * cfg["nheads"] * cfg["headdim"] * 2
        n_sets = bench.n_rotations(set_bytes)
        what = "%s causal=%d d=%d s=%d" % (cfg["dtype"], cfg["causal"], cfg["headdim"], cfg["seqlen_q"])
        try:
            sets = bench.make_inputs(cfg, n_sets, dtype)
        except Exception as e:  # noqa: BLE001
            bench.report_failure("inputs", what, e)
            continue
        cells = {}
        for backend in args.backends:
            rec = dict(cfg, causal=int(cfg["causal"]), backend=backend, n_input_sets=n_sets,
                       fwd_flops=flops, note="")
            notes = []
            for phase in PHASES:
                ms = None
                if backend == "naive" and bench.naive_bytes(cfg, phase != "fwd") > args.naive_max_gb * 1e9:
                    notes.append("%s skipped: naive needs ~%.0f GB" % (
                        phase, bench.naive_bytes(cfg, phase != "fwd") / 1e9))
                else:
                    try:
                        ms = bench.time_phase(backend, phase, cfg, sets)
                    except StickyCudaError:
                        raise
                    except Exception as e:  # noqa: BLE001
                        notes.append("%s: %s" % (phase, bench.report_failure(backend, "%s %s" % (phase, what), e)))
                        if phase == "fwd" and backend != "naive":
                            # a backend that cannot run forward will not run backward
                            for p in PHASES[1:]:
                                rec["%s_ms" % p] = None
                                rec["%s_tflops" % p] = None
                            rec["fwd_ms"], rec["fwd_tflops"] = None, None
                            break
                rec["%s_ms" % phase] = ms
                rec["%s_tflops" % phase] = (PHASE_FLOP_FACTOR[phase] * flops / (ms * 1e-3) / 1e12
                                            if ms else None)
            rec["note"] = "; ".join(notes)
            if backend == "naive":
                _empty_cache(torch)
            rows.append(rec)
            cells[backend] = "%s/%s" % (fmt_num(rec.get("fwd_tflops"), 0), fmt_num(rec.get("bwd_tflops"), 0))
        del sets
        line = "%-5s %-6s %4d %6d %5d %4d |" % (cfg["dtype"], "yes" if cfg["causal"] else "no",
                                               cfg["headdim"], cfg["seqlen_q"], cfg["batch"], cfg["nheads"])
        line += "".join(" %13s |" % cells.get(b, "") for b in args.backends)
        print(line, flush=True)


# (name, flash_attn_func keyword arguments, the plain baseline it is compared with, which
# ratio the criterion is about and its bound): ratio = time / baseline time.
FEATURE_VARIANTS = [
    ("plain", {}, None, None, None),
    ("causal", {"causal": True}, None, None, None),
    ("window(512,0)", {"window_size": (512, 0)}, "causal", "speedup fwdbwd", 4.0),
    ("alibi", {"alibi_slopes": "ALIBI"}, "plain", "fwdbwd", 1.15),
    ("alibi+causal", {"alibi_slopes": "ALIBI", "causal": True}, "causal", "fwdbwd", 1.15),
    ("dropout0.1", {"dropout_p": 0.1}, "plain", "fwdbwd", 1.15),
    ("softcap30", {"softcap": 30.0}, "plain", "fwdbwd", None),
    ("deterministic", {"deterministic": True}, "plain", "bwd", 1.25),
    ("determ.+causal", {"deterministic": True, "causal": True}, "causal", "bwd", 1.25),
]


def _fmt3(x):
    return "n/a" if x is None else "%.3f" % x


def run_features(bench, args, rows):
    """Feature-cost table: ours with each feature vs the plain kernel (same shapes)."""
    torch = bench.torch
    if bench.ours is None:
        raise RuntimeError("flash_attn import failed: %s" % bench.ours_error)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    print("\nFeature costs (ours; ms, and time / baseline time); timer: %s" % bench.timer_kind)
    hdr = "%-5s %4s %6s %5s %4s  %-15s %9s %9s %9s  %-8s %7s %7s %7s  %s" % (
        "dtype", "d", "seqlen", "batch", "nh", "variant", "fwd ms", "bwd ms", "f+b ms",
        "vs", "fwd x", "bwd x", "f+b x", "criterion")
    print(hdr)
    print("-" * len(hdr))
    for dt in args.dtypes:
        dtype = dtypes[dt]
        for d in args.headdims:
            for s in args.seqlens:
                batch = max(1, args.total_tokens // s)
                nheads = args.hidden // d
                cfg = dict(dtype=dt, headdim=d, seqlen_q=s, seqlen_k=s, batch=batch,
                           nheads=nheads, nheads_k=nheads, causal=False)
                n_sets = bench.n_rotations(5 * batch * s * nheads * d * 2)
                sets = bench.make_inputs(cfg, n_sets, dtype)
                slopes = torch.rand(nheads, device=DEVICE, dtype=torch.float32) * 0.1
                times = {}
                for name, kw, base, crit, bound in FEATURE_VARIANTS:
                    kw = {k: (slopes if v == "ALIBI" else v) for k, v in kw.items()}
                    f = bench.ours
                    fn = (lambda q, k, v, kw=kw: f(q, k, v, **kw))
                    rec = dict(cfg, causal=int(kw.get("causal", False)), backend="ours:" + name,
                               n_input_sets=n_sets, note="")
                    ms = {}
                    for phase in PHASES:
                        try:
                            ms[phase] = bench.time_phase("ours", phase, cfg, sets, fn=fn)
                        except StickyCudaError:
                            raise
                        except Exception as e:  # noqa: BLE001
                            rec["note"] = bench.report_failure("ours", "%s %s" % (name, phase), e)
                            ms[phase] = None
                        rec["%s_ms" % phase] = ms[phase]
                    times[name] = ms
                    ratio = {}
                    if base is not None:
                        for phase in PHASES:
                            a, b_ = ms.get(phase), times[base].get(phase)
                            ratio[phase] = a / b_ if a and b_ else None
                    verdict = ""
                    if crit is not None and bound is not None:
                        if crit.startswith("speedup"):
                            r = ratio.get(crit.split()[1])
                            ok = r is not None and 1.0 / r >= bound
                            verdict = "%s %.2fx faster (>= %gx): %s" % (
                                crit.split()[1], 1.0 / r if r else float("nan"), bound,
                                "ok" if ok else "MISSED")
                        else:
                            r = ratio.get(crit)
                            ok = r is not None and r <= bound
                            verdict = "%s <= %gx: %s" % (crit, bound, "ok" if ok else "MISSED")
                    rec["note"] = (rec["note"] + " " + verdict).strip()
                    rows.append(rec)
                    print("%-5s %4d %6d %5d %4d  %-15s %9s %9s %9s  %-8s %7s %7s %7s  %s" % (
                        dt, d, s, batch, nheads, name, _fmt3(ms["fwd"]), _fmt3(ms["bwd"]),
                        _fmt3(ms["fwdbwd"]), base or "", _fmt3(ratio.get("fwd")),
                        _fmt3(ratio.get("bwd")), _fmt3(ratio.get("fwdbwd")), verdict),
                        flush=True)
                del sets


def run_mla(bench, args, rows):
    """Q / K head dim 192, V head dim 128 (DeepSeek MLA prefill): ours against SDPA-cuDNN."""
    torch = bench.torch
    b, s, h, d, dv = 2, 8192, 16, 192, 128
    print("\nMLA (b%d s%d %d heads, head dims %d / %d; TFLOP/s fwd / bwd, FLOPs on %d + %d); timer: %s"
          % (b, s, h, d, dv, d, dv, bench.timer_kind))
    for causal in (False, True):
        cfg = dict(dtype="bf16", headdim=d, headdim_v=dv, seqlen_q=s, seqlen_k=s, batch=b, nheads=h,
                   nheads_k=h, causal=causal)
        sets = bench.make_inputs(cfg, bench.n_rotations(b * s * h * (2 * d + dv) * 2), torch.bfloat16)
        flops = 2 * b * h * s * s * (d + dv) / (2 if causal else 1)
        got = {}
        for backend in ("ours", "cudnn"):
            try:
                ms = {ph: bench.time_phase(backend, ph, cfg, sets) for ph in ("fwd", "bwd")}
            except Exception as e:  # noqa: BLE001 - report and go on
                print("  %s causal=%d: %s" % (backend, causal, str(e).splitlines()[0][:120]))
                continue
            got[backend] = (flops / ms["fwd"] * 1e-9, 2.5 * flops / ms["bwd"] * 1e-9)
            rows.append(dict(cfg, backend=backend, fwd_ms=ms["fwd"], bwd_ms=ms["bwd"],
                             fwd_tflops=got[backend][0], bwd_tflops=got[backend][1], note=""))
        line = "  causal=%d  " % causal + "   ".join("%s %5.0f / %5.0f" % (k, *v) for k, v in got.items())
        if len(got) == 2:
            line += "   ours/cuDNN %.2f / %.2f" % (got["ours"][0] / got["cudnn"][0], got["ours"][1] / got["cudnn"][1])
        print(line, flush=True)
        del sets


def run_sdpa_ab(bench, args, rows):
    """F.scaled_dot_product_attention on our kernels (flash_attn.sdpa) against flash_attn_func
    over the grid, on the same inputs, each round in the other order (the later of two sequential
    timings reads slower at the power cap), median over the rounds."""
    ratios = {"fwd": [], "bwd": []}
    print("\nSDPA on our kernels / flash_attn_func, TFLOP/s ratio (median of %d alternated rounds; "
          "> 1: SDPA faster); timer: %s" % (args.ab_rounds, bench.timer_kind))
    for cfg in grid_configs(args):
        dtype = {"bf16": bench.torch.bfloat16, "fp16": bench.torch.float16}[cfg["dtype"]]
        set_bytes = 5 * cfg["batch"] * cfg["seqlen_q"] * cfg["nheads"] * cfg["headdim"] * 2
        sets = bench.make_inputs(cfg, bench.n_rotations(set_bytes), dtype)
        ms = {b: {"fwd": [], "bwd": []} for b in ("ours", "sdpa_ours")}
        for r in range(max(1, args.ab_rounds)):
            for backend in (("ours", "sdpa_ours") if r % 2 == 0 else ("sdpa_ours", "ours")):
                for phase in ("fwd", "bwd"):
                    ms[backend][phase].append(bench.time_phase(backend, phase, cfg, sets))
        med = {b: {ph: statistics.median(v) for ph, v in m.items()} for b, m in ms.items()}
        cell = {ph: med["ours"][ph] / med["sdpa_ours"][ph] for ph in ("fwd", "bwd")}
        for ph in cell:
            ratios[ph].append(cell[ph])
        for b in med:
            rows.append(dict(cfg, causal=int(cfg["causal"]), backend=b, fwd_ms=med[b]["fwd"],
                             bwd_ms=med[b]["bwd"], note=""))
        print("  %s causal=%d d=%d s=%d   fwd %.3f   bwd %.3f" % (
            cfg["dtype"], cfg["causal"], cfg["headdim"], cfg["seqlen_q"], cell["fwd"], cell["bwd"]), flush=True)
        del sets
    for ph, xs in ratios.items():
        if xs:
            print("  %s: geometric mean %.3f, lowest %.3f, %d of %d cells below 0.98" % (
                ph, _geomean(xs), min(xs), sum(x < 0.98 for x in xs), len(xs)))


# gpt-oss alternates 128-token sliding-window layers with full ones.
SINK_WINDOWS = ((128, 0), (-1, -1))


def run_sink_cost(bench, args, rows):
    """learnable_sink's cost: the same call with and without a sink, timed in alternating order
    over rounds (timed one after the other, the later call reads a few percent slower at the
    power cap whatever it is), median over the rounds."""
    torch = bench.torch
    if bench.ours is None:
        raise RuntimeError("flash_attn import failed: %s" % bench.ours_error)
    b, s, h, hk, d = 2, 8192, 64, 8, 64
    cfg = dict(dtype="bf16", headdim=d, seqlen_q=s, seqlen_k=s, batch=b, nheads=h, nheads_k=hk,
               causal=True)
    sets = bench.make_inputs(cfg, bench.n_rotations(5 * b * s * h * d * 2), torch.bfloat16)
    sink = torch.randn(h, device=DEVICE, dtype=torch.float32, requires_grad=True)
    f = bench.ours
    print("\nlearnable_sink cost (ours; b%d s%d %d q / %d kv heads d%d causal; median ms of %d "
          "alternated rounds); timer: %s" % (b, s, h, hk, d, args.sink_rounds, bench.timer_kind))
    for window in SINK_WINDOWS:
        fns = {False: lambda q, k, v, w=window: f(q, k, v, causal=True, window_size=w),
               True: lambda q, k, v, w=window: f(q, k, v, causal=True, window_size=w, learnable_sink=sink)}
        ms = {use: {"fwd": [], "bwd": []} for use in fns}
        for r in range(max(1, args.sink_rounds)):
            for use in ((False, True) if r % 2 == 0 else (True, False)):
                for phase in ("fwd", "bwd"):
                    ms[use][phase].append(bench.time_phase("ours", phase, cfg, sets, fn=fns[use]))
        med = {use: {ph: statistics.median(v) for ph, v in m.items()} for use, m in ms.items()}
        for use in fns:
            rows.append(dict(cfg, backend="ours:sink" if use else "ours", window=str(window),
                             fwd_ms=med[use]["fwd"], bwd_ms=med[use]["bwd"], note=""))
        print("  window %-9s fwd %7.3f -> %7.3f ms (%+.1f%%)   bwd %7.3f -> %7.3f ms (%+.1f%%)" % (
            window, med[False]["fwd"], med[True]["fwd"], 100 * (med[True]["fwd"] / med[False]["fwd"] - 1),
            med[False]["bwd"], med[True]["bwd"], 100 * (med[True]["bwd"] / med[False]["bwd"] - 1)), flush=True)
    del sets


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


FA3_ANCHORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fa3_anchors_h200.json")


def load_fa3_anchors(path=FA3_ANCHORS):
    """{(headdim, causal, seqlen): {"fwd": r, "bwd": r}}: upstream FA3's TFLOP/s over cuDNN's per
    cell of the bf16 grid, measured in one run on an H200 (the file says which builds). FA3 is
    not built here; a cell's FA3 estimate is this run's cuDNN TFLOP/s times that ratio, so
    ours / FA3 = (ours / cuDNN) / (FA3 / cuDNN). None if the file is missing."""
    try:
        with open(path) as f:
            cells = json.load(f)["cells"]
    except (OSError, ValueError, KeyError):
        return None
    return {(c["headdim"], int(c["causal"]), c["seqlen"]): c["fa3_over_cudnn"] for c in cells}


def fa3_comparison(by, anchors):
    """Lines comparing ours with FA3 through this run's cuDNN (see load_fa3_anchors), per
    (causal, d) and overall, bf16 cells only; and {label: {phase: geomean}}."""
    groups, cells = {}, {"fwd": [], "bwd": []}
    for (dt, c, d, s), rs in sorted(by.items()):
        anchor = anchors.get((d, int(c), s))
        if dt != "bf16" or anchor is None or "ours" not in rs or "cudnn" not in rs:
            continue
        for phase in ("fwd", "bwd"):
            a, o = rs["ours"].get(phase + "_tflops"), rs["cudnn"].get(phase + "_tflops")
            if a and o:
                x = a / o / anchor[phase]
                groups.setdefault((c, d, phase), []).append(x)
                cells[phase].append((x, "d%d %s%s" % (d, "causal " if c else "", s)))
    if not cells["fwd"] and not cells["bwd"]:
        return [], {}
    lines = ["ours/FA3 TFLOP/s ratio via cuDNN in this run (FA3/cuDNN per cell from %s; geometric "
             "mean over seqlens; >1 = ours faster):" % os.path.basename(FA3_ANCHORS)]
    summary = {}
    for (c, d) in sorted({k[:2] for k in groups}):
        fw, bw = _geomean(groups.get((c, d, "fwd"), [])), _geomean(groups.get((c, d, "bwd"), []))
        label = "bf16 causal=%d d=%d" % (c, d)
        lines.append("  %-22s fwd %s  bwd %s" % (label, "%.2f" % fw if fw else " n/a",
                                                  "%.2f" % bw if bw else " n/a"))
        summary[label] = {"fwd": fw, "bwd": bw}
    for phase in ("fwd", "bwd"):
        xs = cells[phase]
        if xs:
            worst = min(xs)
            lines.append("  %s: geometric mean %.3f, %d of %d cells >= 1.05, slowest %s (%.2f)" % (
                phase, _geomean([x for x, _ in xs]), sum(x >= 1.05 for x, _ in xs), len(xs),
                worst[1], worst[0]))
            summary["overall"] = dict(summary.get("overall", {}), **{phase: _geomean([x for x, _ in xs])})
    return lines, summary


def summarize(rows, args):
    """Geometric-mean ratio ours / other per (dtype, causal, d) and overall."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault((r["dtype"], r["causal"], r["headdim"], r["seqlen_q"]), {})[r["backend"]] = r
    summary = {}
    for other in [b for b in ("sdpa_ours", "flash", "cudnn") if b in args.backends]:
        if "ours" not in args.backends:
            break
        groups = {}
        for (dt, c, d, s), rs in by.items():
            if "ours" not in rs or other not in rs:
                continue
            for phase in ("fwd", "bwd"):
                a, o = rs["ours"].get(phase + "_tflops"), rs[other].get(phase + "_tflops")
                if a and o:
                    groups.setdefault((dt, c, d, phase), []).append(a / o)
                    groups.setdefault(("all", "all", "all", phase), []).append(a / o)
        if not groups:
            lines.append("ours/%s: no configuration where both ran" % other)
            continue
        lines.append("ours/%s TFLOP/s ratio (geometric mean over seqlens; >1 = ours faster):" % other)
        keys = sorted({k[:3] for k in groups if k[0] != "all"}) + [("all", "all", "all")]
        for k in keys:
            fw, bw = _geomean(groups.get(k + ("fwd",), [])), _geomean(groups.get(k + ("bwd",), []))
            label = "overall" if k[0] == "all" else "%s causal=%d d=%d" % k
            lines.append("  %-22s fwd %s  bwd %s" % (label, "%.2f" % fw if fw else " n/a",
                                                      "%.2f" % bw if bw else " n/a"))
            summary["%s|%s" % (other, label)] = {"fwd": fw, "bwd": bw}
    anchors = load_fa3_anchors()
    if anchors and "ours" in args.backends and "cudnn" in args.backends:
        fa3_lines, fa3_summary = fa3_comparison(by, anchors)
        lines += fa3_lines
        summary.update({"fa3|" + k: v for k, v in fa3_summary.items()})
    return lines, summary


# --------------------------------------------------------------------------------------
# Decode mode
# --------------------------------------------------------------------------------------
def run_decode(bench, args, rows):
    """Appends one record per (decode config, backend) to rows (kept on a fatal error)."""
    torch = bench.torch
    dtype = torch.bfloat16
    h, hk, d = DECODE_HEADS_Q, DECODE_HEADS_KV, DECODE_HEADDIM
    backends = [b for b in args.backends]
    shown = []
    for b in backends:
        shown += [b, "ours_paged%d" % args.decode_page] if b == "ours" else [b]
    print("\nDecode: bf16, seqlen_q=1, %d q heads / %d kv heads, d=%d; GB/s = bytes of K and V "
          "(GQA-sized) / median time (median of %d interleaved rounds); timer: %s" % (
              h, hk, d, max(1, args.decode_rounds), bench.timer_kind))
    if args.decode_clean:
        print("(rows 'read-fl.': the same calls timed over CUDA events after an L2 flush that reads, "
              "not writes, a 256 MB buffer, median of 40 calls per round)")
    hdr = "%6s %8s %9s |" % ("batch", "seqlen_k", "KV MB") + "".join(" %12s |" % b for b in shown)
    print(hdr)
    print("-" * len(hdr))
    for batch, sk in DECODE_CONFIGS:
        cfg = dict(dtype="bf16", causal=0, headdim=d, seqlen_q=1, seqlen_k=sk, batch=batch,
                   nheads=h, nheads_k=hk)
        kv_bytes = 2 * batch * sk * hk * d * 2
        n_sets = bench.n_rotations(kv_bytes)
        what = "decode b=%d sk=%d" % (batch, sk)
        try:
            sets = bench.make_inputs(cfg, n_sets, dtype)
        except Exception as e:  # noqa: BLE001
            bench.report_failure("inputs", what, e)
            continue
        # One timing of each variant per round; rounds interleave the backends.
        variants = []  # (name, record template, timing function)
        for backend in backends:
            if backend == "ours":
                for variant, page in (("ours", None), ("ours_paged%d" % args.decode_page, args.decode_page)):
                    rec = dict(cfg, backend=variant, n_input_sets=n_sets, kv_bytes=kv_bytes,
                               note="flash_attn_with_kvcache" + (", page %d" % page if page else ""))
                    variants.append((variant, rec, lambda page=page: (time_decode_ours(bench, sets, page), None)))
                continue
            rec = dict(cfg, backend=backend, n_input_sets=n_sets, kv_bytes=kv_bytes, note="")
            variants.append((backend, rec, lambda backend=backend: time_decode_other(bench, backend, cfg, sets, what, h, hk)))
        times = {name: [] for name, _, _ in variants}
        clean_times = {name: [] for name, _, _ in variants}
        notes = {name: rec["note"] for name, rec, _ in variants}
        for _ in range(max(1, args.decode_rounds)):
            for name, rec, fn in variants:
                if times[name] is None:  # failed in an earlier round
                    continue
                try:
                    ms, note = fn()
                    if args.decode_clean:
                        with bench.timer_swapped(bench.clean_timer):
                            clean_times[name].append(fn()[0])
                except StickyCudaError:
                    raise
                except Exception as e:  # noqa: BLE001
                    ms, note = None, bench.report_failure(name, what, e)
                if ms is None:
                    times[name] = None
                    notes[name] = note
                    continue
                times[name].append(ms)
                if note is not None:
                    notes[name] = note
        cells, clean_cells = {}, {}
        for name, rec, _ in variants:
            ms = sorted(times[name])[len(times[name]) // 2] if times[name] else None
            rec["fwd_ms"] = ms
            rec["gbps"] = kv_bytes / (ms * 1e-3) / 1e9 if ms else None
            rec["rounds_ms"] = times[name] or []
            rec["note"] = notes[name] or ""
            if ms and clean_times[name]:
                clean_ms = sorted(clean_times[name])[len(clean_times[name]) // 2]
                rec["fwd_ms_read_flush"] = clean_ms
                rec["gbps_read_flush"] = kv_bytes / (clean_ms * 1e-3) / 1e9
                clean_cells[name] = "%.0f" % rec["gbps_read_flush"]
            rows.append(rec)
            star = "*" if ms and "outside the timed" in (notes[name] or "") else ""
            cells[name] = ("%.0f%s" % (rec["gbps"], star)) if ms else "n/a"
        del sets
        _empty_cache(torch)
        print("%6d %8d %9.0f |" % (batch, sk, kv_bytes / 1e6) +
              "".join(" %12s |" % cells.get(b, "") for b in shown), flush=True)
        if args.decode_clean:
            print("%6s %8s %9s |" % ("", "", "read-fl.") +
                  "".join(" %12s |" % clean_cells.get(b, "n/a") for b in shown), flush=True)
    if any("outside the timed" in (r.get("note") or "") for r in rows if r.get("fwd_ms")):
        print("  * SDPA backend refused enable_gqa: K,V were repeated to %d heads outside the timed "
              "region, so the kernel read %dx more bytes than counted." % (h, h // hk))



def time_decode_other(bench, backend, cfg, sets, what, h, hk):
    """(median ms, note) of an SDPA / naive backend on the decode shape; raises when every
    attempt fails. SDPA backends try enable_gqa first, then K/V heads repeated outside the timed
    region (the kernel then reads h / hk times the counted bytes)."""
    attempts = []
    if backend in SDPA_BACKEND_NAMES:
        attempts = [("enable_gqa=True", True, None),
                    ("kv heads repeated x%d outside the timed region (kernel reads %dx the "
                     "bytes; GB/s still counts GQA-sized K,V)" % (h // hk, h // hk), False,
                     lambda t: t.repeat_interleave(h // hk, dim=2))]
    elif backend == "naive":
        attempts = [("matmul+softmax; kv heads expanded inside the timed region", False, None)]
    else:
        attempts = [("native GQA", False, None)]
    errs = []
    for label, gqa, kvt in attempts:
        try:
            return bench.time_phase(backend, "fwd", cfg, sets, enable_gqa=gqa, kv_transform=kvt), label
        except StickyCudaError:
            raise
        except Exception as e:  # noqa: BLE001
            errs.append("%s: %s" % (label, bench.report_failure(backend, "%s (%s)" % (what, label), e)))
    raise RuntimeError("; ".join(errs))


def time_decode_ours(bench, sets, page):
    """Median ms of flash_attn_with_kvcache over the input sets (contiguous or paged cache)."""
    torch = bench.torch
    from flash_attn import flash_attn_with_kvcache
    prepared = []
    for q, k, v in sets:
        b, sk = k.shape[0], k.shape[1]
        if page is None:
            prepared.append((q, k, v, None))
            continue
        nblk = (sk + page - 1) // page
        pad = nblk * page - sk
        kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(b * nblk, page, *k.shape[2:])
        vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(b * nblk, page, *v.shape[2:])
        # Pages in a shuffled order, as an allocator would hand them out.
        perm = torch.randperm(b * nblk, device=k.device)
        kp2, vp2 = torch.empty_like(kp), torch.empty_like(vp)
        kp2[perm], vp2[perm] = kp, vp
        table = perm.view(b, nblk).to(torch.int32)
        prepared.append((q, kp2, vp2, table))
    seqlens = [torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
               for q, k, _ in sets]
    n, it = len(prepared), [0]

    def run():
        i = it[0] % n
        it[0] += 1
        q, k, v, table = prepared[i]
        flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens[i], block_table=table)
    with torch.no_grad():
        return bench._bench(run)


# --------------------------------------------------------------------------------------
# Varlen mode
# --------------------------------------------------------------------------------------
def varlen_lengths(total, lo=128, hi=4096, seed=0):
    import random
    rng = random.Random(seed)
    lens = []
    while sum(lens) < total:
        lens.append(min(rng.randint(lo, hi), total - sum(lens)))
    if lens[-1] < lo and len(lens) > 1:  # fold a short remainder into the previous one
        lens[-2] += lens.pop()
    return lens


def run_varlen(bench, args, rows):
    torch = bench.torch
    from flash_attn import flash_attn_func, flash_attn_varlen_func
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    lens = varlen_lengths(args.total_tokens)
    total = sum(lens)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    cu = cu.to(DEVICE)
    print("\nVarlen: %d sequences, %d tokens, lengths %d..%d; TFLOP/s fwd/bwd/fwd+bwd; timer: %s" % (
        len(lens), total, min(lens), max(lens), bench.timer_kind))
    hdr = "%-5s %-6s %4s %4s | %20s | %20s | %7s" % ("dtype", "causal", "d", "nh", "varlen", "dense s=2048", "fb ratio")
    print(hdr)
    print("-" * len(hdr))
    for dt in args.dtypes:
        dtype = dtypes[dt]
        for d in args.headdims:
            h = args.hidden // d
            for causal in args.causals:
                flops = sum(attn_fwd_flops(1, h, L, L, d, causal) for L in lens)
                q = torch.randn(total, h, d, device=DEVICE, dtype=dtype, requires_grad=True)
                k = torch.randn(total, h, d, device=DEVICE, dtype=dtype, requires_grad=True)
                v = torch.randn(total, h, d, device=DEVICE, dtype=dtype, requires_grad=True)
                res = {}
                for kind in ("varlen", "dense"):
                    if kind == "varlen":
                        fn = lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)  # noqa: E731
                        kflops = flops
                    else:
                        s = 2048
                        b = max(1, total // s)
                        qd, kd, vd = [t.detach()[: b * s].view(b, s, h, d).requires_grad_() for t in (q, k, v)]
                        fn = lambda: flash_attn_func(qd, kd, vd, causal=causal)  # noqa: E731
                        kflops = attn_fwd_flops(b, h, s, s, d, causal)
                    try:
                        with torch.no_grad():
                            t_f = bench._bench(fn)
                        out = fn()
                        dout = torch.randn_like(out)
                        leaves = (q, k, v) if kind == "varlen" else (qd, kd, vd)
                        t_b = bench._bench(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
                        t_fb = bench._bench(lambda: torch.autograd.grad(fn(), leaves, dout))
                        res[kind] = tuple(f * kflops / (t * 1e-3) / 1e12 for f, t in
                                          ((1.0, t_f), (2.5, t_b), (3.5, t_fb)))
                        del out
                    except StickyCudaError:
                        raise
                    except Exception as e:  # noqa: BLE001
                        bench.report_failure("ours", "varlen %s" % kind, e)
                        res[kind] = (None, None, None)
                    rows.append(dict(dtype=dt, causal=int(causal), headdim=d, nheads=h, nheads_k=h,
                                     batch=len(lens) if kind == "varlen" else max(1, total // 2048),
                                     seqlen_q=max(lens) if kind == "varlen" else 2048,
                                     seqlen_k=max(lens) if kind == "varlen" else 2048,
                                     backend="ours_" + kind, fwd_flops=kflops,
                                     fwd_tflops=res[kind][0], bwd_tflops=res[kind][1],
                                     fwdbwd_tflops=res[kind][2],
                                     note="lengths " + ",".join(map(str, lens)) if kind == "varlen" else ""))
                cell = lambda r: "/".join(fmt_num(x, 0) for x in r)  # noqa: E731
                ratio = (res["varlen"][2] / res["dense"][2]
                         if res["varlen"][2] and res["dense"][2] else None)
                print("%-5s %-6s %4d %4d | %20s | %20s | %7s" % (
                    dt, "yes" if causal else "no", d, h, cell(res["varlen"]), cell(res["dense"]),
                    "%.2f" % ratio if ratio else "n/a"), flush=True)
                del q, k, v
                _empty_cache(torch)

# --------------------------------------------------------------------------------------
# Output files
# --------------------------------------------------------------------------------------
CSV_FIELDS = ["dtype", "causal", "headdim", "seqlen_q", "seqlen_k", "batch", "nheads", "nheads_k",
              "backend", "n_input_sets", "fwd_flops", "fwd_ms", "bwd_ms", "fwdbwd_ms",
              "fwd_tflops", "bwd_tflops", "fwdbwd_tflops", "kv_bytes", "gbps", "note"]


def write_csv(path, rows):
    fields = [f for f in CSV_FIELDS if any(f in r for r in rows)] or CSV_FIELDS
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("n/a" if r.get(k) is None and k in r else
                            ("%.6g" % r[k] if isinstance(r.get(k), float) else r.get(k, "")))
                        for k in fields})


def write_json(path, meta, rows, extra=None):
    doc = {"meta": meta, "results": rows}
    if extra:
        doc.update(extra)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)


def plot_grid(path, rows, args, title=""):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print("(no plot: matplotlib unavailable: %s; pip install matplotlib)" % e)
        return None
    panels = [(dt, c, ph) for dt in args.dtypes for c in [int(x) for x in args.causals]
              for ph in ("fwd", "bwd")]
    dims = list(args.headdims)
    fig, axes = plt.subplots(len(panels), len(dims), figsize=(4.6 * len(dims), 3.2 * len(panels)),
                             squeeze=False)
    colors = {"ours": "tab:red", "sdpa_ours": "tab:purple", "flash": "tab:blue", "cudnn": "tab:green",
              "efficient": "tab:orange", "naive": "tab:gray"}
    anchors = load_fa3_anchors() if "cudnn" in args.backends else None
    for i, (dt, c, ph) in enumerate(panels):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for be in args.backends:
                pts = sorted((r["seqlen_q"], r.get(ph + "_tflops")) for r in rows
                             if r["dtype"] == dt and r["causal"] == c and r["headdim"] == d
                             and r["backend"] == be and r.get(ph + "_tflops"))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                            label=be, color=colors.get(be))
                if be == "cudnn" and anchors and dt == "bf16":
                    fa3 = [(x, y * anchors[(d, c, x)][ph]) for x, y in pts if (d, c, x) in anchors]
                    if fa3:
                        ax.plot([p[0] for p in fa3], [p[1] for p in fa3], ls="--", marker="x", ms=3,
                                label="FA3 (anchors x cudnn)", color="black")
            ax.set_xscale("log", base=2)
            ax.set_xticks(args.seqlens)
            ax.set_xticklabels([("%dk" % (s // 1024)) if s >= 1024 else str(s) for s in args.seqlens])
            ax.set_title("%s %s causal=%d d=%d" % (dt, ph, c, d), fontsize=9)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == len(panels) - 1:
                ax.set_xlabel("seqlen")
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_decode(path, rows, backends, title="", hbm_gbps=4300.0):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print("(no plot: matplotlib unavailable: %s; pip install matplotlib)" % e)
        return None
    cfgs = [(b, sk) for b, sk in DECODE_CONFIGS]
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / max(1, len(backends))
    for bi, be in enumerate(backends):
        ys = []
        for b, sk in cfgs:
            m = [r.get("gbps") for r in rows if r["backend"] == be and r["seqlen_k"] == sk
                 and r["batch"] == b]
            ys.append(m[0] if m and m[0] else 0.0)
        ax.bar([x + bi * w for x in range(len(cfgs))], ys, width=w, label=be)
    ax.axhline(hbm_gbps, ls="--", color="k", lw=0.8, label="%.1f TB/s" % (hbm_gbps / 1000))
    ax.set_xticks([x + w * (len(backends) - 1) / 2 for x in range(len(cfgs))])
    ax.set_xticklabels(["b=%d sk=%dk" % (b, sk // 1024) for b, sk in cfgs])
    ax.set_ylabel("GB/s (K+V bytes / time)")
    ax.set_title("decode: bf16, 1 query token, 32 q / 8 kv heads, d=128\n" + title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def collect_meta(bench, args):
    torch = bench.torch
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "gpu": bench.device_name,
        "capability": bench.capability,
        "gpu_memory_bytes": bench.total_mem,
        "l2_bytes": bench.l2_bytes,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "timer": bench.timer_kind,
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "flop_convention": "fwd = 4*b*h*sq*sk*d (/2 causal); bwd = 2.5x fwd; fwd+bwd = 3.5x fwd",
        "ours_import_error": bench.ours_error,
        "ours_built_configs": bench.built_configs,
    }
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        meta["triton"] = None
    try:
        import flash_attn
        meta["flash_attn"] = getattr(flash_attn, "__version__", None)
        meta["flash_attn_path"] = os.path.dirname(flash_attn.__file__)
    except Exception:  # noqa: BLE001
        meta["flash_attn"] = None
    return meta


# --------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("error: PyTorch is not installed (pip install torch)")
    if ON_GPU and not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU is visible (torch %s, CUDA build %s). This benchmark must run "
                 "on a machine with an NVIDIA GPU; `--help` works anywhere." %
                 (torch.__version__, torch.version.cuda))
    os.makedirs(args.out, exist_ok=True)
    bench = Bench(args)
    print("GPU: %s (sm%s, L2 %.0f MB) | torch %s, CUDA %s | timer: %s" % (
        bench.device_name, bench.capability.replace(".", ""), bench.l2_bytes / 2**20,
        torch.__version__, torch.version.cuda, bench.timer_kind))
    if bench.ours_error:
        print("warning: `from flash_attn import flash_attn_func` failed: %s" % bench.ours_error)
    elif bench.built_configs is not None:
        print("flash_attn built configs (dtype, head-dim tile): %s" %
              ", ".join("%s/%s" % tuple(c) for c in bench.built_configs))

    if args.check and not bench.check():
        sys.exit("error: --check failed (see above); not benchmarking")

    meta = collect_meta(bench, args)
    rows, extra, status = [], {}, 0
    prefix = ("decode" if args.decode else "varlen" if args.varlen else "features" if args.features
              else "sinks" if args.sinks else "mla" if args.mla else "sdpa_ab" if args.sdpa_ab else "attn")
    try:
        if args.sinks:
            run_sink_cost(bench, args, rows)
        elif args.mla:
            run_mla(bench, args, rows)
        elif args.sdpa_ab:
            run_sdpa_ab(bench, args, rows)
        elif args.decode:
            run_decode(bench, args, rows)
        elif args.varlen:
            run_varlen(bench, args, rows)
        elif args.features:
            run_features(bench, args, rows)
        else:
            if not args.skip_memory and "ours" in args.backends:
                print()
                extra["peak_memory"] = bench.peak_memory()
            run_grid(bench, args, rows)
    except StickyCudaError as e:
        print("\nerror: %s\nStopping; partial results are saved." % e)
        status = 2
    except KeyboardInterrupt:
        print("\ninterrupted; partial results are saved.")
        status = 130

    if not (args.decode or args.varlen or args.features or args.sinks or args.mla or args.sdpa_ab):
        lines, summary = summarize(rows, args)
        if lines:
            print()
            print("\n".join(lines))
        extra["ratio_summary"] = summary
    if bench.failures_suppressed:
        print("(%d repeated failure messages not printed; see the note column in the CSV)" %
              bench.failures_suppressed)

    csv_path = os.path.join(args.out, prefix + ".csv")
    json_path = os.path.join(args.out, prefix + ".json")
    write_csv(csv_path, rows)
    write_json(json_path, meta, rows, extra)
    png = None
    try:
        title = "%s | torch %s | %s" % (bench.device_name, torch.__version__, meta["date"])
        if args.features or args.sinks or args.mla or args.sdpa_ab:
            png = None
        elif args.decode:
            shown = []
            for b in args.backends:
                shown += [b, "ours_paged%d" % args.decode_page] if b == "ours" else [b]
            png = plot_decode(os.path.join(args.out, "decode_bw.png"), rows, shown, title)
        elif not args.varlen:
            png = plot_grid(os.path.join(args.out, "attn_tflops.png"), rows, args, title)
    except Exception as e:  # noqa: BLE001
        print("(plot failed: %s: %s)" % (type(e).__name__, e))
    print("\nwrote %s, %s%s" % (csv_path, json_path, (", " + png) if png else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
