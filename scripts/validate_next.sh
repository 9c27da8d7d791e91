#!/usr/bin/env bash
# Device-machine validation of the `next` branch (main + d256-feat + ws-fwd + ws-fwd-feat +
# bwd-dropout), in three calls of under 10 minutes each (chain them: the machine idles out in 30 s):
#   PART=1 bash scripts/validate_next.sh   # full build + default suite (everything new is off or A/B-able)
#   PART=2 bash scripts/validate_next.sh   # warp-specialised forward: layout checks, check_fwd_ws.py, suite with FLASH_ATTN_FWD_WS=1
#   PART=3 bash scripts/validate_next.sh   # feature costs (d256 sets / bwd dropout modes / WS), decode, grid
# Logs go to $OUT. Every step runs under `timeout` (a pipeline hang must not eat the session).
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}; mkdir -p "$OUT"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.deps/cutlass_include} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
PY=${PY:-python3}
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?;
         echo "== $name rc=$rc $(( $(date +%s) - t0 )) s"; tail -${TAIL:-4} "$OUT/$name.log"; }
case ${PART:-1} in
  1)
    step build 420 env FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e .
    step test_default 300 $PY -m pytest tests -q -x ;;
  2)
    step layout_fwd 60 bash -c "nvcc -std=c++17 --expt-relaxed-constexpr -DFLASH_ATTN_SM90A -Icsrc -I$CUTLASS_PATH scripts/check_dropout_ws_layout.cu -o /tmp/cdl && /tmp/cdl"
    step layout_bwd 60 bash -c "cd csrc && nvcc -std=c++17 --expt-relaxed-constexpr -I. -I$CUTLASS_PATH ../scripts/check_dropout_bwd_layout2.cu -o /tmp/cdb && /tmp/cdb"
    step check_ws 150 $PY scripts/check_fwd_ws.py --no-bench
    TAIL=6 step test_ws 300 env FLASH_ATTN_FWD_WS=1 $PY -m pytest tests -q -x ;;
  3)
    step bench_ws 120 $PY scripts/check_fwd_ws.py --bench-only
    step bench_ws_feat 120 $PY scripts/check_fwd_ws.py --feat-only --bench-only
    for m in 0 1 2; do TAIL=40 step features_bwdmode$m 110 env FLASH_ATTN_BWD_DROPOUT_MODE=$m $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out "$OUT/feat$m"; done
    TAIL=12 step features_d256_old 60 env FLASH_ATTN_D256_FEAT_OLD=1 $PY benchmarks/benchmark_attn.py --features --headdims 256 --out "$OUT/feat_old"
    TAIL=8 step decode 120 $PY benchmarks/benchmark_attn.py --decode --out "$OUT/decode" ;;
esac
