#!/usr/bin/env bash
# The etcd benchmarks of BENCHMARKS.md ("etcd beside PostgreSQL"): on a
# private 3-member etcd this script starts (Debian's etcd-server; members on
# free 127.0.0.1 ports, data in a temp dir, stopped and removed on exit),
# dbmutex-bench's rtt, floor, uncontended, contended and fairness scenarios
# beside the raw etcd floor (etcd's own concurrency.Mutex recipe on the same
# client crate, crates/dbmutex-bench/src/raw_etcd.rs) in the same run, then
# the same scenarios on PostgreSQL (DATABASE_URL) in the same round, then
# the fleet scenario on etcd (N separate processes, raw floor beside).
# Rounds are interleaved (etcd, PostgreSQL, etcd, …) so a drift of a shared
# machine weighs on both; the summary gives medians and ranges.
#
#   scripts/etcd-bench.sh                       # 3 rounds, 5 s, fleet N = 2 50 200
#   ROUNDS=1 DURATION=2 FLEET_PROCS=2 scripts/etcd-bench.sh
#
# Environment: DATABASE_URL (PostgreSQL; PG=0 skips it), ROUNDS, DURATION,
# CLIENTS (contended tasks, each on a locker of its own, like processes),
# FLEET_PROCS (FLEET=0 skips the fleet; SCENARIOS=0 runs only the fleet), OUT (directory for the JSON lines),
# DBMUTEX_ETCD_BINDIR (etcd programs, else PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-8}
SCENARIOS=${SCENARIOS:-1}
FLEET=${FLEET:-1}
FLEET_PROCS=${FLEET_PROCS:-"2 50 200"}
PG=${PG:-1}
OUT=${OUT:-$(mktemp -d -t dbmutex-etcd-bench.XXXXXX)}
mkdir -p "$OUT"
bin() { if [ -n "${DBMUTEX_ETCD_BINDIR:-}" ]; then echo "$DBMUTEX_ETCD_BINDIR/$1"; else echo "$1"; fi; }
for tool in "$(bin etcd)" "$(bin etcdctl)" jq cargo python3; do
    command -v "$tool" >/dev/null || { echo "etcd-bench.sh: $tool is missing (apt-get install etcd-server etcd-client jq)" >&2; exit 1; }
done

