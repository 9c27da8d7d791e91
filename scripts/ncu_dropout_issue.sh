#!/usr/bin/env bash
# Issue-slot budget of dropout (issue 3: dropout <= 15% of plain forward + backward): for each case,
# one launch of the warp-specialised forward or backward kernel under ncu, with the kernel time,
# the warp instructions issued, the issue-slot utilisation and the busiest pipes. With the plain
# and dropout rows side by side: how many instructions dropout adds, and how busy the issue slots
# already are without it (a lower bound on the dropout cost where the kernel is issue-bound).
# Cases: "pass d p" triples (bf16, b=2, seqlen 8k, hidden 2048; scripts/dropout_profile_case.py).
#   bash scripts/ncu_dropout_issue.sh > $OUT/ncu_dropout_issue.txt 2>&1
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg,smsp__inst_issued.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active
METRICS=$METRICS,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
BASIC=gpu__time_duration.sum,sm__cycles_elapsed.avg,smsp__inst_issued.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
SUMMARY='
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 5]
if len(rows) < 3:
    print("  (no ncu rows)"); sys.exit(1)
head, units, vals = rows[0], rows[1], rows[2]
wanted = sys.argv[1].split(",")
for i, name in enumerate(head):
    if name in wanted:
        print("  %-80s %14s %s" % (name, vals[i], units[i]))
'
IFS=';' read -ra cases <<< "${CASES:-fwd 64 0.0;fwd 64 0.1;bwd 64 0.0;bwd 64 0.1;fwd 128 0.0;fwd 128 0.1;bwd 128 0.0;bwd 128 0.1}"
for case in "${cases[@]}"; do
  read -r pass d p <<< "$case"
  kernel=$([ "$pass" = fwd ] && echo flash_fwd_ws_kernel_sm90 || echo flash_bwd_ws_kernel_sm90)
  echo "=================== $pass d=$d dropout_p=$p ($kernel)"
  for m in "$METRICS" "$BASIC"; do  # the basic set if this ncu lacks a metric of the full one
    timeout ${NCU_TIMEOUT:-100} ncu --clock-control none -k regex:$kernel --launch-skip 3 --launch-count 1 \
      --metrics $m --csv --page raw $PY "$HERE/dropout_profile_case.py" $pass $d $p > /tmp/ncu_issue.csv 2>&1
    grep -v "^==" /tmp/ncu_issue.csv | $PY -c "$SUMMARY" "$m" && break
    grep "^==ERROR==" /tmp/ncu_issue.csv | head -3
  done
done
