#!/usr/bin/env bash
# The suite on a busy machine: N fresh clones of this repository's main in a row, `.ci/run` in
# each (a fresh venv, make test), one core kept busy by a spinning process the whole time.
#   scripts/busy_clones.sh [N] [RESULTS] [REV]   (default 10, ../busy_clones.txt, HEAD)
# REV pins every clone to one commit (taken when the script starts), so that work committed
# meanwhile does not change what the later runs test.
# The clone sits beside this checkout, so that it finds ../shared as CI does. One line per run
# in RESULTS: its exit status, seconds, commit, and pytest's summary (failures and reruns).
set -u
N=${1:-10}
HERE=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${2:-$(dirname "$HERE")/busy_clones.txt}
CLONE=$(dirname "$HERE")/busyclone
REV=$(git -C "$HERE" rev-parse "${3:-HEAD}")
python3 -c "
while True:
    sum(i * i for i in range(10000))
" &
SPIN=$!
trap 'kill $SPIN' EXIT
for i in $(seq 1 "$N"); do
  rm -rf "$CLONE"
  git clone -q "$HERE" "$CLONE" && git -C "$CLONE" checkout -q "$REV"
  start=$(date +%s)
  (cd "$CLONE" && ./.ci/run > "$CLONE.log.$i" 2>&1)
  rc=$?
  summary=$(grep -E "passed|failed|rerun" "$CLONE.log.$i" | tail -3 | tr '\n' ' ')
  echo "run $i rc=$rc $(( $(date +%s) - start ))s commit=$(git -C "$CLONE" rev-parse --short HEAD) $summary" >> "$RESULTS"
done
