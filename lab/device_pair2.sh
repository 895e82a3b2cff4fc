#!/usr/bin/env bash
# Pair-kernel experiments: the child test, rows serial vs pair (L2 prefetch on) vs pair
# (prefetch off), and the L2 probe for both schedules.   bash lab/device_pair2.sh OUTDIR
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
timeout 120 python3 -c "from tests.test_paged_gpu import _wg_child; _wg_child('pair')" > "$OUT/child.log" 2>&1
echo "== pair child rc $? ($(grep -c ': ok' "$OUT/child.log") ok)"; grep -a FAILED "$OUT/child.log" | head -5
ROWS="decode:16:32:8192 decode:128:32:8192 decode:16:8:8192"
timeout 150 python3 lab/paged_rows.py --wg serial,pair $ROWS 2>&1 | grep -a "\] \[\|\]: ours" > "$OUT/rows.log"
cat "$OUT/rows.log"
echo "== prefetch off"
timeout 80 python3 lab/with_defines.py PA_PAIR_PREFETCH=0 lab/paged_rows.py --wg pair $ROWS 2>&1 | grep -a "\]: ours"
for s in pair serial; do
  echo "== L2 probe $s"
  ATTNRT_BENCH_PAGED_WG=$s timeout 120 python3 lab/paged_l2_probe.py 2>&1 | grep -av "^\[bench\]" | tail -8
done
