#!/usr/bin/env bash
# One device run for an A/B of pair-kernel builds, within BUDGET seconds: the pair child test
# with the shipped builds and with each define list in $CHILD_SETS (space-separated), then a few rows once per build set, the sets taken in rounds
# (interleaved, one process each: ours and FlashMLA in the same process).
#   bash lab/device_ab_rows.sh OUTDIR BUDGET "ROWS" SET [SET ...]
# SET is a comma-separated define list for lab/with_defines.py ("-" for none), e.g.
#   bash lab/device_ab_rows.sh out 520 "decode:16:32:8192 decode:128:32:8192" - PA_SOFTCAP=1
set -u
OUT=${1:?OUTDIR}; BUDGET=${2:?BUDGET}; ROWS=${3:?ROWS}; shift 3; mkdir -p "$OUT"; T0=$(date +%s)
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-ab-cache}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
python3 tools/build_ext.py > /dev/null 2>&1
for cs in - ${CHILD_SETS:-}; do
  timeout 90 python3 lab/with_defines.py "${cs/#-/}" lab/wg_child.py pair > "$OUT/child.log" 2>&1
  echo "== pair child [$cs] rc $? ($(grep -ac ': ok' "$OUT/child.log") ok) in $(( $(date +%s) - T0 ))s"
  grep -a "FAILED" "$OUT/child.log" | head -5
done
for round in 1 2 3; do
  for set in "$@"; do
    [ "$(left)" -lt 75 ] && break 2
    d=${set/#-/}
    PYTHONPATH=$PYTHONPATH:tools timeout 75 python3 lab/with_defines.py "$d" lab/paged_rows.py \
      --wg pair $ROWS 2>&1 | grep -a "ours" | sed "s/^/r$round $set | /"
  done
done
echo "== done in $(( $(date +%s) - T0 ))s"
