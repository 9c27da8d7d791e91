#!/usr/bin/env bash
# ncu profile of the warp-specialised sm_90a forward (device machine; needs a build). One launch of
# each case after warm-up; prints the sections that say where a consumer warp waits:
#   - WarpStateStats: stall reasons (a large "Wait" / "Dispatch Stall" share on WARPGROUP.DEPBAR
#     means the softmax is waiting for the warpgroup's own P V GEMM: no intra-warpgroup overlap);
#   - SourceCounters: the SASS lines with the most stall samples (look for WARPGROUP.DEPBAR.LE);
#   - ComputeWorkloadAnalysis / SpeedOfLight: tensor pipe utilisation.
# Cases (bf16, b=2, seqlen 8k, hidden 2048): d128 plain, d128 dropout 0.1, d256 plain.
#   bash scripts/profile_fwd_ws.sh > $OUT/ncu_ws.txt 2>&1
set -uo pipefail
PY=${PY:-python3}
cat > /tmp/ws_profile_case.py <<'PYEOF'
import sys, torch
from flash_attn import flash_attn_func
d, p = int(sys.argv[1]), float(sys.argv[2])
b, s, h = 2, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(3):
        flash_attn_func(q, k, v, dropout_p=p)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")
    flash_attn_func(q, k, v, dropout_p=p)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
PYEOF
for case in "128 0.0" "128 0.1" "256 0.0"; do
  echo "=================== d, dropout_p = $case"
  timeout 120 ncu --clock-control none -k regex:flash_fwd_ws_kernel_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SourceCounters --print-details all $PY /tmp/ws_profile_case.py $case 2>&1 \
    | grep -v "^==PROF==" | head -${NCU_LINES:-140}
done
