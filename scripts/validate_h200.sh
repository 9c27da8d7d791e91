#!/usr/bin/env bash
# Device-machine validation of the checkout in two chained calls of under 10 minutes each (the
# machine idles out in 30 s; PART=B on a cold machine rebuilds first):
#   PART=A bash scripts/validate_h200.sh   # full build (ptxas -v); the suite; feature costs
#                                          # (default, and against the lock-step backward)
#   PART=B bash scripts/validate_h200.sh   # decode; varlen; llama; grid (ours, flash, cuDNN,
#                                          # efficient); WS backward self-check; our grid with
#                                          # the lock-step backward (FLASH_ATTN_BWD_WS=0)
#   PART=M bash scripts/validate_h200.sh   # head dims 64 / 128 build; suite; feature costs
#   PART=F bash scripts/validate_h200.sh   # full build; suite; feature costs; WS deterministic check
#   PART=D bash scripts/validate_h200.sh   # d64/128 build; WS dropout backward check; features
#   PART=E bash scripts/validate_h200.sh   # the suite on that build (rebuilds on a cold machine)
#   PART=M128 bash scripts/validate_h200.sh  # d64 A/B build: WS backward on 128-row query blocks
#   PART=CT bash scripts/validate_h200.sh  # d128 A/B build: decode with cuDNN's schedule (FLASH_ATTN_DECODE_CTA)
#   PART=PG bash scripts/validate_h200.sh  # d128 bf16 A/B build: paged decode through the CTA kernel
#   PART=DPN bash scripts/validate_h200.sh # d128 bf16 build: ncu stall sources, dropout forward vs plain
#   PART=CL bash scripts/validate_h200.sh  # d128 bf16 A/B build: decode with clusters of the KV heads' CTAs
#   PART=N17 bash scripts/validate_h200.sh # branch next17: PG + CL in one d128 bf16 A/B build
#   PART=DN bash scripts/validate_h200.sh  # ncu: spread of SM active cycles, decode ours vs cuDNN
#   PART=P bash scripts/validate_h200.sh   # ncu: our backward vs SDPA-flash's, d256 and d128
#   PART=V bash scripts/validate_h200.sh   # d256 build; SM80-class backward variants: check, A/B, ncu
#   PART=W bash scripts/validate_h200.sh   # branch ws-persistent-fix: WS head dims build; persistent
#                                          # forward check + timing; suite
#   PART=X bash scripts/validate_h200.sh   # branch next (s10): build 64/128/256; persistent forward
#                                          # check + timing; d256 backward variants check + A/B
#   PART=Y bash scripts/validate_h200.sh   # on that build: the d256 WS backward's check + bench;
#                                          # the suite; feature costs
#   PART=G bash scripts/validate_h200.sh   # full build; suite; feature costs (then PART=C)
#   PART=C bash scripts/validate_h200.sh   # decode; varlen; llama; grid (PART=B without its A/B steps)
#   PART=H bash scripts/validate_h200.sh   # d256 build; the split-d WS backward's softcap / ALiBi /
#                                          # deterministic kernel (FLASH_ATTN_BWD_WS_D256_MOD=1): times
#                                          # vs SM80-class; det check + slice A/B; suite; features
#   PART=Z bash scripts/validate_h200.sh   # branch next (s11 -> s12): d128 + d256 build; d256 kMod
#                                          # / dropout times, dropout and det checks; decode pipeline A/B
#   PART=Z2 bash scripts/validate_h200.sh  # on that build, FLASH_ATTN_BWD_WS_D256_MOD=1: suite; d256
#                                          # feature costs; d256 WS check incl. float4 dQ (DQ_V4) + times
#   PART=S bash scripts/validate_h200.sh   # d256 build; the WS deterministic kernel's bulk-reduce dQ:
#                                          # times, check, suite
#   PART=S2 bash scripts/validate_h200.sh  # d256 build: every non-dropout d256 WS backward with dQ
#                                          # through the Q / dO stage: times, suite, check
#   PART=G2 bash scripts/validate_h200.sh  # full build; suite; features (then PART=C2)
#   PART=S20A bash scripts/validate_h200.sh # after `git revert bb7e824`: full build; features; grid vs cuDNN; suite
#   PART=S20D bash scripts/validate_h200.sh # final: full build; suite; features; grid (4 backends)
#   PART=S20E bash scripts/validate_h200.sh # then: decode; varlen; llama (d64/128 build if cold)
#   PART=S20F bash scripts/validate_h200.sh # ncu: one whole backward, ours vs cuDNN, d128 / d64
#   PART=S26D bash scripts/validate_h200.sh # branch s26-fwd-next, optional: d64 scheduling boundary with lazy rescaling (two-.so A/B)
#   PART=S28B bash scripts/validate_h200.sh # d128 bf16 A/B build: decode ring depths / tile shapes timed cold, then after 90 s of heat
#   PART=S28A bash scripts/validate_h200.sh # branch s28-q-early: d128 Q released after its ldmatrix; tests; two-.so A/B; clock probe (settled, limit reasons)
#   PART=S27C bash scripts/validate_h200.sh # branch s27-q-regs: d128 Q in registers for S = Q K^T; tests; two-.so A/B; power per arm
#   PART=S27B bash scripts/validate_h200.sh # after S27A: power limit, matmul baseline, ncu traffic / instruction counts ours vs cuDNN
#   PART=S27A bash scripts/validate_h200.sh # d64/128/256 bf16 build; SM clock + power per forward cell, ours vs cuDNN (clock_probe.py)
#   PART=S26F bash scripts/validate_h200.sh # branch s26-feat-lazy: conditional rescaling in the d128/256 feature forwards; suite; two-.so A/B
#   PART=S26C bash scripts/validate_h200.sh # branch s26-fwd-next: TMA store of O (run-time A/B) + conditional rescaling (two-.so A/B)
#   PART=S26B bash scripts/validate_h200.sh # branch s26-tma-store: TMA store of the forward O tile; suite; run-time A/B
#   PART=S25D bash scripts/validate_h200.sh # final: full build; suite; grid (then S23E)
#   PART=S25C bash scripts/validate_h200.sh # branch s25-decode-spec: decode speculative start; kvcache tests; spec A/B
#   PART=S25B bash scripts/validate_h200.sh # d128 bf16: .L2::128B hint on the decode cp.async, two-.so decode A/B
#   PART=S25A bash scripts/validate_h200.sh # branch s25-mask-bounds: d64/128/256 bf16; suite; two-.so mask A/B (carry .ab)
#   PART=S24E bash scripts/validate_h200.sh # d128 bf16 build; decode benchmark x3
#   PART=S24D bash scripts/validate_h200.sh # final: full build; suite; fwd zero-fill A/B; grid (then S23E)
#   PART=S24B bash scripts/validate_h200.sh # d128/256 bf16 A/B build: FA3's key tiles (176 / 80) as single wgmmas (extended MMA shapes): tests, A/B
#   PART=S24A bash scripts/validate_h200.sh # d64/128 bf16 A/B build; ncu ours vs cuDNN forward at 512 (d64 causal, d128) and d128 8k (128 vs 176 keys)
#   PART=S23F bash scripts/validate_h200.sh # final code (d64 m128 for narrow windows too): full build; suite; window A/B
#   PART=S23D bash scripts/validate_h200.sh # final: full build; suite; grid vs SDPA flash / cuDNN / efficient
#   PART=S23E bash scripts/validate_h200.sh # final, after S23D on the same machine: features; decode; varlen; llama
#   PART=S23C bash scripts/validate_h200.sh # bf16 d64/128/256: d64 m128 default + O rescale before P V; suite; two-.so A/B vs main's mainloop
#   PART=S23A bash scripts/validate_h200.sh # d64 bf16 A/B build: d64 forward on 128-row tiles vs 192 (branch s22-d64-m128-fwd)
#   PART=S22C bash scripts/validate_h200.sh # full build; suite; grid ours vs cuDNN (s21-pass-lanes merged)
#   PART=S22B bash scripts/validate_h200.sh # final: full build; suite; decode; varlen; llama
#   PART=S22A bash scripts/validate_h200.sh # A/B build 64/128/256 bf16: persistent fwd (own O buffer, dynamic order): check, bench vs cuDNN, tests
#   PART=S21I bash scripts/validate_h200.sh # d256 bf16: row prefetch in the split-d kernels vs HEAD~1 (two builds)
#   PART=S21H bash scripts/validate_h200.sh # d64/256 bf16 build; ncu stall sources of the d256 and d64-dropout bwd
#   PART=S21C bash scripts/validate_h200.sh # d64/128 bf16 build; bwd tests; dQ-before-dK A/B; fwd ncu
#   PART=S21B bash scripts/validate_h200.sh # d64/128 bf16 build; suite; bwd A/B (dQ swizzle, dS stmatrix); grid; ncu
#   PART=S21A bash scripts/validate_h200.sh # d64/128 bf16 build; ncu stall reasons per SASS line of the WS backward
#   PART=S20G bash scripts/validate_h200.sh # bwd preprocess / convert lane groups, no fill: build; suite; pass times; grid
#   PART=S20B bash scripts/validate_h200.sh # A/B build d128/d256 bf16: FA3 tiles and persistent fwd with the boundary
#   PART=S19A bash scripts/validate_h200.sh # d64/128 build: dropout Philox on producer warps; tests; features
#   PART=S19B bash scripts/validate_h200.sh # full build; features; the suite
#   PART=S19C bash scripts/validate_h200.sh # full build + A/B fwd dropout producer; features x2; suite
#   PART=S18A bash scripts/validate_h200.sh # full build; kvcache tests; decode A/B (PDL, splits); kernel times
#   PART=S18B bash scripts/validate_h200.sh # suite; features; PART=C benchmarks; ncu dropout issue slots
#   PART=C2 bash scripts/validate_h200.sh  # d256 bwd times, dropout / d256 checks; grid
#   PART=N bash scripts/validate_h200.sh   # branch next: build; WS deterministic check; suite;
#                                          # feature costs
# Logs go to $OUT. Every step runs under `timeout`, capped by a whole-call deadline (DEADLINE
# seconds, default 570), so a pipeline hang cannot eat the session.
set -uo pipefail
OUT=${OUT:-/tmp/fa_out}; mkdir -p "$OUT"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.deps/cutlass_include} MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
PY=${PY:-python3}
T_START=$(date +%s); DEADLINE=${DEADLINE:-570}
step() { local name=$1 t=$2; shift 2; local left=$(( DEADLINE - ($(date +%s) - T_START) ));
         (( t > left )) && t=$left; (( t < 10 )) && { echo "== $name skipped (no time left)"; return 1; }
         local t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?;
         echo "== $name rc=$rc $(( $(date +%s) - t0 )) s"; tail -${TAIL:-4} "$OUT/$name.log"; return $rc; }
