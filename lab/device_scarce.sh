#!/usr/bin/env bash
# One device call that answers the most when the device is scarce, within TOTAL seconds:
# every kernel variant compiled in the background (`attnrt warm`) while FlashMLA builds and
# the pair child test runs per define set, then lab/device_ab_rows.sh's interleaved rows
# for each SET within AB seconds, then every GPU test within the time left.
#   CHILD_SETS="PA_X=1" bash lab/device_scarce.sh OUTDIR TOTAL AB "ROWS" SET [SET ...]
set -u
OUT=${1:?OUTDIR}; TOTAL=${2:?TOTAL}; AB=${3:?AB}; ROWS=${4:?ROWS}; shift 4; mkdir -p "$OUT"
T0=$(date +%s)
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-scarce-cache}
nvidia-smi --query-gpu=name,uuid,clocks.max.sm --format=csv,noheader
python3 tools/build_ext.py > "$OUT/build_ext.log" 2>&1
python3 -m attnrt.app.cli warm > "$OUT/warm.log" 2>&1 &
WARM=$!
bash .peers/flashmla/build.sh --prebuilt > "$OUT/fm-build.log" 2>&1
echo "== flashmla: $(tail -n 1 "$OUT/fm-build.log") in $(( $(date +%s) - T0 ))s"
wait "$WARM"; echo "== warm rc $? in $(( $(date +%s) - T0 ))s"
bash lab/device_ab_rows.sh "$OUT/ab" "$AB" "$ROWS" "$@"
LEFT=$(( TOTAL - ($(date +%s) - T0) - 10 ))
timeout "$LEFT" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit-gpu.xml" \
  > "$OUT/pytest-gpu.log" 2>&1
echo "== pytest -m gpu rc $? within ${LEFT}s"; tail -n 3 "$OUT/pytest-gpu.log"
grep -a "FAILED\|Error" "$OUT/pytest-gpu.log" | head -20
echo "== total $(( $(date +%s) - T0 ))s"
