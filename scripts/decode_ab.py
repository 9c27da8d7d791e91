#!/usr/bin/env python
"""A/B of the split-KV decode kernels on one GPU (meant for the H200; about a minute).

    python scripts/decode_ab.py [--rep MS] [--warmup MS] [--no-sweep] [--configs 0,1,2]

FLASH_ATTN_DECODE_KERNEL (read by the binding at each call) picks the kernel: "old" is the
SM80-class cp.async kernel, "new" the sm_90a bulk-copy one (head dims 64 / 128 on sm_90).

1. Correctness: old and new against a naive fp32 reference (max |err| / max |ref|, NaN check) on
   each timed shape (fresh random cache, cache_seqlens a little short of the cache so the tail
   tile is cut), plus small cases: GQA causal seqlen_q = 4 (contiguous and paged), leftpad +
   seqused (contiguous and paged), softcap, fp16 d = 64, many (partly empty) splits.
2. Timing: bf16, d = 128, 32 query / 8 KV heads, seqlen_q = 1; batch 16 at 4k and 32k keys,
   batch 4 at 128k; contiguous and paged (page 16; pages 64 and 256 on the 32k shape). Old and
   new with the split heuristic (num_splits = 0), new with explicit splits 1..32, and PyTorch SDPA
   flash / cuDNN on the contiguous shapes. Median of triton.testing.do_bench (L2 flushed before
   each call), two cache copies rotated. GB/s = bytes of K and V (GQA-sized) / time.

A failure in one variant prints and the script goes on.
"""
import argparse
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import event_median_ms  # noqa: E402

H, HK, D = 32, 8, 128
CONFIGS = [(16, 4096), (16, 32768), (4, 131072)]  # (batch, seqlen_k)
EXTRA_PAGES = {1: (64, 256)}  # config index -> more page sizes timed once
SPLIT_SWEEP = (1, 2, 4, 8, 16, 32)
REL_TOL = 2e-2  # max |out - ref| / max |ref|, bf16 output


def set_kernel(name):
    os.environ["FLASH_ATTN_DECODE_KERNEL"] = name


def paged_from_dense(k, v, page):
    """Shuffled pages (num_blocks, page, hk, d) holding the dense (b, S, hk, d) cache, and the
    block table (b, S / page) int32."""
    b, s = k.shape[:2]
    nblk = (s + page - 1) // page
    pad = nblk * page - s
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(b * nblk, page, *k.shape[2:])
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(b * nblk, page, *v.shape[2:])
    perm = torch.randperm(b * nblk, device=k.device)
    kp2, vp2 = torch.empty_like(kp), torch.empty_like(vp)
    kp2[perm], vp2[perm] = kp, vp
    return kp2, vp2, perm.view(b, nblk).to(torch.int32)


