#!/usr/bin/env bash
# Start (or stop) a project-local Postgres and Redis under .data/, for the demo
# and the test suite, and the demo vendor (the fake payments API the refund-desk
# agent calls, at AGENT_WORKER_VENDOR_URL's default). Idempotent: a service
# already answering is left alone.
#   deploy/local/services.sh start|stop|status
# As root, Postgres runs as the postgres user, which must be able to enter the
# data folder: a checkout under a mode-700 folder (root's home on Debian) keeps
# Postgres's data under /var/lib/agent-worker/ instead (one folder per checkout).
# Postgres: scram-sha-256 over TCP (no trust), and the three roles of every
# deploy path (deploy/k8s/postgres-roles.sql): agent_worker_owner owns database
# agent_worker and its schema (`agent-worker db upgrade` connects as it);
# agent_worker, the app role, has DML only there, and may CREATE DATABASE
# (the test suite's databases, which it owns); agent_worker_system (BYPASSRLS,
# a member of agent_worker) is for the workers, sweeper and beat
# (AGENT_WORKER_SYSTEM_DATABASE_URL). None is a superuser. Their generated
# passwords are in .data/pg-owner-password, pg-password and pg-system-password
# and the libpq passfile ($PGPASSFILE, else ~/.pgpass), so URLs need no
# password. A data folder of an older version of this script (trust,
# superuser, the app role owning the tables) is migrated at start.
# Ports: Postgres 54329, Redis 63799 (the defaults of AGENT_WORKER_DATABASE_URL
# and AGENT_WORKER_BROKER_URL), so they never clash with a system install.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
data="${AGENT_WORKER_DATA_DIR:-$root/.data}"
pg_port="${PG_PORT:-54329}"
redis_port="${REDIS_PORT:-63799}"
vendor_port="${VENDOR_PORT:-63800}"
# The checkout's virtual environment's python (deploy/local/install.sh), for the vendor.
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
pgbin="$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | tail -1)"

