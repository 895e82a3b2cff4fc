#!/usr/bin/env bash
# One device run for a PagedAttention change: the paged GPU tests, compute-sanitizer
# memcheck and racecheck on the wgmma child test, tools/bench.py paged (-> OUTDIR/paged.json),
# then the whole GPU suite (tools/gpu_check.sh, no bench) in the time left.
#   bash lab/device_final.sh OUTDIR [SECONDS]
set -u
OUT=${1:?OUTDIR}; BUDGET=${2:-420}; T0=$(date +%s)
mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_paged_gpu.py \
  tests/test_fuzz_paged.py --timeout 160 > /tmp/paged.log 2>&1
echo "== paged GPU tests rc $?"; grep -E "FAILED|passed|failed" /tmp/paged.log | tail -8
grep -E "wg .*FAILED" /tmp/paged.log | head -5
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  timeout 100 "$CS" --tool "$tool" --error-exitcode 1 --print-limit 20 python3 -c \
    "from tests.test_paged_gpu import _wg_child; _wg_child()" > "/tmp/$tool.log" 2>&1
  echo "== $tool rc $? ($(grep -c ': ok' "/tmp/$tool.log") cases ok)"; grep -E "FAILED|SUMMARY" "/tmp/$tool.log" | head -4
done
timeout 150 python3 tools/bench.py paged --out /tmp/bp --name paged > /tmp/bench.log 2>&1
echo "== bench rc $?"; cp /tmp/bp/paged.json "$OUT/" 2>/dev/null
grep -iE "failed|error|DISAGREE" /tmp/bench.log | head -3
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "== gpu_check with ${LEFT}s left"
if [ "$LEFT" -gt 60 ]; then
  ATTNRT_BENCH=none ATTNRT_GPU_TESTS="--timeout 120" timeout "$LEFT" bash tools/gpu_check.sh /tmp/gc \
    > /tmp/gc.log 2>&1
  echo "== gpu_check rc $?"; tail -2 /tmp/gc/pytest-gpu.log; tail -1 /tmp/gc.log
fi