def reference(q, k, v, seqused, leftpad=None, causal=False, softcap=0.0):
    """fp32 attention per batch element over cache rows [leftpad, seqused); GQA by grouping."""
    b, sq, h, d = q.shape
    hk = k.shape[2]
    g = h // hk
    scale = d ** -0.5
    out = torch.zeros(b, sq, h, d, device=q.device, dtype=torch.float32)
    for i in range(b):
        lo = int(leftpad[i]) if leftpad is not None else 0
        hi = int(seqused[i])
        kb, vb = k[i, lo:hi].float(), v[i, lo:hi].float()  # (n, hk, d)
        n = kb.shape[0]
        if n == 0:
            continue
        qi = q[i].float().view(sq, hk, g, d)
        s = torch.einsum("qhgd,nhd->hgqn", qi, kb) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if causal:
            rows = torch.arange(sq, device=q.device).view(sq, 1) + (n - sq)
            cols = torch.arange(n, device=q.device).view(1, n)
            s = s.masked_fill(cols > rows, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[i] = torch.einsum("hgqn,nhd->qhgd", p, vb).reshape(sq, h, d)
    return out


def rel_err(out, ref):
    if not torch.isfinite(out.float()).all():
        return float("nan")
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def check(results, label, run, ref):
    for kernel in ("old", "new"):
        set_kernel(kernel)
        try:
            err = rel_err(run(), ref)
            ok = err == err and err <= REL_TOL
            results.append(ok)
            print("  %-44s %-3s rel err %.2e %s" % (label, kernel, err, "ok" if ok else "FAIL"), flush=True)
        except Exception as e:  # noqa: BLE001
            results.append(False)
            print("  %-44s %-3s ERROR %s" % (label, kernel, str(e).splitlines()[0][:120]), flush=True)


def small_checks(fa, results):
    dev = "cuda"
    torch.manual_seed(1)
    print("Small cases (old / new vs fp32 reference):")

    def case(label, b=3, sq=1, s=1000, h=H, hk=HK, d=D, dtype=torch.bfloat16, page=None, leftpad=False,
             causal=False, softcap=0.0, num_splits=0):
        try:
            q = torch.randn(b, sq, h, d, device=dev, dtype=dtype) * 2
            k = torch.randn(b, s, hk, d, device=dev, dtype=dtype)
            v = torch.randn_like(k)
            seqused = torch.randint(s // 2, s + 1, (b,), device=dev, dtype=torch.int32)
            seqused[0] = s  # one full-length row
            lp = None
            if leftpad:
                lp = torch.stack([torch.randint(0, int(x) // 2 + 1, (), device=dev) for x in seqused]).to(torch.int32)
            ref = reference(q, k, v, seqused, lp, causal, softcap)
            kc, vc, table = (k, v, None) if page is None else paged_from_dense(k, v, page)
            run = lambda: fa(q, kc, vc, cache_seqlens=seqused, cache_leftpad=lp, block_table=table,  # noqa: E731
                             causal=causal, softcap=softcap, num_splits=num_splits)
            check(results, label, run, ref)
        except Exception as e:  # noqa: BLE001
            results.append(False)
            print("  %-44s setup ERROR %s" % (label, e), flush=True)

    case("gqa causal sq=4", sq=4, causal=True)
    case("gqa causal sq=4 paged16", sq=4, causal=True, page=16)
    case("gqa causal sq=4 paged16 splits=3", sq=4, causal=True, page=16, num_splits=3)
    case("leftpad+seqused", b=4, s=2000, leftpad=True)
    case("leftpad+seqused paged16", b=4, s=2000, leftpad=True, page=16)
    case("leftpad+seqused causal sq=3 paged32", b=4, s=2000, sq=3, leftpad=True, page=32, causal=True)
    case("softcap 20 (kMod variant)", softcap=20.0)
    case("fp16 d64 paged16", dtype=torch.float16, d=64, page=16)
    case("fp16 d64 splits=5", dtype=torch.float16, d=64, num_splits=5)
    case("s=300 splits=64 (empty splits)", s=300, num_splits=64)
    case("mha h=hk=8 sq=1 s=77", h=8, hk=8, s=77)


def make_bench(rep, warmup):
    try:
        import triton.testing as tt

        def bench(fn):
            return tt.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
        return bench, "triton.testing.do_bench median"
    except Exception:  # noqa: BLE001
        def bench(fn):
            return event_median_ms(fn)
        return bench, "CUDA events median (no L2 flush)"


def rotating(fns):
    it = [0]

    def run():
        fns[it[0] % len(fns)]()
        it[0] += 1
    return run


def heuristic_new(ctas, sms, s):
    """Python copy of splitkv_heuristic_sm90 (csrc/flash_api.cpp), for the table."""
    max_splits = min(128, max(1, s // 128))

    def cost(n):
        return ((ctas * n + sms - 1) // sms) * ((s + n - 1) // n + 256)
    best = min(cost(n) for n in range(1, max_splits + 1))
    return next((n for n in range(1, max_splits) if cost(n) * 100 <= best * 103), max_splits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep ms (default 60)")
    ap.add_argument("--warmup", type=int, default=15, help="do_bench warmup ms (default 15)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the explicit split sweep")
    ap.add_argument("--configs", default="0,1,2", help="indices into %s" % (CONFIGS,))
    args = ap.parse_args()

    from flash_attn import flash_attn_with_kvcache as fa
    import flash_attn._C as C  # noqa: N812

    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print("%s, %d SMs, torch %s, sm90 kernels built: %s" % (props.name, sms, torch.__version__,
                                                            C.sm90_kernels_built()))
    bench, timer = make_bench(args.rep, args.warmup)
    results = []
    small_checks(fa, results)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa_backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for ci in [int(x) for x in args.configs.split(",")]:
        batch, s = CONFIGS[ci]
        kv_bytes = 2 * batch * s * HK * D * 2
        print("\nbatch %d, seqlen_k %d: K+V %.0f MB" % (batch, s, kv_bytes / 1e6), flush=True)
        torch.manual_seed(ci)
        try:
            copies = []
            for _ in range(2):
                q = torch.randn(batch, 1, H, D, device=dev, dtype=torch.bfloat16) * 2
                k = torch.randn(batch, s, HK, D, device=dev, dtype=torch.bfloat16)
                copies.append((q, k, torch.randn_like(k)))
        except Exception as e:  # noqa: BLE001
            print("  inputs failed: %s" % e)
            continue
        full = torch.full((batch,), s, device=dev, dtype=torch.int32)
        # Correctness on the timed shape: cache_seqlens a little short, so the last tile is cut.
        q0, k0, v0 = copies[0]
        short = (s - torch.randint(0, 40, (batch,), device=dev)).to(torch.int32)
        try:
            ref = reference(q0, k0, v0, short)
        except Exception as e:  # noqa: BLE001
            ref = None
            print("  reference failed: %s" % e)

        for page in (None, 16) + EXTRA_PAGES.get(ci, ()):
            layout = "contig" if page is None else "paged%d" % page
            try:
                caches = [(q, k, v, None) if page is None else (q, *paged_from_dense(k, v, page)) for q, k, v in copies]
            except Exception as e:  # noqa: BLE001
                print("  %s: paging failed: %s" % (layout, e))
                continue
            if ref is not None:
                qq, kc, vc, table = caches[0]
                check(results, "b%d s%d %s" % (batch, s, layout),
                      lambda: fa(qq, kc, vc, cache_seqlens=short, block_table=table), ref)
            cells = {}

            def time_ours(kernel, splits, caches):
                set_kernel(kernel)
                fns = [lambda q=q, k=k, v=v, t=t: fa(q, k, v, cache_seqlens=full, block_table=t, num_splits=splits)
                       for q, k, v, t in caches]
                with torch.no_grad():
                    return bench(rotating(fns))

            variants = [("old", 0), ("new", 0)] + ([] if args.no_sweep else [("new", n) for n in SPLIT_SWEEP])
            for kernel, splits in variants:
                name = "%s_s%s" % (kernel, splits if splits else "h")
                try:
                    ms = time_ours(kernel, splits, caches)
                    cells[name] = kv_bytes / (ms * 1e-3) / 1e9
                except Exception as e:  # noqa: BLE001
                    print("  %s %s failed: %s" % (layout, name, str(e).splitlines()[0][:160]), flush=True)
            if page is None:
                for bname, be in sdpa_backends.items():
                    # enable_gqa on views of the cache; else a (b, hk, s, d) contiguous copy; else
                    # K/V repeated to H heads (the kernel then reads 4x the counted bytes: marked *).
                    attempts = [
                        ("", lambda q, k, v: (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), True),
                        ("", lambda q, k, v: (q.transpose(1, 2), k.transpose(1, 2).contiguous(),
                                              v.transpose(1, 2).contiguous()), True),
                        ("*", lambda q, k, v: (q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(H // HK, 1),
                                               v.transpose(1, 2).repeat_interleave(H // HK, 1)), False),
                    ]
                    errs = []
                    for mark, prep, gqa in attempts:
                        try:
                            args_sets = [prep(q, k, v) for q, k, v in copies]
                            kw = dict(enable_gqa=True) if gqa else {}
                            fns = [lambda a=a: torch.nn.functional.scaled_dot_product_attention(*a, **kw)
                                   for a in args_sets]
                            with sdpa_kernel([be]), torch.no_grad():
                                fns[0]()
                                ms = bench(rotating(fns))
                            cells[bname] = kv_bytes / (ms * 1e-3) / 1e9
                            cells[bname + "_mark"] = mark
                            del args_sets, fns
                            break
                        except Exception as e:  # noqa: BLE001
                            errs.append(str(e).splitlines()[0][:100] if str(e) else type(e).__name__)
                    else:
                        print("  %s failed: %s" % (bname, " | ".join(errs)), flush=True)
            rows.append((batch, s, layout, cells))
            print("  %-8s %s" % (layout, "  ".join("%s %.0f" % (k, v) for k, v in cells.items()
                                                    if not k.endswith("_mark"))), flush=True)
            del caches
        del copies, ref
        torch.cuda.empty_cache()

    # ---- summary table ----
    cols = ["old_sh", "new_sh"] + ([] if args.no_sweep else ["new_s%d" % n for n in SPLIT_SWEEP]) + \
        ["sdpa_flash", "sdpa_cudnn"]
    print("\nGB/s (%s); old_sh/new_sh: split heuristic (new's pick in brackets); best SDPA = max(flash, cuDNN) "
          "of the contiguous shape" % timer)
    hdr = "%-5s %-7s %-7s |" % ("batch", "seqlen", "layout") + "".join(" %7s" % c.replace("sdpa_", "") for c in cols) + \
        " | %7s %8s %8s" % ("new/old", "new/SDPA", "pg/contig")
    print(hdr)
    print("-" * len(hdr))
    contig = {}
    for batch, s, layout, cells in rows:
        if layout == "contig":
            contig[(batch, s)] = cells
        base = contig.get((batch, s), {})
        best_sdpa = max([base.get("sdpa_flash", 0), base.get("sdpa_cudnn", 0)])
        line = "%-5d %-7d %-7s |" % (batch, s, layout)
        for c in cols:
            v = cells.get(c)
            line += " %7s" % (("%.0f" % v + cells.get(c + "_mark", "")) if v else "-")
        new, old = cells.get("new_sh"), cells.get("old_sh")
        line += " | %7s %8s %8s" % (
            "%.3f" % (new / old) if new and old else "-",
            "%.3f" % (new / best_sdpa) if new and best_sdpa else "-",
            "%.3f" % (new / base["new_sh"]) if new and base.get("new_sh") and layout != "contig" else "-")
        line += "  [h=%d]" % heuristic_new(batch * HK, sms, s)
        print(line)
    n_bad = results.count(False)
    print("\ncorrectness: %d checks, %d failed" % (len(results), n_bad))
    print("* SDPA read K/V repeated to %d heads (enable_gqa refused): 4x the counted bytes" % H)
    return 1 if n_bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(2)