as_pg() {
  # initdb and postgres refuse to run as root.
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_dir() {
  # Where Postgres keeps its data: $data/pg when the postgres user can enter
  # $data, else a folder of its own under /var/lib/agent-worker (initdb would
  # fail with "could not access directory ...: Permission denied").
  if [ "$(id -u)" != 0 ] || runuser -u postgres -- test -x "$data" 2>/dev/null; then
    echo "$data/pg"
  else
    echo "/var/lib/agent-worker/$(printf %s "$root" | sha256sum | cut -c1-12)/pg"
  fi
}

start_pg() {
  mkdir -p "$data"
  local pg
  pg="$(pg_dir)"
  if [ "$pg" != "$data/pg" ]; then
    install -d -m 755 "$(dirname "$pg")"
    echo "postgres: data in $pg (the postgres user cannot enter $data)"
  fi
  if [ ! -s "$pg/PG_VERSION" ]; then
    mkdir -p "$pg"
    [ "$(id -u)" = 0 ] && chown postgres "$pg" && chmod 700 "$pg"
    # Never trust: passwords (scram-sha-256) over TCP from the first start on.
    as_pg "$pgbin/initdb" -D "$pg" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
      -E UTF8 >/dev/null
    pg_auth_files "$pg"
  fi
  if ! as_pg "$pgbin/pg_isready" -h 127.0.0.1 -p "$pg_port" -q; then
    [ "$(id -u)" = 0 ] && chown -R postgres "$pg"
    as_pg "$pgbin/pg_ctl" -D "$pg" -l "$pg/server.log" -w -t 60 \
      -o "-p $pg_port -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
  fi
  if pg_ours "$pg"; then
    secure_pg "$pg"
    echo "postgres: postgresql+psycopg://agent_worker@127.0.0.1:$pg_port/agent_worker" \
      "(password in $data/pg-password and $(passfile))"
  else
    # Another checkout's server answers on this port: not ours to reconfigure.
    echo "postgres: postgresql+psycopg://agent_worker@127.0.0.1:$pg_port/agent_worker" \
      "(served from another data directory; left as it is)"
  fi
}

pg_ours() {
  # Is the server on $pg_port the one running from this data folder? Its
  # postmaster.pid names the port (line 4) and a live pid (line 1).
  local pidfile="$1/postmaster.pid"
  [ "$(as_pg sed -n 4p "$pidfile" 2>/dev/null)" = "$pg_port" ] &&
    kill -0 "$(as_pg sed -n 1p "$pidfile" 2>/dev/null)" 2>/dev/null
}

passfile() { echo "${PGPASSFILE:-$HOME/.pgpass}"; }

pg_auth_files() {
  # Peer auth on the socket for the postgres superuser only (mapped from the OS
  # user that runs the server: postgres as root, else the caller), and
  # scram-sha-256 for every TCP client. Replaces initdb's rules, or an older
  # version of this script's trust.
  local pg="$1" me
  me="$(as_pg id -un)"
  printf '# Written by deploy/local/services.sh.\nowner %s postgres\n' "$me" |
    as_pg sh -c 'cat > "$1"' _ "$pg/pg_ident.conf"
  printf '%s\n' '# Written by deploy/local/services.sh: no trust anywhere.' \
    'local all postgres peer map=owner' \
    'host all all 127.0.0.1/32 scram-sha-256' \
    'host all all ::1/128 scram-sha-256' |
    as_pg sh -c 'cat > "$1"' _ "$pg/pg_hba.conf"
}

secure_pg() {
  # The three roles of deploy/k8s/postgres-roles.sql, none a superuser (so
  # COPY ... TO PROGRAM and friends are refused); each logs in with a
  # generated password kept in $data (mode 600) and in the libpq passfile
  # ($PGPASSFILE, else ~/.pgpass) that the app and the tests read. Also
  # migrates a data folder of an older script (trust auth, superuser role, the
  # app role owning database agent_worker and its tables: handed to the owner).
  local pg="$1" pw file
  if ! as_pg grep -q 'no trust anywhere' "$pg/pg_hba.conf" 2>/dev/null ||
     ! as_pg grep -q '^owner ' "$pg/pg_ident.conf" 2>/dev/null; then
    pg_auth_files "$pg"
    as_pg "$pgbin/pg_ctl" -D "$pg" reload >/dev/null
    sleep 0.5
  fi
  pw="$(secret_file "$data/pg-password")"
  # The system role (AGENT_WORKER_SYSTEM_DATABASE_URL): workers, the sweeper
  # and beat act for every tenant, so they skip the row-level policies
  # (BYPASSRLS) that bind every API caller; a member of agent_worker, so it
  # has the app role's privileges and nothing more. The owner runs the
  # migrations only. Each its own password file.
  local syspw ownerpw
  syspw="$(secret_file "$data/pg-system-password")"
  ownerpw="$(secret_file "$data/pg-owner-password")"
  # The app role may CREATE DATABASE here only: the test suite creates (and
  # owns) a database per session.
  # Passwords in the environment of psql (read by the roles file's \getenv),
  # never in argv: they stay out of the process list.
  # One at a time (test sessions, one per xdist worker, start the services at
  # the same moment): two concurrent ALTER ROLEs fail "tuple concurrently
  # updated". The lock is held for these statements only: no daemon inherits it.
  {
  flock 9
  as_pg "$pgbin/psql" -h /tmp -p "$pg_port" -U postgres -d postgres -qtA -v ON_ERROR_STOP=1 \
    >/dev/null <<'SQL'
SELECT 'CREATE DATABASE agent_worker'
  WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'agent_worker') \gexec
SQL
  AGENT_WORKER_OWNER_PASSWORD="$ownerpw" AGENT_WORKER_APP_PASSWORD="$pw" \
    AGENT_WORKER_SYSTEM_PASSWORD="$syspw" as_pg "$pgbin/psql" -h /tmp -p "$pg_port" \
    -U postgres -d agent_worker -qtA -v ON_ERROR_STOP=1 \
    -v app_createdb=CREATEDB \
    -f - <"$root/deploy/k8s/postgres-roles.sql" >/dev/null  # stdin: postgres may not read $root
  } 9>"$data/roles.lock"
  file="$(passfile)"
  (umask 077 && touch "$file")
  { grep -v -E "^(127\.0\.0\.1|localhost):$pg_port:\*:agent_worker(_system|_owner)?:" \
      "$file" || true
    for host in 127.0.0.1 localhost; do
      echo "$host:$pg_port:*:agent_worker:$pw"
      echo "$host:$pg_port:*:agent_worker_system:$syspw"
      echo "$host:$pg_port:*:agent_worker_owner:$ownerpw"
    done; } > "$file.new.$$"
  chmod 600 "$file.new.$$" && mv "$file.new.$$" "$file"
}

