#!/usr/bin/env bash
# A throwaway PostgreSQL for the store tests, on 127.0.0.1:55432.
#   eval "$(bash scripts/postgres.sh)"    # install if needed, init, start; exports KVLAB_TEST_POSTGRES_URL
#   bash scripts/postgres.sh stop         # stop it (the data directory stays for the next start)
#   bash scripts/postgres.sh status       # exit 0 if it is up, else 1 (installs and starts nothing)
# Idempotent: when the server is already up it only prints the export line. Everything but that
# line goes to stderr, so the output can be eval'ed. The cluster lives in $KVLAB_PG_DIR
# (default /tmp/kvlab-postgres), is owned by the `postgres` user when run as root (the server
# refuses to run as root), listens on loopback only and holds nothing worth keeping.
set -euo pipefail

PORT="${KVLAB_PG_PORT:-55432}"
DATA="${KVLAB_PG_DIR:-/tmp/kvlab-postgres}"
USER_NAME=kvlab
PASSWORD=kvlab-test-only
DATABASE=kvlab_test
URL="postgresql+psycopg://${USER_NAME}:${PASSWORD}@127.0.0.1:${PORT}/${DATABASE}"

log() { echo "postgres.sh: $*" >&2; }

find_bindir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return
  fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; fi
}

BIN=$(find_bindir)
if [ "${1:-}" = status ]; then
  [ -n "$BIN" ] || exit 1
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$BIN/pg_isready" -q -h "$DATA" -p "$PORT"; else
    "$BIN/pg_isready" -q -h "$DATA" -p "$PORT"; fi
  exit $?
fi
if [ -z "$BIN" ]; then
  [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed; run as root or: apt-get install postgresql"; exit 1; }
  log "installing PostgreSQL (apt-get)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  BIN=$(find_bindir)
fi

# The server refuses to run as root: as root, run its commands as the `postgres` user.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "${1:-}" = stop ]; then
  as_owner "$BIN/pg_ctl" -D "$DATA" -m fast stop >&2 || true
  exit 0
fi

psql_admin() {
  as_owner "$BIN/psql" -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt "$@"
}

ready() { as_owner "$BIN/pg_isready" -q -h "$DATA" -p "$PORT"; }

if ! ready; then
  if [ ! -s "$DATA/PG_VERSION" ]; then
    log "initialising a cluster in $DATA"
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown postgres: "$DATA"
    chmod 700 "$DATA"
    # Local (socket) connections trust the OS user; TCP needs the password.
    as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --no-instructions >&2
  fi
  # A server that was killed (the end of a session kills everything) may take a moment to go;
  # until it has, its pid file makes a new one refuse to start: retry for a while.
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    log "starting on 127.0.0.1:$PORT (attempt $attempt)"
    if as_owner "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 start \
        -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" >&2; then
      break
    fi
    sleep 2
    ready && break
  done
  ready || { log "the server did not start; its log:"; tail -n 20 "$DATA/server.log" >&2; exit 1; }
fi

if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$USER_NAME'")" != 1 ]; then
  psql_admin -c "CREATE ROLE $USER_NAME LOGIN PASSWORD '$PASSWORD'"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" != 1 ]; then
  psql_admin -c "CREATE DATABASE $DATABASE OWNER $USER_NAME"
fi

echo "export KVLAB_TEST_POSTGRES_URL=$URL"
