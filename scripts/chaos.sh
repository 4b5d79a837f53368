#!/usr/bin/env bash
# Mutual exclusion under chaos (issue #6): several worker processes x tasks
# contend for a few lock names while faults are injected (pg_terminate_backend
# of lock holders, kill -9 of workers, cancelled acquires, PostgreSQL
# restarts). Prints sections, violations, losses, detection latency, leaks
# and faults by kind; exits non-zero on a violation or a leak.
#
#   scripts/chaos.sh [--short]   about 60 s, one server restart (CI runs this)
#   scripts/chaos.sh --long      600 s, a server restart every 120 s
#   scripts/chaos.sh --etcd [--short|--long]
#                                the same on a private 3-member etcd (the marks
#                                stay in the private PostgreSQL): lease revokes
#                                of random holders instead of terminates, and
#                                every 10 s a member killed (-9) and restarted,
#                                the leader every other time
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
etcd=0
while :; do
  case "${1:-}" in
    --short|--long) mode=$1; shift ;;
    --etcd) etcd=1; shift ;;
    *) break ;;
  esac
done

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
  # A free loopback port below the ephemeral range (10000-31999: no
  # outgoing connection takes it while the server restarts): nothing
  # answers there now; retry if the server loses a race for it.
  local port conf attempt
  conf=$(cat "$PG_DIR/data/postgresql.conf")
  for attempt in 1 2 3 4 5; do
    port=$(( 10000 + RANDOM % 22000 ))
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

# A private 3-member etcd on free 127.0.0.1 ports (data in a temp dir,
# removed at exit), and a helper that kills one member (`leader` or
# `random`) with SIGKILL and starts it again on its data.
# Six distinct free ports below the kernel's ephemeral range: a port from
# that range (what bind(0) hands out) can be taken by any outgoing
# connection, such as a chaos worker's, before a member binds it or while
# a killed member is down ("bind: address already in use").
free_ports_below_ephemeral() {
  python3 - <<'PY'
import random, socket
hi = 32767
try:
    hi = min(hi, int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0]) - 1)
except Exception:
    pass
ports = []
while len(ports) < 6:
    p = random.randint(10000, hi)
    if p in ports:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        ports.append(p)
    except OSError:
        pass
    finally:
        s.close()
print(" ".join(map(str, ports)))
PY
}

start_private_etcd() {
  local attempt
  for attempt in 1 2 3 4 5; do
    start_private_etcd_once && return 0
    # A port taken between the pick and the bind: new ports, a new cluster.
    if grep -qs "address already in use" "$ETCD_DIR"/m*.log && [ "$attempt" -lt 5 ]; then
      stop_private_etcd
      continue
    fi
    tail -n 20 "$ETCD_DIR"/m*.log >&2
    exit 1
  done
}

start_private_etcd_once() {
  ETCD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dbmutex-private-etcd-chaos-XXXXXX")
  local i ports=() cluster="" endpoints=""
  read -r -a ports <<<"$(free_ports_below_ephemeral)"
  for i in 0 1 2; do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$((i + 3))]}"
    endpoints+="${endpoints:+,}http://127.0.0.1:${ports[$i]}"
  done
  cat >"$ETCD_DIR/member.sh" <<SH
#!/usr/bin/env bash
# member.sh start|leader|random|N: start member N, or kill one and restart it.
set -euo pipefail
client=(${ports[0]} ${ports[1]} ${ports[2]}); peer=(${ports[3]} ${ports[4]} ${ports[5]})
run() {
  local state=\$2
  etcd --name "m\$1" --data-dir "$ETCD_DIR/m\$1" \\
    --listen-client-urls "http://127.0.0.1:\${client[\$1]}" --advertise-client-urls "http://127.0.0.1:\${client[\$1]}" \\
    --listen-peer-urls "http://127.0.0.1:\${peer[\$1]}" --initial-advertise-peer-urls "http://127.0.0.1:\${peer[\$1]}" \\
    --initial-cluster "$cluster" --initial-cluster-state "\$state" --initial-cluster-token "chaos-$$" \\
    --heartbeat-interval 50 --election-timeout 500 >>"$ETCD_DIR/m\$1.log" 2>&1 &
  echo \$! >"$ETCD_DIR/m\$1.pid"
}
healthy() {
  for _ in \$(seq 150); do
    ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --command-timeout=1s endpoint health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
case "\$1" in
  start) for i in 0 1 2; do run "\$i" new; done; healthy; exit ;;
  leader) i=\$(ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --command-timeout=2s endpoint status 2>/dev/null |
              awk -F', ' '\$5 == "true" { print \$1 }' | sed 's/.*://' | head -n1)
          for j in 0 1 2; do [ "\${client[\$j]}" = "\$i" ] && i=\$j && break; done ;;
  random) i=\$((RANDOM % 3)) ;;
  *) i=\$1 ;;
esac
case "\$i" in 0|1|2) ;; *) i=0 ;; esac
kill -9 "\$(cat "$ETCD_DIR/m\$i.pid")" 2>/dev/null || true
sleep 1
run "\$i" existing
healthy
SH
  chmod +x "$ETCD_DIR/member.sh"
  "$ETCD_DIR/member.sh" start || return 1
  export DBMUTEX_CHAOS_LOCK_URL="etcd://${endpoints//http:\/\//}"
  export DBMUTEX_CHAOS_MEMBER_CMD="$ETCD_DIR/member.sh"
  say "private etcd (3 members) at $DBMUTEX_CHAOS_LOCK_URL ($ETCD_DIR)"
}

stop_private_etcd() {
  if [ -n "${ETCD_DIR:-}" ]; then
    for f in "$ETCD_DIR"/m*.pid; do [ -f "$f" ] && { kill -9 "$(cat "$f")" 2>/dev/null || true; }; done
    rm -rf "$ETCD_DIR"
  fi
  return 0
}

if [ -z "${DBMUTEX_CHAOS_PG_URL:-}" ]; then
  start_private_pg
fi
if [ "$etcd" = 1 ]; then
  trap 'stop_private_etcd; stop_private_pg' EXIT
  start_private_etcd
fi
# Every feature. DBMUTEX_CHAOS_BIN names an example built already (.ci/run
# builds it with test.sh's targets and features, which reuses test.sh's
# build: `-p dbmutex` alone unifies other features and compiles the
# library again), and then no cargo runs here.
chaos_bin=${DBMUTEX_CHAOS_BIN:-}
if [ -z "$chaos_bin" ]; then
  cargo build -q -p dbmutex --all-features --example chaos
  chaos_bin=${CARGO_TARGET_DIR:-target}/debug/examples/chaos
fi
"$chaos_bin" run "$mode" "$@"
