#!/usr/bin/env bash
# One device run for the paired wgmma schedule (cuda/paged_mla_pair.cu): its GPU child test
# (every wg case), a few bench rows serial vs pair vs FlashMLA in one process, then
# compute-sanitizer memcheck on the pair child.
#   bash lab/device_pair.sh OUTDIR [ROWS...]
set -u
OUT=${1:?OUTDIR}; shift
mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
timeout 150 python3 -c "from tests.test_paged_gpu import _wg_child; _wg_child('pair')" \
  > "$OUT/child.log" 2>&1
echo "== pair child rc $? ($(grep -c ': ok' "$OUT/child.log") ok)"
grep -E "FAILED|Error|error" "$OUT/child.log" | head -12
ROWS=${*:-decode:16:32:8192 decode:64:32:8192 decode:128:32:8192 decode:16:128:8192 decode:128:1:8192 decode:16:8:8192 ragged:16:32:8192 spec:16:32:8192:4}
# shellcheck disable=SC2086
timeout 240 python3 lab/paged_rows.py --wg serial,pair $ROWS > "$OUT/rows.log" 2>&1
echo "== rows rc $?"; grep -E "\[|rror" "$OUT/rows.log" | head -40
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 120 "$CS" --tool memcheck --error-exitcode 1 --print-limit 20 python3 -c \
  "from tests.test_paged_gpu import _wg_child; _wg_child('pair')" > "$OUT/memcheck.log" 2>&1
echo "== memcheck rc $? ($(grep -c ': ok' "$OUT/memcheck.log") cases ok)"
grep -E "FAILED|SUMMARY" "$OUT/memcheck.log" | head -4
