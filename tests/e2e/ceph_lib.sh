# ceph_lib.sh — a throw-away single-node Ceph cluster with an S3 gateway
# (radosgw), for the tests of blobs on S3-compatible storage. Source it after
# lib.sh:
#
#   . "$E2E_DIR/lib.sh"; . "$E2E_DIR/ceph_lib.sh"
#   ceph_start            # a monitor, one OSD (memstore), radosgw on 127.0.0.1
#
# ceph_start makes everything in $work/ceph (one generated ceph.conf names
# every path: data, run dir, pid files, admin sockets, logs, the keyring;
# cephx inside the cluster with one keyring, S3 requests are signed as on any S3 store), waits
# until the gateway answers (a poll, never a fixed sleep), creates an S3 user
# and exports:
#   AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
#   ceph_port (the gateway's port) and ceph_dir
# The cluster is stopped at the script's exit (ceph_stop: SIGTERM to each
# daemon by its pid file, SIGKILL after a grace period); on a start that fails
# the error names the daemon and shows the tail of its log.
# Debian's ceph-mon, ceph-osd, radosgw and ceph-common (make deps); no
# ceph-mgr. Measured here: ~4 s to start, ~140 MB resident for the three.

ceph_dir=
ceph_port=
# CEPH_OBJECTSTORE=bluestore (bench/s3.sh): the OSD keeps its data in a
# sparse file of CEPH_BLUESTORE_GB (default 24) in the folder, not in memory
# (memstore, the default: 2 GiB, ample for the tests).
CEPH_OBJECTSTORE=${CEPH_OBJECTSTORE:-memstore}

ceph_objectstore_conf() {
    if [ "$CEPH_OBJECTSTORE" = bluestore ]; then
        printf '%s\n' "osd objectstore = bluestore" "bluestore block create = true" \
            "bluestore block size = $((${CEPH_BLUESTORE_GB:-24} << 30))" "bluestore fsck on mount = false" \
            "osd memory target = 1073741824"
    else
        printf '%s\n' "osd objectstore = memstore" "memstore device bytes = 2147483648"
    fi
}

# ceph_free_ports N: N distinct free TCP ports on 127.0.0.1, one per line.
ceph_free_ports() {
    "$py" -S - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
for s in socks:
    print(s.getsockname()[1])
EOF
}

# ceph_daemon_fail NAME MSG: fail with the tail of NAME's log.
ceph_daemon_fail() {
    local log="$ceph_dir/$1.log"
    [ -f "$log" ] && { echo "--- $1.log (tail)"; tail -n 25 "$log"; } >&2
    [ -f "$ceph_dir/$1.out" ] && { echo "--- $1 output"; tail -n 25 "$ceph_dir/$1.out"; } >&2
    fail "ceph: $2"
}

# ceph_cmd ARGS...: the ceph CLI on this cluster, with a ceiling on the wait
# for the monitor (a hang, not a measure of speed).
ceph_cmd() { ceph -c "$ceph_dir/ceph.conf" --connect-timeout 60 "$@"; }

ceph_start() {
    local t0 p ports mon_port rgw_port fsid
    for p in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph; do
        command -v "$p" >/dev/null || fail "ceph: $p is not installed (make deps installs ceph-mon ceph-osd radosgw ceph-common)"
    done
    t0=$(date +%s%N)
    ceph_dir=$work/ceph
    mkdir -p "$ceph_dir/mon.a" "$ceph_dir/osd.0" "$ceph_dir/run"
    # The monitor's and the gateway's ports are free ones of the kernel's
    # ephemeral range; the OSD takes the first free port of 6800-7568 (below
    # that range), so clusters of concurrent tests do not collide.
    mapfile -t ports < <(ceph_free_ports 2)
    mon_port=${ports[0]} rgw_port=${ports[1]}
    fsid=$(cat /proc/sys/kernel/random/uuid)
    cat >"$ceph_dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind msgr2 = true
ms bind port min = 6800
ms bind port max = 7568
client mount timeout = 60
rados mon op timeout = 60
run dir = $ceph_dir/run
admin socket = $ceph_dir/run/\$name.asok
pid file = $ceph_dir/run/\$name.pid
log file = $ceph_dir/\$name.log
log to stderr = false
err to stderr = true
log to syslog = false
crash dir = $ceph_dir/crash
keyring = $ceph_dir/keyring
exec dir = $ceph_dir/run
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 1
mon data avail warn = 2
mon osd full ratio = 0.99
mon osd nearfull ratio = 0.98
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
paxos propose interval = 0.01
paxos min wait = 0.01
mon data = $ceph_dir/mon.\$id
osd data = $ceph_dir/osd.\$id
$(ceph_objectstore_conf)
osd crush update on start = true
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw thread pool size = 32
rgw data = $ceph_dir/rgw
EOF
    monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$ceph_dir/monmap" >"$ceph_dir/monmaptool.out" 2>&1 ||
        ceph_daemon_fail monmaptool "monmaptool failed"
    # One keyring holds every daemon's key; the monitor's mkfs imports them
    # all into its database (cephx, as a real cluster runs).
    ceph-authtool --create-keyring "$ceph_dir/keyring" --gen-key -n mon. --cap mon 'allow *' >"$ceph_dir/keyring.out" 2>&1 &&
        ceph-authtool "$ceph_dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
            --cap mgr 'allow *' >>"$ceph_dir/keyring.out" 2>&1 &&
        ceph-authtool "$ceph_dir/keyring" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap osd 'allow *' \
            >>"$ceph_dir/keyring.out" 2>&1 &&
        ceph-authtool "$ceph_dir/keyring" --gen-key -n client.rgw.a --cap mon 'allow rw' --cap osd 'allow rwx' \
            >>"$ceph_dir/keyring.out" 2>&1 || ceph_daemon_fail keyring "ceph-authtool failed"
    ceph-mon -c "$ceph_dir/ceph.conf" --mkfs -i a --monmap "$ceph_dir/monmap" >"$ceph_dir/mon.a.out" 2>&1 ||
        ceph_daemon_fail mon.a "ceph-mon --mkfs failed"
    ceph-mon -c "$ceph_dir/ceph.conf" -i a >>"$ceph_dir/mon.a.out" 2>&1 || ceph_daemon_fail mon.a "ceph-mon did not start"
    local uuid
    uuid=$(cat /proc/sys/kernel/random/uuid)
    ceph_cmd osd new "$uuid" >"$ceph_dir/osd-new.out" 2>&1 || ceph_daemon_fail mon.a "the monitor does not answer (ceph osd new)"
    ceph-osd -c "$ceph_dir/ceph.conf" -i 0 --mkfs --osd-uuid "$uuid" >"$ceph_dir/osd.0.out" 2>&1 ||
        ceph_daemon_fail osd.0 "ceph-osd --mkfs failed"
    ceph-osd -c "$ceph_dir/ceph.conf" -i 0 >>"$ceph_dir/osd.0.out" 2>&1 || ceph_daemon_fail osd.0 "ceph-osd did not start"
    ceph_port=$rgw_port
    ceph_rgw_start
    export AWS_ACCESS_KEY_ID=CKPTTEST$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F)
    export AWS_SECRET_ACCESS_KEY=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
    radosgw-admin -c "$ceph_dir/ceph.conf" -n client.admin user create --uid ckpt --display-name ckpt \
        --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" >"$ceph_dir/user.out" 2>&1 ||
        ceph_daemon_fail user "radosgw-admin user create failed"
    export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port AWS_REGION=us-east-1
    unset AWS_PROFILE AWS_SESSION_TOKEN AWS_DEFAULT_REGION
    note "ceph: started in $((($(date +%s%N) - t0) / 1000000)) ms, gateway on $AWS_ENDPOINT_URL"
}

