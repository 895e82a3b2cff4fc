#!/usr/bin/env bash
# One device run for a PagedAttention change: compute-sanitizer racecheck and memcheck on the
# wgmma child test (schedules in $SCHEDULES, default "serial pair"), the whole GPU suite
# (tools/gpu_check.sh, no bench; it includes the paged GPU tests), then, with time left,
# tools/bench.py paged (-> OUTDIR/paged.json).
#   bash lab/device_final.sh OUTDIR [SECONDS]
set -u
OUT=${1:?OUTDIR}; BUDGET=${2:-420}; T0=$(date +%s)
mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for sched in ${SCHEDULES:-serial pair}; do
  for tool in racecheck memcheck; do
    timeout 110 "$CS" --tool "$tool" --error-exitcode 1 --print-limit 20 python3 -c \
      "from tests.test_paged_gpu import _wg_child; _wg_child('$sched')" > "$OUT/$tool-$sched.log" 2>&1
    echo "== $tool $sched rc $? ($(grep -ac ': ok' "$OUT/$tool-$sched.log") cases ok)"
    grep -aE "FAILED|SUMMARY" "$OUT/$tool-$sched.log" | head -4
  done
done
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "== gpu_check with ${LEFT}s left"
ATTNRT_BENCH=none ATTNRT_GPU_TESTS="--timeout 150" timeout "$LEFT" bash tools/gpu_check.sh "$OUT/gc" \
  > "$OUT/gc.log" 2>&1
echo "== gpu_check rc $?"; tail -3 "$OUT/gc/pytest-gpu.log" 2>/dev/null; tail -1 "$OUT/gc.log"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
if [ "$LEFT" -gt 120 ]; then
  timeout "$LEFT" python3 tools/bench.py paged --out "$OUT/bp" --name paged > "$OUT/bench.log" 2>&1
  echo "== bench rc $? with ${LEFT}s"; grep -aiE "failed|error|DISAGREE" "$OUT/bench.log" | head -3
fi
