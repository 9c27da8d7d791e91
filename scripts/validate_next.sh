#!/usr/bin/env bash
# Device-machine validation of the checkout, in two chained calls of under 10 minutes each (the
# machine idles out in 30 s; PART=B reuses PART=A's build only while it stays warm):
#   PART=A bash scripts/validate_next.sh   # full build, suite, feature costs
#   PART=B bash scripts/validate_next.sh   # decode, varlen, llama, grid (without the naive backend),
#                                          # A/B and diagnostics (FLASH_ATTN_DET_STORE_FIRST=0,
#                                          # ncu stall sources of the WS forward with dropout)
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
case ${PART:-A} in
  A)
    step build 400 env FLASH_ATTN_PTXAS_VERBOSE=${PTXAS_VERBOSE:-0} $PY -m pip install --no-build-isolation --no-deps -e . || exit 1
    TAIL=3 step test 250 $PY -m pytest tests -q -x
    TAIL=32 step features 75 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  B)
    TAIL=6 step decode 45 $PY benchmarks/benchmark_attn.py --decode --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid
    TAIL=8 step features_dsf0 45 env FLASH_ATTN_DET_STORE_FIRST=0 $PY benchmarks/benchmark_attn.py --features --headdims 64,128 --out /tmp/featd
    TAIL=80 step ncu_source 200 env CASES="128 0.0;128 0.1" bash scripts/ncu_stall_source.sh ;;
esac
