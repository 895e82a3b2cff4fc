#!/usr/bin/env bash
# tools/sanitize.sh OUTDIR: the GPU kernel tests under compute-sanitizer.
#
# Runs a representative, small-shape subset of the kernel tests (attention, paged, index_share)
# under compute-sanitizer --tool memcheck, racecheck, initcheck and synccheck (each with
# --error-exitcode 1), one log per tool, then writes OUTDIR/sanitize.md: tool, tests run,
# passed/failed, sanitizer errors, status. The kernels are compiled once beforehand, without
# the sanitizer (`attnrt warm` into ATTNRT_CACHE_DIR), so the sanitized runs only load CUBINs.
#
# Files in OUTDIR: warm.log, <tool>.log (sanitizer + pytest output), <tool>.xml (junit),
# <tool>.result (one summary row; re-running some tools into the same OUTDIR keeps the
# others' rows), sanitize.md.
# The runs so far, and what they found: docs/notes/sanitize.md.
#
# Environment:
#   ATTNRT_SANITIZE_TOOLS    tools to run (default: "memcheck racecheck initcheck synccheck")
#   ATTNRT_SANITIZE_TIMEOUT  seconds per tool before it is stopped (default 110; the four tools
#                          then fit in about 8 minutes with the warm-up)
#   COMPUTE_SANITIZER      path of compute-sanitizer (default: PATH, then the CUDA toolkit)
#   ATTNRT_CACHE_DIR         compile cache (default: the one tools/gpu_check.sh uses)
#   ATTNRT_COMMIT            commit recorded in sanitize.md (default: git rev-parse HEAD)
# Exit status: 0 when every tool ran to the end with zero sanitizer errors and no failing
# test; 1 otherwise; 2 when compute-sanitizer is not found.
set -uo pipefail
OUT=${1:?usage: tools/sanitize.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: "${ATTNRT_CACHE_DIR:=${TMPDIR:-/tmp}/attnrt-gpu-check-cache}"
export ATTNRT_CACHE_DIR
TOOLS=${ATTNRT_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
LIMIT=${ATTNRT_SANITIZE_TIMEOUT:-110}

find_sanitizer() {
  local c
  if [ -n "${COMPUTE_SANITIZER:-}" ] && [ -x "$COMPUTE_SANITIZER" ]; then
    echo "$COMPUTE_SANITIZER"; return 0
  fi
  c=$(command -v compute-sanitizer 2>/dev/null) && { echo "$c"; return 0; }
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  # pip wheels (nvidia-cuda-sanitizer-api / cuda-toolkit) put it under site-packages/nvidia.
  c=$(python3 - <<'PY' 2>/dev/null
import os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    base = os.path.join(r, "nvidia")
    for dirpath, _dirs, files in os.walk(base):
        if "compute-sanitizer" in files:
            p = os.path.join(dirpath, "compute-sanitizer")
            if os.access(p, os.X_OK):
                print(p); sys.exit(0)
sys.exit(1)
PY
) && { echo "$c"; return 0; }
  return 1
}

CS=$(find_sanitizer)
if [ -z "$CS" ]; then
  {
    echo "# compute-sanitizer sweep"
    echo
    echo "compute-sanitizer was not found (PATH, /usr/local/cuda*/bin, site-packages/nvidia);"
    echo "set COMPUTE_SANITIZER=/path/to/compute-sanitizer. Nothing was run."
  } > "$OUT/sanitize.md"
  cat "$OUT/sanitize.md"
  exit 2
fi
echo "compute-sanitizer: $CS ($("$CS" --version 2>/dev/null | tail -n 1))"

# Compile every kernel variant for this GPU once, without the sanitizer.
python3 -m attnrt.app.cli warm > "$OUT/warm.log" 2>&1 || echo "warning: attnrt warm failed (see warm.log)"

# The subset: small shapes, one or more cases per kernel family (fused tensor-core and SIMT
# attention, split-KV combine, unfused GEMM/softmax; MLA 64/32-key tiles, split-KV, simple
# path, RoPE writes, slot -1; IndexShare SIMT and MMA paths, capacity frontier/scatter,
# concat copies, split-K combine, device index validation with poisoned rows, the
# warp-specialised persistent wgmma build with one and two Q slots and its two-CTA cluster
# merge; out-of-range block/slot/position ids that must latch instead of faulting).
ATTN_K="(test_vs_reference and (q17k128D64 or q1k17D80 or q128k17D64 or q17k17D80 \
or q128k1000D64)) \
or test_split_kv or test_simt_fallback or test_empty_keys or test_strided_views \
or test_large_head_dim or test_wg_persistent or test_wg_path_in_child_process"
PAGED_K="test_simple_odd_head or test_simple_path_on_mla_shapes or test_mla_32_key_tiles \
or (test_decode_mla and bf16-half-rope) or test_slot_minus_one or test_attention_metadata_input \
or test_out_of_range_ids_latch or test_position_outside_rotary_table_latches"
IS_K="(test_matches_reference and (f32-gqa-rank1 or f16-mha-hiN-rank2 or bf16-mma-wm1-rank4-cap \
or f32-cap-hiN-k1 or bf16-odd-h72-rank3 or f16-narrow-h20 or f32-decode-splitk \
or bf16-wg-h64-g96-cap or bf16-ws-g128-i64-rank4 or f16-ws-gqa2-g128-h64)) \
or test_eager_rejects_bad_rows or test_capture_replay_and_poisoned_indices \
or test_chained_calls_in_one_graph"
# racecheck is the slowest (every shared-memory access is tracked): fewer cases. The eight-CTA
# IndexShare merge (ws-cluster8, IS_CMDS) runs in a run of its own with racecheck's
# asynchronous-copy checks off (IS_K_RACE_NOASYNC): its partners store into rings that
# cp.async filled, ordered by the copies' wait and a cluster barrier, which racecheck does not
# follow (it reports such hazards for any kernel that does this: lab/rc_cluster_probe.py,
# docs/notes/index_share-history.md, round 22). That run checks every other hazard class (plain and
# distributed shared-memory accesses against each other), but no longer the ring's cp.async
# protocol of that build; the two-CTA (ws-cluster) and four-CTA cases check it.
DEC_K="(test_cluster_merge_equals_memory_merge and (B16H32 or k60D128 or q4k1000 or q3k300 \
or k2000D256 or m2-local)) or (test_capture_replay_with_new_inputs and (cluster or pool)) \
or (test_vs_reference and (s7 or s5 or q2k1000D64)) \
or (test_warp_ring_equals_cta_ring and (B8H32 or k100D128 or k2000D256))"
DEC_K_RACE="(test_cluster_merge_equals_memory_merge and (B16H32 or k60D128 or q4k1000)) \
or (test_vs_reference and s5) or (test_warp_ring_equals_cta_ring and (B8H32 or k100D128))"
ATTN_K_RACE="(test_vs_reference and (q17k128D64 or q1k17D80)) or test_simt_fallback \
or (test_split_kv and fused-4) or (test_wg_persistent and q128k1000D128)"
PAGED_K_RACE="test_mla_32_key_tiles or (test_simple_odd_head and bf16) or test_slot_minus_one"
IS_K_RACE="(test_matches_reference and (f16-mha-hiN-rank2 or bf16-mma-wm1-rank4-cap \
or f32-decode-splitk or f32-cap-hiN-k1 or bf16-wg-h64-g96-cap or f16-ws-gqa2-g128-h64)) \
or (test_capture_replay_and_poisoned_indices and ws-cluster and none and not ws-cluster8) \
or (test_chained_calls_in_one_graph and ws-cluster and k320)"
IS_K_RACE_NOASYNC="test_capture_replay_and_poisoned_indices and none and ws-cluster8"

run_tool() {
  # $6 (racecheck only): an IndexShare expression run again with --racecheck-memcpy-async no.
  local tool=$1 ak=$2 pk=$3 ik=$4 dk=$5 xk=${6:-} log="$OUT/$1.log" t0 rc
  t0=$(date +%s)
  echo "== $tool (limit ${LIMIT}s)"
  # One pytest per file keeps each -k expression with its file; all under one sanitizer
  # process would need a single expression. Each invocation appends to the tool's log.
  : > "$log"
  rm -f "$OUT/$tool"-[0-9].xml
  rc=0
  local files=(tests/test_attention_gpu.py tests/test_paged_gpu.py tests/test_index_share_gpu.py
               tests/test_attention_decode_gpu.py)
  local exprs=("$ak" "$pk" "$ik" "$dk")
  local flags=("" "" "" "")
  if [ -n "$xk" ]; then
    files+=(tests/test_index_share_gpu.py)
    exprs+=("$xk")
    flags+=("--racecheck-memcpy-async no")
  fi
  local i left
  for i in "${!files[@]}"; do
    left=$(( LIMIT - ($(date +%s) - t0) ))
    if [ "$left" -le 5 ]; then
      echo "TIMEOUT: no time left for ${files[$i]}" >> "$log"
      rc=124
      break
    fi
    echo "---- ${files[$i]} -k \"${exprs[$i]}\" ${flags[$i]}" >> "$log"
    # shellcheck disable=SC2086
    timeout --kill-after=15 "$left" "$CS" --tool "$tool" ${flags[$i]} --error-exitcode 1 \
      --print-limit 100 python3 -m pytest -m gpu -q -p no:cacheprovider \
      --junitxml="$OUT/$tool-$i.xml" "${files[$i]}" -k "(${exprs[$i]}) and not torch" \
      >> "$log" 2>&1
    local r=$?
    [ "$r" -ne 0 ] && rc=$r
    [ "$r" -eq 124 ] && { echo "TIMEOUT after ${LIMIT}s" >> "$log"; break; }
  done
  local secs=$(( $(date +%s) - t0 ))
  python3 - "$tool" "$log" "$rc" "$secs" "$OUT" > "$OUT/$tool.result" <<'PY'
import glob, re, sys
import xml.etree.ElementTree as ET
tool, log, rc, secs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(log, errors="replace").read()
# Every tool ends with "========= ERROR SUMMARY: N error(s)"; racecheck also prints hazards.
errors = sum(int(n) for n in re.findall(r"ERROR SUMMARY:\s+(\d+)\s+error", text))
hazards = re.findall(r"RACECHECK SUMMARY:\s+(\d+)\s+hazard", text)
tests = failed = skipped = 0
for f in sorted(glob.glob(f"{out}/{tool}-[0-9].xml")):
    try:
        root = ET.parse(f).getroot()
    except Exception:
        continue
    for s in ([root] if root.tag == "testsuite" else list(root)):
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
timed_out = rc == 124 or "TIMEOUT" in text
if timed_out:
    status = "TIMEOUT"
elif errors or (rc == 1 and not failed):
    status = "SANITIZER ERRORS"
elif failed or rc:
    status = "TESTS FAILED"
elif tests - skipped == 0:
    status = "NOTHING RAN"
else:
    status = "clean"
extra = f" ({sum(map(int, hazards))} race hazards)" if hazards else ""
print(f"| {tool} | {tests - skipped} | {tests - skipped - failed} | {failed} | {errors}{extra} "
      f"| {status} | {secs} |")
PY
  cat "$OUT/$tool.result"
}

for tool in $TOOLS; do
  case "$tool" in
    racecheck) run_tool "$tool" "$ATTN_K_RACE" "$PAGED_K_RACE" "$IS_K_RACE" "$DEC_K_RACE" \
                 "$IS_K_RACE_NOASYNC" ;;
    memcheck|initcheck|synccheck) run_tool "$tool" "$ATTN_K" "$PAGED_K" "$IS_K" "$DEC_K" ;;
    *) echo "unknown tool $tool (memcheck, racecheck, initcheck, synccheck)"; exit 2 ;;
  esac
