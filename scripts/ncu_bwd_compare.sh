#!/usr/bin/env bash
# Our backward kernel against SDPA-flash's (upstream FA2) on the same shape, with ncu (device
# machine; needs a build): duration, throughput, pipe utilisation, warp stall reasons, registers,
# shared memory and occupancy of one launch each (bf16, b=2, seqlen 8k, hidden 2048). The d256
# backward is an SM80-class kernel with FA2's tile configuration (64 x 64, 8 warps) and still runs
# 0.77x of FA2's TFLOP/s (session 9 grid: 199 vs 258): this shows where the time goes.
#   D=256 bash scripts/ncu_bwd_compare.sh > $OUT/ncu_bwd_d256.txt 2>&1
#   D=128 BACKENDS="ours cudnn" bash scripts/ncu_bwd_compare.sh   # every kernel of one backward each
# (BACKENDS set: the profiled range is one whole backward, cudaProfilerStart / Stop, any kernel name)
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
D=${D:-256}
if [ -n "${BACKENDS:-}" ]; then
  for backend in $BACKENDS; do
    echo "=================== $backend d$D (every kernel of one backward)"
    timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --profile-from-start off --launch-count 8 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats \
      $PY "$HERE/bwd_profile_case.py" $backend $D 2>&1 | grep -vE "^==PROF==|^\s*$" | head -400
  done
  exit 0
fi
for backend in ours flash; do
  # Ours: flash_bwd_kernel (SM80-class) / flash_bwd_ws_kernel_sm90 / flash_bwd_kernel_sm90;
  # FA2 in PyTorch: flash_bwd_dq_dk_dv_loop(_seqk_parallel)_kernel.
  regex='regex:flash_bwd_(ws_)?kernel|flash_bwd_dq_dk_dv_loop'
  echo "=================== $backend d$D"
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k "$regex" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --section Occupancy --section MemoryWorkloadAnalysis \
    $PY "$HERE/bwd_profile_case.py" $backend $D 2>&1 | grep -vE "^==PROF==|^\s*$" | head -150
done
