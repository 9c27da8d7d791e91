#!/usr/bin/env bash
# Device-machine validation of the `next` branch (session 7: main + bwd-ws + bwd-ws-dq +
# ws-persistent, all default-off and A/B-able at run time), in chained calls of under 10 minutes
# each (the machine idles out in 30 s; later parts reuse PART=1's build only while it stays warm):
#   PART=1 bash scripts/validate_next.sh   # full build (ptxas -v), check_fwd_ws_persistent.py
#   PART=2 bash scripts/validate_next.sh   # check_bwd_ws.py (old / ws / ws+dq_tma / ws+overlap /
#                                          # ws+dq_tma+overlap, then the bench with cuDNN)
#   PART=3 bash scripts/validate_next.sh   # suite with FLASH_ATTN_FWD_WS_PERSISTENT=1,
#                                          # FLASH_ATTN_BWD_WS=1 (every plain call on the new
#                                          # paths), then FLASH_ATTN_BWD_WS_DQ=tma; grid
#   PART=A / PART=B: main's final validation (build + suite + features / decode, varlen, llama,
#                    grid), as on main.
# Logs go to $OUT (at most 8 files come back per call). Every step runs under `timeout`, capped by a
# whole-call deadline (DEADLINE seconds, default 570), so a pipeline hang cannot eat the session.
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}; mkdir -p "$OUT"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.deps/cutlass_include} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
PY=${PY:-python3}
T_START=$(date +%s); DEADLINE=${DEADLINE:-570}
step() { local name=$1 t=$2; shift 2; local left=$(( DEADLINE - ($(date +%s) - T_START) ));
         (( t > left )) && t=$left; (( t < 10 )) && { echo "== $name skipped (no time left)"; return 1; }
         local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?;
         echo "== $name rc=$rc $(( $(date +%s) - t0 )) s"; tail -${TAIL:-4} "$OUT/$name.log"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
case ${PART:-1} in
  1)
    step build 420 env FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e . || exit 1
    grep -E "spill stores" "$OUT/build.log" | grep -v " 0 bytes spill stores" | sort | uniq -c | head -8
    grep -E "C75[0-9][0-9]" "$OUT/build.log" | sort | uniq -c | head -4  # ptxas wgmma serialisation warnings
    TAIL=30 step check_persistent 140 $PY scripts/check_fwd_ws_persistent.py ;;
  2)
    TAIL=40 step check_bwd_ws 540 $PY scripts/check_bwd_ws.py ;;
  3)
    TAIL=3 step test_new_paths 230 env FLASH_ATTN_FWD_WS_PERSISTENT=1 FLASH_ATTN_BWD_WS=1 $PY -m pytest tests -q -x
    TAIL=3 step test_bwd_dq_tma 170 env FLASH_ATTN_BWD_WS=1 FLASH_ATTN_BWD_WS_DQ=tma $PY -m pytest tests -q -x -k "bwd or backward or grad"
    TAIL=56 step grid_new_paths 160 env FLASH_ATTN_FWD_WS_PERSISTENT=1 FLASH_ATTN_BWD_WS=1 \
      $PY benchmarks/benchmark_attn.py --backends ours,cudnn --out /tmp/grid ;;
  A)
    step build 400 $PY -m pip install --no-build-isolation --no-deps -e . || exit 1
    TAIL=3 step test 250 $PY -m pytest tests -q -x
    TAIL=32 step features 75 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  B)
    TAIL=6 step decode 45 $PY benchmarks/benchmark_attn.py --decode --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid ;;
esac
