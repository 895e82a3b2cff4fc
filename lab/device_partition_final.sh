#!/usr/bin/env bash
# One device run for the partition change when the device is scarce: lab/device_partition.sh
# (child tests, rows off / on / the earlier tree's), then every GPU test within the time left.
#   OLD=DIR bash lab/device_partition_final.sh OUTDIR ROWS_BUDGET TESTS_BUDGET "ROWS"
set -u
OUT=${1:?OUTDIR}; RB=${2:?}; TB=${3:?}; ROWS=${4:?}; mkdir -p "$OUT"
bash lab/device_partition.sh "$OUT/p" "$RB" "$ROWS" 2>&1 | tee "$OUT/rows.txt"
timeout "$TB" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit-gpu.xml" \
  > "$OUT/pytest-gpu.log" 2>&1
echo "== pytest -m gpu rc $?"; tail -n 4 "$OUT/pytest-gpu.log"; grep -a "FAILED\|Error" "$OUT/pytest-gpu.log" | head
