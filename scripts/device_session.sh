#!/usr/bin/env bash
# One run on a GPU machine, in named stages; every stage logs under $OUT (default /tmp/fa_out).
# From the repository root:
#   STAGES="build test bench" bash scripts/device_session.sh          # the default stages
#   STAGES="build profile" PROFILE_CASES="fwd 128 8192 0" bash scripts/device_session.sh
#   STAGES="build ab" AB_BASE=/path/to/base/tree bash scripts/device_session.sh
#
# Stages (run in the order given):
#   build    pip install --no-build-isolation --no-deps -e . with ptxas statistics (build.log;
#            prints the most frequent register / spill lines). The build variables
#            (FLASH_ATTN_CUDA_ARCHS, FLASH_ATTN_HEAD_DIMS, FLASH_ATTN_DTYPES, CUTLASS_PATH,
#            MAX_JOBS) pass through to setup.py.
#   check    benchmarks/check_kernels.py: kernels against naive attention, a few timings (CHECK_ARGS)
#   test     python -m pytest tests -q -x (PYTEST_ARGS)
#   bench    benchmarks/benchmark_attn.py --out $OUT/bench (BENCH_ARGS, e.g. "--quick" or
#            "--decode --decode-clean"; attn_tflops.png lands in $OUT/bench)
#   profile  scripts/ncu_profile.sh for each case of PROFILE_CASES ("PASS D SEQLEN CAUSAL [BACKEND]",
#            ';'-separated; default "fwd 128 8192 0;bwd 128 8192 0"); SOURCE / SECTIONS / METRICS
#            pass through
#   ab       scripts/ab_two_builds.py AB_BASE . (AB_ARGS, default "--cells grid,decode,varlen"):
#            AB_BASE is the base source tree, or AB_REF a commit checked out into a worktree
#            (needs git); the base extension is built in place first if it has none
#            (python setup.py build_ext --inplace, with the same build variables)
#   sanitize compute-sanitizer memcheck, racecheck and initcheck (with the TMA store of O off, which
#            initcheck does not see as a write) over scripts/sanitize_workload.py
#            (SANITIZE_ARGS, e.g. "--head-dims 64"; SANITIZE_TOOLS to choose the tools)
#   llama    scripts/llama_flash_attention_2.py (needs transformers)
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build test bench"}
if [ -z "${CUTLASS_PATH:-}" ] && [ -d .deps/cutlass_include ]; then export CUTLASS_PATH=$PWD/.deps/cutlass_include; fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
rc=0
# logged LOG LINES CMD...: run CMD, its output into $OUT/LOG, the last LINES lines shown; rc=1 if it fails.
logged() {
  local log=$OUT/$1 n=$2
  shift 2
  "$@" 2>&1 | tee "$log" | tail -n "$n"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
for stage in $STAGES; do
  t0=$(date +%s)
  echo "== stage $stage"
  case $stage in
    build)
      FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
        || { tail -60 "$OUT/build.log"; exit 1; }
      grep -E "spill stores|Used [0-9]+ registers" "$OUT/build.log" | sort | uniq -c | sort -rn | head -5 ;;
    # shellcheck disable=SC2086  # the *_ARGS variables are split into arguments on purpose
    check) logged check.log 0 $PY benchmarks/check_kernels.py ${CHECK_ARGS:-}; grep -v "^ok" "$OUT/check.log" | tail -40 ;;
    # shellcheck disable=SC2086
    test) logged test.log 25 $PY -m pytest tests -q -x ${PYTEST_ARGS:-} ;;
    # shellcheck disable=SC2086
    bench) logged bench.log "${BENCH_TAIL:-60}" $PY benchmarks/benchmark_attn.py --out "$OUT/bench" ${BENCH_ARGS:-} ;;
    profile)
      IFS=';' read -ra cases <<< "${PROFILE_CASES:-fwd 128 8192 0;bwd 128 8192 0}"
      : > "$OUT/profile.log"
      for case in "${cases[@]}"; do
        # shellcheck disable=SC2086  # the case is split into its arguments
        PY=$PY bash scripts/ncu_profile.sh $case >> "$OUT/profile.log" 2>&1 || rc=1
      done
      tail -n "${PROFILE_TAIL:-80}" "$OUT/profile.log" ;;
    ab)
      if [ -z "${AB_BASE:-}" ] && [ -n "${AB_REF:-}" ]; then  # a commit of this checkout instead of a tree
        AB_BASE=${AB_WORKTREE:-/tmp/fa-ab-base}
        [ -d "$AB_BASE" ] || git worktree add --detach "$AB_BASE" "$AB_REF" > /dev/null || exit 1
      fi
      [ -n "${AB_BASE:-}" ] && [ -d "$AB_BASE/flash_attn" ] || { echo "ab: set AB_BASE to the base source tree"; exit 1; }
      if ! ls "$AB_BASE"/flash_attn/_C*.so >/dev/null 2>&1; then
        (cd "$AB_BASE" && $PY setup.py build_ext --inplace > "$OUT/ab_base_build.log" 2>&1) \
          || { tail -60 "$OUT/ab_base_build.log"; exit 1; }
      fi
      # shellcheck disable=SC2086
      logged ab.log "${AB_TAIL:-200}" $PY scripts/ab_two_builds.py "$AB_BASE" . ${AB_ARGS:---cells grid,decode,varlen} \
        --json "$OUT/ab.json" ;;
    sanitize)
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
        # initcheck does not count TMA bulk-tensor stores as writes: with the forward's TMA store
        # of O on, every backward preprocess read of `out` is reported. It runs with that store off.
        extra=""
        [ "$tool" = initcheck ] && extra="--debug-kernel fwd_tma_o_off=1"
        # shellcheck disable=SC2086
        logged "sanitize_$tool.log" 8 compute-sanitizer --tool "$tool" --error-exitcode 1 \
          $PY scripts/sanitize_workload.py ${SANITIZE_ARGS:-} $extra
      done ;;
    llama) logged llama.log 10 $PY scripts/llama_flash_attention_2.py ;;
    *) echo "unknown stage: $stage (build check test bench profile ab sanitize llama)"; exit 2 ;;
  esac
  echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
exit $rc
