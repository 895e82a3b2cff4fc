#!/usr/bin/env bash
# GPU CI entry point: tools/gpu_check.sh OUTDIR
#
# Compiles every kernel variant (`attnrt warm --strict`), runs the GPU tests (pytest -m gpu,
# junit XML + log), then the benchmarks, and writes everything into OUTDIR:
# doctor.txt, warm.log, pytest-gpu.log, junit-gpu.xml, bench.log, bench.json, bench.md,
# bench.png (the whole run) and latest/<op>.{json,md,png} (one file set per benchmark, the
# layout of benchmarks/latest/: copy them there to publish a run, then
# `python tools/readme_numbers.py --write`).
# Prints a short table last. Exit status: pytest's, else warm's, else bench's.
#
# Environment:
#   ATTNRT_GPU_TESTS  extra pytest arguments (e.g. "tests/test_runtime_gpu.py -x")
#   ATTNRT_BENCH      benchmarks to run: "all" (default), a list such as "runtime paged",
#                   or "none"
#   ATTNRT_BENCH_ARGS extra tools/bench.py arguments (e.g. "--quick")
set -uo pipefail
OUT=${1:?usage: tools/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: "${ATTNRT_CACHE_DIR:=${TMPDIR:-/tmp}/attnrt-gpu-check-cache}"
export ATTNRT_CACHE_DIR

# The optional compiled launch path (pip install builds it; a bare checkout needs this).
python3 tools/build_ext.py 2>&1 | tail -n 1
python3 -m attnrt.app.cli doctor 2>&1 | tee "$OUT/doctor.txt"
# Every kernel variant for this GPU, compiled with this machine's NVRTC (the tests then load
# them from the cache). --strict: a variant whose compile drew a ptxas performance advisory
# (e.g. C7511, serialised wgmmas; these depend on the NVRTC version) fails the check.
python3 -m attnrt.app.cli warm --strict 2> "$OUT/warm.log"
warm_rc=$?
tail -n 1 "$OUT/warm.log" | tr '\r' '\n' | tail -n 1
grep -A 200 "performance loss" "$OUT/warm.log"

# shellcheck disable=SC2086
python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit-gpu.xml" \
  ${ATTNRT_GPU_TESTS:-} 2>&1 | tee "$OUT/pytest-gpu.log"
test_rc=${PIPESTATUS[0]}

bench_rc=0
if [ "${ATTNRT_BENCH:-all}" != "none" ]; then
  # shellcheck disable=SC2086
  python3 tools/bench.py ${ATTNRT_BENCH:-all} --out "$OUT" --name bench --latest "$OUT/latest" \
    ${ATTNRT_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  bench_rc=$?
  tail -n 60 "$OUT/bench.log"
fi

echo
echo "== gpu_check summary =="
python3 - "$OUT/junit-gpu.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as exc:
    print(f"no junit results: {exc}")
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else list(root)
tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
print(f"| tests | passed | failed | errors | skipped |\n|---:|---:|---:|---:|---:|\n"
      f"| {tot['tests']} | {passed} | {tot['failures']} | {tot['errors']} | {tot['skipped']} |")
PY
echo "warm exit: $warm_rc, pytest exit: $test_rc, bench exit: $bench_rc"
[ "$test_rc" -ne 0 ] && exit "$test_rc"
[ "$warm_rc" -ne 0 ] && exit "$warm_rc"
exit "$bench_rc"
