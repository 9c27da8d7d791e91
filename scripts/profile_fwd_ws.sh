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
HERE=$(cd "$(dirname "$0")" && pwd)
for case in "128 0.0" "128 0.1" "256 0.0"; do
  echo "=================== d, dropout_p = $case"
  timeout 120 ncu --clock-control none -k regex:flash_fwd_ws_kernel_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SourceCounters --print-details all $PY "$HERE/ws_profile_case.py" $case 2>&1 \
    | grep -v "^==PROF==" | head -${NCU_LINES:-140}
done
