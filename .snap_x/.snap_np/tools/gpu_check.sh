#!/usr/bin/env bash
# GPU CI entry point: tools/gpu_check.sh OUTDIR
#
# Runs the GPU tests (pytest -m gpu, junit XML + log), then the benchmarks, and writes
# everything flat into OUTDIR: doctor.txt, pytest-gpu.log, junit-gpu.xml, bench.json,
# bench.md, bench.png. Prints a short table last. Exit status: pytest's, else bench's.
#
# Environment:
#   NXRT_GPU_TESTS  extra pytest arguments (e.g. "tests/test_runtime_gpu.py -x")
#   NXRT_BENCH      benchmarks to run: "all" (default), a list such as "runtime paged",
#                   or "none"
#   NXRT_BENCH_ARGS extra tools/bench.py arguments (e.g. "--quick")
set -uo pipefail
OUT=${1:?usage: tools/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: "${NXRT_CACHE_DIR:=${TMPDIR:-/tmp}/nxrt-gpu-check-cache}"
export NXRT_CACHE_DIR

# The optional compiled launch path (pip install builds it; a bare checkout needs this).
python3 tools/build_ext.py 2>&1 | tail -n 1
python3 -m nxrt.cli doctor 2>&1 | tee "$OUT/doctor.txt"

# shellcheck disable=SC2086
python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit-gpu.xml" \
  ${NXRT_GPU_TESTS:-} 2>&1 | tee "$OUT/pytest-gpu.log"
test_rc=${PIPESTATUS[0]}

bench_rc=0
if [ "${NXRT_BENCH:-all}" != "none" ]; then
  # shellcheck disable=SC2086
  python3 tools/bench.py ${NXRT_BENCH:-all} --out "$OUT" --name bench ${NXRT_BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
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
echo "pytest exit: $test_rc, bench exit: $bench_rc"
[ "$test_rc" -ne 0 ] && exit "$test_rc"
exit "$bench_rc"
