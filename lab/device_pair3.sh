#!/usr/bin/env bash
# Pair-kernel diagnosis: SM-clock trace of one pair (PA_PAIR_TRACE), and lab switches.
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
R="decode:16:32:8192"
run() { timeout 90 python3 lab/with_defines.py "$1" lab/paged_rows.py --wg pair $2 > "$OUT/$3.log" 2>&1
        echo "== $1: $(grep -a '\]: ours' "$OUT/$3.log" | sed 's/d576.*ours/ours/' | tr '\n' ' ')"; }
run PA_PAIR_TRACE=1,PA_PAIR_PREFETCH=0 "$R" trace
grep -a "^TRACE" "$OUT/trace.log" | tail -6
run PA_PAIR_PREFETCH=0 "$R decode:16:8:8192" base
run PA_PAIR_PREFETCH=0,PA_PAIR_SFENCE=0 "$R decode:16:8:8192" nofence
run PA_PAIR_TRACE=1,PA_PAIR_PREFETCH=0,PA_PAIR_SFENCE=0 "$R" trace_nofence
grep -a "^TRACE" "$OUT/trace_nofence.log" | tail -4
