#!/usr/bin/env bash
# The fleet benchmark (BENCHMARKS.md, "Fleets"): N separate processes locking
# in a loop on 1 name and on N names, dbmutex with its defaults beside the raw
# floor (the same N processes, `pg_advisory_lock` + `pg_advisory_unlock` on one
# connection each) in the same run, on a private PostgreSQL this script starts
# (initdb into a temp dir, a free 127.0.0.1 port; removed on exit), so the
# server's CPU per acquisition is the fleet's alone.
#
#   scripts/fleet.sh                   # N = 2, 50, 200; 5 s per side
#   PROCS="50" DURATION=3 scripts/fleet.sh
#   LOAD=1 scripts/fleet.sh            # with a busy loop beside it
#   CALIBRATE=1 scripts/fleet.sh       # A/A: the raw floor in dbmutex's place
#
# Environment: BENCH_BIN (a dbmutex-bench binary to run instead of building
# this checkout's, for an A/B of two commits), PROCS (list of N), DURATION (seconds per side), ROUNDS (runs per
# case, interleaved, the raw floor first in odd rounds and dbmutex first in
# even ones; the summary line is their median, default 3), WARMUP
# (seconds of one round of both sides run before each case's rounds and
# not counted, default 2; 0: none), LOAD (busy loops beside the run), MAX_CONNECTIONS (default 100, PostgreSQL's; raised to
# fit the largest N plus room: every process of both sides holds one
# connection), OUT (directory for the JSON lines), CALIBRATE (1: a second raw
# floor runs where dbmutex would, labelled raw-b: how far apart the harness
# puts two identical sides; a ratio read against it), PAD_LINES (with
# CALIBRATE=1: the second raw floor also runs that many cache lines of code
# of its own per acquisition, src/pad.rs; an experiment).
#
# Columns: throughput, p99 wait, server connections at peak, server CPU per
# acquisition; for dbmutex's side, against the raw floor's: throughput,
# server CPU, and the workers' own CPU per acquisition in user space and in
# the kernel (user x, kern x).
set -euo pipefail
cd "$(dirname "$0")/.."

PROCS=${PROCS:-"2 50 200"}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
LOAD=${LOAD:-0}
WARMUP=${WARMUP:-2}
CALIBRATE=${CALIBRATE:-0}
calibrate=()
[ "$CALIBRATE" = 0 ] || calibrate=(--fleet-calibrate --fleet-pad-lines "${PAD_LINES:-0}")
OUT=${OUT:-$(mktemp -d -t dbmutex-fleet.XXXXXX)}
mkdir -p "$OUT"
max_n=$(tr ' ' '\n' <<<"$PROCS" | sort -n | tail -n1)
MAX_CONNECTIONS=${MAX_CONNECTIONS:-$(( max_n + 40 > 100 ? max_n + 40 : 100 ))}