dir=$(mktemp -d -t dbmutex-private-etcd-bench.XXXXXX)
pids=()
cleanup() {
    [ "${#pids[@]}" -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=() peer=()
for i in 0 1 2; do client+=("$(free_port)"); peer+=("$(free_port)"); done
cluster="m0=http://127.0.0.1:${peer[0]},m1=http://127.0.0.1:${peer[1]},m2=http://127.0.0.1:${peer[2]}"
for i in 0 1 2; do
    "$(bin etcd)" --name "m$i" --data-dir "$dir/m$i" \
        --listen-client-urls "http://127.0.0.1:${client[$i]}" --advertise-client-urls "http://127.0.0.1:${client[$i]}" \
        --listen-peer-urls "http://127.0.0.1:${peer[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$i]}" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "bench-$$" \
        >"$dir/m$i.log" 2>&1 &
    pids+=("$!")
done
endpoints="http://127.0.0.1:${client[0]},http://127.0.0.1:${client[1]},http://127.0.0.1:${client[2]}"
for _ in $(seq 100); do
    ETCDCTL_API=3 "$(bin etcdctl)" --endpoints "$endpoints" --command-timeout=2s endpoint health >/dev/null 2>&1 && break
    sleep 0.2
done
ETCDCTL_API=3 "$(bin etcdctl)" --endpoints "$endpoints" endpoint health >/dev/null || { tail "$dir"/m*.log >&2; exit 1; }
ETCD_URL="etcd://127.0.0.1:${client[0]},127.0.0.1:${client[1]},127.0.0.1:${client[2]}"

cargo build --release -q -p dbmutex-bench --features etcd 2>/dev/null || cargo build --release -p dbmutex-bench --features etcd
BENCH="${CARGO_TARGET_DIR:-target}/release/dbmutex-bench"

echo "== $(nproc) cores, $(uname -sr); etcd $("$(bin etcd)" --version | awk '/etcd Version/ {print $3}') x3 on loopback (data in $(df --output=fstype "$dir" | tail -n1), fsync on); ${DURATION} s per scenario, $ROUNDS interleaved rounds"
echo "== JSON lines in $OUT"
common=(--duration "$DURATION" --clients "$CLIENTS" --lockers "$CLIENTS" --json)
for r in $(seq "$ROUNDS"); do
    [ "$SCENARIOS" = 1 ] || break
    echo "-- round $r: etcd" >&2
    "$BENCH" --database-url "$ETCD_URL" --scenario all "${common[@]}" | jq -c ". + {round: $r}" >>"$OUT/scenarios.jsonl"
    if [ "$PG" = 1 ]; then
        echo "-- round $r: PostgreSQL" >&2
        for s in rtt floor uncontended contended fairness; do
            "$BENCH" --database-url "$DATABASE_URL" --scenario "$s" "${common[@]}" | jq -c ". + {round: $r}" >>"$OUT/scenarios.jsonl"
        done
    fi
done

if [ "$SCENARIOS" = 1 ]; then
# Medians (range) per backend and scenario row; ratios to the floor of the
# same backend and round (PostgreSQL's scenarios run one process each).
jq -rs '
  def med: sort | .[(length - 1) / 2 | floor];
  def mr(f): (map(f) | map(select(. != null))) as $v
    | if ($v | length) == 0 then "-" else "\($v | med) (\($v | min)–\($v | max))" end;
  (map(select(.scenario == "floor" and .clients == 1)) | map({key: "\(.backend)/\(.round)", value: .ops_per_s}) | from_entries) as $f1
  | (map(select(.scenario == "floor-contended")) | map({key: "\(.backend)/\(.round)", value: .ops_per_s}) | from_entries) as $fc
  | map(if .scenario == "uncontended" or .scenario == "contended"
        then .ratio_to_floor = ((.ops_per_s / $f1["\(.backend)/\(.round)"]) * 1000 | round / 1000)
        else . end
      | if .scenario == "contended" and $fc["\(.backend)/\(.round)"] != null
        then .ratio_to_contended_floor = ((.ops_per_s / $fc["\(.backend)/\(.round)"]) * 1000 | round / 1000)
        else . end)
  | group_by([.backend, .scenario, .clients, (.waiter // .strategy // "")])[]
  | "\(.[0].backend)\t\(.[0].scenario)\t\(.[0].clients)\t\(.[0].waiter // .[0].strategy // "")\tops/s \(mr(.ops_per_s | round))\tp50 µs \(mr(.p50_us))\tp99 µs \(mr(.p99_us))\tratio \(mr(.ratio_to_floor))\tcontended ratio \(mr(.ratio_to_contended_floor))\thandoff p50 µs \(mr(.handoff_p50_us))\tshare \(mr(.handoff_share))\tmax wait ms \(mr(.max_wait_ms))"
' "$OUT/scenarios.jsonl" | column -t -s $'\t'
fi

[ "$FLEET" = 1 ] || exit 0
echo "== fleet on etcd: raw concurrency.Mutex processes, then dbmutex, per round; server CPU = the 3 members'"
export DBMUTEX_BENCH_SERVER_PIDS="${pids[*]}"
for n in $FLEET_PROCS; do
    for names in 1 "$n"; do
        for r in $(seq "$ROUNDS"); do
            "$BENCH" --database-url "$ETCD_URL" --scenario fleet --procs "$n" --names "$names" \
                --duration "$DURATION" --json | jq -c ". + {round: $r}" >>"$OUT/fleet.jsonl"
        done
        [ "$names" != "$n" ] || break
    done
done
jq -rs '
  def med: sort | .[(length - 1) / 2 | floor];
  def mr(f): (map(f) | map(select(. != null))) as $v
    | if ($v | length) == 0 then "-" else "\($v | med) (\($v | min)–\($v | max))" end;
  group_by([.clients, .names, .side])[]
  | "N=\(.[0].clients)\tnames=\(.[0].names)\t\(.[0].side)\tacq/s \(mr(.ops_per_s | round))\tp99 ms \(mr((.p99_us // 0) / 100 | round / 10))\tcpu ms/acq \(mr(.server_cpu_ms_per_acq))\tratio \(mr(.ratio_to_raw))\tcpu x \(mr(.cpu_ratio_to_raw))"
' "$OUT/fleet.jsonl" | column -t -s $'\t'
