#!/usr/bin/env bash
# The suite on a busy machine: N fresh clones of this repository's main in a row, `.ci/run` in
# each (a fresh venv, make test), BUSY cores (default 1) kept busy by spinning processes the whole
# time (BUSY=2 on 2 cores: a load of 4-6).
#   [BUSY=2] scripts/busy_clones.sh [N] [RESULTS] [REV]   (default 10, ../busy_clones.txt, HEAD)
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
SPIN=
for _ in $(seq 1 "${BUSY:-1}"); do  # BUSY=2: both cores of a 2-core machine kept busy
  python3 -c "
while True:
    sum(i * i for i in range(10000))
" &
  SPIN="$SPIN $!"
done
RUN=
# stopping this script (a signal, or the end) stops the spinner and the run in progress, the
# whole process group of its `.ci/run` (pytest and the trainings it started), so that nothing
# is left writing into the clone when the next loop removes it
trap '[ -n "$RUN" ] && kill -- -"$RUN" 2>/dev/null; kill $SPIN 2>/dev/null' EXIT
trap 'exit 130' INT TERM
for i in $(seq 1 "$N"); do
  rm -rf "$CLONE"
  if ! { git clone -q "$HERE" "$CLONE" && git -C "$CLONE" checkout -q "$REV"; }; then
    echo "run $i: no clone of $REV at $CLONE (a process still writing there?): stopped" >> "$RESULTS"
    exit 1
  fi
  start=$(date +%s)
  setsid bash -c 'cd "$1" && exec ./.ci/run' _ "$CLONE" > "$CLONE.log.$i" 2>&1 &
  RUN=$!
  wait "$RUN"
  rc=$?
  RUN=
  summary=$(grep -E "passed|failed|rerun" "$CLONE.log.$i" | tail -3 | tr '\n' ' ')
  echo "run $i rc=$rc $(( $(date +%s) - start ))s commit=$(git -C "$CLONE" rev-parse --short HEAD) $summary" >> "$RESULTS"
done
