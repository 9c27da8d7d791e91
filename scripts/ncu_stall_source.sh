#!/usr/bin/env bash
# Where the consumer warps of the warp-specialised sm_90a forward stall, per SASS instruction
# (device machine; needs a build): ncu WarpStateStats + SourceCounters of one launch per case,
# then the stall-reason totals and the 30 SASS lines with the most stall samples
# (scripts/ncu_source_top.py). Cases: "d p" pairs (bf16, b=2, seqlen 8k, hidden 2048).
#   CASES="128 0.0;128 0.1" bash scripts/ncu_stall_source.sh > $OUT/ncu_source.txt 2>&1
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
cat > /tmp/ws_profile_case.py <<'PYEOF'
import sys, torch
from flash_attn import flash_attn_func
d, p = int(sys.argv[1]), float(sys.argv[2])
b, s, h = 2, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(4):
        flash_attn_func(q, k, v, dropout_p=p)
torch.cuda.synchronize()
PYEOF
IFS=';' read -ra cases <<< "${CASES:-128 0.0;128 0.1}"
for case in "${cases[@]}"; do
  tag=$(echo "$case" | tr ' .' '__')
  echo "=================== d, dropout_p = $case"
  rm -f /tmp/ncu_$tag.ncu-rep
  timeout ${NCU_TIMEOUT:-100} ncu --clock-control none -k regex:flash_fwd_ws_kernel_sm90 --launch-skip 3 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --import-source no -o /tmp/ncu_$tag \
    $PY /tmp/ws_profile_case.py $case > /tmp/ncu_$tag.log 2>&1 || { tail -5 /tmp/ncu_$tag.log; continue; }
  ncu -i /tmp/ncu_$tag.ncu-rep --page raw --csv 2>/dev/null > /tmp/ncu_${tag}_raw.csv
  ncu -i /tmp/ncu_$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null > /tmp/ncu_${tag}_src.csv
  $PY "$HERE/ncu_source_top.py" /tmp/ncu_${tag}_raw.csv /tmp/ncu_${tag}_src.csv
done
