#!/usr/bin/env bash
# Device run for the wg tile / schedule study (docs/notes/paged_attention.md#wg-tile):
# the paged GPU tests under each schedule, then tools/bench.py paged once per variant.
#   bash lab/device_paged_variants.sh OUTDIR "32:1:1 32:0:1 64:0:0"   (tile:pipelined:pdl)
set -u
OUT=${1:?OUTDIR}; VARIANTS=${2:-"32:1:1 32:0:1 64:0:0"}; TESTS=${3:-1}
mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=${ATTNRT_CACHE_DIR:-/tmp/attnrt-gpu-check-cache}
python3 tools/build_ext.py > /dev/null 2>&1
if [ "$TESTS" = 1 ]; then
  for p in $(for v in $VARIANTS; do v=${v#*:}; echo "${v%:*}"; done | sort -u); do
    echo "== tests, ATTNRT_WG_PIPE=$p"
    ATTNRT_WG_PIPE=$p timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/test_paged_gpu.py --timeout 200 2>&1 | tail -4
  done
fi
for v in $VARIANTS; do
  IFS=: read -r t p d <<< "$v"
  n="b$t$p$d"
  ATTNRT_WG_PIPE=$p ATTNRT_BENCH_PAGED_WG_TILE=$t ATTNRT_BENCH_PAGED_PDL=$d timeout 150 \
    python3 tools/bench.py paged --out "/tmp/$n" --name "$n" > "/tmp/$n.log" 2>&1
  echo "== bench $v rc $?"
  cp "/tmp/$n/$n.json" "$OUT/" 2>/dev/null
  grep -i "failed\|error" "/tmp/$n.log" | head -3
done
