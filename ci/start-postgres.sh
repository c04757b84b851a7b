#!/usr/bin/env bash
# Make sure a PostgreSQL server for the pool tests answers on 127.0.0.1:5432 with a `test` database that
# the `postgres` role can use without a password (the default of PTEFARM_TEST_PG_URL:
# postgresql://postgres@127.0.0.1:5432/test).
#
# - already answering: nothing is started;
# - installed but stopped: the Debian cluster is started (pg_ctlcluster, no systemd needed);
# - not installed: `apt-get install postgresql`, local trust auth (a throwaway CI server), start.
# Exits non-zero with a message saying what failed. PTEFARM_TEST_PG_URL="" (explicitly empty) means the
# PostgreSQL tests are disabled: then this does nothing.
set -euo pipefail

HOST=127.0.0.1
PORT=5432
DB=test
ETC=${PTEFARM_PG_ETC:-/etc/postgresql}  # Debian's cluster configs (overridable for the script's test)

say() { echo "start-postgres: $*" >&2; }
die() { say "error: $*"; exit 1; }

if [[ -n "${PTEFARM_TEST_PG_URL+set}" && -z "${PTEFARM_TEST_PG_URL}" ]]; then
    say "PTEFARM_TEST_PG_URL is empty: PostgreSQL tests disabled, nothing to do"
    exit 0
fi

answers() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$HOST" -p "$PORT" -t 2
    else
        timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null
    fi
}

as_postgres() {  # run a client command as the postgres OS user over the local socket (peer or trust)
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

sudo_if_needed() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "need root for: $*"; fi
}

install_postgres() {
    say "PostgreSQL is not installed: installing it (apt-get install postgresql)"
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is not available"
    export DEBIAN_FRONTEND=noninteractive
    sudo_if_needed apt-get update -q >/dev/null || die "apt-get update failed"
    sudo_if_needed apt-get install -y -q postgresql >/dev/null || die "apt-get install postgresql failed"
    # A throwaway CI server: the postgres role may connect over loopback without a password.
    local hba
    hba=$(ls -d "$ETC"/*/main | head -n1)/pg_hba.conf
    [[ -f "$hba" ]] || die "no cluster config after install (expected $hba)"
    sudo_if_needed sh -c "printf 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' > '$hba'"
}

start_cluster() {
    local installed_now=0
    if [[ ! -d "$ETC" ]] || [[ -z "$(ls "$ETC" 2>/dev/null)" ]]; then
        install_postgres
        installed_now=1
    fi
    local version
    version=$(ls "$ETC" | sort -V | tail -n1)
    command -v pg_ctlcluster >/dev/null || die "pg_ctlcluster missing (package postgresql-common)"
    if [[ $installed_now == 1 ]] && answers; then
        # The package's post-install started the cluster: load the pg_hba.conf written above.
        sudo_if_needed pg_ctlcluster --skip-systemctl-redirect "$version" main reload \
            || die "pg_ctlcluster $version main reload failed"
        return 0
    fi
    say "starting cluster $version/main"
    sudo_if_needed pg_ctlcluster --skip-systemctl-redirect "$version" main start \
        || die "pg_ctlcluster $version main start failed; see /var/log/postgresql/postgresql-$version-main.log"
    for _ in $(seq 1 30); do
        answers && return 0
        sleep 1
    done
    die "cluster $version/main started but $HOST:$PORT does not answer after 30s"
}

if answers; then
    say "PostgreSQL answers on $HOST:$PORT"
else
    start_cluster
fi

psql_tcp() { psql -X -q -h "$HOST" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"; }
if psql_tcp -tAc "SELECT 1" >/dev/null 2>&1; then
    exists=$(psql_tcp -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")
    [[ "$exists" == 1 ]] || psql_tcp -c "CREATE DATABASE $DB" || die "cannot create database $DB"
elif as_postgres psql -X -q -d postgres -tAc "SELECT 1" >/dev/null 2>&1; then
    exists=$(as_postgres psql -X -q -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")
    [[ "$exists" == 1 ]] || as_postgres createdb "$DB" || die "cannot create database $DB"
    say "warning: role postgres cannot connect over TCP without a password; set PTEFARM_TEST_PG_URL"
else
    die "PostgreSQL answers on $HOST:$PORT but role postgres cannot log in (check pg_hba.conf)"
fi
say "ready: postgresql://postgres@$HOST:$PORT/$DB"