secret_file() {
  # A generated password kept in $1 (mode 600), made on first use.
  if [ ! -s "$1" ]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr '+/' '-_' > "$1")
  fi
  chmod 600 "$1"
  cat "$1"
}

start_redis() {
  mkdir -p "$data/redis"
  if ! redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
    redis-server "$root/deploy/redis/redis.conf" --port "$redis_port" --bind 127.0.0.1 \
      --dir "$data/redis" --daemonize yes --logfile "$data/redis.log" \
      --pidfile "$data/redis.pid" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  echo "redis: redis://127.0.0.1:$redis_port/0"
}

vendor_up() { (exec 3<>"/dev/tcp/127.0.0.1/$vendor_port") 2>/dev/null; }

start_vendor() {
  if ! vendor_up; then
    if ! (cd "$root" && "$py" -c "import agent_worker.demo.vendor") >/dev/null 2>&1; then
      echo "vendor: not started (the package is not installed yet: deploy/local/install.sh)"
      return 0
    fi
    # Launched from Python: Popen closes every inherited descriptor (a shell
    # background job would keep the caller's pipes open, and whoever captures
    # this script's output would wait for the vendor to exit).
    (cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$vendor_port" "$data" <<'PY'
import subprocess, sys
port, data = sys.argv[1], sys.argv[2]
with open(f"{data}/vendor.log", "ab") as log:
    proc = subprocess.Popen([sys.executable, "-m", "agent_worker.demo.vendor", "--port", port,
                             "--db", f"{data}/vendor.db"], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
with open(f"{data}/vendor.pid", "w") as out:
    out.write(f"{proc.pid}\n")
PY
    )
    for _ in $(seq 100); do vendor_up && break; sleep 0.1; done
    vendor_up || { echo "vendor: did not start; see $data/vendor.log" >&2; return 1; }
  fi
  echo "vendor: http://127.0.0.1:$vendor_port (demo payments API for refund-desk)"
}

stop_vendor() {
  local pid
  pid="$(cat "$data/vendor.pid" 2>/dev/null || true)"
  # The pid must still be our vendor (after a reboot it may be anyone's).
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
       grep -q agent_worker.demo.vendor && kill "$pid" 2>/dev/null; then
    rm -f "$data/vendor.pid"
    echo "stopped demo vendor (port $vendor_port)"
  else
    echo "demo vendor was not running from $data"
  fi
}

case "${1:-start}" in
  start) start_pg; start_redis; start_vendor ;;
  stop)
    pg="$(pg_dir)"
    if as_pg "$pgbin/pg_ctl" -D "$pg" -m fast stop >/dev/null 2>&1; then
      echo "stopped postgres (port $pg_port, data in $pg)"
    else
      echo "postgres was not running from $pg"
    fi
    # Only the Redis this checkout started (its pidfile): another checkout's may
    # answer on the same port.
    if [ -s "$data/redis.pid" ] && redis-cli -p "$redis_port" ping >/dev/null 2>&1 &&
       [ "$(redis-cli -p "$redis_port" info server | tr -d '\r' | sed -n 's/^process_id://p')" \
         = "$(cat "$data/redis.pid")" ]; then
      redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
      echo "stopped redis (port $redis_port)"
    else
      echo "redis was not running from $data"
    fi
    stop_vendor ;;
  status)
    as_pg "$pgbin/pg_isready" -h 127.0.0.1 -p "$pg_port"; redis-cli -p "$redis_port" ping ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
