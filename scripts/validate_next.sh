#!/usr/bin/env bash
# Device-machine validation of the `next` branch (main + d256-feat + ws-fwd + ws-fwd-feat +
# bwd-dropout), in chained calls of under 10 minutes each (the machine idles out in 30 s, and the
# build of PART=1 is reused by the later parts only while it stays warm):
#   PART=1 bash scripts/validate_next.sh        # full build + scripts/check_fwd_ws.py (cases + bench)
#   PART=2 WS=1 bash scripts/validate_next.sh   # suite with FLASH_ATTN_FWD_WS=$WS, features, decode
#   PART=3 WS=1 bash scripts/validate_next.sh   # grid, varlen, llama; A/B: bwd dropout mode 0, d256 old
#   PART=final bash scripts/validate_next.sh    # one call: full build, suite, features, decode, varlen,
#                                               # llama, grid (without the naive backend)
# Logs go to $OUT (at most 8 files come back per call). Every step runs under `timeout`, capped by a
# whole-call deadline (DEADLINE seconds, default 570), so a pipeline hang cannot eat the session.
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}; mkdir -p "$OUT"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.deps/cutlass_include} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
[ -n "${WS:-}" ] && export FLASH_ATTN_FWD_WS=$WS
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
    TAIL=60 step check_ws 170 $PY scripts/check_fwd_ws.py ;;
  2)
    TAIL=6 step test 300 $PY -m pytest tests -q -x
    TAIL=40 step features 140 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=10 step decode 110 $PY benchmarks/benchmark_attn.py --decode --out /tmp/dec ;;
  3)
    TAIL=30 step grid 200 $PY benchmarks/benchmark_attn.py --out /tmp/grid
    TAIL=8 step varlen 60 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=4 step llama 60 $PY scripts/llama_flash_attention_2.py
    TAIL=30 step features_bwdmode0 110 env FLASH_ATTN_BWD_DROPOUT_MODE=0 $PY benchmarks/benchmark_attn.py --features --headdims 64,128 --out /tmp/feat0
    TAIL=12 step features_d256_old 60 env FLASH_ATTN_D256_FEAT_OLD=1 $PY benchmarks/benchmark_attn.py --features --headdims 256 --out /tmp/featold ;;
  final)
    step build 420 $PY -m pip install --no-build-isolation --no-deps -e . || exit 1
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=6 step decode 45 $PY benchmarks/benchmark_attn.py --decode --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 150 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid ;;
esac
