#!/usr/bin/env bash
# Client instructions per lock cycle, counted by callgrind (issue #25): the
# same on an idle or a busy machine, unlike a timing. For each side — the
# raw driver (the floor), dbmutex with `release().await`, dbmutex dropping
# the guard — runs `dbmutex-bench --scenario cycles` under callgrind with 0
# and with CYCLES cycles and prints (Ir(CYCLES) - Ir(0)) / CYCLES, one JSON
# object per side, with the ratio to the raw side of the same run.
#
#   scripts/callgrind.sh                        # PostgreSQL, 2000 cycles
#   CYCLES=500 scripts/callgrind.sh mysql://root@127.0.0.1:3306/test
#
# Environment: CYCLES (default 2000), SIDES (default "raw dbmutex
# dbmutex-drop"). Needs valgrind (apt-get install valgrind). The bench is
# built with the `profiling` profile (release, with line tables), so
# `callgrind_annotate` on the kept output files (OUT, default a temp dir)
# names the functions.
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:-${DBMUTEX_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}}
cycles=${CYCLES:-2000}
sides=${SIDES:-"raw dbmutex dbmutex-drop"}
out=${OUT:-$(mktemp -d -t dbmutex-callgrind.XXXXXX)}
mkdir -p "$out"
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build -q --profile profiling -p dbmutex-bench
bench=${CARGO_TARGET_DIR:-target}/profiling/dbmutex-bench

# ir SIDE N: the instructions of one run.
ir() {
  local file="$out/callgrind.$1.$2"
  valgrind --tool=callgrind --callgrind-out-file="$file" -q \
    "$bench" --database-url "$url" --scenario cycles --cycle-side "$1" --cycles "$2" >&2
  awk '/^(summary|totals):/ { print $2; exit }' "$file"
}

raw_per=""
for side in $sides; do
  base=$(ir "$side" 0)
  full=$(ir "$side" "$cycles")
  per=$(( (full - base) / cycles ))
  [ "$side" != raw ] || raw_per=$per
  ratio=null
  [ -z "$raw_per" ] || ratio=$(awk -v a="$per" -v b="$raw_per" 'BEGIN { printf "%.3f", a / b }')
  printf '{"side":"%s","cycles":%d,"instructions_per_cycle":%d,"ratio_to_raw":%s,"callgrind_out":"%s"}\n' \
    "$side" "$cycles" "$per" "$ratio" "$out/callgrind.$side.$cycles"
done
