#!/usr/bin/env bash
# Nsight Compute profile of one attention call (device machine, after a build): every kernel of
# the call (scripts/profile_case.py: bf16, 16k tokens, hidden 2048; three warm-up calls first).
#
#   bash scripts/ncu_profile.sh PASS D SEQLEN CAUSAL [BACKEND] [DROPOUT_P]
#   bash scripts/ncu_profile.sh fwd 128 8192 0                 # ours, the default sections
#   bash scripts/ncu_profile.sh bwd 64 8192 1 cudnn            # SDPA's cuDNN backend (or flash)
#   SOURCE=1 KERNEL=flash_fwd_ws bash scripts/ncu_profile.sh fwd 128 8192 0
#
# PASS fwd | bwd; CAUSAL 0 | 1; BACKEND ours (default) | cudnn | flash.
# Environment:
#   SECTIONS   ncu sections (default: launch shape, occupancy, speed of light, compute and memory
#              workload, warp stall reasons)
#   METRICS    a comma list of raw metrics instead of the sections (e.g. dram__bytes_read.sum)
#   SOURCE=1   per-SASS-line stall samples of the first kernel matching KERNEL (a regex; default:
#              the main kernel of our forward or backward), summarised by ncu_source_top.py
#   NCU_TIMEOUT  seconds (default 180);  PY  the Python interpreter (default python3)
set -uo pipefail
if [ $# -lt 4 ]; then sed -n '2,20p' "$0"; exit 2; fi
PASS=$1 D=$2 SEQLEN=$3 CAUSAL=$4 BACKEND=${5:-ours} DROPOUT=${6:-0.0}
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v ncu >/dev/null || { echo "ncu not found (Nsight Compute)"; exit 1; }
CASE=("$HERE/profile_case.py" "$BACKEND" "$PASS" "$D" "$SEQLEN" "$CAUSAL" "$DROPOUT")
echo "=== $BACKEND $PASS d$D seqlen $SEQLEN causal $CAUSAL dropout $DROPOUT"

if [ "${SOURCE:-0}" = 1 ]; then
  kernel=${KERNEL:-$([ "$PASS" = bwd ] && echo 'flash_bwd_(ws_)?kernel' || echo 'flash_fwd_')}
  tmp=$(mktemp -d)
  timeout "${NCU_TIMEOUT:-180}" ncu --clock-control none --profile-from-start off -k "regex:$kernel" --launch-count 1 \
    --section WarpStateStats --section SourceCounters --import-source no -o "$tmp/rep" \
    "$PY" "${CASE[@]}" > "$tmp/log" 2>&1 || { tail -20 "$tmp/log"; exit 1; }
  ncu -i "$tmp/rep.ncu-rep" --page raw --csv > "$tmp/raw.csv" 2>/dev/null
  ncu -i "$tmp/rep.ncu-rep" --page source --csv --print-source sass > "$tmp/src.csv" 2>/dev/null
  "$PY" "$HERE/ncu_source_top.py" "$tmp/raw.csv" "$tmp/src.csv" "${TOP:-30}"
  rm -rf "$tmp"
  exit 0
fi

if [ -n "${METRICS:-}" ]; then
  what=(--metrics "$METRICS")
else
  what=()
  for s in ${SECTIONS:-LaunchStats Occupancy SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats}; do
    what+=(--section "$s")
  done
fi
timeout "${NCU_TIMEOUT:-180}" ncu --clock-control none --profile-from-start off "${what[@]}" \
  "$PY" "${CASE[@]}" 2>&1 | grep -vE '^==PROF==|^\s*$'
