#!/usr/bin/env bash
# Client instructions per lock cycle, counted by callgrind (issue #25): the
# same on an idle or a busy machine, unlike a timing. For each side — the
# raw driver (the floor), dbmutex with `release().await`, dbmutex dropping
# the guard — runs `dbmutex-bench --scenario cycles` under callgrind with 0
# and with CYCLES cycles and prints (Ir(CYCLES) - Ir(0)) / CYCLES, one JSON
# object per side, with the ratio to the raw side of the same run, and the
# code a cycle runs ("code": distinct instructions, 64-byte lines and 4 KiB
# pages that ran once a cycle; scripts/code-footprint.py). python3 reads it.
#
#   scripts/callgrind.sh                        # PostgreSQL, 2000 cycles
#   CYCLES=500 scripts/callgrind.sh mysql://root@127.0.0.1:3306/test
#
# Environment: CYCLES (default 2000), SIDES (default "raw dbmutex
# dbmutex-drop"), WAITS (default 1: also the waiting cycle of a fleet
# worker, below; 0 skips it), DATA (default 1: also the data a cycle
# touches, "data": distinct 64-byte lines of stack, heap and the program's
# own data in one cycle's stretch of a run under valgrind's lackey,
# scripts/data-footprint.py, for the waiting cycle too; 0 skips it).
#
# The waiting cycle: one `fleet-worker` of each side (raw, dbmutex) runs
# under callgrind for 2 s and for 6 s beside a raw partner worker on the
# same name, so most acquisitions wait in the server behind the partner
# (dbmutex: a key contended lately goes straight to the server wait);
# (Ir(6 s) - Ir(2 s)) / (acquisitions(6 s) - acquisitions(2 s)) is printed
# as `waiting-raw` / `waiting-dbmutex`. Needs valgrind (apt-get install valgrind). The bench is
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
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$file" -q \
    "$bench" --database-url "$url" --scenario cycles --cycle-side "$1" --cycles "$2" >&2
  awk '/^(summary|totals):/ { print $2; exit }' "$file"
}

# data SIDE PER: the data lines a cycle of PER instructions touches, as
# JSON ("null" with DATA=0), from a run of 600 cycles under lackey.
data() {
  [ "${DATA:-1}" = 1 ] || { echo null; return; }
  valgrind --tool=lackey --trace-mem=yes --log-fd=9 \
    "$bench" --database-url "$url" --scenario cycles --cycle-side "$1" --cycles 600 9>&1 >/dev/null |
    scripts/data-footprint.py "$2"
}

raw_per=""
for side in $sides; do
  base=$(ir "$side" 0)
  full=$(ir "$side" "$cycles")
  per=$(( (full - base) / cycles ))
  [ "$side" != raw ] || raw_per=$per
  ratio=null
  [ -z "$raw_per" ] || ratio=$(awk -v a="$per" -v b="$raw_per" 'BEGIN { printf "%.3f", a / b }')
  # The code a cycle runs, in distinct instructions, cache lines and pages:
  # what a fleet worker's cold caches pay for (scripts/code-footprint.py).
  fp=$(scripts/code-footprint.py "$cycles" "$out/callgrind.$side.0" "$out/callgrind.$side.$cycles")
  dp=$(data "$side" "$per")
  printf '{"side":"%s","cycles":%d,"instructions_per_cycle":%d,"ratio_to_raw":%s,"code":%s,"data":%s,"callgrind_out":"%s"}\n' \
    "$side" "$cycles" "$per" "$ratio" "$fp" "$dp" "$out/callgrind.$side.$cycles"
done

[ "${WAITS:-1}" = 1 ] || exit 0
# wait_run SIDE SECONDS: "Ir acquisitions" of one worker under callgrind.
wait_run() {
  local file="$out/callgrind.waiting-$1.$2" name="callgrind-wait-$$"
  local start=$(( $(date +%s%3N) + 4000 ))
  local end=$(( start + $2 * 1000 ))
  "$bench" --database-url "$url" --scenario fleet-worker --fleet-side raw --fleet-name "$name" \
    --fleet-app callgrind-partner --fleet-start-ms "$start" --fleet-end-ms "$end" </dev/null >/dev/null &
  local partner=$!
  local waits
  waits=$(valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$file" -q \
    "$bench" --database-url "$url" --scenario fleet-worker --fleet-side "$1" --fleet-name "$name" \
    --fleet-app "callgrind-$1" --fleet-start-ms "$start" --fleet-end-ms "$end" </dev/null | grep '^waits')
  wait "$partner"
  # The line is `waits USER_US KERNEL_US SWITCHES PREEMPTED W1 W2 ...`:
  # the acquisitions are the rest.
  echo "$(awk '/^(summary|totals):/ { print $2; exit }' "$file") $(( $(wc -w <<<"$waits") - 5 ))"
}
# wait_data SIDE PER: the data lines of the waiting cycle (PER
# instructions), as JSON ("null" with DATA=0): one worker under lackey for
# 4 s beside a raw partner, as above.
wait_data() {
  [ "${DATA:-1}" = 1 ] || { echo null; return; }
  local name="callgrind-wait-data-$$"
  local start=$(( $(date +%s%3N) + 4000 ))
  local end=$(( start + 4000 ))
  "$bench" --database-url "$url" --scenario fleet-worker --fleet-side raw --fleet-name "$name" \
    --fleet-app callgrind-partner --fleet-start-ms "$start" --fleet-end-ms "$end" </dev/null >/dev/null &
  local partner=$!
  valgrind --tool=lackey --trace-mem=yes --log-fd=9 \
    "$bench" --database-url "$url" --scenario fleet-worker --fleet-side "$1" --fleet-name "$name" \
    --fleet-app "callgrind-$1" --fleet-start-ms "$start" --fleet-end-ms "$end" </dev/null 9>&1 >/dev/null |
    scripts/data-footprint.py "$2"
  wait "$partner"
}
raw_wait=""
for side in raw dbmutex; do
  read -r ir2 n2 < <(wait_run "$side" 2)
  read -r ir6 n6 < <(wait_run "$side" 6)
  [ "$n6" -gt "$n2" ] || { echo "callgrind.sh: the waiting cycle made no progress ($n2, $n6)" >&2; exit 1; }
  per=$(( (ir6 - ir2) / (n6 - n2) ))
  [ "$side" != raw ] || raw_wait=$per
  ratio=$(awk -v a="$per" -v b="$raw_wait" 'BEGIN { printf "%.3f", a / b }')
  fp=$(scripts/code-footprint.py "$(( n6 - n2 ))" "$out/callgrind.waiting-$side.2" "$out/callgrind.waiting-$side.6")
  dp=$(wait_data "$side" "$per")
  printf '{"side":"waiting-%s","acquisitions":%d,"instructions_per_cycle":%d,"ratio_to_raw":%s,"code":%s,"data":%s,"callgrind_out":"%s"}\n' \
    "$side" "$(( n6 - n2 ))" "$per" "$ratio" "$fp" "$dp" "$out/callgrind.waiting-$side.6"
done
