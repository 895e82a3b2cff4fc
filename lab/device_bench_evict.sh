#!/usr/bin/env bash
# One device run: tools/bench.py paged at HEAD (-> OUTDIR/bp), the serial wgmma kernel's B8
# rows with and without PA_WG_EVICT, and ncu's warp-state and memory sections of the pair
# kernel and FlashMLA's on one memory-bound row.
#   bash lab/device_bench_evict.sh OUTDIR
set -u
OUT=${1:?OUTDIR}; mkdir -p "$OUT"; T0=$(date +%s)
export ATTNRT_CACHE_DIR=/tmp/bench-evict-cache
python3 tools/build_ext.py > /dev/null 2>&1
timeout 300 python3 tools/bench.py paged --out "$OUT/bp" --name paged > "$OUT/bench.log" 2>&1
echo "== bench rc $? in $(( $(date +%s) - T0 ))s"; grep -aiE "failed|error|DISAGREE" "$OUT/bench.log" | head -3
ROWS="decode:16:8:8192 decode:128:8:8192 decode:16:8:4096 decode:64:8:32768"
for ev in 0 1; do
  PYTHONPATH=$PYTHONPATH:tools timeout 90 python3 lab/with_defines.py PA_WG_EVICT=$ev \
    lab/paged_rows.py --wg serial $ROWS 2>&1 | grep -a "ours" | sed "s/^/wg-evict$ev /"
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
LEFT=$(( 560 - ($(date +%s) - T0) ))
echo "== ncu with ${LEFT}s"
PYTHONPATH=$PYTHONPATH:tools ATTNRT_BENCH_PAGED_WG=pair timeout "$LEFT" "$NCU" --clock-control none \
  -k regex:"paged_mla_pair_fwd|flash_fwd_splitkv" -c 2 --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section SpeedOfLight \
  python3 lab/paged_rows.py decode:16:32:8192 > "$OUT/ncu.log" 2>&1
echo "ncu rc $?"
grep -aE "paged_mla_pair_fwd|flash_fwd_splitkv|Duration|Throughput|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible Warps|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu.log" | sed -E 's/ {2,}/ /g' | head -60
