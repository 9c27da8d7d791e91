#!/usr/bin/env bash
# Where the consumer warps of the warp-specialised sm_90a forward stall, per SASS instruction
# (device machine; needs a build): ncu WarpStateStats + SourceCounters of one launch per case,
# then the stall-reason totals and the 30 SASS lines with the most stall samples
# (scripts/ncu_source_top.py). Cases: "d p" pairs (bf16, b=2, seqlen 8k, hidden 2048).
#   CASES="128 0.0;128 0.1" bash scripts/ncu_stall_source.sh > $OUT/ncu_source.txt 2>&1
# KIND=bwd: the warp-specialised backward's main kernel instead (cases: head dims, plain calls;
# scripts/bwd_profile_case.py, the 4th backward's launch):
#   KIND=bwd CASES="128;64" bash scripts/ncu_stall_source.sh
# KIND=fwd_shape: the forward at the grid's shapes (cases "d seqlen causal": bf16, 16k tokens,
# hidden 2048; scripts/fwd_profile_case.py, the 5th forward's launch):
#   KIND=fwd_shape CASES="64 512 1;128 512 0" bash scripts/ncu_stall_source.sh
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
KIND=${KIND:-fwd}
if [ "$KIND" = bwd ]; then
  kernel=flash_bwd_ws_kernel_sm90; default_cases="128;64"
elif [ "$KIND" = fwd_shape ]; then
  kernel=flash_fwd_ws_kernel_sm90; default_cases="64 512 1;128 512 0"
else
  kernel=flash_fwd_ws_kernel_sm90; default_cases="128 0.0;128 0.1"
fi
IFS=';' read -ra cases <<< "${CASES:-$default_cases}"
for case in "${cases[@]}"; do
  tag=$(echo "$case" | tr ' .' '__')
  skip=3
  case $KIND in
    bwd) echo "=================== backward d = $case"; case_cmd=("$HERE/bwd_profile_case.py" ours $case) ;;
    fwd_shape) echo "=================== forward d seqlen causal = $case"; skip=4
               case_cmd=("$HERE/fwd_profile_case.py" ours $case) ;;
    *) echo "=================== d, dropout_p = $case"; case_cmd=("$HERE/ws_profile_case.py" $case) ;;
  esac
  rm -f /tmp/ncu_$tag.ncu-rep
  timeout ${NCU_TIMEOUT:-100} ncu --clock-control none -k regex:$kernel --launch-skip $skip --launch-count 1 \
    --section WarpStateStats --section SourceCounters --import-source no -o /tmp/ncu_$tag \
    $PY "${case_cmd[@]}" > /tmp/ncu_$tag.log 2>&1 || { tail -5 /tmp/ncu_$tag.log; continue; }
  ncu -i /tmp/ncu_$tag.ncu-rep --page raw --csv 2>/dev/null > /tmp/ncu_${tag}_raw.csv
  ncu -i /tmp/ncu_$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null > /tmp/ncu_${tag}_src.csv
  $PY "$HERE/ncu_source_top.py" /tmp/ncu_${tag}_raw.csv /tmp/ncu_${tag}_src.csv
done
