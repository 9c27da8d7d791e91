#!/usr/bin/env python3
"""Time two builds of flash_attn against each other, interleaved cell by cell in one run.

A build is a source tree whose extension is built in place (flash_attn/_C*.so next to the
Python package): `pip install --no-build-isolation -e .` leaves it there, and so does
`python setup.py build_ext --inplace` for a second tree (two editable installs of one
distribution would replace each other). For example, the current tree against a base commit:

    git worktree add /tmp/fa-base <base-ref>
    (cd /tmp/fa-base && python setup.py build_ext --inplace)
    python scripts/ab_two_builds.py /tmp/fa-base . --cells grid,decode,varlen

One driver process starts one worker process per build and asks them for the cells in turn, so
both builds are timed on the same machine, in the same minutes, one call at a time on the GPU.
Each worker imports its own tree's Python package and extension (two copies of flash_attn cannot
share one process: both register the flash_attn:: custom ops), so the harness compares builds
whose Python layer differs too. Each cell runs through the public API (flash_attn_func,
flash_attn_varlen_func, flash_attn_with_kvcache), timed by triton.testing.do_bench (median, L2
flushed before each call); each repeat alternates which build goes first; the table shows the
median over the repeats.

Cell groups (--cells):
  grid      bf16, 16k tokens, hidden 2048, d 64 / 128 / 256, causal off / on, seqlen 512..16k,
            forward and backward TFLOP/s (the README's standard grid)
  decode    bf16 d128, 1 query token, 32 q / 8 kv heads, b16 4k, b16 32k, b4 128k, contiguous
            and paged (16-token pages): K+V GB/s
  varlen    8 sequences of 16k tokens in all (benchmarks/benchmark_attn.py --varlen's lengths),
            causal off / on, forward+backward TFLOP/s
  features  bf16 d128 seqlen 8k: dropout 0.1, ALiBi, softcap 30 (fwd, bwd), window (512, 0)
            (fwd, bwd), deterministic backward (plain and causal)
The ratio column is new / base of the rates (> 1: the new build is faster). The summary counts the
cells slower than --tolerance (default 2%); --confirm N re-times those cells N more repeats first
(single cells move 2-4% between runs on one machine); --strict makes that the exit status.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

GRID_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
GRID_HEAD_DIMS = (64, 128, 256)
DECODE_CONFIGS = ((16, 4096), (16, 32768), (4, 131072))
FEATURE_CASES = ("dropout", "alibi", "softcap", "window")
TOTAL_TOKENS, HIDDEN = 16384, 2048


# ----------------------------------------------------------------------------------------------
# Cells: plain dicts, the same list in the driver and in both workers (no torch needed here)
# ----------------------------------------------------------------------------------------------
def varlen_lengths(total=TOTAL_TOKENS, lo=128, hi=4096, seed=0):
    """The sequence lengths of benchmarks/benchmark_attn.py --varlen (its generator, loaded from
    this tree's benchmarks/; it imports only the standard library at load)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks",
                        "benchmark_attn.py")
    spec = importlib.util.spec_from_file_location("_benchmark_attn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.varlen_lengths(total, lo, hi, seed)


def make_cells(groups, head_dims=GRID_HEAD_DIMS, seqlens=GRID_SEQLENS):
    cells = []
    if "grid" in groups:
        for d in head_dims:
            for causal in (False, True):
                for s in seqlens:
                    for pas in ("fwd", "bwd"):
                        cells.append(dict(kind="dense", pas=pas, d=d, s=s, causal=causal))
    if "decode" in groups:
        for b, sk in DECODE_CONFIGS:
            for page in (None, 16):
                cells.append(dict(kind="decode", b=b, sk=sk, page=page))
    if "varlen" in groups:
        for d in head_dims:
            for causal in (False, True):
                cells.append(dict(kind="varlen", pas="fb", d=d, causal=causal))
    if "features" in groups:
        for feat in FEATURE_CASES:
            for pas in ("fwd", "bwd"):
                cells.append(dict(kind="dense", pas=pas, d=128, s=8192, causal=False, feat=feat))
        for causal in (False, True):
            cells.append(dict(kind="dense", pas="bwd", d=128, s=8192, causal=causal, feat="deterministic"))
    return cells


def cell_name(c):
    if c["kind"] == "decode":
        return f"decode b{c['b']} sk{c['sk']}" + (f" paged{c['page']}" if c["page"] else "")
    mode = "causal" if c["causal"] else "full"
    if c["kind"] == "varlen":
        return f"varlen d{c['d']} {mode} {c['pas']}"
    feat = f" {c['feat']}" if c.get("feat") else ""
    return f"{c['pas']} d{c['d']} {mode} s{c['s']}{feat}"


def cell_unit(c):
    return "GB/s" if c["kind"] == "decode" else "TFLOP/s"


def summarize(names, rate_a, rate_b, tolerance):
    """Ratios new / base per cell (None where either build has no number), their geometric
    mean, the cells slower than `tolerance` and the slowest cell."""
    ratios = {n: (rate_b[n] / rate_a[n] if rate_a.get(n) and rate_b.get(n) else None) for n in names}
    valid = [r for r in ratios.values() if r is not None]
    slower = [n for n in names if ratios[n] is not None and ratios[n] < 1.0 - tolerance]
    worst = min((n for n in names if ratios[n] is not None), key=lambda n: ratios[n], default=None)
    geo = math.exp(sum(math.log(r) for r in valid) / len(valid)) if valid else None
    return ratios, geo, slower, worst


# ----------------------------------------------------------------------------------------------
# Worker: one per build, imports that build's flash_attn, answers one JSON line per cell
# ----------------------------------------------------------------------------------------------
def worker(root):
    root = os.path.abspath(root)
    sys.path.insert(0, root)
    import torch

    import flash_attn
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

    where = os.path.abspath(flash_attn.__file__)
    if not where.startswith(root + os.sep):
        raise SystemExit(f"ab_two_builds: {root} imported flash_attn from {where}; build it in place first")
    import flash_attn._C as ext  # fail here, not in the first cell, when the tree has no build

    class BindContext(torch.autograd.Function):
        """Binds the CUDA context on torch's autograd device thread (a synchronize there), which
        builds older than the FLASH_BIND_CONTEXT fix need: their backward's TMA descriptor
        encode crashed on a thread without one. Run in both workers, so that they match."""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            torch.cuda.synchronize()
            return g

    BindContext.apply(torch.ones(4, device="cuda", requires_grad=True)).sum().backward()
    try:
        import triton.testing as tt
    except ImportError:
        tt = None

    def bench(fn):
        if tt is not None:
            try:
                return tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
            except TypeError:  # older triton: no return_mode
                return tt.do_bench(fn, warmup=25, rep=100, quantiles=[0.5])
        for _ in range(5):
            fn()
        times = []
        for _ in range(30):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    def rand(*shape, grad=False):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    def dense(c):
        d, s, causal, feat = c["d"], c["s"], c["causal"], c.get("feat")
        h, b = HIDDEN // d, TOTAL_TOKENS // s
        q, k, v = (rand(b, s, h, d, grad=c["pas"] == "bwd") for _ in range(3))
        kw = dict(causal=causal)
        visible = s * s / (2 if causal else 1)
        if feat == "dropout":
            kw["dropout_p"] = 0.1
        elif feat == "alibi":
            kw["alibi_slopes"] = torch.rand(h, device="cuda", dtype=torch.float32) * 0.3
        elif feat == "softcap":
            kw["softcap"] = 30.0
        elif feat == "window":
            kw["window_size"] = (512, 0)
            visible = sum(min(i, 512) + 1 for i in range(s))
        elif feat == "deterministic":
            kw["deterministic"] = True
        flops = 4 * b * h * visible * d
        if c["pas"] == "fwd":
            with torch.no_grad():
                return flops / bench(lambda: flash_attn_func(q, k, v, **kw)) * 1e-9
        out = flash_attn_func(q, k, v, **kw)
        dout = torch.randn_like(out)
        ms = bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        return 2.5 * flops / ms * 1e-9

    def varlen(c):
        d, causal = c["d"], c["causal"]
        h = HIDDEN // d
        lens = varlen_lengths()
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
        q, k, v = (rand(sum(lens), h, d, grad=True) for _ in range(3))
        dout = rand(sum(lens), h, d)
        flops = sum(4 * h * L * L * d / (2 if causal else 1) for L in lens)

        def fb():
            out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
            torch.autograd.grad(out, (q, k, v), dout)
        return 3.5 * flops / bench(fb) * 1e-9

    def decode(c):
        b, sk, page = c["b"], c["sk"], c["page"]
        h, h_k, d = 32, 8, 128
        q = rand(b, 1, h, d)
        k, v = rand(b, sk, h_k, d), rand(b, sk, h_k, d)
        table = None
        if page:
            nblk = sk // page
            perm = torch.randperm(b * nblk, device="cuda")  # pages in a shuffled order
            kp = torch.empty(b * nblk, page, h_k, d, device="cuda", dtype=k.dtype)
            vp = torch.empty_like(kp)
            kp[perm], vp[perm] = k.reshape(b * nblk, page, h_k, d), v.reshape(b * nblk, page, h_k, d)
            k, v, table = kp, vp, perm.view(b, nblk).to(torch.int32)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        with torch.no_grad():
            ms = bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table))
        return 2 * b * sk * h_k * d * 2 / ms * 1e-6

    built = {tuple(x) for x in ext.built_configs()} if hasattr(ext, "built_configs") else None
    tile = ext.head_dim_tile if hasattr(ext, "head_dim_tile") else (lambda d: d)
    print(json.dumps(dict(ready=where, torch=torch.__version__, gpu=torch.cuda.get_device_name())), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        try:
            d = c.get("d", 128)
            if built is not None and ("bf16", tile(d)) not in built:
                raise RuntimeError(f"bf16 d{d} not built")
            rate = {"dense": dense, "varlen": varlen, "decode": decode}[c["kind"]](c)
            reply = dict(rate=rate)
        except Exception as e:  # noqa: BLE001 - report and go on with the next cell
            reply = dict(error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
            if "CUDA error" in str(e) or "illegal" in str(e):  # the context is lost: stop this worker
                print(json.dumps(reply), flush=True)
                raise
        torch.cuda.empty_cache()
        print(json.dumps(reply), flush=True)


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
class Worker:
    def __init__(self, label, root):
        self.label, self.root = label, os.path.abspath(root)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", self.root],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        hello = self._read()
        if "ready" not in hello:
            raise SystemExit(f"{label}: worker did not start: {hello}")
        self.info = hello

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            return dict(error=f"worker exited (status {self.proc.wait()})")
        return json.loads(line)

    def run(self, cell):
        if self.proc.poll() is not None:
            return dict(error=f"worker exited (status {self.proc.returncode})")
        try:
            self.proc.stdin.write(json.dumps(cell) + "\n")
        except BrokenPipeError:
            return dict(error="worker exited")
        return self._read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)


def git_head(root):
    try:
        r = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", nargs="?", help="source tree of the base build (flash_attn/_C*.so built in place)")
    p.add_argument("new", nargs="?", help="source tree of the new build")
    p.add_argument("--cells", default="grid,decode,varlen", help="comma list of grid, decode, varlen, features")
    p.add_argument("--head-dims", default=",".join(map(str, GRID_HEAD_DIMS)))
    p.add_argument("--seqlens", default=",".join(map(str, GRID_SEQLENS)))
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every cell (median over them)")
    p.add_argument("--tolerance", type=float, default=0.02, help="report cells slower than this fraction")
    p.add_argument("--confirm", type=int, default=0,
                   help="re-time the cells slower than --tolerance this many more repeats (interleaved); "
                        "their verdict is the median over all repeats")
    p.add_argument("--strict", action="store_true", help="exit 1 when a cell is slower than --tolerance")
    p.add_argument("--json", help="write the rates of every repeat and the summary to this file")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    if not (args.base and args.new):
        p.error("give the base and the new source tree")

    groups = {g for g in args.cells.split(",") if g}
    unknown = groups - {"grid", "decode", "varlen", "features"}
    if unknown:
        p.error(f"unknown cell groups: {sorted(unknown)}")
    cells = make_cells(groups, tuple(int(x) for x in args.head_dims.split(",")),
                       tuple(int(x) for x in args.seqlens.split(",")))
    names = [cell_name(c) for c in cells]
    workers = [Worker("base", args.base), Worker("new", args.new)]
    for w in workers:
        print(f"{w.label}: {w.root} ({git_head(w.root)}); flash_attn from {w.info['ready']}")
    print(f"{workers[0].info['gpu']}, torch {workers[0].info['torch']}; {len(cells)} cells x {args.repeats} repeats\n",
          flush=True)

    rates = {w.label: {n: [] for n in names} for w in workers}
    errors = {}

    def time_cells(todo, repeats, t0):
        for r in range(repeats):
            if r:
                print(f"  repeat {r} of {repeats} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
            for i, (c, n) in enumerate(todo):
                order = workers if (r + i) % 2 == 0 else workers[::-1]
                for w in order:
                    reply = w.run(c)
                    if "rate" in reply:
                        rates[w.label][n].append(reply["rate"])
                    else:
                        errors[(w.label, n)] = reply.get("error", "?")

    def medians():
        return {lab: {n: (statistics.median(v) if v else None) for n, v in per.items()} for lab, per in rates.items()}

    confirmed = []
    try:
        t0 = time.time()
        time_cells(list(zip(cells, names)), args.repeats, t0)
        if args.confirm > 0:
            med = medians()
            flagged = summarize(names, med["base"], med["new"], args.tolerance)[2]
            confirmed = [(c, n) for c, n in zip(cells, names) if n in flagged]
            if confirmed:
                print(f"  confirming {len(confirmed)} cells: {args.confirm} more repeats", file=sys.stderr, flush=True)
                time_cells(confirmed, args.confirm, time.time())
    finally:
        for w in workers:
            w.close()

    med = medians()
    ratios, geo, slower, worst = summarize(names, med["base"], med["new"], args.tolerance)
    fmt = lambda x: f"{x:9.1f}" if x is not None else "      n/a"  # noqa: E731
    print(f"{'cell':<36} {'unit':>7} {'base':>9} {'new':>9} {'new/base':>9}")
    for c, n in zip(cells, names):
        ratio = f"{ratios[n]:9.3f}" if ratios[n] is not None else "      n/a"
        flag = "  <" if n in slower else ""
        print(f"{n:<36} {cell_unit(c):>7} {fmt(med['base'][n])} {fmt(med['new'][n])} {ratio}{flag}")
    by_error = {}
    for (lab, n), err in errors.items():
        by_error.setdefault((lab, err), []).append(n)
    for (lab, err), cells_hit in sorted(by_error.items()):
        more = f" and {len(cells_hit) - 3} more" if len(cells_hit) > 3 else ""
        print(f"{lab}: {err} ({', '.join(cells_hit[:3])}{more})")
    print(f"\ngeometric mean new/base: {geo:.4f}" if geo else "\nno cell timed by both builds")
    if worst:
        print(f"slowest cell: {worst} ({ratios[worst]:.3f})")
    if confirmed:
        print(f"re-timed ({args.repeats + args.confirm} repeats): {', '.join(n for _, n in confirmed)}")
    print(f"cells slower by more than {100 * args.tolerance:g}%: {len(slower)}" + (f" ({', '.join(slower)})" if slower else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cells=cells, names=names, rates=rates, median=med, ratios=ratios, geo_mean=geo,
                           slower=slower, errors={f"{k[0]}: {k[1]}": v for k, v in errors.items()},
                           base=dict(root=workers[0].root, head=git_head(workers[0].root)),
                           new=dict(root=workers[1].root, head=git_head(workers[1].root))), f, indent=1)
    return 1 if args.strict and slower else 0


if __name__ == "__main__":
    sys.exit(main())
