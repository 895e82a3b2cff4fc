#!/usr/bin/env bash
# One device run of the PagedAttention study (docs/notes/paged_attention.md#wg-tile, #pdl):
# the full GPU suite (tools/gpu_check.sh, no bench), compute-sanitizer memcheck and racecheck
# on the wgmma child test, then tools/bench.py paged once per variant "pdl:max_splits".
#   bash lab/device_paged_variants.sh OUTDIR ["1:64 1:128"]
# Results: OUTDIR/b<pdl>_<max_splits>.json; test and sanitizer tails on stdout.
set -u
OUT=${1:?OUTDIR}; VARIANTS=${2:-"1:64 1:128"}
mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
ATTNRT_BENCH=none ATTNRT_GPU_TESTS="--timeout 150" timeout 330 bash tools/gpu_check.sh /tmp/gc \
  > /tmp/gc.log 2>&1
echo "== gpu_check rc $?"; tail -3 /tmp/gc/pytest-gpu.log; tail -2 /tmp/gc.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  timeout 150 "$CS" --tool "$tool" --error-exitcode 1 --print-limit 20 python3 -c \
    "from tests.test_paged_gpu import _wg_child; _wg_child()" > "/tmp/$tool.log" 2>&1
  echo "== $tool rc $? ($(grep -c ': ok' "/tmp/$tool.log") cases ok)"; tail -2 "/tmp/$tool.log"
done
for v in $VARIANTS; do
  IFS=: read -r d m <<< "$v"
  n="b${d}_$m"
  ATTNRT_BENCH_PAGED_PDL=$d ATTNRT_BENCH_PAGED_MAX_SPLITS=$m timeout 150 \
    python3 tools/bench.py paged --out "/tmp/$n" --name "$n" > "/tmp/$n.log" 2>&1
  echo "== bench $v rc $?"
  cp "/tmp/$n/$n.json" "$OUT/" 2>/dev/null
  grep -i "failed\|error" "/tmp/$n.log" | head -3
done
