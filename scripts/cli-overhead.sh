#!/usr/bin/env bash
# What `dbmutex run` adds to the command it wraps: the median wall time of
# `true`, `flock FILE true`, the database's own client taking the same lock
# (`psql -c "SELECT pg_try_advisory_lock(..)"`, `mariadb -e "SELECT
# GET_LOCK(..)"`; none for local), on PostgreSQL the raw floor (`raw-run`:
# connect, try, run the command, unlock, in a minimal tokio-postgres
# program) and `dbmutex run NAME -- true`, on each backend, measured in the
# same run. Prints one JSON object per backend.
#
# Usage: scripts/cli-overhead.sh [RUNS]          (default 200 runs per command)
#
# Environment:
#   DBMUTEX                 the binary (default: the dist build under
#                           $CARGO_TARGET_DIR, else target/; build it with
#                           `cargo build --profile dist -p dbmutex-cli`)
#   DBMUTEX_TEST_PG_URL     PostgreSQL URL (default postgres://postgres@127.0.0.1:5432/test);
#                           without an sslmode, sslmode=disable is added (as
#                           bench.sh does): the floor is plaintext, and on a
#                           server with ssl=on the TLS handshake would add
#                           ~2 ms to dbmutex and psql alike
#   RAW_RUN                 the floor's binary (default: the dist build of
#                           dbmutex-bench's raw-run beside DBMUTEX; build it
#                           with `cargo build --profile dist -p dbmutex-bench
#                           --bin raw-run`); timed only with sslmode=disable
#   DBMUTEX_TEST_MYSQL_URL  MySQL/MariaDB URL (default mysql://root@127.0.0.1:3306/test)
#   BACKENDS                which backends (default "local postgres mysql")
#   BASELINE                a second dbmutex binary (e.g. an earlier build), timed
#                           in the same rounds: "baseline_run_ms" in the output
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

runs=${1:-200}
dbmutex=${DBMUTEX:-${CARGO_TARGET_DIR:-target}/dist/dbmutex}
pg_url=${DBMUTEX_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
case $pg_url in
  *sslmode=*) ;;
  *\?*) pg_url="$pg_url&sslmode=disable" ;;
  *) pg_url="$pg_url?sslmode=disable" ;;
esac
raw_run=${RAW_RUN:-$(dirname "$dbmutex")/raw-run}
mysql_url=${DBMUTEX_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
true_bin=$(command -v true | grep / || echo /bin/true)
[ -x "$true_bin" ] || true_bin=/bin/true

if [ ! -x "$dbmutex" ]; then
  echo "cli-overhead.sh: no binary at $dbmutex; run cargo build --profile dist -p dbmutex-cli" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Timed from fresh copies in one directory, as `cargo install` leaves a
# binary: run in place, the linker's output (a hard link under target/)
# started 0.45 ms slower than a copy of the same bytes, which made the
# baseline's comparison unfair.
cp "$dbmutex" "$work/dbmutex" && dbmutex=$work/dbmutex
if [ -n "${BASELINE:-}" ]; then
  cp "$BASELINE" "$work/dbmutex-baseline" && BASELINE=$work/dbmutex-baseline
fi
case $pg_url in
  *sslmode=disable*)
    if [ ! -x "$raw_run" ]; then
      echo "cli-overhead.sh: no floor binary at $raw_run; run cargo build --profile dist -p dbmutex-bench --bin raw-run" >&2
      exit 1
    fi
    cp "$raw_run" "$work/raw-run" && raw_run=$work/raw-run ;;
  *) raw_run= ;;
esac
name="cli-overhead-$$"

# elapsed_us CMD...: runs CMD once and prints its wall time in microseconds
# ($EPOCHREALTIME costs no fork).
elapsed_us() {
  local s=$EPOCHREALTIME
  "$@" >/dev/null
  local e=$EPOCHREALTIME
  echo $((${e/./} - ${s/./}))
}

# median_ms: the median of the microsecond figures on stdin, in milliseconds.
median_ms() {
  sort -n | awk '{ t[NR] = $1 } END { m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2; printf "%.3f", m / 1000 }'
}

# use_backend BACKEND: sets the environment that selects BACKEND (call it in
# a subshell; no `env` wrapper, whose exec would count in the timing).
use_backend() {
  unset DBMUTEX_DATABASE_URL DATABASE_URL
  case $1 in
    local) export DBMUTEX_LOCK_DIR="$work/locks" ;;
    postgres) export DBMUTEX_DATABASE_URL="$pg_url" ;;
    mysql) export DBMUTEX_DATABASE_URL="$mysql_url" ;;
    *) echo "cli-overhead.sh: unknown backend $1" >&2; return 1 ;;
  esac
}

