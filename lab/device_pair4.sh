#!/usr/bin/env bash
# Pair kernel: the clock trace (H16, H128), then the whole paged bench with the pair schedule.
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
timeout 100 python3 lab/with_defines.py PA_PAIR_TRACE=1 lab/paged_pair_trace.py 16 128 2>&1 | tail -16
ATTNRT_BENCH_PAGED_WG=pair timeout 300 python3 tools/bench.py paged --out "$OUT/bp" --name paged > "$OUT/bench.log" 2>&1
echo "== bench rc $?"; grep -aiE "failed|error|DISAGREE" "$OUT/bench.log" | head -3
