#!/usr/bin/env bash
# One device run for a PagedAttention change, within BUDGET seconds (default 480), most
# important first: tools/gpu_check.sh without benchmarks; the child test with the lab
# switches PA_PAIR_ORDER and PA_PAIR_FASTMASK; a few rows without and with PA_PAIR_ORDER;
# racecheck of the pair kernel built with every hand-off a full bar.sync (PA_PAIR_FULLSYNC=1;
# racecheck does not follow the shipped bar.arrive/bar.sync hand-offs:
# lab/rc_named_barrier_probe.py mode 4) and memcheck of the shipped one; the rows with
# PA_PAIR_FASTMASK and with the tensor map's L2 promotion at 128 bytes (256 shipped); with
# time left, ncu's stall reasons of the pair kernel and FlashMLA's.
#   bash lab/device_verify_ncu.sh OUTDIR [BUDGET]
set -u
OUT=${1:?OUTDIR}; BUDGET=${2:-480}; mkdir -p "$OUT"; T0=$(date +%s)
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
python3 tools/build_ext.py > /dev/null 2>&1
ATTNRT_BENCH=none ATTNRT_GPU_TESTS="--timeout 150" timeout "$(cap 240)" bash tools/gpu_check.sh "$OUT/gc" > "$OUT/gc.log" 2>&1
echo "== gpu_check rc $? in $(( $(date +%s) - T0 ))s"; tail -3 "$OUT/gc/pytest-gpu.log" 2>/dev/null
timeout "$(cap 60)" python3 lab/with_defines.py PA_PAIR_ORDER=1,PA_PAIR_FASTMASK=1 lab/wg_child.py pair \
  > "$OUT/order-fastmask-child.log" 2>&1
echo "== order+fastmask child rc $? ($(grep -ac ': ok' "$OUT/order-fastmask-child.log") ok)"
ROWS="decode:16:32:8192 decode:128:32:8192 decode:16:128:8192 decode:64:32:32768"
rows() {
  for set in "$@"; do
    [ "$(left)" -lt 30 ] && break
    PYTHONPATH=$PYTHONPATH:tools timeout "$(cap 70)" python3 lab/with_defines.py ${set%:*} \
      lab/with_l2_promotion.py ${set#*:} lab/paged_rows.py --wg pair $ROWS 2>&1 | grep -a "ours" | sed "s/^/$set /"
  done
}
rows PA_PAIR_ORDER=0:256 PA_PAIR_ORDER=1:256
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout "$(cap 100)" "$CS" --tool racecheck --error-exitcode 1 --print-limit 8 python3 lab/with_defines.py \
  PA_PAIR_FULLSYNC=1 lab/wg_child.py pair > "$OUT/racecheck-fullsync.log" 2>&1
echo "== racecheck pair (fullsync) rc $? ($(grep -ac ': ok' "$OUT/racecheck-fullsync.log") ok): $(grep -a SUMMARY "$OUT/racecheck-fullsync.log")"
timeout "$(cap 80)" "$CS" --tool memcheck --error-exitcode 1 --print-limit 8 python3 lab/wg_child.py pair \
  > "$OUT/memcheck-pair.log" 2>&1
echo "== memcheck pair rc $? ($(grep -ac ': ok' "$OUT/memcheck-pair.log") ok): $(grep -a 'ERROR SUMMARY' "$OUT/memcheck-pair.log")"
rows PA_PAIR_ORDER=1,PA_PAIR_FASTMASK=1:256 PA_PAIR_ORDER=1:128
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
for row in decode:128:32:8192 decode:16:32:8192; do
  for k in paged_mla_pair_fwd flash_fwd_splitkv_mla; do
    [ "$(left)" -lt 40 ] && break 2
    PYTHONPATH=$PYTHONPATH:tools ATTNRT_BENCH_PAGED_WG=pair timeout "$(left)" "$NCU" --clock-control none \
      --csv --print-units base -k regex:$k -c 1 --metrics "$M" python3 lab/paged_rows.py $row \
      > "$OUT/ncu-$row-$k.log" 2>&1
    echo "== ncu $row $k rc $?"
    python3 - "$OUT/ncu-$row-$k.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1], errors="replace") if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; m, v = h.index("Metric Name"), h.index("Metric Value")
for r in rows[1:]:
    name = r[m].replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    try: val = float(r[v].replace(",", ""))
    except ValueError: continue
    if val >= 0.05 or not name.startswith("stall"): print(f"  {name:60s} {val:10.2f}")
PY
  done
done
echo "== done in $(( $(date +%s) - T0 ))s"
