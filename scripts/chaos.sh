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
# It RESTARTS the PostgreSQL server (pg_ctlcluster; override with
# DBMUTEX_PG_RESTART_CMD), which disturbs every other client of that server
# for a second or two: run it on a test machine, on the database host.
# Environment: DBMUTEX_TEST_PG_URL as for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=--short
case "${1:-}" in
  --short|--long) mode=$1; shift ;;
esac
cargo build -q -p dbmutex --example chaos
exec "${CARGO_TARGET_DIR:-target}/debug/examples/chaos" run "$mode" "$@"
