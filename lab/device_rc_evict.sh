#!/usr/bin/env bash
# One device run: does racecheck flag the pair kernel's barrier skeleton (probe mode 4) and
# the pair kernel with every hand-off a full bar.sync (PA_PAIR_FULLSYNC=1)? Then a few bench
# rows with and without the evict-first hint (PA_PAIR_EVICT), and ncu's per-kernel times of
# one memory-bound row (ours and FlashMLA's kernels).
#   bash lab/device_rc_evict.sh OUTDIR
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"
export ATTNRT_CACHE_DIR=/tmp/rc-evict-cache
python3 tools/build_ext.py > /dev/null 2>&1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 40 "$CS" --tool racecheck --racecheck-report all python3 lab/rc_named_barrier_probe.py 4 > "$OUT/probe4.log" 2>&1
echo "== probe 4 rc $?: $(grep -a 'mode' "$OUT/probe4.log" | tail -1) | $(grep -a SUMMARY "$OUT/probe4.log")"
timeout 150 "$CS" --tool racecheck --print-limit 8 python3 lab/with_defines.py PA_PAIR_FULLSYNC=1 \
  lab/wg_child.py pair > "$OUT/rc-fullsync.log" 2>&1
echo "== racecheck fullsync rc $? ($(grep -ac ': ok' "$OUT/rc-fullsync.log") ok): $(grep -a SUMMARY "$OUT/rc-fullsync.log")"
grep -a "Race reported" "$OUT/rc-fullsync.log" | sort | uniq -c | head -6
ROWS="decode:16:32:8192 decode:16:128:8192 decode:64:32:8192 decode:128:32:8192 decode:16:8:8192 ragged:16:32:8192"
for ev in 0 1; do
  PYTHONPATH=$PYTHONPATH:tools timeout 110 python3 lab/with_defines.py PA_PAIR_EVICT=$ev \
    lab/paged_rows.py --wg pair $ROWS 2>&1 | grep -a "ours" | sed "s/^/evict$ev /"
done
echo "== ncu"
PYTHONPATH=$PYTHONPATH:tools ATTNRT_BENCH_PAGED_WG=pair timeout 150 "$NCU" --clock-control none \
  --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size -c 60 \
  python3 lab/paged_rows.py decode:16:32:8192 > "$OUT/ncu.log" 2>&1
echo "ncu rc $?"
python3 - "$OUT/ncu.log" <<'PY'
import csv, sys, statistics as st
from collections import defaultdict
rows = [r for r in csv.reader(l for l in open(sys.argv[1], errors="replace") if l.startswith('"'))]
hdr = rows[0]; k, m, v = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
ids = hdr.index("ID")
per = defaultdict(dict)
for r in rows[1:]:
    per[(r[ids], r[k][:60])][r[m]] = r[v]
agg = defaultdict(list)
for (i, name), d in per.items():
    agg[name].append(d)
for name, ds in agg.items():
    t = st.median(float(d["gpu__time_duration.sum"].replace(",", "")) for d in ds)
    b = st.median(float(d["dram__bytes_read.sum"].replace(",", "")) for d in ds)
    print(f"{len(ds):3d}x {name:60s} {t/1e3:9.1f} us  {b/1e6:9.1f} MB  grid {ds[0]['launch__grid_size']}")
PY
