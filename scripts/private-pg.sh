# Sourced by the benchmark scripts (fleet.sh, fleet-perf.sh): a private
# PostgreSQL of their own, so the server's CPU is the run's alone.
#
#   private_pg_start MAX_CONNECTIONS   # initdb into a temp dir, start it on a
#                                      # free 127.0.0.1 port; sets
#                                      # PRIVATE_PG_URL (and PRIVATE_PG_DIR)
#   private_pg_stop                    # stop it, remove the dir (call it
#                                      # from the script's EXIT trap)
#
# DBMUTEX_PG_BINDIR names the server's bin directory (default: the newest
# /usr/lib/postgresql/*/bin). As root, the server runs as `postgres`.

private_pg_bindir=${DBMUTEX_PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}
PRIVATE_PG_DIR=

private_pg_as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

private_pg_start() {
  [ -x "$private_pg_bindir/initdb" ] || { echo "$0: no initdb (apt-get install postgresql)" >&2; exit 1; }
  PRIVATE_PG_DIR=$(mktemp -d -t dbmutex-private-pg-bench.XXXXXX)
  [ "$(id -u)" != 0 ] || chown postgres "$PRIVATE_PG_DIR"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  private_pg_as_pg "$private_pg_bindir/initdb" -D "$PRIVATE_PG_DIR/data" -A trust -U postgres >/dev/null
  cat >>"$PRIVATE_PG_DIR/data/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PRIVATE_PG_DIR'
max_connections = $1
fsync = off
full_page_writes = off
EOC
  private_pg_as_pg "$private_pg_bindir/pg_ctl" -D "$PRIVATE_PG_DIR/data" -l "$PRIVATE_PG_DIR/log" -w start >/dev/null
  PRIVATE_PG_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
}

private_pg_stop() {
  [ -n "$PRIVATE_PG_DIR" ] || return 0
  private_pg_as_pg "$private_pg_bindir/pg_ctl" -D "$PRIVATE_PG_DIR/data" stop -m immediate >/dev/null 2>&1 || true
  rm -rf "$PRIVATE_PG_DIR"
}
