#!/usr/bin/env bash
# Where a fleet worker's time goes, sampled in the fleet itself
# (BENCHMARKS.md, session 25): N `fleet-worker` processes of one side on K
# names for DURATION seconds on a private PostgreSQL, under
# `perf record -a`, first the raw floor, then dbmutex (SIDES); prints for each side
# the acquisitions and the samples per 1,000 acquisitions by process and
# object (the workers' own code, their kernel time, libc; the server's),
# then the workers' own code by crate. Callgrind (scripts/callgrind.sh)
# counts one cycle alone; this sees the caches a fleet leaves.
#
#   scripts/fleet-perf.sh              # N = 50 on 50 names, 8 s per side
#   N=200 NAMES=1 scripts/fleet-perf.sh
#   SIDES="dbmutex raw" scripts/fleet-perf.sh   # the other order
#
# Needs perf (Debian linux-perf) and root (perf -a). Builds the bench with
# the `profiling` profile (release with line tables); OUT keeps the
# perf.data files (default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${N:-50}
names=${NAMES:-$n}
secs=${DURATION:-8}
out=${OUT:-$(mktemp -d -t dbmutex-fleet-perf.XXXXXX)}
mkdir -p "$out"
command -v perf >/dev/null || { echo "fleet-perf.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
cargo build -q --profile profiling -p dbmutex-bench
bench=$out/dbmutex-bench
cp "${CARGO_TARGET_DIR:-target}/profiling/dbmutex-bench" "$bench"

# shellcheck source=scripts/private-pg.sh
. scripts/private-pg.sh
cleanup() {
  exec 3>&- # EOF: the workers of a side cut short end too
  private_pg_stop
}
trap cleanup EXIT
private_pg_start $(( n + 40 > 100 ? n + 40 : 100 ))
url=$PRIVATE_PG_URL

for side in ${SIDES:-raw dbmutex}; do
  # perf starts first and records the whole run: started under the
  # fleet's load, it took seconds to begin sampling.
  start=$(( $(date +%s%3N) + 6000 + n * 40 ))
  end=$(( start + secs * 1000 ))
  perf record -q -a -F 1999 -o "$out/$side.perf" -- sleep $(( secs + 8 + n / 20 )) >/dev/null 2>&1 &
  perf_pid=$!
  # The workers' stdin: a FIFO whose one writer is this script (fd 3), so
  # a worker keeps its connection until the script closes it (EOF).
  mkfifo "$out/$side.stdin"
  exec 3<>"$out/$side.stdin"
  for i in $(seq 0 $((n - 1))); do
    "$bench" --database-url "$url" --scenario fleet-worker --fleet-side "$side" \
      --fleet-name "fleet-perf-$(( i % names ))" --fleet-app "fleet-perf-$side" \
      --fleet-start-ms "$start" --fleet-end-ms "$end" <"$out/$side.stdin" >"$out/$side.w$i" 2>&1 3>&- &
  done
  wait "$perf_pid" || true
  while [ "$(date +%s%3N)" -lt $(( end + 1500 )) ]; do sleep 0.2; done
  exec 3>&-
  wait
  acq=$(cat "$out/$side".w* | awk '/^waits/ { a += NF - 5 } END { print a + 0 }')
  echo "== $side: $acq acquisitions; samples per 1,000 acquisitions"
  [ "$acq" -gt 0 ] || { echo "fleet-perf.sh: no acquisitions on the $side side" >&2; exit 1; }
  perf report -n -i "$out/$side.perf" --sort comm,dso --stdio 2>/dev/null |
    awk -v a="$acq" '$1 ~ /%$/ && ($3 == "dbmutex-bench" || $3 == "postgres" || $3 == "dbmutex-timers") {
      printf "  %7.1f  %s %s\n", $2 * 1000 / a, $3, $4 }'
  echo "  the workers' own code, by crate:"
  perf report -n -i "$out/$side.perf" --comm dbmutex-bench --dso dbmutex-bench --sort sym --stdio 2>/dev/null |
    grep '\[\.\]' | python3 -c '
import collections, re, sys
a = int(sys.argv[1]); by = collections.Counter()
for line in sys.stdin:
    p = line.split(None, 3)
    m = re.match(r"<?([A-Za-z_0-9]+)", p[3].strip())
    by[m.group(1) if m else "?"] += int(p[1])
for crate, n in by.most_common(12):
    print("  %7.1f  %s" % (n * 1000 / a, crate))
' "$acq"
done
