#!/usr/bin/env bash
# One device call that answers the most when the device is scarce, within TOTAL seconds:
# every kernel variant compiled in the background (`attnrt warm`) while FlashMLA builds;
# the pair child test for each define list in $CHILD_SETS (the shipped build's runs in the
# GPU tests); then a few rows per SET in interleaved rounds within AB seconds (one process
# each, FlashMLA in it); then every GPU test within the time left.
#   CHILD_SETS="PA_X=1" [EXTRA="cmd"] bash lab/device_scarce.sh OUTDIR TOTAL AB "ROWS" SET [SET ...]
# EXTRA: one more command (e.g. a lab probe) after the rows, at most 120 s. TESTS: pytest
# arguments (default: every GPU test). WARM=0: no background warm (a short call).
# SET: "-" (this tree as it is), a comma-separated define list for lab/with_defines.py, or
# tree=DIR (another checkout's rows, e.g. `git archive` of the commit before, ignored here).
set -u
OUT=${1:?OUTDIR}; TOTAL=${2:?TOTAL}; AB=${3:?AB}; ROWS=${4:?ROWS}; shift 4; mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-scarce-cache}
export ATTNRT_FLASHMLA_DIR=${ATTNRT_FLASHMLA_DIR:-$PWD/.peers/flashmla}
nvidia-smi --query-gpu=name,uuid,clocks.max.sm --format=csv,noheader
python3 tools/build_ext.py > "$OUT/build_ext.log" 2>&1
if [ "${WARM:-1}" = 1 ]; then python3 -m attnrt.app.cli warm > "$OUT/warm.log" 2>&1 & else true & fi
WARM=$!
bash .peers/flashmla/build.sh --prebuilt > "$OUT/fm-build.log" 2>&1
echo "== flashmla: $(tail -n 1 "$OUT/fm-build.log") at $(el)s"
for set in "$@"; do
  case $set in tree=*) (cd "${set#tree=}" && python3 tools/build_ext.py > /dev/null 2>&1) ;; esac
done
wait "$WARM"; echo "== warm rc $? at $(el)s"
for cs in ${CHILD_SETS:-}; do
  timeout 120 python3 lab/with_defines.py "$cs" lab/wg_child.py pair > "$OUT/child.log" 2>&1
  echo "== pair child [$cs] rc $? ($(grep -ac ': ok' "$OUT/child.log") ok) at $(el)s"
  grep -a "FAILED" "$OUT/child.log" | head -5
done
TA=$(date +%s)
for round in 1 2 3; do
  for set in "$@"; do
    [ $(( AB - ($(date +%s) - TA) )) -lt 70 ] && break 2
    case $set in
      tree=*) (cd "${set#tree=}" && PYTHONPATH=${PYTHONPATH:-}:$PWD:$PWD/tools timeout 70 \
                python3 lab/paged_rows.py --wg pair $ROWS) ;;
      *) PYTHONPATH=${PYTHONPATH:-}:tools timeout 70 python3 lab/with_defines.py "${set/#-/}" \
           lab/paged_rows.py --wg pair $ROWS ;;
    esac 2>&1 | grep -a "ours\|Error" | sed "s/^/r$round $set | /"
  done
done
echo "== rows done at $(el)s"
if [ -n "${EXTRA:-}" ]; then
  timeout 120 bash -c "$EXTRA" 2>&1 | tail -n 20
  echo "== extra rc ${PIPESTATUS[0]} at $(el)s"
fi
LEFT=$(( TOTAL - $(el) - 10 ))
if [ "$LEFT" -ge 30 ]; then
  # shellcheck disable=SC2086
  timeout "$LEFT" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit-gpu.xml" \
    ${TESTS:-} > "$OUT/pytest-gpu.log" 2>&1
  echo "== pytest -m gpu rc $? within ${LEFT}s"; tail -n 3 "$OUT/pytest-gpu.log"
  grep -a "FAILED\|Error" "$OUT/pytest-gpu.log" | head -20
else
  echo "== no time left for the GPU tests"
fi
echo "== total $(el)s"
