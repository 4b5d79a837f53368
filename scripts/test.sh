#!/usr/bin/env bash
# Runs every test of the workspace against real servers.
#
# Makes sure PostgreSQL (127.0.0.1:5432, database `test`) and MariaDB
# (127.0.0.1:3306, database `test`) answer, starting them or installing them
# from Debian's packages when absent, and that pgbouncer is installed (the
# pooler tests start their own instance). Then runs `cargo test`.
#
# Environment:
#   DBMUTEX_TEST_PG_URL     PostgreSQL URL (default postgres://postgres@127.0.0.1:5432/test)
#   DBMUTEX_TEST_MYSQL_URL  MySQL/MariaDB URL (default mysql://root@127.0.0.1:3306/test)
#   DBMUTEX_SKIP_SERVICES=1 do not touch services (you manage them yourself)
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p dbmutex`).
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
    if [ ! -x /usr/sbin/mariadbd ]; then
      say "installing MariaDB from Debian's packages"
      apt_install mariadb-server mariadb-client
    fi
    say "starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql || true
    if ! wait_for 30 my_up; then
      # A fresh install lets root in by socket only: allow the empty password on TCP (test machines only).
      mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" || true
      wait_for 10 my_up || { say "MariaDB does not answer on 127.0.0.1:3306"; exit 1; }
    fi
  fi
  mariadb -h 127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS test'
}

ensure_pgbouncer() {
  command -v pgbouncer >/dev/null || { say "installing pgbouncer"; apt_install pgbouncer; }
}

if [ "${DBMUTEX_SKIP_SERVICES:-}" != 1 ]; then
  ensure_postgres
  ensure_mariadb
  ensure_pgbouncer
fi

say "running cargo test"
exec cargo test --workspace "$@"
