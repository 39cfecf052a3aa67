# pg_lib.sh — a throw-away PostgreSQL 15 server for one e2e script (source it
# after lib.sh):
#
#   pg_start            initdb in $work/pg as the `postgres` system user (the
#                       server refuses to run as root), listening on
#                       127.0.0.1 on a free port with its unix socket in the
#                       same folder; creates the database `ckpt` and sets
#                       $pg_url (postgresql://ckpt@127.0.0.1:PORT/ckpt),
#                       $pg_port and $pg_dir. Waits for readiness by polling
#                       pg_isready (a ceiling that only catches a hang).
#   pg_kill9            kill -9 of the server: the postmaster and every one of
#                       its processes at once (a machine that loses power),
#                       waiting until they are gone; pg_restart then starts
#                       it again on the same port and folder (crash recovery).
#   pg_stop             pg_ctl stop -m immediate (its processes are not the
#                       script's children): the script's on_exit calls it.
#   pg_psql SQL         runs SQL in the database as its owner; rows on stdout,
#                       unaligned, '|' between columns.
#
# The server's own files stay in $work/pg, which lib.sh empties at exit.

pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
pg_user=${PG_USER:-postgres}
pg_dir=
pg_port=
pg_url=

# as_pg CMD...: CMD as the unprivileged server user (as ourselves when we are not root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u "$pg_user" -- "$@"; else "$@"; fi
}

pg_start() {
    [ -x "$pg_bin/initdb" ] || fail "no $pg_bin/initdb (make deps installs postgresql)"
    pg_dir=$work/pg
    mkdir -p "$pg_dir"
    if [ "$(id -u)" -eq 0 ]; then
        getent passwd "$pg_user" >/dev/null || fail "no '$pg_user' user to run PostgreSQL as (Debian's postgresql package makes it)"
        # The server user must reach $work: our scratch folder only, never its parents.
        chmod o+x "$work"
        chown "$pg_user" "$pg_dir"
        as_pg test -w "$pg_dir" || fail "the '$pg_user' user cannot reach $pg_dir (a parent folder is not searchable)"
    fi
    as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U ckpt --auth=trust --no-sync -E UTF8 --locale=C.UTF-8 >"$pg_dir/initdb.log" 2>&1 ||
        fail "initdb failed: $(tail -n 5 "$pg_dir/initdb.log")"
    local try
    for try in 1 2 3 4 5; do
        # A free port now; another process may take it before the server binds (then retry).
        pg_port=$("$py" -S -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        if pg_server_start; then break; fi
        grep -q "could not bind\|already in use" "$pg_dir/server.log" 2>/dev/null || fail "PostgreSQL did not start: $(tail -n 5 "$pg_dir/server.log")"
        pg_port=
    done
    [ -n "$pg_port" ] || fail "PostgreSQL found no free port in 5 tries"
    wait_until 60 "PostgreSQL to accept connections" "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -U ckpt -d postgres
    as_pg "$pg_bin/createdb" -h "$pg_dir" -p "$pg_port" -U ckpt ckpt || fail "createdb failed"
    pg_url="postgresql://ckpt@127.0.0.1:$pg_port/ckpt"
}

# pg_server_start: the server on $pg_dir/data and $pg_port; waits for it (pg_ctl -w).
pg_server_start() {
    # fsync off: the test's data is thrown away, and durability of the server itself is not under test.
    as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -s \
        -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_dir -c fsync=off -c full_page_writes=off -c max_connections=60" \
        start -w -t 60 >>"$pg_dir/ctl.log" 2>&1
}

pg_restart() {
    pg_server_start || fail "PostgreSQL did not start again: $(tail -n 5 "$pg_dir/server.log")"
    wait_until 60 "PostgreSQL to accept connections again" "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -U ckpt -d postgres
}

pg_kill9() {
    local pm procs p
    pm=$(head -n 1 "$pg_dir/data/postmaster.pid")
    [ -n "$pm" ] && kill -0 "$pm" 2>/dev/null || fail "no PostgreSQL postmaster to kill (pid '$pm')"
    procs="$pm $(pgrep -P "$pm" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # a list of pids
    kill -9 $procs
    # Reaped, not only dead: the postmaster's parent is init, which reaps its
    # zombie when it gets to it, and a new postmaster refuses to start while
    # the pid in postmaster.pid still answers kill -0 (a zombie does).
    for p in $procs; do wait_until 60 "PostgreSQL's process $p to be reaped" test ! -e "/proc/$p"; done
}

pg_stop() {
    [ -n "$pg_dir" ] && [ -f "$pg_dir/data/postmaster.pid" ] || return 0
    as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -s -m immediate stop >/dev/null 2>&1 || true
}

pg_psql() {
    "$pg_bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U ckpt -d ckpt -c "$1"
}

# Helpers for scripts whose daemons share the database's queue:
#   col ID EXPR         EXPR of job ID, read straight from the database
#                       (cheaper than a ckpt process per poll)
#   state_is ID STATE   job ID is in STATE;  running_pid ID: it runs in a worker
#   parent_of PID       PID's parent (gone PID: lib.sh)
col() { pg_psql "SELECT $2 FROM jobs WHERE id = $1"; }
state_is() { [ "$(col "$1" state)" = "$2" ]; }
running_pid() { [ "$(col "$1" "state = 'running' AND worker_pid > 0")" = t ]; }
parent_of() { awk '/^PPid:/ {print $2}' "/proc/$1/status"; }