done

# ATTNRT_COMMIT (as tools/bench.py): the commit of a copied tree that git cannot see.
if [ -n "${ATTNRT_COMMIT:-}" ]; then
  commit=${ATTNRT_COMMIT:0:7}
  dirty=""
else
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$(git status --porcelain 2>/dev/null | grep -q . && echo " (uncommitted changes)" || true)
fi
gpu=$(python3 -c "import attnrt; r = attnrt.CudaRuntime(0); print(r.capabilities.name); r.close()" \
      2>/dev/null || echo unknown)
{
  echo "# compute-sanitizer sweep"
  echo
  echo "Commit $commit$dirty on $gpu, $(date -u +%Y-%m-%d). Sanitizer: \`$("$CS" --version 2>/dev/null | tail -n 1)\`."
  echo "Command per tool: \`compute-sanitizer --tool TOOL --error-exitcode 1 python3 -m pytest -m gpu FILE -k EXPR\`"
  echo "over tests/test_attention_gpu.py, tests/test_paged_gpu.py, tests/test_index_share_gpu.py and"
  echo "tests/test_attention_decode_gpu.py (the -k expressions are in tools/sanitize.sh; racecheck runs"
  echo "a smaller subset, and the eight-CTA IndexShare case a fifth time with"
  echo "\`--racecheck-memcpy-async no\`: see the script's comment)."
  echo
  echo "| tool | tests run | passed | failed | sanitizer errors | status | wall s |"
  echo "|---|---:|---:|---:|---:|---|---:|"
  for tool in memcheck racecheck initcheck synccheck; do
    [ -f "$OUT/$tool.result" ] && cat "$OUT/$tool.result"
  done
  echo
  echo "Logs: \`<tool>.log\` beside this file; a finding there starts with \`========= \` and names"
  echo "the kernel, the access and the thread."
} > "$OUT/sanitize.md"
cat "$OUT/sanitize.md"
if grep -qE '\| (SANITIZER ERRORS|TESTS FAILED|TIMEOUT|NOTHING RAN) \|' "$OUT/sanitize.md"; then
  exit 1
fi
exit 0