# Parts that time A/B-only kernels (persistent forward, FA3 tiles, SM80-class d256 variants, the
# redundant d256 WS backward) export FLASH_ATTN_AB_KERNELS=1 before building.
build() { step build 420 env FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e . || exit 1
          grep -E "spill stores" "$OUT/build.log" | grep -v " 0 bytes spill stores" | sort | uniq -c | head -8
          grep -E "C75[0-9][0-9]" "$OUT/build.log" | sort | uniq -c | head -4; }  # wgmma serialisation
built() { $PY -c "import flash_attn._C" 2>/dev/null; }
# Two-.so A/B of one `constexpr int NAME = ...;` of the WS forward's traits header: the built .so
# is arm "lazy8" (HEAD's value), NAME sed'ed to 0 and rebuilt is arm "lazy0"; the bench script
# (FWD lines, one argument: the arm) runs twice per arm, interleaved; the table goes to
# $OUT/ab_lazy.log (S26C, S26F). Usage: traits_zero_ab NAME SCRIPT REBUILD_S BENCH_S
traits_zero_ab() { local name=$1 script=$2 t_build=$3 t_bench=$4 f=csrc/hopper/kernel_traits_fwd_ws_sm90.h
    local so; so=$(ls flash_attn/_C*.so); cp "$so" /tmp/lazy8.so; cp $f /tmp/traits.h
    sed -i "s/^constexpr int $name = .*;/constexpr int $name = 0;/" $f; grep -c "$name = 0;" $f
    TAIL=1 step rebuild_lazy0 "$t_build" $PY -m pip install --no-build-isolation --no-deps -e . && cp "$so" /tmp/lazy0.so
    cp /tmp/traits.h $f
    for r in 1 2; do for v in lazy0 lazy8; do [ -f /tmp/$v.so ] || continue; cp /tmp/$v.so "$so"
      timeout "$t_bench" $PY "$script" $v 2>&1 | grep FWD
    done; done > "$OUT/ab_lazy_raw.log"
    cp /tmp/lazy8.so "$so"
    $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import fwd_so_ab_table as t; print(t(open('$OUT/ab_lazy_raw.log'), base='lazy0'))" | tee "$OUT/ab_lazy.log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
case ${PART:-A} in
  A)
    build
    TAIL=3 step test 250 $PY -m pytest tests -q -x
    TAIL=32 step features 75 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    # The same costs against the lock-step plain backward (the kernel the feature calls run).
    TAIL=32 step features_bwd_ws0 75 env FLASH_ATTN_BWD_WS=0 $PY benchmarks/benchmark_attn.py --features \
      --headdims 64,128,256 --out /tmp/feat0 ;;
  B)
    built || build
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid
    TAIL=6 step check_bwd_ws 60 $PY scripts/check_bwd_ws.py --no-bench
    # Our grid again with the lock-step backward: the WS backward's gain per seqlen.
    TAIL=30 step grid_bwd_ws0 90 env FLASH_ATTN_BWD_WS=0 $PY benchmarks/benchmark_attn.py --backends ours --out /tmp/grid0 ;;
  M)
    # A restricted build (head dims 64 and 128, both dtypes: every kernel the WS backward's
    # score-modifier variant touches) + the suite on it + the feature costs with and without the
    # WS backward: for a change to those kernels when the device time left is short of PART=A.
    export FLASH_ATTN_HEAD_DIMS=64,128
    build
    TAIL=3 step test 170 $PY -m pytest tests -q -x
    TAIL=20 step features 40 $PY benchmarks/benchmark_attn.py --features --headdims 64,128 --out /tmp/feat
    TAIL=20 step features_bwd_ws0 40 env FLASH_ATTN_BWD_WS=0 $PY benchmarks/benchmark_attn.py --features \
      --headdims 64,128 --out /tmp/feat0 ;;
  F)
    # Session 9 final: full build; the suite; feature costs; the WS deterministic check (cases in
    # their own processes under a timeout, then default vs deterministic backward times).
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=20 step check_bwd_ws_det 150 $PY scripts/check_bwd_ws_det.py --timeout 60 ;;
  G)
    # Session 11 final, first call: full build; the suite; feature costs.
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  C)
    built || build
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid ;;
  H)
    # Session 11: the d256 split-d exchange kernel's kMod variant (softcap / ALiBi / deterministic
    # with ordered consumer atomics). Head dim 256 only.
    # Opt-in (FLASH_ATTN_BWD_WS_D256_MOD=1) since its first run was slow; the suite and the
    # feature costs below run with it on.
    export FLASH_ATTN_HEAD_DIMS=256
    build
    TAIL=12 step bench_bwd_d256_mod 40 $PY scripts/bench_bwd_d256_mod.py
    export FLASH_ATTN_BWD_WS_D256_MOD=1
    TAIL=30 step check_bwd_ws_det 170 $PY scripts/check_bwd_ws_det.py --timeout 60 --splits 1,2,4,8 --bench-head-dims 256
    TAIL=3 step test 150 $PY -m pytest tests -q -x
    TAIL=14 step features 40 $PY benchmarks/benchmark_attn.py --features --headdims 256 --out /tmp/feat ;;
  Z)
    # Branch next (session 11 -> 12), first call: the d256 WS kMod kernel after its ATOMG fix
    # and its new dropout variant (opt-in: FLASH_ATTN_BWD_WS_D256_MOD=1), the decode S
    # pipelining (FLASH_ATTN_DECODE_PIPELINE=1). PART=Z2 then runs the suite and feature costs.
    export FLASH_ATTN_HEAD_DIMS=128,256
    build
    TAIL=14 step bench_bwd_d256_mod 60 $PY scripts/bench_bwd_d256_mod.py
    TAIL=6 step decode_ab 80 $PY scripts/decode_variants_ab.py --rounds 3
    TAIL=14 step check_bwd_ws_dropout 130 env FLASH_ATTN_HEAD_DIMS=256 $PY scripts/check_bwd_ws_dropout.py --timeout 60 \
      --no-bench
    TAIL=16 step check_bwd_ws_det 130 env FLASH_ATTN_HEAD_DIMS=256 FLASH_ATTN_BWD_WS_D256_MOD=1 $PY \
      scripts/check_bwd_ws_det.py --timeout 60 --splits 1,2 --bench-head-dims 256 ;;
  Z2)
    export FLASH_ATTN_HEAD_DIMS=128,256 FLASH_ATTN_BWD_WS_D256_MOD=1
    built || build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=14 step features 30 $PY benchmarks/benchmark_attn.py --features --headdims 256 --out /tmp/feat
    TAIL=20 step check_bwd_ws_d256 150 env FLASH_ATTN_HEAD_DIMS=256 $PY scripts/check_bwd_ws_d256.py --timeout 60 ;;
  S)
    # Session 12: the d256 WS deterministic kernel with dQ through the Q / dO stage and the
    # writer warp's ordered bulk reduces (branch ws-d256-det-bulk). Head dim 256 only.
    export FLASH_ATTN_HEAD_DIMS=256
    build
    TAIL=14 step bench_bwd_d256_mod 45 $PY scripts/bench_bwd_d256_mod.py
    TAIL=24 step check_bwd_ws_det 200 $PY scripts/check_bwd_ws_det.py --timeout 40 --no-bench
    TAIL=3 step test 200 $PY -m pytest tests -q -x ;;
  S2)
    # Session 12: every d256 WS backward but dropout with dQ through the Q / dO stage (kDqStage).
    export FLASH_ATTN_HEAD_DIMS=256
    build
    TAIL=14 step bench_bwd_d256_mod 30 $PY scripts/bench_bwd_d256_mod.py
    TAIL=3 step test 120 $PY -m pytest tests -q -x
    TAIL=20 step check_bwd_ws_d256 100 $PY scripts/check_bwd_ws_d256.py --timeout 30 --no-bench ;;
  S20A)
    # Session 20, first call: the WS forward's scheduling-block boundary (apply it first:
    # `git revert bb7e824`, i.e. commit 57b0525, branch s19-sched-boundary). Full build (ptxas -v);
    # feature costs; our grid against cuDNN. Compare with docs/results/s19/s19c_features.log and
    # docs/results/s18/s18b_grid.log (fwd 504 / 597 / 623 TF at 8k).
    build
    TAIL=32 step features 70 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=40 step grid 150 $PY benchmarks/benchmark_attn.py --backends ours,cudnn --out /tmp/grid
    TAIL=3 step test 240 $PY -m pytest tests -q -x ;;
  S20D)
    # Session 20, final (the boundary in the plain d >= 128 WS forward kernels only): full build;
    # the suite; feature costs; the grid against SDPA's flash / cuDNN / efficient backends.
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=56 step grid 200 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid ;;
  S20E)
    # Session 20, after S20D (same machine, or a d64 / d128 build on a cold one): decode; varlen; llama.
    built || { export FLASH_ATTN_HEAD_DIMS=64,128; build; }
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py ;;
  S20F)
    # Session 20, last call (left-over device time): ncu of one whole backward, ours vs SDPA-cuDNN,
    # d128 and d64, bf16 8k (the backward is our largest gap: 0.84 / 0.80x of cuDNN).
    built || { export FLASH_ATTN_HEAD_DIMS=64,128 FLASH_ATTN_DTYPES=bf16; build; }
    TAIL=2 step ncu_bwd_d128 170 env D=128 BACKENDS="ours cudnn" bash scripts/ncu_bwd_compare.sh
    TAIL=2 step ncu_bwd_d64 170 env D=64 BACKENDS="ours cudnn" bash scripts/ncu_bwd_compare.sh ;;
  S21I)
    # Session 21 (branch s21-d256-prefetch; not merged: non-causal +-0, causal 2% slower): LSE /
    # softmax_d read ahead of the GEMM waits in the d256 split-d exchange kernels against the
    # previous kernel (compile-time change: two builds, the .so swapped between
    # interleaved timing processes). Needs .ab/old_bwd_kernel.h (`git show 882e23e:csrc/hopper/
    # flash_bwd_ws_kernel_sm90.h`, carried: .ab in .git/info/exclude and in `carry`). d256 bf16
    # build; d256 tests; 2 x 2 interleaved backward timings.
    export FLASH_ATTN_HEAD_DIMS=256 FLASH_ATTN_DTYPES=bf16
    build
    so=$(ls flash_attn/_C*.so); cp "$so" /tmp/new.so
    TAIL=3 step test_d256 100 $PY -m pytest tests/test_flash_attn.py tests/test_flash_attn_features.py -q -x
    cp csrc/hopper/flash_bwd_ws_kernel_sm90.h /tmp/new_kernel.h; cp .ab/old_bwd_kernel.h csrc/hopper/flash_bwd_ws_kernel_sm90.h
    TAIL=1 step rebuild_old 150 env FLASH_ATTN_PTXAS_VERBOSE=1 $PY -m pip install --no-build-isolation --no-deps -e .
    cp "$so" /tmp/old.so; cp /tmp/new_kernel.h csrc/hopper/flash_bwd_ws_kernel_sm90.h
    for r in 1 2; do for v in old new; do cp /tmp/$v.so "$so"; echo "== $v"
      $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import bench_backward_variants as b; b([('$v', {}, {})], head_dims=(256,))" 2>&1 | tail -2
    done; done | tee "$OUT/ab_d256_prefetch.log" ;;
  S21H)
    # Session 21, last call: the per-instruction ncu view (stall reasons, bank-conflict excess) of
    # the d256 split-d backward and the d64 dropout backward. d64 / d256 bf16 build.
    export FLASH_ATTN_HEAD_DIMS=64,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=100 step ncu_bwd_source 150 env KIND=bwd CASES="256;64 0.1" bash scripts/ncu_stall_source.sh ;;
  S21C)
    # Session 21, second experiment (branch s21-dq-first; not merged: d64 +1%, d128 +-0): dQ
    # issued before dK and written out under it (FLASH_ATTN_BWD_WS_DQ_FIRST=1, plain d64 / d128);
    # the forward's stall sources and bank conflicts (ncu). d64 / d128 bf16 build.
    export FLASH_ATTN_HEAD_DIMS=64,128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test_bwd 120 $PY -m pytest tests/test_flash_attn.py -q -x -k "backward"
    TAIL=12 step bench_dq_first 60 $PY scripts/bench_bwd_s21.py --dq-first
    TAIL=80 step ncu_fwd_source 120 env CASES="128 0.0;64 0.0" bash scripts/ncu_stall_source.sh ;;
  S21B)
    # Session 21: the WS backward's dQ tiles swizzled (conflict-free stores), dS^T by stmatrix,
    # LSE / softmax_d read ahead of the GEMM waits (plain d128). d64 / d128 bf16 build; the suite;
    # A/B of the run-time switches; ours vs cuDNN bwd grid; ncu stall sources again.
    export FLASH_ATTN_HEAD_DIMS=64,128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=12 step bench_bwd_s21 90 $PY scripts/bench_bwd_s21.py
    TAIL=30 step grid 120 $PY benchmarks/benchmark_attn.py --backends ours,cudnn --headdims 64,128 --causal both --skip-memory --out /tmp/grid
    TAIL=60 step ncu_bwd_source 120 env KIND=bwd CASES="128;64" bash scripts/ncu_stall_source.sh ;;
  S21A)
    # Session 21 (prepared in session 20): where the WS backward's warps wait. d64 / d128 bf16
    # build; ncu stall reasons per SASS line of the main kernel (the 4th backward), d128 and d64.
    export FLASH_ATTN_HEAD_DIMS=64,128 FLASH_ATTN_DTYPES=bf16
    built || build
    TAIL=60 step ncu_bwd_source 240 env KIND=bwd CASES="128;64" bash scripts/ncu_stall_source.sh ;;
  S20G)
    # Session 20: the backward's preprocess / dQ conversion with a lane group per row (every lane
    # busy at d64 / d128) and dq_accum zeroed in the preprocess (no fill kernel). Full build; the
    # suite; the passes' kernel times; our non-causal grid (compare with s20d_grid.log).
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=8 step bwd_pass_times 40 $PY scripts/bwd_pass_times.py
    TAIL=24 step grid 60 $PY benchmarks/benchmark_attn.py --backends ours --causal 0 --skip-memory --out /tmp/grid ;;
  S24B)
    # Prepared in session 23 (not GPU-run): FA3's key tiles (d128 128 x 176, d256 128 x 80) now
    # compile to single HGMMA.64x176x16 / 64x80x16 instructions (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
    # in setup.py; before, 11 / 5 HGMMA.64x16x16 per K step: the 20-25% of sessions 5 and 20).
    # d128 / d256 bf16 A/B build; their tests; the forward tests with each forced; the A/B.
    export FLASH_ATTN_AB_KERNELS=1 FLASH_ATTN_HEAD_DIMS=128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test_alt 60 $PY -m pytest tests/test_flash_attn.py -q -k alt_key_tiles
    TAIL=3 step test_fwd_176 120 env FLASH_ATTN_FWD_WS_D128_N=176 FLASH_ATTN_FWD_WS_D256_N=80 $PY -m pytest \
      tests/test_flash_attn.py tests/test_flash_attn_features.py tests/test_varlen_kvcache.py -q -x \
      -k "not bwd and not backward and not grad"
    TAIL=44 step ab_ext_tiles 150 $PY scripts/ws_tile_ab.py --ext-tiles ;;
  S26D)
    # Optional (branch s26-fwd-next): with the conditional rescaling, the d64 forward's P V wait
    # after its softmax again (scheduling_block_boundary, d >= 128 only since session 20, where d64
    # measured 0-4% slower with it). d64 bf16 builds without (the branch) and with it (sed), the
    # two-.so forward A/B (scripts/fwd_ab_cells.py, 2 rounds). ~4 min.
    export FLASH_ATTN_HEAD_DIMS=64 FLASH_ATTN_DTYPES=bf16
    build
    so=$(ls flash_attn/_C*.so); cp "$so" /tmp/nobound.so
    f=csrc/hopper/flash_fwd_ws_mainloop_sm90.h; cp $f /tmp/mainloop.h
    sed -i 's/if constexpr (!kFeat \&\& Traits::kHeadDim >= 128) {/if constexpr (!kFeat \&\& Traits::kHeadDim >= 64) {/' $f; grep -c 'Traits::kHeadDim >= 64) {' $f
    TAIL=1 step rebuild_bound 200 $PY -m pip install --no-build-isolation --no-deps -e . && cp "$so" /tmp/bound.so
    cp /tmp/mainloop.h $f
    for r in 1 2; do for v in nobound bound; do [ -f /tmp/$v.so ] || continue; cp /tmp/$v.so "$so"
      timeout 60 $PY scripts/fwd_ab_cells.py $v 2>&1 | grep FWD
    done; done > "$OUT/ab_bound_raw.log"
    cp /tmp/nobound.so "$so"
    $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import fwd_so_ab_table as t; print(t(open('$OUT/ab_bound_raw.log'), base='nobound'))" | tee "$OUT/ab_bound.log" ;;
  S28B)
    # Session 28 (issue 4): ours / cuDNN at 32k reads 0.996-0.997 on a fresh machine but 0.985-0.986
    # after the benchmark grid (sessions 25, 27: 4418 vs 4482-4484 GB/s; cuDNN loses 1%, ours 2%).
    # If a hot GPU (HBM refresh, SM clock) costs ours more, a kernel that keeps more bytes in
    # flight (deeper rings) or fewer SM-side steps per byte (128-key tiles) should lose less. The
    # CTA variants of an A/B build (FLASH_ATTN_DECODE_CTA, read at each call), cold, then after
    # 90 s of matmul + copy heat; nvidia-smi logs temperatures and clocks throughout.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_AB_KERNELS=1
    build
    nvidia-smi --query-gpu=timestamp,temperature.gpu,temperature.memory,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active \
      --format=csv -lms 500 > "$OUT/smi.log" 2>&1 & smi=$!
    modes=skip,cta11,cta10,cta12,cta13,cta9,cta8
    TAIL=4 step decode_cold 150 $PY scripts/decode_variants_ab.py --rounds 3 --modes $modes
    TAIL=3 step heat 110 $PY scripts/gpu_heat.py --seconds 90
    TAIL=4 step decode_hot 150 $PY scripts/decode_variants_ab.py --rounds 3 --modes $modes
    kill $smi ;;
  S28A)
    # Prepared in session 27 (branch s28-q-early, compile-checked, not GPU-run): with Q in
    # registers (S27C), the d128 persistent forward releases Q's shared tile right after its
    # ldmatrix instead of after the tile's last S GEMM (kFwdQEarlyRelease; 0 = main's place, rebuilt
    # by sed; table arms: lazy8 = early, lazy0 = late). bf16 d128 build; tests; two-.so A/B; then the
    # clock probe with a 1.2 s settle and the clock-limit reasons (S27A's first cells read low).
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 150 $PY -m pytest tests -q -x
    traits_zero_ab kFwdQEarlyRelease scripts/fwd_ab_cells.py 150 60
    # Q in registers made the persistent d128 kernel faster (S27C); the non-persistent one still
    # serves 16k keys (fwd_ws_use_persistent): persistent (B) against one CTA per tile (A).
    TAIL=6 step persist_ab 90 $PY scripts/fwd_env_ab.py FLASH_ATTN_FWD_WS_PERSISTENT 0 1 --head-dims 128 --seqlens 8192,16384
    TAIL=20 step clock_probe 120 $PY scripts/clock_probe.py --matmul --bwd --head-dims 128 --seqlens 8192,512 --seconds 1.0
    TAIL=6 step clock_probe_qscale 60 $PY scripts/clock_probe.py --q-scale 1e-3 --head-dims 128 --seqlens 8192 --seconds 1.0 ;;
  S27C)
    # Session 27 (branch s27-q-regs): S = Q K^T with Q in registers (RS wgmma) in the d128 plain
    # persistent forward, to cut the wgmma's shared-memory reads and with them power (S27A/B: ours
    # ~690 W at the 700 W limit). bf16 d128 build; tests; two-.so A/B against kFwdQInRegs = 0
    # (table arms: lazy8 = Q in registers, lazy0 = Q from shared memory); clock + power per arm.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 150 $PY -m pytest tests -q -x
    traits_zero_ab kFwdQInRegs scripts/fwd_ab_cells.py 150 60
    so=$(ls flash_attn/_C*.so)
    for v in lazy8 lazy0 lazy8 lazy0; do cp /tmp/$v.so "$so"; echo "== power arm $v"
      $PY scripts/clock_probe.py --head-dims 128 --seqlens 8192,2048 --seconds 1.0 2>&1 | grep ours; done
    cp /tmp/lazy8.so "$so" ;;
  S27B)
    # Session 27, after S27A (ours ~690 W = the board limit at d >= 128 8k and causal d64, cuDNN
    # ~560 W at the same TFLOP/s and clock): the power limit, a matmul baseline, then per-kernel
    # DRAM / L2 / shared-memory traffic and instruction counts, ours vs cuDNN (ncu_power_metrics.sh).
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    built || build
    nvidia-smi -q -d POWER | grep -iE "limit|draw" | head -12
    TAIL=20 step clock_matmul 60 $PY scripts/clock_probe.py --matmul --head-dims 128 --seqlens 8192
    CASES="fwd 128 8192 0;fwd 64 8192 0;fwd 64 8192 1;bwd 64 8192 0;bwd 64 8192 1;bwd 128 8192 0;fwd 256 8192 0" \
      TAIL=5 step ncu_power 420 bash scripts/ncu_power_metrics.sh ;;
  S27A)
    # Prepared in session 26 (not GPU-run): is the long d >= 128 forward power-capped? The
    # conditional rescaling gained more at 8k than its FMULs explain. SM clock and board power
    # sampled by nvidia-smi while each cell loops (~1.5 s), ours and cuDNN (~2 min). Works on any
    # build (a full one from S25D too: `built ||`).
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    built || build
    TAIL=60 step clock_probe 240 $PY scripts/clock_probe.py --bwd
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec ;;
  S26F)
    # Session 26 (branch s26-feat-lazy): the softcap / ALiBi / dropout forwards at d >= 128 take
    # the plain kernels' conditional rescaling too (kFwdLazyRescaleLog2Feat = 8; main = 0, rebuilt
    # by sed for the two-.so A/B). bf16 d128 / 256 build; the suite; A/B; feature costs.
    export FLASH_ATTN_HEAD_DIMS=128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 120 $PY -m pytest tests -q -x -k "alibi or softcap or dropout or growing"
    TAIL=30 step features 40 $PY benchmarks/benchmark_attn.py --features --headdims 128,256 --out /tmp/feat
    traits_zero_ab kFwdLazyRescaleLog2Feat scripts/feat_ab_cells.py 150 50 ;;
  S26C)
    # Prepared in session 25 (branch s26-fwd-next = s26-tma-store + conditional rescaling,
    # compile-checked, not GPU-run): (1) the forward's TMA store of O (run-time switch
    # FLASH_ATTN_FWD_TMA_O, A/B in one build); (2) the plain WS forward keeps a row's running max
    # until a tile raises it by more than 2^8 and skips O's rescale where no row of the warp moved
    # (kFwdLazyRescaleLog2 = 8; main's behaviour = 0, rebuilt by sed for the two-.so A/B).
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=26 step tma_o_ab 120 $PY scripts/fwd_tma_o_ab.py
    traits_zero_ab kFwdLazyRescaleLog2 scripts/fwd_ab_cells.py 200 60 ;;
  S26B)
    # Prepared in session 25 (branch s26-tma-store, compile-checked, not GPU-run): the WS
    # forward's plain kernels write each warpgroup's O tile with one TMA store on dense calls
    # (FLASH_ATTN_FWD_TMA_O=0: main's 16-byte stores by every thread). bf16 d64 / 128 / 256
    # build; the suite (incl. test_flash_attn_forward_tma_o_*: bitwise equal to the thread
    # stores); the run-time A/B (scripts/fwd_tma_o_ab.py, one build, interleaved arms).
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=30 step tma_o_ab 150 $PY scripts/fwd_tma_o_ab.py ;;
  S25C)
    # Session 25 (run on branch s25-decode-spec, where this part's code lives; not merged): the d128 decode's speculative start: d128 bf16 build;
    # the kvcache tests; A/B against FLASH_ATTN_DECODE_SPEC_START=0, no cache_seqlens and cuDNN.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test_kvcache 150 $PY -m pytest tests/test_varlen_kvcache.py -q -x -k "kvcache"
    TAIL=4 step decode_spec_ab 120 $PY scripts/decode_spec_ab.py --rounds 5 ;;
  S25B)
    # Session 25: the .L2::128B prefetch-size hint on the split-KV kernels' 16-byte cp.async (what
    # CuTe's SM80_CP_ASYNC_CACHEGLOBAL and so FA2 / cuDNN-class kernels emit; ours had no hint,
    # and .L2::256B measured 2-5% slower in s7 / s16). d128 bf16 builds with and without it, the
    # decode benchmark (ours, paged 16, cuDNN) in interleaved processes, 3 rounds each.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    build
    so=$(ls flash_attn/_C*.so); cp "$so" /tmp/none.so
    f=csrc/flash_fwd_splitkv_common.h; cp $f /tmp/common.h
    sed -i 's|"cp.async.cg.shared.global \[%0\]|"cp.async.cg.shared.global.L2::128B [%0]|' $f
    grep -c 'global.L2::128B' $f
    TAIL=1 step rebuild_l2_128 200 $PY -m pip install --no-build-isolation --no-deps -e .
    cp "$so" /tmp/l2_128.so; cp /tmp/common.h $f
    for r in 1 2 3; do for v in none l2_128; do cp /tmp/$v.so "$so"
      echo "== $v round $r"; timeout 60 $PY benchmarks/benchmark_attn.py --decode --backends ours,cudnn \
        --decode-rounds 1 --decode-clean --out /tmp/dec_${v}_$r 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ |read-fl'
    done; done | tee "$OUT/decode_l2_ab.log"
    cp /tmp/none.so "$so" ;;
  S25A)
    # Prepared in session 24 (branch s25-mask-bounds, compile-checked, not GPU-run): Mask::apply
    # with per-row bounds and compile-time column offsets (2 instructions per masked element for
    # causal calls instead of ~4-5; the WS backward's transposed mask likewise, Mask::apply_t).
    # bf16 d64 / 128 / 256 build; the suite; then main's mask.h and WS backward kernel (carried in
    # .ab/old_mask) rebuilt for a two-.so A/B of masked and unmasked forward / backward cells.
    # Before the run: mkdir -p .ab/old_mask; git show main:csrc/mask.h > .ab/old_mask/mask.h;
    # git show main:csrc/hopper/flash_bwd_ws_kernel_sm90.h > .ab/old_mask/flash_bwd_ws_kernel_sm90.h
    # (carry [".deps", ".ab"]; ~9 min with the 3-head-dim build and the rebuild).
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    build
    so=$(ls flash_attn/_C*.so); cp "$so" /tmp/new.so
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    cp csrc/mask.h /tmp/new_mask.h; cp csrc/hopper/flash_bwd_ws_kernel_sm90.h /tmp/new_bwd_ws.h
    cp .ab/old_mask/mask.h csrc/mask.h; cp .ab/old_mask/flash_bwd_ws_kernel_sm90.h csrc/hopper/
    TAIL=1 step rebuild_old 240 $PY -m pip install --no-build-isolation --no-deps -e .
    cp "$so" /tmp/old.so; cp /tmp/new_mask.h csrc/mask.h; cp /tmp/new_bwd_ws.h csrc/hopper/flash_bwd_ws_kernel_sm90.h
    for r in 1 2; do for v in old new; do cp /tmp/$v.so "$so"
      timeout 100 $PY scripts/mask_ab_cells.py $v 2>&1 | grep FWD
    done; done > "$OUT/ab_mask_raw.log"
    cp /tmp/new.so "$so"
    $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import fwd_so_ab_table as t; print(t(open('$OUT/ab_mask_raw.log')))" | tee "$OUT/ab_mask.log" ;;
  S24E)
    # Session 24: decode repeated (issue 4's decode criterion, measured at parity +-0.5% across
    # sessions): d128 bf16 build; the decode benchmark three times.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    build
    for i in 1 2 3; do TAIL=12 step decode_$i 60 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec$i; done
    for i in 1 2 3; do cp /tmp/dec$i/decode.csv "$OUT/decode_$i.csv" 2>/dev/null; done ;;
  S24D)
    # Session 24, final: full build; the suite; the forward without its per-call zero fill
    # (scripts/fwd_fill_ab.py, FLASH_ATTN_FWD_ZERO_FILL=1 vs default); the grid against SDPA's
    # flash / cuDNN / efficient. S23E follows on the same machine.
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=30 step fill_ab 90 $PY scripts/fwd_fill_ab.py
    TAIL=56 step grid 220 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid
    cp /tmp/grid/*.csv "$OUT/" 2>/dev/null ;;
  S24A)
    # Prepared in session 23 (not GPU-run): where the short-sequence forward's time goes, ours
    # against cuDNN (d64 causal 512: 0.81x; d128 512: 0.92x), and why FA3's 176-key d128 tiles run
    # 20-25% slower in our kernel (d128 8k: 621 vs FA3 679). d64 / d128 bf16 A/B build; ncu of
    # every kernel of one forward call per case.
    export FLASH_ATTN_AB_KERNELS=1 FLASH_ATTN_HEAD_DIMS=64,128 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=40 step ncu_fwd_short 240 env CASES="64 512 1;128 512 0" bash scripts/ncu_fwd_compare.sh
    TAIL=40 step ncu_fwd_d128 120 env CASES="128 8192 0" bash scripts/ncu_fwd_compare.sh
    TAIL=80 step ncu_fwd_short_source 120 env KIND=fwd_shape CASES="64 512 1;128 512 0" bash scripts/ncu_stall_source.sh ;;
  S23F)
    # Session 23, the last heuristic change (d64 128-row tiles for windows of <= 513 keys too):
    # full build; the suite; the window / causal A/B (forced 192 / 128).
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=12 step d64_m128_window_ab 40 $PY scripts/d64_m128_window_ab.py ;;
  S23D|S25D)
    # Sessions 23 and 25, final: full build; the suite; the grid against SDPA's flash / cuDNN /
    # efficient (S23E follows on the same machine).
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=56 step grid 220 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid
    cp /tmp/grid/*.csv "$OUT/" 2>/dev/null ;;
  S23E)
    # Session 23, final, after S23D (the same machine keeps the build; a cold one builds again):
    # feature costs; decode; varlen; llama.
    built || build
    TAIL=32 step features 80 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    cp /tmp/feat/*.csv /tmp/dec/*.csv /tmp/vl/*.csv "$OUT/" 2>/dev/null ;;
  S23C)
    # Session 23: the d64 128-row tiles as the default for short causal calls, and O's rescale
    # placed before the next P V issue (kRescaleOBeforePV, every head dim). bf16 d64 / 128 / 256
    # build; the suite; the m128 A/B (both shapes forced); then main's mainloop and traits
    # (.ab/old_fwd2, carried) rebuilt for a two-.so A/B, plain grid cells and feature forwards.
    export FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    build
    so=$(ls flash_attn/_C*.so); cp "$so" /tmp/new.so
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=12 step ab_m128 60 $PY scripts/ws_tile_ab.py --d64-m-only
    mkdir -p /tmp/new_fwd; for f in .ab/old_fwd2/*.h; do b=$(basename $f); cp csrc/hopper/$b /tmp/new_fwd/; cp $f csrc/hopper/$b; done
    TAIL=1 step rebuild_old 200 $PY -m pip install --no-build-isolation --no-deps -e .
    cp "$so" /tmp/old.so; cp /tmp/new_fwd/*.h csrc/hopper/
    for r in 1 2; do for v in old new; do cp /tmp/$v.so "$so"
      timeout 90 $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import bench_forward_cells as b; b('$v', head_dims=(64, 128, 256), features=True)" 2>&1 | grep FWD
    done; done > "$OUT/ab_rescale_raw.log"
    cp /tmp/new.so "$so"
    $PY -c "import sys; sys.path.insert(0, 'scripts'); from gpu_check_common import fwd_so_ab_table as t; print(t(open('$OUT/ab_rescale_raw.log')))" | tee "$OUT/ab_rescale.log" ;;
  S23A)
    # Prepared in session 22 (branch s22-d64-m128-fwd, not GPU-run): the d64 forward on 128 x 128
    # tiles with 2 consumer warpgroups (FLASH_ATTN_FWD_WS_D64_M=128, A/B). d64 bf16 A/B build; its
    # tests; the A/B against the default 192-row tiles (both persistent up to 8k); cuDNN context in
    # check_fwd_ws_persistent's bench.
    export FLASH_ATTN_AB_KERNELS=1 FLASH_ATTN_HEAD_DIMS=64 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=3 step test_m128 120 $PY -m pytest tests/test_flash_attn.py -q -k "d64_m128 or persistent"
    TAIL=12 step ab 150 $PY scripts/ws_tile_ab.py --d64-m-only ;;
  S22C)
    # Session 22, with branch s21-pass-lanes merged: full build; the suite; the grid (backward).
    build
    TAIL=3 step test 200 $PY -m pytest tests -q -x
    TAIL=56 step grid 120 $PY benchmarks/benchmark_attn.py --backends ours,cudnn --out /tmp/grid ;;
  S22B)
    # Session 22, final (after S20D's grid / features on the same kernels): full build; the suite;
    # decode; varlen; llama.
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py ;;
  S22A)
    # Session 22: the persistent WS forward with O in its own buffer (Q released after the tile's
    # last S GEMM) and the dynamic tile order for causal / window / varlen calls. A/B build, bf16,
    # head dims 64 / 128 / 256: correctness (bitwise vs one CTA per tile), times vs cuDNN, tests.
    export FLASH_ATTN_AB_KERNELS=1 FLASH_ATTN_HEAD_DIMS=64,128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=60 step check_fwd_ws_persistent 200 $PY scripts/check_fwd_ws_persistent.py --dtypes bf16 --case-timeout 30
    TAIL=3 step test_persistent 150 env FLASH_ATTN_FWD_WS_PERSISTENT=1 $PY -m pytest tests/test_flash_attn.py \
      tests/test_varlen_kvcache.py -q -x -k "not bwd and not backward and not grad" ;;
  S20B)
    # Session 20, second call: with the scheduling-block boundary (the plain d >= 128 WS forward
    # kernels), FA3's key tiles (d128 176, d256 80) and the persistent forward again (session 5 /
    # 11: 20-25% / up to 38% slower without the intra-warpgroup overlap). A/B build, bf16 d128 / d256.
    export FLASH_ATTN_AB_KERNELS=1 FLASH_ATTN_HEAD_DIMS=128,256 FLASH_ATTN_DTYPES=bf16
    build
    TAIL=30 step ws_tile_ab 120 $PY scripts/ws_tile_ab.py --fwd-only
    TAIL=3 step test_fa3_tiles 150 env FLASH_ATTN_FWD_WS_D128_N=176 FLASH_ATTN_FWD_WS_D256_N=80 \
      $PY -m pytest tests/test_flash_attn.py -q -x ;;
  S19A)
    # Session 19, dev call (commit 8d73ac2, hung: setmaxnreg over the CTA's register pool): dropout
    # Philox on the producer warps (fwd: warps 1-3, ring of two slots; bwd: warps 2-3). Head dims 64 / 128 build; dropout tests; feature costs; WS dropout bwd check;
    # the suite on this build.
    export FLASH_ATTN_HEAD_DIMS=64,128
    build
    TAIL=4 step test_drop 120 $PY -m pytest tests/test_flash_attn_features.py tests/test_varlen_kvcache.py -q -x -k dropout
    TAIL=20 step features 50 $PY benchmarks/benchmark_attn.py --features --headdims 64,128 --out /tmp/feat
    TAIL=18 step check_bwd_ws_dropout 100 $PY scripts/check_bwd_ws_dropout.py --timeout 60 --no-bench
    TAIL=3 step test 200 $PY -m pytest tests -q -x ;;
  S19B)
    # Session 19 (commit 89e7ca8): full build; feature costs (a dropout hang ends the call there); the suite.
    build
    TAIL=32 step features 70 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    [ $? -eq 124 ] && exit 1
    TAIL=3 step test 240 $PY -m pytest tests -q -x ;;
  S19C)
    # Session 19, final (commit 34cdd48, branch s19-fwd-drop-producer: main has no A/B forward):
    # full build with the A/B forward (dropout Philox on the producer warps,
    # FLASH_ATTN_FWD_DROPOUT_PRODUCER=1); feature costs, default and A/B; the suite (default paths).
    export FLASH_ATTN_FWD_DROP_PRODUCER_KERNELS=1
    build
    TAIL=32 step features 70 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    [ $? -eq 124 ] && exit 1
    TAIL=22 step features_fwdprod 40 env FLASH_ATTN_FWD_DROPOUT_PRODUCER=1 $PY benchmarks/benchmark_attn.py \
      --features --headdims 64,128 --out /tmp/featp
    TAIL=3 step test 240 $PY -m pytest tests -q -x ;;
  S18A)
    # Session 18, first call: full build; kvcache tests (the combine rewrite: lse in registers, partials
    # 8 splits at a time; the programmatic dependent launch, FLASH_ATTN_DECODE_PDL); decode A/B of PDL
    # and split counts next to cuDNN; the decode kernels' own times.
    build
    TAIL=3 step test_kv 120 $PY -m pytest tests/test_varlen_kvcache.py -q -x
    TAIL=8 step decode_ab 150 $PY scripts/decode_variants_ab.py --rounds 5 --clean \
      --modes cta11,cta11:nopdl,cta11:s2,cta11:s4,cta11:s8,cta11:s16,pagedcta
    TAIL=12 step ktimes 60 $PY scripts/decode_kernel_times.py ;;
  S18B)
    # Session 18, second call (same machine; rebuilds if cold): the suite; feature costs; PART=C's
    # benchmarks; then ncu issue-slot counts of plain vs dropout WS forward / backward at d64 / d128.
    built || build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat
    TAIL=10 step decode 80 $PY benchmarks/benchmark_attn.py --decode --decode-clean --out /tmp/dec
    TAIL=8 step varlen 40 $PY benchmarks/benchmark_attn.py --varlen --out /tmp/vl
    TAIL=2 step llama 45 $PY scripts/llama_flash_attention_2.py
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid
    TAIL=2 step ncu_issue 200 bash scripts/ncu_dropout_issue.sh ;;
  G2)
    # Session 13, first call (branch with ws-d256-drop-stage): full build; the suite; feature costs.
    build
    TAIL=3 step test 240 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  C2)
    # Session 13, second call: the d256 backward checks and times on that build, then PART=C.
    built || build
    TAIL=14 step bench_bwd_d256_mod 30 $PY scripts/bench_bwd_d256_mod.py
    TAIL=14 step check_bwd_ws_dropout 140 env FLASH_ATTN_HEAD_DIMS=256 $PY scripts/check_bwd_ws_dropout.py --timeout 40 \
      --no-bench
    TAIL=16 step check_bwd_ws_d256 120 env FLASH_ATTN_HEAD_DIMS=256 $PY scripts/check_bwd_ws_d256.py --timeout 40 --no-bench
    [ -f scripts/eager_op_ab.py ] && TAIL=6 step eager_op_ab 40 $PY scripts/eager_op_ab.py  # branch eager-direct
    TAIL=56 step grid 170 $PY benchmarks/benchmark_attn.py --backends ours,flash,cudnn,efficient --out /tmp/grid ;;
  M128)
    # Session 13: the d64 WS backward on 128-row query blocks (FLASH_ATTN_BWD_WS_M128, A/B-only,
    # FA3's d64 tiles): head dim 64 A/B build; its tests (dense, window, varlen); times against the
    # default 64-row blocks; d64 grid (ours with it, cuDNN).
    export FLASH_ATTN_HEAD_DIMS=64 FLASH_ATTN_AB_KERNELS=1
    build
    TAIL=3 step test_m128 60 $PY -m pytest tests -q -x -k "m128 or ab_only"
    TAIL=4 step bench_m128 40 $PY scripts/bench_bwd_m128.py
    TAIL=16 step grid_m128 45 env FLASH_ATTN_BWD_WS_M128=1 $PY benchmarks/benchmark_attn.py --backends ours,cudnn \
      --headdims 64 --out /tmp/gm ;;
  CT)
    # Sessions 15-16: the d128 decode with cuDNN's schedule (FLASH_ATTN_DECODE_CTA); d128 bf16 A/B
    # build; its tests; A/B against the wide kernel (and CT_MODES: the paged kernel, split counts)
    # and cuDNN, with do_bench's dirty-L2 flush and a read-only one.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_AB_KERNELS=1
    built || build
    TAIL=3 step test_cta 120 $PY -m pytest tests/test_varlen_kvcache.py -q -x -k "decode_cta or ab_only or test_kvcache"
    TAIL=8 step decode_cta_ab 300 $PY scripts/decode_variants_ab.py --rounds ${CT_ROUNDS:-7} --clean \
      --modes ${CT_MODES:-skip,cta7,cta11,cta13,cta14,cta15} ;;
  PG)
    # Sessions 16-17: paged d128 decode through the CTA-schedule kernel (FLASH_ATTN_DECODE_PAGED_CTA=1,
    # A/B-only: power-of-two pages, one block-table entry per 16-row chunk; session 16's first form, a
    # division and an entry per row, was 14-22% slower than the sm_90a kernel); d128 bf16 A/B build;
    # kvcache tests; A/B (paged: the sm_90a kernel) and the decode benchmark.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_AB_KERNELS=1
    built || build
    TAIL=3 step test_kv 150 $PY -m pytest tests/test_varlen_kvcache.py -q -x -k "paged or test_kvcache_decode_cta or ab_only"
    TAIL=8 step decode_ab 150 $PY scripts/decode_variants_ab.py --rounds 7 --modes cta11,paged,pagedcta
    TAIL=6 step decode 60 $PY benchmarks/benchmark_attn.py --decode --out /tmp/dec ;;
  DPN)
    # Session 17 plan: where the d128 dropout forward spends its 0.66 ms over plain (consumer-
    # generated flags): ncu stall reasons per SASS line, plain vs dropout 0.1; d128 bf16 build.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    built || build
    TAIL=80 step ncu_drop_fwd 240 env CASES="128 0.0;128 0.1" NCU_TIMEOUT=110 bash scripts/ncu_stall_source.sh ;;
  CL)
    # Session 17 plan: the default decode's h_k CTAs of a batch in one cluster, in step every 8 tiles
    # (FLASH_ATTN_DECODE_CTA=16, A/B-only); d128 bf16 A/B build; CTA tests; A/B vs cta11 and cuDNN.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_AB_KERNELS=1
    built || build
    TAIL=3 step test_cta 120 $PY -m pytest tests/test_varlen_kvcache.py -q -x -k "decode_cta or ab_only"
    TAIL=8 step decode_cta_ab 150 $PY scripts/decode_variants_ab.py --rounds 7 --modes ${CT_MODES:-cta11,cta16} ;;
  N17)
    # Session 17, first call (branch next17 = decode-cta-paged2 + decode-cluster + TMA loads): one
    # d128 bf16 A/B build; the paged / CTA tests; A/B of cta11, cta16 (clusters), cta17 (TMA), paged
    # (sm_90a) and pagedcta (FLASH_ATTN_DECODE_PAGED_CTA=1) against cuDNN, do_bench and read-only flush.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16 FLASH_ATTN_AB_KERNELS=1
    built || build
    TAIL=3 step test_kv 150 $PY -m pytest tests/test_varlen_kvcache.py -q -x -k "paged or decode_cta or ab_only"
    TAIL=8 step decode_ab 200 $PY scripts/decode_variants_ab.py --rounds 7 --clean --modes cta11,cta16,cta17,paged,pagedcta ;;
  DN)
    # Session 13: is the decode gap to cuDNN a tail? ncu spread of SM active cycles (min / avg /
    # max over SMs) for our default wide kernel and cuDNN, b16 32k and b16 4k; bf16 d128 build.
    export FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16
    built || build
    M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max
    M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sectors_op_read.sum
    M=$M,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum
    for who in ours cudnn; do
      for s in 32768 4096; do
        TAIL=14 step ncu_spread_${who}_$s 40 env DECODE_S=$s ncu --clock-control none -k regex:"splitkv|sdpa" \
          --launch-skip 2 --launch-count 1 --metrics $M $PY scripts/decode_profile_case.py $who 3
      done
    done ;;
  D)
    # Dropout kernels, head dims 64 / 128: the WS dropout backward's check (cases in their own
    # processes under a timeout, then dropout backward times on the WS and the lock-step kernels),
    # the feature costs. PART=E then runs the suite on this build.
    export FLASH_ATTN_HEAD_DIMS=64,128
    build
    TAIL=18 step check_bwd_ws_dropout 150 $PY scripts/check_bwd_ws_dropout.py --timeout 60
    TAIL=20 step features 40 $PY benchmarks/benchmark_attn.py --features --headdims 64,128 --out /tmp/feat ;;
  V)
    export FLASH_ATTN_AB_KERNELS=1
    # The d256 SM80-class backward's A/B (FLASH_ATTN_BWD_SM80_VARIANT, session 10): head dim 256
    # build; each variant against the reference and timed against FA2; ncu of variants 1 / 3 with
    # source counters; then the suite on this build (default variant).
    export FLASH_ATTN_HEAD_DIMS=256
    build
    TAIL=30 step check_bwd_sm80_variants 150 $PY scripts/check_bwd_sm80_variants.py
    for var in 1 3; do
      TAIL=4 step ncu_bwd_d256_v$var 60 env FLASH_ATTN_BWD_SM80_VARIANT=$var ncu --clock-control none \
        -k regex:flash_bwd_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SourceCounters --section InstructionStats \
        --section MemoryWorkloadAnalysis_Tables $PY scripts/bwd_profile_case.py ours 256
    done
    TAIL=3 step test 150 $PY -m pytest tests -q -x ;;
  W)
    export FLASH_ATTN_AB_KERNELS=1
    # Branch ws-persistent-fix (session 10, not GPU-run): the persistent WS forward with the fix of
    # its consumers' V pipeline state. check_fwd_ws_persistent.py: bitwise equal to the one-tile
    # kernel and within the reference rule (tiles per CTA 0..~100), then both timed over seqlen
    # 512..16k; a hang costs only the step's timeout. Then the suite.
    export FLASH_ATTN_HEAD_DIMS=64,128,256
    build
    TAIL=45 step check_fwd_ws_persistent 200 $PY scripts/check_fwd_ws_persistent.py
    TAIL=3 step test 200 $PY -m pytest tests -q -x ;;
  X)
    export FLASH_ATTN_AB_KERNELS=1
    # Branch next (session 10 -> 11: ws-persistent-fix + bwd256-variants + ws-bwd-d256), one build:
    # head dims 64 / 128 / 256; the persistent forward's check and timing; the d256 backward
    # variants' check and A/B against FA2. PART=Y then runs the suite and the feature costs on it.
    export FLASH_ATTN_HEAD_DIMS=64,128,256
    build
    TAIL=45 step check_fwd_ws_persistent 200 $PY scripts/check_fwd_ws_persistent.py
    TAIL=30 step check_bwd_sm80_variants 120 $PY scripts/check_bwd_sm80_variants.py ;;
  Y)
    export FLASH_ATTN_AB_KERNELS=1
    # + ws-bwd-d256 (session 10): the split-d WS backward at head dim 256 (FLASH_ATTN_BWD_WS_D256=1 / 2),
    # each case in its own process under a timeout, then timed against the SM80-class kernel.
    export FLASH_ATTN_HEAD_DIMS=64,128,256
    built || build
    TAIL=20 step check_bwd_ws_d256 180 $PY scripts/check_bwd_ws_d256.py --timeout 60
    TAIL=3 step test 250 $PY -m pytest tests -q -x
    TAIL=32 step features 60 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  E)
    export FLASH_ATTN_HEAD_DIMS=64,128
    built || build
    TAIL=3 step test 250 $PY -m pytest tests -q -x ;;
  P)
    # Profile: our backward against SDPA-flash's (upstream FA2) with ncu, d256 (the SM80-class
    # backward, 0.77x FA2 with the same tiles) and d128 (the WS kernel) for reference.
    built || build
    TAIL=60 step ncu_bwd_d256 300 env D=256 bash scripts/ncu_bwd_compare.sh
    TAIL=10 step ncu_bwd_d128 200 env D=128 bash scripts/ncu_bwd_compare.sh ;;
  N)
    # Branch next (session 8 -> 9): the WS backward's deterministic mode (check_bwd_ws_det.py:
    # one process per case under a timeout, since a wrong counter order hangs) and its varlen
    # softcap / ALiBi calls, then the suite and the feature costs.
    build
    TAIL=20 step check_bwd_ws_det 150 $PY scripts/check_bwd_ws_det.py --timeout 60
    TAIL=3 step test 170 $PY -m pytest tests -q -x
    TAIL=32 step features 40 $PY benchmarks/benchmark_attn.py --features --headdims 64,128,256 --out /tmp/feat ;;
  *)
    echo "unknown PART=${PART}"; exit 2 ;;
esac
