# common.sh - sourced by bench/bench.sh and bench/multi.sh: the untar corpus and a private
# PostgreSQL cluster. The caller sets WORK (a work directory), QUICK (0/1) and defines log().
# shellcheck shell=bash

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---- corpus: a real source tree (the Swift package mirrors, or /usr/include), built once per
# work directory: $WORK/corpus.tar (~21k files here), or $WORK/corpus-quick.tar (~3.8k) with QUICK=1;
# BENCH_CORPUS names another tarball. Sets CORPUS and CFILES (its number of regular files).
make_corpus() {
    CORPUS=${BENCH_CORPUS:-$WORK/corpus$([ "$QUICK" = 1 ] && echo -quick).tar}
    if [ ! -f "$CORPUS" ]; then
        log "building corpus $CORPUS (once)"
        local stage n=0 repo d
        stage=$(mktemp -d "$WORK/stage.XXXX")
        if [ -d /opt/swift-packages ]; then
            for repo in $(find /opt/swift-packages -mindepth 2 -maxdepth 2 -type d -name '*.git' | LC_ALL=C sort); do
                git -C "$repo" rev-parse -q --verify HEAD >/dev/null 2>&1 || continue
                d="$stage/$(basename "$(dirname "$repo")")/$(basename "$repo" .git)"; mkdir -p "$d"
                git -C "$repo" archive HEAD | tar -x -C "$d" 2>/dev/null
                n=$(find "$stage" -type f | wc -l)
                [ "$QUICK" = 1 ] && [ "$n" -ge 3000 ] && break
            done
        else cp -a /usr/include "$stage/include"; fi
        tar --sort=name -C "$stage" -cf "$CORPUS" . && rm -rf "$stage"
    fi
    CFILES=$(tar -tvf "$CORPUS" | grep -c '^-')
}

# ---- a private PostgreSQL cluster: initdb as postgres, own port and socket directory under $WORK,
# as the tests do; one database "bench". start_pg sets PGROOT, PGPORT, PGBASE (the database's libpq
# URI, to which "&container=NAME" is added) and PGURI (the container "bench"); stop_pg stops it and
# removes its files (call it from an EXIT trap). PGBIN: the newest installed server, empty if none.
# BENCH_PG_SETTINGS: extra postgresql.conf lines (";"-separated), e.g. "shared_buffers = 2GB; max_wal_size = 8GB"
# (the default is initdb's settings, as Debian's server starts with).
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
PGROOT=""; PGPORT=""; PGBASE=""; PGURI=""
have_pg() { [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ]; }
start_pg() {
    PGROOT=$(mktemp -d "$WORK/pg.XXXX"); chown postgres:postgres "$PGROOT"; PGPORT=$(free_port)
    runuser -u postgres -- "$PGBIN/initdb" -D "$PGROOT/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --no-sync -E UTF8 --locale=C > "$PGROOT/initdb.log" 2>&1 || { cat "$PGROOT/initdb.log" >&2; return 1; }
    printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = '127.0.0.1'\n" "$PGPORT" "$PGROOT" >> "$PGROOT/data/postgresql.auto.conf"
    [ -z "${BENCH_PG_SETTINGS:-}" ] || printf '%s\n' "${BENCH_PG_SETTINGS//;/$'\n'}" >> "$PGROOT/data/postgresql.auto.conf"
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/server.log" -w -t 60 start > /dev/null || { cat "$PGROOT/server.log" >&2; return 1; }
    runuser -u postgres -- "$PGBIN/createdb" -h "$PGROOT" -p "$PGPORT" -U postgres bench || return 1
    PGBASE="postgresql:///bench?host=$PGROOT&port=$PGPORT&user=postgres"
    PGURI="$PGBASE&container=bench"
    log "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on port $PGPORT, socket $PGROOT${BENCH_PG_SETTINGS:+, settings: $BENCH_PG_SETTINGS}"
}
# The postmaster's pid (empty when the cluster is not running).
pg_pid() { [ -n "$PGROOT" ] && head -1 "$PGROOT/data/postmaster.pid" 2>/dev/null; }
stop_pg() {
    [ -n "$PGROOT" ] || return 0
    if [ -f "$PGROOT/data/postmaster.pid" ]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGROOT/data" -m fast -w -t 60 stop > /dev/null 2>&1 \
            || runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGROOT/data" -m immediate -w stop > /dev/null 2>&1
    fi
    rm -rf "$PGROOT"; PGROOT=""
}