# client_us BACKEND: the database's own command-line client taking a lock
# and leaving (its disconnect releases it), in microseconds; nothing for
# local, or when the client is not installed.
client_us() {
  case $1 in
    postgres) if command -v psql >/dev/null; then
      elapsed_us psql -X -q -At -c "SELECT pg_try_advisory_lock(4242)" "$pg_url"
    fi ;;
    mysql) local c; c=$(command -v mariadb || command -v mysql) || return 0
      # mysql://user[:pass]@host:port/db, the one shape this script's default has.
      local rest=${mysql_url#mysql://} user host port
      user=${rest%%@*} && rest=${rest#*@} && host=${rest%%:*} && port=${rest#*:} && port=${port%%/*}
      elapsed_us "$c" -u"${user%%:*}" -h "$host" -P "$port" --protocol=tcp -N -e "SELECT GET_LOCK('cli-overhead', 0)" ;;
  esac
}

for backend in ${BACKENDS:-local postgres mysql}; do
  if ! (use_backend "$backend" && "$dbmutex" run -n "$name" -- "$true_bin"); then
    echo "cli-overhead.sh: dbmutex run fails on the $backend backend" >&2
    exit 1
  fi
  # Interleaved, so that load from elsewhere weighs on all of them alike.
  : >"$work/t_true" && : >"$work/t_flock" && : >"$work/t_dbmutex" && : >"$work/t_client" && : >"$work/t_base" && : >"$work/t_raw"
  # The floor: PostgreSQL only (the key is any integer of its own).
  floor=
  if [ "$backend" = postgres ] && [ -n "$raw_run" ]; then
    floor=1
    "$raw_run" "$pg_url" 4243 "$true_bin" || { echo "cli-overhead.sh: raw-run fails" >&2; exit 1; }
  fi
  for ((i = -5; i < runs; i++)); do # the first 5 rounds warm up
    a=$(elapsed_us "$true_bin")
    b=$(elapsed_us flock "$work/flock" "$true_bin")
    # The head, the baseline and the floor in an order that turns over
    # every four rounds: each of head and baseline runs first (right
    # after true and flock, which follow the last round's psql, whose
    # backend may still be exiting) in one round of four, the floor in
    # two; the floor never runs right after psql. (A fixed or two-round
    # order put one binary 0.14-0.34 ms apart from itself, A/A.)
    e= f=
    case $((((i % 4) + 4) % 4)) in
      0) order="c e f" ;;
      1) order="f e c" ;;
      2) order="e c f" ;;
      *) order="f c e" ;;
    esac
    for x in $order; do
      case $x in
        c) c=$(use_backend "$backend" && elapsed_us "$dbmutex" run "$name" -- "$true_bin") ;;
        e) [ -z "${BASELINE:-}" ] || e=$(use_backend "$backend" && elapsed_us "$BASELINE" run "$name" -- "$true_bin") ;;
        f) [ -z "$floor" ] || f=$(elapsed_us "$raw_run" "$pg_url" 4243 "$true_bin") ;;
      esac
    done
    d=$(client_us "$backend")
    if ((i >= 0)); then
      echo "$a" >>"$work/t_true" && echo "$b" >>"$work/t_flock" && echo "$c" >>"$work/t_dbmutex"
      [ -z "$d" ] || echo "$d" >>"$work/t_client"
      [ -z "$e" ] || echo "$e" >>"$work/t_base"
      [ -z "$f" ] || echo "$f" >>"$work/t_raw"
    fi
  done
  t_true=$(median_ms <"$work/t_true")
  t_flock=$(median_ms <"$work/t_flock")
  t_dbmutex=$(median_ms <"$work/t_dbmutex")
  t_client=null
  [ ! -s "$work/t_client" ] || t_client=$(median_ms <"$work/t_client")
  base=
  [ ! -s "$work/t_base" ] || base=,\"baseline_run_ms\":$(median_ms <"$work/t_base")
  raw=
  if [ -s "$work/t_raw" ]; then
    t_raw=$(median_ms <"$work/t_raw")
    raw=,\"raw_floor_ms\":$t_raw,\"x_raw_floor\":$(awk -v d="$t_dbmutex" -v r="$t_raw" 'BEGIN { printf "%.3f", d / r }')
  fi
  printf '{"backend":"%s","runs":%d,"true_ms":%s,"flock_ms":%s,"db_client_ms":%s,"dbmutex_run_ms":%s%s%s}\n' \
    "$backend" "$runs" "$t_true" "$t_flock" "$t_client" "$t_dbmutex" "$raw" "$base"
done
