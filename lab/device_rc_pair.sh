#!/usr/bin/env bash
# Racecheck on the pair kernel with line info, and the named-barrier probe (modes 0-3).
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=/tmp/rc-lineinfo-cache
python3 tools/build_ext.py > /dev/null 2>&1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for m in 0 1 2 3; do
  timeout 40 "$CS" --tool racecheck --racecheck-report all python3 lab/rc_named_barrier_probe.py $m > "$OUT/probe$m.log" 2>&1
  echo "== probe mode $m rc $?: $(grep -a 'mode' "$OUT/probe$m.log" | tail -1) | $(grep -a 'SUMMARY' "$OUT/probe$m.log")"
done
timeout 130 "$CS" --tool racecheck --print-limit 12 python3 -c "
import attnrt.runtime.compiler as c
f = c.full_options
c.full_options = lambda o, a: f(o, a) + ['-lineinfo']
from tests.test_paged_gpu import _wg_child
_wg_child('pair')" > "$OUT/rc.log" 2>&1
echo "== racecheck pair rc $?"
grep -a -A3 "Error: Race" "$OUT/rc.log" | grep -a "Race\|access\|paged_mla_pair.cu" | sort | uniq -c | sort -rn | head -24
