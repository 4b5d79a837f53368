#!/usr/bin/env bash
# Runs every test of the workspace against real servers.
#
# Makes sure PostgreSQL (127.0.0.1:5432, database `test`) and MariaDB
# (127.0.0.1:3306, database `test`) answer, starting them or installing them
# from Debian's packages when absent, and that pgbouncer, pgpool2, openssl,
# flock(1), faketime, etcd (etcd-server, etcd-client), protoc
# (protobuf-compiler, which the `etcd` feature's build needs), iproute2 and
# nftables (the silent-partition tests) are installed
# (the pooler tests start their own pgbouncer or pgpool, the etcd tests a
# private 3-member cluster; the cron test plays hosts with skewed clocks). Then
# runs every test of `cargo test --workspace --all-features --no-fail-fast`
# (every optional integration, such as sqlx, is tested too), so one failure
# never hides the others: the test binaries that cargo builds, two at a
# time (below, "Two test binaries at a time"), then the doctests. Ends with
# a one-line summary (passed, failed, ignored, test binaries run); the exit
# status is non-zero when anything failed.
#
# The shared servers only see ordinary lock traffic: tests that fill the
# lock table, restart a server or need special settings (TLS, a plugin)
# start private servers of their own (initdb / mariadb-install-db into
# $TMPDIR/dbmutex-private-*, on free 127.0.0.1 ports; see
# crates/dbmutex/tests/common/private*.rs), and remove them when they end.
# The tests assume nothing else of the shared servers (TLS, name
# resolution, plugins).
#
# Environment:
#   DBMUTEX_TEST_PG_URL     PostgreSQL URL (default postgres://postgres@127.0.0.1:5432/test)
#   DBMUTEX_TEST_MYSQL_URL  MySQL/MariaDB URL (default mysql://root@127.0.0.1:3306/test)
#   DBMUTEX_SKIP_SERVICES=1 do not touch services (you manage them yourself)
#   LANES=1                 cargo runs the test binaries, one at a time
#   TEST_TIMEOUT            seconds one test binary may run (default 900, the
#                           longest takes ~70 s): past it, the binary and the
#                           processes it started are killed, its output so far
#                           printed, and the run fails, instead of a hung test
#                           holding CI silent until the job's own limit (not
#                           with LANES=1 or arguments: cargo runs them then)
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p dbmutex`),
# which then runs the binaries itself, one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'test.sh: %s\n' "$*" >&2; }

apt_install() {
  if [ -z "${APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # wait_for SECONDS COMMAND...
  local n=$(( $1 * 10 )); shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
pg_sql() { psql -h 127.0.0.1 -U postgres -d postgres -Atqc "$1"; }

ensure_postgres() {
  if command -v pg_isready >/dev/null && pg_up; then :; else
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      say "installing PostgreSQL from Debian's packages"
      apt_install postgresql postgresql-client
      local ver; ver=$(ls /etc/postgresql | sort -V | tail -n1)
      # Test machines only: trust loopback connections, as the test URLs expect.
      sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' \
        "/etc/postgresql/$ver/main/pg_hba.conf"
    fi
    local ver; ver=$(ls /etc/postgresql | sort -V | tail -n1)
    say "starting PostgreSQL $ver"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    wait_for 30 pg_up || { say "PostgreSQL does not answer on 127.0.0.1:5432"; exit 1; }
  fi
  if [ "$(pg_sql "SELECT 1 FROM pg_database WHERE datname = 'test'" 2>/dev/null)" != 1 ]; then
    pg_sql "CREATE DATABASE test" || su postgres -c "createdb test"
  fi
}

my_up() { mariadb -h 127.0.0.1 -P 3306 -uroot -e 'SELECT 1' >/dev/null 2>&1; }

ensure_mariadb() {
  if command -v mariadb >/dev/null && my_up; then :; else
    local installed=
    if [ ! -x /usr/sbin/mariadbd ]; then
      say "installing MariaDB from Debian's packages"
      apt_install mariadb-server mariadb-client
      installed=1
    fi
    say "starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql || true
    if ! wait_for 30 my_up; then
      if [ -z "$installed" ]; then
        # Never weaken a server this script did not install.
        say "MariaDB does not let root in without a password on 127.0.0.1:3306, and test.sh"
        say "changes no authentication of a server it did not install: run the tests with"
        say "DBMUTEX_SKIP_SERVICES=1 DBMUTEX_TEST_MYSQL_URL=mysql://USER:PASSWORD@127.0.0.1:3306/test"
        say "(a user that may create databases and users), or allow root on TCP yourself"
        exit 1
      fi
      # The server just installed lets root in by socket only: allow the empty password on TCP.
      mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
      wait_for 10 my_up || { say "MariaDB does not answer on 127.0.0.1:3306"; exit 1; }
    fi
  fi
  mariadb -h 127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS test'
}

ensure_tools() {
  command -v pgbouncer >/dev/null || { say "installing pgbouncer"; apt_install pgbouncer; }
  command -v pgpool >/dev/null || { say "installing pgpool2"; apt_install pgpool2; }
  command -v openssl >/dev/null || { say "installing openssl"; apt_install openssl; }
  [ -x /usr/bin/flock ] || { say "installing util-linux (flock)"; apt_install util-linux; }
  command -v faketime >/dev/null || { say "installing faketime"; apt_install faketime; }
  command -v etcd >/dev/null || { say "installing etcd-server"; apt_install etcd-server; }
  command -v etcdctl >/dev/null || { say "installing etcd-client"; apt_install etcd-client; }
  command -v protoc >/dev/null || { say "installing protobuf-compiler"; apt_install protobuf-compiler; }
  # The silent partitions: `ip netns` and blackhole rules (iproute2), and
  # nftables to drop one etcd member's packets (tests/common/netns.rs).
  command -v ip >/dev/null || { say "installing iproute2"; apt_install iproute2; }
  command -v nft >/dev/null || { say "installing nftables"; apt_install nftables; }
  # Reads cargo's list of test binaries.
  command -v python3 >/dev/null || { say "installing python3"; apt_install python3; }
}

if [ "${DBMUTEX_SKIP_SERVICES:-}" != 1 ]; then
  ensure_postgres
  ensure_mariadb
  ensure_tools
fi

log=$(mktemp "${TMPDIR:-/tmp}/dbmutex-test.XXXXXX")
outdir=$(mktemp -d "${TMPDIR:-/tmp}/dbmutex-test-out.XXXXXX")
trap 'rm -rf "$log" "$outdir"' EXIT
start=$(date +%s)

# The test binaries, one per line: weight (its seconds on a 2-core CI
# machine, session 25; 1 for one not listed), target name, executable,
# the package's directory (cargo runs a test binary there), source path.
weights='cli=70 behaviour=60 fleet=55 postgres_backend=38 pgbouncer=33 etcd_backend=25
  secrets=15 lock_delay=15 mysql_backend=14 pgpool=10 caller=10 failover=10 mysql_faults=9
  fencing=7 passwords=6 upgrade=6 pooler_reset=5 lock_budget=5 multihost=5 etcd=4 security=4'
list_binaries() {
  python3 -c '
import json, os, sys
weights = dict(w.split("=") for w in sys.argv[1].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    src = t["src_path"]
    pkg = os.path.dirname(m["manifest_path"])
    rel = os.path.relpath(src, pkg)
    label = rel if "test" in t["kind"] else "unittests " + rel
    print(weights.get(t["name"], "1") if "test" in t["kind"] else "1", t["name"], m["executable"], pkg, label, sep="\t")
' "$weights"
}

# One test binary: run in its package's directory, as cargo runs it, for at
# most TEST_TIMEOUT seconds; its output printed whole (under a lock, so two
# never interleave) once it ends.
run_one() {
  local weight name exe pkg label
  IFS=$'\t' read -r weight name exe pkg label <<<"$1"
  local out="$outdir/$(basename "$exe")"
  local t0=$SECONDS rc=0
  # timeout(1) puts the binary in a process group of its own, with what it
  # starts there: past TEST_TIMEOUT the binary gets TERM (KILL 10 s later
  # if still there), and then whatever is left of the group KILL. Started
  # in the background and waited for, so that a Ctrl-C or a TERM to
  # test.sh reaches that group too, not only this shell.
  (cd "$pkg" && exec timeout --kill-after=10 "$TEST_TIMEOUT" "$exe") >"$out" 2>&1 &
  local group=$!
  trap 'kill -TERM -- -"$group" 2>/dev/null; sleep 2; kill -KILL -- -"$group" 2>/dev/null; exit 130' INT TERM HUP
  wait "$group" || rc=$?
  trap - INT TERM HUP
  case "$rc" in 124 | 137) kill -KILL -- -"$group" 2>/dev/null ;; esac
  {
    flock 9
    printf '     Running %s (%s)\n' "$label" "$exe"
    cat "$out"
    case "$rc" in
      0) ;;
      124) printf 'test.sh: %s did not end within TEST_TIMEOUT=%s s: killed (its output so far is above)\n' "$label" "$TEST_TIMEOUT" ;;
      137) printf 'test.sh: %s was killed by SIGKILL (past TEST_TIMEOUT=%s s and deaf to SIGTERM, or killed by something else)\n' "$label" "$TEST_TIMEOUT" ;;
      *) printf 'test.sh: %s exited with status %d\n' "$label" "$rc" ;;
    esac
    printf 'test.sh: %s took %d s\n' "$label" $((SECONDS - t0)) >&2
  } 9>"$outdir/.lock"
  [ "$rc" = 0 ]
}
export -f run_one
export outdir

set +e
if [ "$#" -gt 0 ] || [ "${LANES:-2}" = 1 ]; then
  # Arguments for cargo (a package, a filter): cargo runs the binaries, one
  # at a time.
  say "running cargo test --workspace --all-features --no-fail-fast $*"
  cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
else
  # Two test binaries at a time (LANES, default 2; LANES=1: cargo runs them
  # one by one): most of a binary's time is spent waiting on servers,
  # processes and timers (CI, session 25: the four longest used 22-64 % of
  # one core), so the suite takes ~40 % less time. The binaries whose
  # claims are about CPU or timing under load (the fleet of 50 processes,
  # the local backend's fairness) run alone, first; the rest longest first.
  lanes=${LANES:-2}
  # xargs -P 0 would start every binary at once.
  [[ "$lanes" =~ ^[1-9][0-9]*$ ]] || { say "LANES must be a positive number, not '$lanes'"; exit 64; }
  export TEST_TIMEOUT=${TEST_TIMEOUT:-900}
  [[ "$TEST_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { say "TEST_TIMEOUT must be a positive number of seconds, not '$TEST_TIMEOUT'"; exit 64; }
  say "running cargo test --workspace --all-features --no-fail-fast, $lanes test binaries at a time"
  binaries=$(cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics | list_binaries)
  status=${PIPESTATUS[0]}
  if [ "$status" != 0 ] || [ -z "$binaries" ]; then
    say "the tests did not build"
    [ "$status" != 0 ] || status=1
  else
    alone=$'^[0-9]+\t(fleet|local_fairness)\t'
    {
      grep -E "$alone" <<<"$binaries" | while IFS= read -r b; do run_one "$b" || echo failed >>"$outdir/.failed"; done
      grep -vE "$alone" <<<"$binaries" | sort -t$'\t' -k1,1nr |
        tr '\n' '\0' | xargs -0 -P "$lanes" -I{} bash -c 'run_one "$1" || echo failed >>"$outdir/.failed"' _ {}
      cargo test --workspace --all-features --doc 2>&1 || echo failed >>"$outdir/.failed"
    } | tee "$log"
    [ ! -s "$outdir/.failed" ] || status=1
  fi
fi
set -e
# Sum the `test result:` lines; every test binary (and doctest run) prints
# one, unless it crashed or did not build.
summary=$(awk -v secs=$(( $(date +%s) - start )) '
  /^ +Running / || /^ +Doc-tests / { bins++ }
  /^test result:/ {
    results++
    if ($3 == "FAILED.") failed_bins++
    for (i = 2; i <= NF; i++) {
      if ($i ~ /^passed;?$/) p += $(i-1)
      if ($i ~ /^failed;?$/) f += $(i-1)
      if ($i ~ /^ignored;?$/) ig += $(i-1)
    }
  }
  END {
    printf "%d passed, %d failed, %d ignored; %d test binaries run, %d with failures, %d without a result; %d s",
      p, f, ig, bins, failed_bins, bins - results, secs
    if (f > 0 || bins != results || bins == 0) exit 1
  }' "$log") || { [ "$status" != 0 ] || status=1; }
if [ "$status" = 0 ]; then
  say "PASS: $summary"
else
  say "FAIL (cargo exit $status): $summary"
  # The failed tests (libtest's `failures:` lists), targets (cargo's last
  # lines) and binaries that ended without a result (timed out, crashed).
  grep -E '^    [A-Za-z0-9_:]+$|^    `|^error: |^test\.sh: .*(did not end|was killed|exited with status)' "$log" |
    tail -n 40 >&2 || true
fi
exit "$status"
