#!/usr/bin/env bash
# lab/nvrtc_sweep.sh OUTDIR VERSION...: every kernel variant compiled under other NVRTC
# versions, each checked for ptxas's performance advisories (`attnrt warm --strict`).
#
# ptxas's "Potential Performance Loss" advisories (e.g. C7511, every wgmma serialised) depend
# on the NVRTC version: one IndexShare build was clean under 13.5 and serialised under 13.0
# (docs/notes/index_share-history.md, rounds 15-16). This compiles the whole variant set for
# sm_90 and sm_80 under each given version of the `nvidia-cuda-nvrtc` wheel (downloaded with
# pip into OUTDIR; needs a package index), by loading its libnvrtc with LD_PRELOAD, with a
# fresh compile cache per version. No GPU is needed.
#
#   lab/nvrtc_sweep.sh /tmp/sweep 13.0.88 13.2.86
#
# Files in OUTDIR: warm-<version>.log per version, sweep.md (version, variants, failures,
# advisories, exit status). Exit status: 0 when every version compiled every variant without
# an advisory, 1 otherwise.
set -uo pipefail
OUT=${1:?usage: lab/nvrtc_sweep.sh OUTDIR VERSION...}
shift
[ $# -gt 0 ] || { echo "usage: lab/nvrtc_sweep.sh OUTDIR VERSION..." >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
echo "| NVRTC | result |" > "$OUT/sweep.md"
echo "|---|---|" >> "$OUT/sweep.md"
for v in "$@"; do
  dir="$OUT/nvrtc-$v"
  if [ ! -d "$dir/nvidia" ]; then
    python3 -m pip download -q --no-deps -d "$dir/wheel" "nvidia-cuda-nvrtc==$v" &&
      python3 -m zipfile -e "$dir"/wheel/*.whl "$dir" || { echo "| $v | download failed |" >> "$OUT/sweep.md"; rc=1; continue; }
  fi
  lib=$(find "$dir/nvidia" -name 'libnvrtc.so.*' ! -name '*alt*' | head -n 1)
  echo "== NVRTC $v ($lib)"
  ATTNRT_CACHE_DIR="$dir/cache" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$(dirname "$lib")" \
    python3 -c "
import sys
from attnrt.runtime import compiler
print('nvrtc', '.'.join(map(str, compiler.nvrtc_version())))
from attnrt.app.cli import main
sys.exit(main(['warm', '--arch', 'sm_90', '--arch', 'sm_80', '--strict']))
" > "$OUT/warm-$v.log" 2>&1
  r=$?
  summary=$(tr '\r' '\n' < "$OUT/warm-$v.log" | grep -E '^warm:' | tail -n 1)
  loaded=$(head -n 1 "$OUT/warm-$v.log")
  advice=$(tr '\r' '\n' < "$OUT/warm-$v.log" | grep -c 'Potential Performance Loss')
  echo "| $v | $loaded; $summary; $advice advisory lines; exit $r |" >> "$OUT/sweep.md"
  echo "$loaded; $summary; $advice advisory lines; exit $r"
  [ "$r" -eq 0 ] || rc=1
done
cat "$OUT/sweep.md"
exit "$rc"
