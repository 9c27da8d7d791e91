#!/usr/bin/env bash
# Where the power goes (session 27: our d >= 128 forwards and causal d64 calls draw ~690 W, the
# board limit, against cuDNN's ~560 W at the same TFLOP/s and clock; scripts/clock_probe.py):
# per kernel of one call, the traffic and instruction counts that cost energy (DRAM and L2 bytes,
# shared-memory wavefronts, instructions per pipe, tensor-pipe activity), ours and cuDNN's.
# Device machine, needs a build. Metrics the chip lacks are dropped (ncu --query-metrics).
#   CASES="fwd 128 8192 0;fwd 64 8192 1" bash scripts/ncu_power_metrics.sh > $OUT/ncu_power.txt 2>&1
set -uo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
want="gpu__time_duration.sum sm__cycles_elapsed.avg.per_second dram__bytes_read.sum dram__bytes_write.sum
lts__t_bytes.sum lts__t_sector_hit_rate.pct sm__inst_executed.sum sm__inst_executed_pipe_fma.sum
sm__inst_executed_pipe_alu.sum sm__inst_executed_pipe_xu.sum sm__inst_executed_pipe_uniform.sum
sm__inst_executed_pipe_lsu.sum l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
smsp__inst_executed_op_shared_ld.sum smsp__inst_executed_op_shared_st.sum smsp__inst_executed_op_ldsm.sum
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
l1tex__m_xbar2l1tex_read_bytes.sum l1tex__m_l1tex2xbar_write_bytes.sum"
avail=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=""
for m in $want; do
  if grep -qx "${m%%.*}" <<< "$avail"; then metrics="$metrics,$m"; else echo "(no metric ${m%%.*})"; fi
done
metrics=${metrics#,}
IFS=';' read -ra cases <<< "${CASES:-fwd 128 8192 0;fwd 64 8192 0;fwd 64 8192 1}"
for case in "${cases[@]}"; do
  for backend in ${BACKENDS:-ours cudnn}; do
    echo "=================== $backend: pass d seqlen causal = $case"
    timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --profile-from-start off --metrics "$metrics" --csv \
      $PY "$HERE/power_profile_case.py" $backend $case 2>/dev/null | grep -vE "^==PROF==" |
      $PY -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
hdr = rows[0]; ki, mi, ui, vi = (hdr.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
for r in rows[1:]:
    print(f"{r[ki][:48]:<48} {r[mi]:<70} {r[vi]:>16} {r[ui]}")'
  done
done
