"""Summarise an ncu report exported as CSV (SOURCE=1 bash scripts/ncu_profile.sh ...): the stall
reasons of the raw page (smsp__pcsamp_warps_issue_stalled_*), the SASS lines of the source page
with the most stall samples, stall samples by opcode, shared-memory bank conflicts (excessive
wavefronts) and the instructions around the hottest line.

    python scripts/ncu_source_top.py raw.csv src.csv [top_n]
"""
import csv
import sys


def read_rows(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("==")]
    return list(csv.reader(lines))


def stall_totals(raw_path):
    rows = read_rows(raw_path)
    if len(rows) < 2:
        print("  (raw page empty)")
        return
    header = rows[0]
    values = rows[-1]
    picked = []
    for name, value in zip(header, values):
        if "pcsamp_warps_issue_stalled" in name and not name.endswith("_not_issued"):
            try:
                picked.append((float(value.replace(",", "")), name))
            except ValueError:
                pass
    total = sum(v for v, _ in picked) or 1.0
    print("  stall samples by reason (share of all samples):")
    for v, name in sorted(picked, reverse=True)[:14]:
        print(f"    {name.replace('smsp__pcsamp_warps_issue_stalled_', ''):32s} {v:12.0f}  {100 * v / total:5.1f}%")


def source_top(src_path, top_n):
    rows = read_rows(src_path)
    if len(rows) < 2:
        print("  (source page empty)")
        return
    # The page starts with a "Kernel Name" row; the table header is the first row with a
    # "Source" cell.
    start = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), 0)
    header = rows[start]
    body = [r for r in rows[start + 1:] if len(r) == len(header)]
    def col(*keys):
        for i, h in enumerate(header):
            if all(k.lower() in h.lower() for k in keys):
                return i
        return None
    i_src = col("Source")
    i_addr = col("Address")
    i_all = col("Warp Stall Sampling", "All")
    if i_all is None:
        i_all = col("Sampling")
    if i_all is None:
        print("  columns:", header)
        return
    def num(s):
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(num(r[i_all]) for r in body) or 1.0
    print(f"  top {top_n} SASS lines by stall samples ({header[i_all]}; total {total:.0f}):")
    ranked = sorted(range(len(body)), key=lambda k: -num(body[k][i_all]))[:top_n]
    for k in sorted(ranked):
        r = body[k]
        print(f"    #{k:5d} {r[i_addr] if i_addr is not None else '':>8s} {100 * num(r[i_all]) / total:5.1f}%  {r[i_src][:90]}")
    by_op = {}
    for r in body:
        tok = r[i_src].split()
        op = tok[1] if tok and tok[0].startswith("@") and len(tok) > 1 else (tok[0] if tok else "?")
        by_op[op] = by_op.get(op, 0.0) + num(r[i_all])
    print("  stall samples by opcode:")
    for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {op:32s} {100 * v / total:5.1f}%")
    # Shared-memory bank conflicts: the total and the lines with the most excessive wavefronts.
    i_wf, i_ex = col("L1 Wavefronts Shared"), col("L1 Wavefronts Shared Excessive")
    i_wf = next((i for i, h in enumerate(header) if h.strip() == "L1 Wavefronts Shared"), i_wf)
    if i_wf is not None and i_ex is not None:
        wf = sum(num(r[i_wf]) for r in body) or 1.0
        ex = sum(num(r[i_ex]) for r in body)
        print(f"  shared wavefronts {wf:.0f}, excessive {ex:.0f} ({100 * ex / wf:.1f}%)")
        for k in sorted(range(len(body)), key=lambda k: -num(body[k][i_ex]))[:6]:
            if num(body[k][i_ex]) > 0:
                print(f"    #{k:5d} excessive {num(body[k][i_ex]):12.0f} of {num(body[k][i_wf]):12.0f}  {body[k][i_src][:70]}")
    # The instruction mix around the hottest line helps read it: print its neighbours.
    hot = ranked[0]
    print("  around the hottest line:")
    for k in range(max(0, hot - 8), min(len(body), hot + 4)):
        r = body[k]
        print(f"    #{k:5d} {100 * num(r[i_all]) / total:5.1f}%  {r[i_src][:90]}")


if __name__ == "__main__":
    stall_totals(sys.argv[1])
    source_top(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)
