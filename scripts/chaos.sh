#!/usr/bin/env bash
# Mutual exclusion under chaos (issue #6): several worker processes x tasks
# contend for a few lock names while faults are injected (pg_terminate_backend
# of lock holders, kill -9 of workers, cancelled acquires, PostgreSQL
# restarts). Prints sections, violations, losses, detection latency, leaks
# and faults by kind; exits non-zero on a violation or a leak.
#
#   scripts/chaos.sh [--short]   about 60 s, one server restart (CI runs this)
#   scripts/chaos.sh --long      600 s, a server restart every 120 s
#   extra arguments go to `chaos run` (--secs N --restarts N --workers N --tasks N --names N)
#
# The faults hit a PRIVATE PostgreSQL that this script starts (initdb into
# $TMPDIR/dbmutex-private-pg-chaos-*, trust auth, fsync off, a free port on
# 127.0.0.1) and removes when it ends, even on failure or Ctrl-C; the shared
# test server (DBMUTEX_TEST_PG_URL) is never restarted nor touched. As root
# the server runs as the `postgres` OS user. PostgreSQL binaries come from
# DBMUTEX_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin.
#
# To run it against a server of your own instead (it will be restarted and
# its sessions terminated): DBMUTEX_CHAOS_PG_URL=... DBMUTEX_PG_RESTART_CMD=...
set -euo pipefail
cd "$(dirname "$0")/.."
mode=--short
case "${1:-}" in
  --short|--long) mode=$1; shift ;;
esac

say() { printf 'chaos.sh: %s\n' "$*" >&2; }

start_private_pg() {
  local bindir=${DBMUTEX_PG_BINDIR:-}
  if [ -z "$bindir" ]; then
    bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
    [ -n "$bindir" ] || bindir=$(dirname "$(command -v initdb)")
  fi
  local as_pg=()
  [ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --)
  PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dbmutex-private-pg-chaos-XXXXXX")
  # Who owns it (pid and start time): the Rust harness sweeps directories
  # whose owner is gone, should this script be killed before its trap runs.
  printf '%s %s' "$$" "$(sed -E 's/.*\) //' /proc/$$/stat | cut -d' ' -f20)" >"$PG_DIR/owner"
  [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR"
  PG_CTL=("${as_pg[@]}" "$bindir/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log")
  trap stop_private_pg EXIT
  trap 'exit 130' INT TERM HUP
  "${as_pg[@]}" "$bindir/initdb" -D "$PG_DIR/data" -A trust -U postgres -E UTF8 --no-sync --no-instructions >/dev/null
  # A free loopback port: nothing answers there now; retry if the server
  # loses a race for it.
  local port conf attempt
  conf=$(cat "$PG_DIR/data/postgresql.conf")
  for attempt in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 40000 ))
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
    cat >"$PG_DIR/data/postgresql.conf" <<CONF
$conf
# dbmutex chaos: private server
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG_DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 32MB
CONF
    "${PG_CTL[@]}" -w -t 120 start >/dev/null 2>&1 && break
    grep -q 'could not bind' "$PG_DIR/log" && [ "$attempt" -lt 5 ] && continue
    cat "$PG_DIR/log" >&2
    exit 1
  done
  PGSSLMODE=disable "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'CREATE DATABASE test'
  export DBMUTEX_CHAOS_PG_URL="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
  export DBMUTEX_PG_RESTART_CMD="${PG_CTL[*]} -m fast -w -t 120 restart >/dev/null"
  say "private PostgreSQL on 127.0.0.1:$port ($PG_DIR)"
}

stop_private_pg() {
  if [ -n "${PG_DIR:-}" ]; then
    [ -f "$PG_DIR/data/postmaster.pid" ] && "${PG_CTL[@]}" -m immediate -w -t 30 stop >/dev/null 2>&1
    rm -rf "$PG_DIR"
  fi
}

if [ -z "${DBMUTEX_CHAOS_PG_URL:-}" ]; then
  start_private_pg
fi
cargo build -q -p dbmutex --example chaos
"${CARGO_TARGET_DIR:-target}/debug/examples/chaos" run "$mode" "$@"