# shellcheck source=scripts/private-pg.sh
. scripts/private-pg.sh
hogs=()
cleanup() {
    [ "${#hogs[@]}" -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true
    private_pg_stop
}
trap cleanup EXIT
private_pg_start "$MAX_CONNECTIONS"
URL=$PRIVATE_PG_URL
dir=$PRIVATE_PG_DIR

if [ -n "${BENCH_BIN:-}" ]; then
    # Another build's binary (an A/B of two commits, one run each).
    cp "$BENCH_BIN" "$dir/dbmutex-bench"
else
    cargo build --release -q -p dbmutex-bench 2>/dev/null || cargo build --release -p dbmutex-bench
    # A copy, so that a build started beside the run cannot change the
    # binary between its rounds.
    cp "${CARGO_TARGET_DIR:-target}/release/dbmutex-bench" "$dir/dbmutex-bench"
fi
BENCH="$dir/dbmutex-bench"

for _ in $(seq "$LOAD"); do
    sh -c 'while :; do :; done' &
    hogs+=("$!")
done

echo "== fleet: $(nproc) cores; private PostgreSQL $("$private_pg_bindir/postgres" --version | awk '{print $3}'), max_connections $MAX_CONNECTIONS; busy loops beside: $LOAD; ${DURATION} s per side"
printf '%-5s %-6s %-8s %10s %9s %7s %12s %8s %8s %8s %8s\n' N names side "acq/s" "p99 ms" conns "cpu ms/acq" ratio "cpu x" "user x" "kern x"
for n in $PROCS; do
    for names in 1 "$n"; do
        : >"$OUT/case.jsonl"
        # A round not counted: twice a case's first round (on a server
        # just started) put dbmutex at 0.38-0.42 x where the rounds after
        # it gave 0.64-0.87 (BENCHMARKS.md, session 16; not explained).
        if [ "$WARMUP" != 0 ]; then
            "$BENCH" --database-url "$URL" --scenario fleet --procs "$n" --names "$names" \
                --duration "$WARMUP" --json "${calibrate[@]}" >"$OUT/warmup.jsonl"
        fi
        # ROUNDS runs of both sides: interleaved, so a drift of the machine
        # weighs on both; raw first in odd rounds, dbmutex first in even
        # ones, so what the second side of a run meets weighs on both too.
        # The summary is the median ratio, the median of each order, and
        # their geometric mean ("balanced"): the second side's handicap
        # (0.91-0.97 x in every A/A round beside a busy loop, its inverse
        # when first) cancels there (A/A: 1.00 and 1.03).
        for r in $(seq "$ROUNDS"); do
            order=()
            [ $((r % 2)) = 1 ] || order=(--fleet-ours-first)
            "$BENCH" --database-url "$URL" --scenario fleet --procs "$n" --names "$names" \
                --duration "$DURATION" --json "${calibrate[@]}" "${order[@]}" | tee -a "$OUT/fleet.jsonl" "$OUT/case.jsonl" |
                jq -r '[.clients, .names, .side, (.ops_per_s | round), ((.p99_us // 0) / 1000 | . * 10 | round / 10),
                         (.connections // "-"), (.server_cpu_ms_per_acq // "-"), (.ratio_to_raw // "-"), (.cpu_ratio_to_raw // "-"),
                         (.client_user_ratio_to_raw // "-"), (.client_kernel_ratio_to_raw // "-")]
                        | @tsv' |
                while IFS=$'\t' read -r c k s o p cn cpu r cx ux kx; do
                    printf '%-5s %-6s %-8s %10s %9s %7s %12s %8s %8s %8s %8s\n' "$c" "$k" "$s" "$o" "$p" "$cn" "$cpu" "$r" "$cx" "$ux" "$kx"
                done
        done
        jq -rs 'map(select(.side != "raw")) as $d
                | def med(f): ($d | map(f) | sort | .[(length - 1) / 2 | floor]);
                  def order(o): ($d | map(select(.first == o) | .ratio_to_raw) | sort);
                  def omed(o): (order(o) | if length == 0 then null else .[(length - 1) / 2 | floor] end);
                  def by(o): (if omed(o) == null then "-" else "\(omed(o)) of \(order(o) | length)" end);
                  def balanced: (if omed("raw") == null or omed("ours") == null then "-"
                                 else (omed("raw") * omed("ours")) | sqrt | . * 1000 | round / 1000 end);
                "=> N=\($d[0].clients) names=\($d[0].names): median of \($d | length): \(med(.ratio_to_raw)) x raw throughput, \(med(.cpu_ratio_to_raw)) x raw server CPU per acquisition, \(med(.client_user_ratio_to_raw)) x raw client user time (range \($d | map(.ratio_to_raw) | min)-\($d | map(.ratio_to_raw) | max)); raw first \(by("raw")), ours first \(by("ours")); balanced \(balanced)"' \
            "$OUT/case.jsonl"
        [ "$names" != "$n" ] || break
    done
done
echo "== JSON lines in $OUT/fleet.jsonl"