# ceph_rgw_start: starts the gateway (again, after ceph_rgw_kill) on
# $ceph_port and waits until it answers.
ceph_rgw_start() {
    local p end
    radosgw -c "$ceph_dir/ceph.conf" -n client.rgw.a >>"$ceph_dir/client.rgw.a.out" 2>&1 ||
        ceph_daemon_fail client.rgw.a "radosgw did not start"
    # The gateway answers once its pools exist (it creates them as it starts).
    end=$(($(date +%s) + 120))
    until curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$ceph_port/"; do
        [ "$(date +%s)" -lt "$end" ] || ceph_daemon_fail client.rgw.a "radosgw does not answer on 127.0.0.1:$ceph_port after 120 s"
        for p in mon.a osd.0 client.rgw.a; do
            [ ! -f "$ceph_dir/run/$p.pid" ] || kill -0 "$(cat "$ceph_dir/run/$p.pid")" 2>/dev/null ||
                ceph_daemon_fail "$p" "$p exited while the cluster was starting"
        done
        sleep 0.05 # a poll interval: the gateway's readiness is awaited, the limit above only catches a hang
    done
}

# ceph_rgw_kill: SIGKILL to the gateway (a crash), and waits until it is gone.
ceph_rgw_kill() {
    local pid i
    pid=$(cat "$ceph_dir/run/client.rgw.a.pid") || fail "ceph: no pid file of the gateway"
    kill -KILL "$pid"
    # gone: no process, or a zombie (the daemon is not our child; init reaps it)
    for i in $(seq 1200); do
        case "$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" in "" | Z) break ;; esac
        sleep 0.05 # waiting for the killed gateway to exit; the limit only catches a hang
    done
    case "$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" in "" | Z) ;; *) fail "ceph: the gateway (pid $pid) survived SIGKILL for 60 s" ;; esac
    rm -f "$ceph_dir/run/client.rgw.a.pid"
}

# ceph_rss_mb: the resident memory of the cluster's daemons, in MB.
ceph_rss_mb() {
    local p kb=0 pid
    for p in "$ceph_dir"/run/*.pid; do
        pid=$(cat "$p") && kb=$((kb + $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
    done
    echo $((kb / 1024))
}

# ceph_term_wait NAME...: SIGTERM to each daemon NAME by its pid file, then
# wait for them to exit; SIGKILL to those still alive after 10 s.
ceph_term_wait() {
    local n f pid pids=() i alive
    for n in "$@"; do
        f=$ceph_dir/run/$n.pid
        [ -f "$f" ] && pid=$(cat "$f") && [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
        rm -f "$f"
    done
    for i in $(seq 200); do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || return 0
        sleep 0.05 # waiting for the daemons to exit; SIGKILL below after 10 s
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# ceph_stop: the gateway and the OSD first, then the monitor (an OSD whose
# monitor is gone takes seconds longer to exit). Idempotent.
ceph_stop() {
    [ -n "$ceph_dir" ] && [ -d "$ceph_dir/run" ] || return 0
    ceph_term_wait client.rgw.a osd.0
    ceph_term_wait mon.a
}
e2e_cleanups+=(ceph_stop)
