#!/usr/bin/env bash
# An interleaved A/B of two command lines: runs A and B in turn N times
# each (the order flipping every pair, so neither always runs right after
# the other) and prints each one's median wall time and B's difference, in
# microseconds. For two builds of `dbmutex run` with nothing else between
# their runs (scripts/cli-overhead.sh times them among true, flock(1),
# psql and the raw floor).
#
#   scripts/cli-ab.sh 300 "old/dbmutex run n -- /usr/bin/true" "new/dbmutex run n -- /usr/bin/true"
#
# The command lines are run by bash (`eval`), their output discarded; one
# that exits non-zero stops the A/B (a failing run is not a fast one).
set -euo pipefail
export LC_ALL=C
[ $# -eq 3 ] || { echo "usage: scripts/cli-ab.sh N 'COMMAND A' 'COMMAND B'" >&2; exit 64; }
n=$1 a=$2 b=$3
ta=() tb=()
# time_one COMMAND: its wall time in microseconds, in $t (no subshell).
time_one() {
  local s=$EPOCHREALTIME rc=0
  eval "$1" >/dev/null 2>&1 || rc=$?
  local e=$EPOCHREALTIME
  if [ "$rc" != 0 ]; then
    echo "cli-ab.sh: exit status $rc from: $1" >&2
    exit 1
  fi
  t=$((${e/./} - ${s/./}))
}
for ((i = 0; i < n; i++)); do
  if ((i % 2)); then
    time_one "$a"; ta+=("$t"); time_one "$b"; tb+=("$t")
  else
    time_one "$b"; tb+=("$t"); time_one "$a"; ta+=("$t")
  fi
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ma=$(median "${ta[@]}") mb=$(median "${tb[@]}")
echo "A ${ma} us  B ${mb} us  B-A $((mb - ma)) us"
