#!/usr/bin/env bash
# Our forward against SDPA-cuDNN's on the same shapes, with ncu (device machine; needs a build):
# every kernel of one forward call each (duration, tensor-pipe use, stall reasons, launch shape,
# registers, shared memory, occupancy). Made for the short-sequence gap (session 23: causal d64 at
# 512 is 0.81x cuDNN, d128 at 512 0.92x), where the per-tile fixed costs dominate.
#   CASES="64 512 1;128 512 0" bash scripts/ncu_fwd_compare.sh > $OUT/ncu_fwd.txt 2>&1
# CASES: "d seqlen causal" separated by ';'. BACKENDS (default "ours cudnn"). Extra environment
# variables reach our forward (e.g. FLASH_ATTN_FWD_WS_D128_N=176 in A/B builds).
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
IFS=';' read -ra cases <<< "${CASES:-64 512 1;128 512 0}"
for case in "${cases[@]}"; do
  for backend in ${BACKENDS:-ours cudnn}; do
    echo "=================== $backend: d seqlen causal = $case"
    timeout ${NCU_TIMEOUT:-90} ncu --clock-control none --profile-from-start off --launch-count 4 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --section Occupancy --section MemoryWorkloadAnalysis \
      $PY "$HERE/fwd_profile_case.py" $backend $case 2>&1 | grep -vE "^==PROF==|^\s*$" | head -${NCU_LINES:-220}
  done
done
