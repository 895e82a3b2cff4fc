#!/usr/bin/env bash
# One device run for the pair kernel's contiguous partition: both wgmma child tests, then rows
# with balanced split-KV off and on (interleaved rounds, one process each, FlashMLA in it);
# with OLD=DIR (a checkout of an earlier commit) also that tree's rows with balancing on.
#   [OLD=DIR] bash lab/device_partition.sh OUTDIR BUDGET "ROWS"
set -u
OUT=${1:?OUTDIR}; BUDGET=${2:?BUDGET}; ROWS=${3:?ROWS}; mkdir -p "$OUT"; T0=$(date +%s)
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-ab-cache}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
python3 tools/build_ext.py > /dev/null 2>&1
for s in pair serial; do
  timeout 150 python3 lab/wg_child.py $s > "$OUT/child-$s.log" 2>&1
  echo "== $s child rc $? ($(grep -ac ': ok' "$OUT/child-$s.log") ok) in $(( $(date +%s) - T0 ))s"
  grep -a "FAILED\|Error" "$OUT/child-$s.log" | head -8
done
for round in 1 2 3; do
  for bal in 0 1; do
    [ "$(left)" -lt 80 ] && break 2
    ATTNRT_BENCH_PAGED_BALANCED=$bal PYTHONPATH=$PYTHONPATH:tools timeout 80 python3 \
      lab/paged_rows.py $ROWS 2>&1 | grep -a "ours\|Error" | sed "s/^/r$round bal$bal | /"
  done
  if [ -n "${OLD:-}" ] && [ "$(left)" -ge 80 ]; then
    (cd "$OLD" && ATTNRT_FLASHMLA_DIR=${ATTNRT_FLASHMLA_DIR:-$OLDPEER} ATTNRT_BENCH_PAGED_BALANCED=1 \
      PYTHONPATH=/tmp/site:$PWD:$PWD/tools timeout 80 python3 lab/paged_rows.py $ROWS 2>&1 \
      | grep -a "ours\|Error" | sed "s/^/r$round old1 | /")
  fi
done
echo "== done in $(( $(date +%s) - T0 ))s"
