#!/usr/bin/env bash
# One device-machine call: build, kernel check, test suite, benchmarks; logs under $OUT.
# Usage (from the repo root on the GPU machine):
#   STAGES="build check test bench" bash scripts/device_session.sh
# Build selection variables (FLASH_ATTN_HEAD_DIMS, ...) pass through to setup.py.
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build check test bench"}
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.deps/cutlass_include}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
rc=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
for stage in $STAGES; do
  t0=$(date +%s)
  case $stage in
    build)
      FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
        || { tail -60 "$OUT/build.log"; exit 1; }
      grep -E "spill stores|Used [0-9]+ registers" "$OUT/build.log" | sort | uniq -c | sort -rn | head -5 ;;
    check) $PY benchmarks/check_kernels.py ${CHECK_ARGS:-} 2>&1 | tee "$OUT/check.log" | grep -v "^ok" || rc=1 ;;
    test) $PY -m pytest tests -q -x ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/test.log" | tail -25 || rc=1 ;;
    bench) $PY benchmarks/benchmark_attn.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -${BENCH_TAIL:-60} ;;
  esac
  echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
exit $rc
