#!/usr/bin/env bash
# bench/serve.sh — the store over HTTP against a static file server (issue 7,
# "Speed"). Not a test; run it by hand with a release build:
#
#   make BUILD=build-rel build-rel/ckpt && CKPT_BIN=build-rel/ckpt bench/serve.sh
#
# A generated llama checkpoint whose weights are ONE safetensors file of about
# 2 GB (gen-model --scale 2 --layers 14 --shard-mb 0: model.safetensors) is
# imported into a fresh CKPT_HOME, and converted there to neuron --tp 8
# (recipes over the original's blobs). `ckpt serve` (127.0.0.1, a free port)
# serves the store: model.safetensors is its stored header plus each tensor
# read from its blob; tp_rank_03/model.safetensors of the layout (about 250 MB)
# is assembled from its recipes on the fly. The baseline, `python3 -m
# http.server` (another free port), serves a folder holding the generated
# model.safetensors and the rank file `ckpt pull --rank 3` wrote — the same
# bytes, checked with cmp against a daemon download of each before timing.
# The page cache holds the blobs and that folder before each step. Measured,
# all with curl on loopback (-o /dev/null, -w status/size/time):
#   1. one stream of a whole file, BENCH_REPEAT rounds (default 3), the servers
#      taking turns in each round: model.safetensors from the daemon's
#      /v1/checkpoints/{ref}/files/{path}, from its Hub URL
#      /{org}/{name}/resolve/{rev}/{path}, and from the static server; then
#      the rank file from the daemon (/resolve/neuron-tp8/...) and the static
#      server. The median round (the best beside it) gives GB/s.
#   2. BENCH_CLIENTS (default 16) curl processes at once, each the whole
#      model.safetensors, against the daemon and against the static server:
#      aggregate GB/s = bytes received / wall time from the first start to
#      the last end. The same with the rank file.
#   3. the same clients, each one of BENCH_CLIENTS equal byte ranges of
#      model.safetensors (Range: bytes=a-b, 206 checked), against the daemon
#      only: `python3 -m http.server` ignores Range, so it has no figure there.
# For each step it reports the server's CPU seconds (user+sys from
# /proc/PID/stat) per GB sent, and for the concurrent steps its peak RSS:
# VmHWM of /proc/PID/status read after the step, the peak having been reset
# to the current RSS just before it (`echo 5 > /proc/PID/clear_refs`; where
# the kernel refuses that, the peak since the server started, and it says
# so). VmHWM counts file pages the server maps, not only its heap.
# Prints a table and the goals: the daemon's single stream at least as fast as
# the static server's, and its peak RSS under 256 MiB with 16 clients.
#
# Environment:
#   CKPT_BIN        the ckpt binary (default: build/ckpt beside this folder; use
#                   a release build, not SAN=1)
#   BENCH_SCALE     gen-model --scale (default 2: hidden 2048, vocab 64128)
#   BENCH_LAYERS    gen-model --layers (default 14: one file of about 2.05 GB)
#   BENCH_REPEAT    single-stream rounds (default 3)
#   BENCH_CLIENTS   concurrent clients (default 16)
#   BENCH_LAYOUT=0  skip the converted layout (the rank file) steps
#   BENCH_DIR       where the temporary work folder goes (default /tmp)
#   BENCH_PYTHON    python3 for the static server (default /usr/bin/python3)
#   BENCH_KEEP=1    keep the work folder (the servers are stopped all the same)
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/serve.sh
set -euo pipefail

BENCH_NAME=serve
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CLIENTS=${BENCH_CLIENTS:-16}
LAYOUT=${BENCH_LAYOUT:-1}
TP=8
RANK=3
RSS_GOAL_MIB=256

[ -x "$PY" ] || PY=$(command -v python3) || die "python3 is needed for the static server"
command -v curl >/dev/null || die "curl is needed"
bench_positive CLIENTS
bench_start
DPID=
SPID=
stop() { # stop PID: TERM, wait; the servers are this script's children
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    stop "$DPID"
    stop "$SPID"
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench/serve: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
export CKPT_HOME=$WORK/home CKPT_QUIET=1
REPO=bench/llama
FILE=model.safetensors
RR=$(printf '%02d' "$RANK")
RFILE=tp_rank_$RR/model.safetensors

quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
now() { date +%s.%N; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, clock ticks ("ckpt", "python3": no space in comm)
TICK=$(getconf CLK_TCK)
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r)," \
    "$(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ckpt: $CKPT_BIN; $(curl --version | head -1 | cut -d' ' -f1-2); $("$PY" --version 2>&1)"

# ---- the checkpoint -----------------------------------------------------------
SRC=$WORK/src
WWW=$WORK/www # what the static server serves: hard links to the same bytes
echo "== generating llama --scale $SCALE --layers $LAYERS in one file, importing it"
quietly "$CKPT_BIN" gen-model llama "$SRC" --scale "$SCALE" --layers "$LAYERS" --shard-mb 0
quietly "$CKPT_BIN" import "$SRC" --repo "$REPO@main" --home "$CKPT_HOME" --quiet
mkdir -p "$WWW"
ln "$SRC/$FILE" "$WWW/$FILE"
declare -A SIZE
SIZE[$FILE]=$(stat -c %s "$SRC/$FILE")
echo "   $FILE: $(gb "${SIZE[$FILE]}") (${SIZE[$FILE]} bytes)"
if [ "$LAYOUT" = 1 ]; then
    echo "== converting it in the store to neuron --tp $TP, pulling rank $RANK for the static server"
    quietly "$CKPT_BIN" convert "$REPO@main" --layout neuron --tp "$TP" --home "$CKPT_HOME" --quiet
    quietly "$CKPT_BIN" pull "$REPO@main:neuron-tp$TP" --rank "$RANK" -o "$WORK/rank" --home "$CKPT_HOME" --quiet
    mkdir -p "$WWW/tp_rank_$RR"
    ln "$WORK/rank/$FILE" "$WWW/$RFILE"
    SIZE[$RFILE]=$(stat -c %s "$WWW/$RFILE")
    echo "   $RFILE of neuron-tp$TP: $(gb "${SIZE[$RFILE]}") (${SIZE[$RFILE]} bytes), assembled from recipes"
fi

# ---- the servers ----------------------------------------------------------------
"$CKPT_BIN" serve --listen 127.0.0.1:0 --workers 1 --home "$CKPT_HOME" >"$WORK/serve.log" 2>&1 &
DPID=$!
"$PY" -u -m http.server --bind 127.0.0.1 --directory "$WWW" 0 >"$WORK/static.log" 2>&1 &
SPID=$!
DURL='' SURL=''
for _ in $(seq 200); do
    kill -0 "$DPID" 2>/dev/null || die "ckpt serve exited: $(cat "$WORK/serve.log")"
    kill -0 "$SPID" 2>/dev/null || die "the static server exited: $(cat "$WORK/static.log")"
    [ -z "$DURL" ] && [ -s "$CKPT_HOME/serve.url" ] && DURL=$(cat "$CKPT_HOME/serve.url")
    [ -z "$SURL" ] && SURL=$(sed -n 's|.*(\(http://[0-9.:]*\)/).*|\1|p' "$WORK/static.log" | head -1)
    if [ -n "$DURL" ] && [ -n "$SURL" ] && curl -sf -o /dev/null "$DURL/healthz" && curl -sf -o /dev/null -I "$SURL/$FILE"; then
        break
    fi
    sleep 0.05
done
curl -sf -o /dev/null "$DURL/healthz" || die "ckpt serve does not answer /healthz: $(cat "$WORK/serve.log")"
curl -sf -o /dev/null -I "$SURL/$FILE" || die "the static server does not answer: $(cat "$WORK/static.log")"
# URL[key], the file it gets (PATH_OF) and the server's pid (PID_OF).
declare -A URL PATH_OF PID_OF
add_url() { URL[$1]=$2 PATH_OF[$1]=$3 PID_OF[$1]=$4; }
add_url v1 "$DURL/v1/checkpoints/${REPO//\//%2F}@main/files/$FILE" "$FILE" "$DPID" # the ref is one segment: '/' encoded
add_url hub "$DURL/$REPO/resolve/main/$FILE" "$FILE" "$DPID"
add_url static "$SURL/$FILE" "$FILE" "$SPID"
if [ "$LAYOUT" = 1 ]; then
    add_url lhub "$DURL/$REPO/resolve/neuron-tp$TP/$RFILE" "$RFILE" "$DPID"
    add_url lstatic "$SURL/$RFILE" "$RFILE" "$SPID"
fi
SINGLE=(v1 hub static)
[ "$LAYOUT" = 1 ] && SINGLE+=(lhub lstatic)
echo "   ckpt serve (pid $DPID), http.server (pid $SPID):"
for k in "${SINGLE[@]}"; do echo "     ${URL[$k]}"; done
echo "== checking that the daemon serves the same bytes (cmp, not timed)"
for k in v1 hub lhub; do
    [ -n "${URL[$k]:-}" ] || continue
    curl -sf "${URL[$k]}" | cmp -s - "$WWW/${PATH_OF[$k]}" || die "${URL[$k]} differs from $WWW/${PATH_OF[$k]}"
done

# ---- 1. one stream ----------------------------------------------------------------
# get KEY: one download of URL[KEY] to /dev/null, status and size checked;
# appends its seconds to T[KEY] and the server's CPU ticks to CT[KEY].
declare -A T CT
get() {
    local key=$1 pid=${PID_OF[$1]} c0 out code size t
    c0=$(cpu_of "$pid")
    out=$(curl -s -o /dev/null -w '%{http_code} %{size_download} %{time_total}' "${URL[$key]}") || die "curl ${URL[$key]} failed"
    CT[$key]=$((${CT[$key]:-0} + $(cpu_of "$pid") - c0))
    read -r code size t <<<"$out"
    [ "$code" = 200 ] && [ "$size" = "${SIZE[${PATH_OF[$key]}]}" ] ||
        die "${URL[$key]}: HTTP $code, $size bytes (expected 200, ${SIZE[${PATH_OF[$key]}]})"
    T[$key]="${T[$key]:-} $t"
    printf ' %s %.3f s' "$key" "$t"
}
echo "== one stream, $REPEAT round(s) (page cache warm)"
warm "$CKPT_HOME/blobs" "$WWW"
for round in $(seq 1 "$REPEAT"); do
    printf '  round %d:' "$round"
    for k in "${SINGLE[@]}"; do get "$k"; done
    echo
done

# ---- 2. and 3. concurrent clients ------------------------------------------------
# many KEY URLKEY whole|ranges LABEL: CLIENTS curls at once; sets W[KEY] (wall
# s), GOT[KEY] (bytes received), CT[KEY] (server CPU ticks), RSS[KEY] (peak MiB).
declare -A W GOT RSS LABEL
RSS_HOW="VmHWM after the step, reset with clear_refs just before it"
many() {
    local key=$1 u=$2 mode=$3 pid=${PID_OF[$2]} bytes=${SIZE[${PATH_OF[$2]}]} i a b t0 t1 c0 code size pids=()
    LABEL[$key]=$4
    warm "$CKPT_HOME/blobs" "$WWW"
    echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || RSS_HOW="VmHWM since the server started (the kernel refused clear_refs)"
    c0=$(cpu_of "$pid")
    t0=$(now)
    for i in $(seq 0 $((CLIENTS - 1))); do
        if [ "$mode" = ranges ]; then
            a=$((bytes * i / CLIENTS)) b=$((bytes * (i + 1) / CLIENTS - 1))
            curl -s -o /dev/null -w '%{http_code} %{size_download}\n' -r "$a-$b" "${URL[$u]}" >"$WORK/many.$i" &
        else
            curl -s -o /dev/null -w '%{http_code} %{size_download}\n' "${URL[$u]}" >"$WORK/many.$i" &
        fi
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || die "$4: a curl failed"; done
    t1=$(now)
    CT[$key]=$(($(cpu_of "$pid") - c0))
    RSS[$key]=$(awk -v k="$(status_kib "$pid" VmHWM)" 'BEGIN {printf "%.1f", k / 1024}')
    GOT[$key]=0
    for i in $(seq 0 $((CLIENTS - 1))); do
        read -r code size <"$WORK/many.$i"
        a=0 b=$((bytes - 1))
        [ "$mode" = ranges ] && a=$((bytes * i / CLIENTS)) b=$((bytes * (i + 1) / CLIENTS - 1))
        [ "$code" = "$([ "$mode" = ranges ] && echo 206 || echo 200)" ] && [ "$size" = $((b - a + 1)) ] ||
            die "$4: client $i got HTTP $code, $size bytes (expected $((b - a + 1)))"
        GOT[$key]=$((GOT[$key] + size))
    done
    W[$key]=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
    printf '  %-44s %7.2f s %7.2f GB/s aggregate, peak RSS %7.1f MiB\n' "$4" "${W[$key]}" \
        "$(awk -v B="${GOT[$key]}" -v t="${W[$key]}" 'BEGIN {printf "%.2f", B / 1e9 / t}')" "${RSS[$key]}"
}
echo "== $CLIENTS clients at once (page cache warm)"
MANY=(dwhole swhole dranges)
many dwhole v1 whole "$CLIENTS x $FILE: ckpt serve"
many swhole static whole "$CLIENTS x $FILE: http.server"
many dranges v1 ranges "$CLIENTS x 1/$CLIENTS range: ckpt serve"
if [ "$LAYOUT" = 1 ]; then
    MANY+=(dlayout slayout)
    many dlayout lhub whole "$CLIENTS x rank $RANK (recipes): ckpt serve"
    many slayout lstatic whole "$CLIENTS x rank $RANK: http.server"
fi
IDLE_RSS=$(awk -v k="$(status_kib "$DPID" VmRSS)" 'BEGIN {printf "%.1f", k / 1024}')

# ---- the table --------------------------------------------------------------------
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
best() { tr ' ' '\n' | grep . | sort -g | head -1; }
gbs() { awk -v B="$1" -v t="$2" 'BEGIN {printf "%.2f", (t > 0 ? B / 1e9 / t : 0)}'; }
cpu_per_gb() { awk -v c="$1" -v k="$TICK" -v B="$2" 'BEGIN {printf "%.3f", (B > 0 ? c / k / (B / 1e9) : 0)}'; }
declare -A M B SLABEL
SLABEL=([v1]="1 x $FILE: ckpt serve /v1/.../files/" [hub]="1 x $FILE: ckpt serve /{repo}/resolve/"
    [static]="1 x $FILE: http.server" [lhub]="1 x rank $RANK (recipes): ckpt serve /resolve" [lstatic]="1 x rank $RANK: http.server")
echo
echo "== results: llama --scale $SCALE --layers $LAYERS: $FILE $(gb "${SIZE[$FILE]}")$([ "$LAYOUT" = 1 ] && echo ", $RFILE of neuron-tp$TP $(gb "${SIZE[$RFILE]}")");" \
    "loopback, page cache warm; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-52s %9s %8s %7s %11s %9s\n' "step" "median s" "best s" "GB/s" "server CPU" "peak RSS"
printf '%-52s %9s %8s %7s %11s %9s\n' "" "" "" "" "s per GB" "MiB"
for k in "${SINGLE[@]}"; do
    M[$k]=$(echo "${T[$k]}" | median) B[$k]=$(echo "${T[$k]}" | best)
    bytes=${SIZE[${PATH_OF[$k]}]}
    printf '%-52s %9.3f %8.3f %7s %11s %9s\n' "${SLABEL[$k]}" "${M[$k]}" "${B[$k]}" "$(gbs "$bytes" "${M[$k]}")" \
        "$(cpu_per_gb "${CT[$k]}" $((bytes * REPEAT)))" "-"
done
for k in "${MANY[@]}"; do
    printf '%-52s %9.3f %8s %7s %11s %9s\n' "${LABEL[$k]}" "${W[$k]}" "(1 run)" "$(gbs "${GOT[$k]}" "${W[$k]}")" \
        "$(cpu_per_gb "${CT[$k]}" "${GOT[$k]}")" "${RSS[$k]}"
done
echo
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
atleast() { awk -v v="$1" -v g="$2" 'BEGIN {print (v >= g ? "met" : "MISSED")}'; }
below() { awk -v v="$1" -v g="$2" 'BEGIN {print (v < g ? "met" : "MISSED")}'; }
printf '%-68s %8s   %-8s %s\n' "goal" "value" "target" "verdict"
row() { printf '%-68s %8s   %-8s %s\n' "$1" "$2" "$3" "$4"; }
# GB/s ratios are inverse time ratios: same bytes on both sides.
r=$(ratio "${M[static]}" "${M[v1]}")
row "1 stream GB/s, $FILE, ckpt serve /v1 / http.server" "$r" ">= 1" "$(atleast "$r" 1)"
r=$(ratio "${M[static]}" "${M[hub]}")
row "1 stream GB/s, $FILE, ckpt serve /resolve / http.server" "$r" ">= 1" "$(atleast "$r" 1)"
if [ "$LAYOUT" = 1 ]; then
    r=$(ratio "${M[lstatic]}" "${M[lhub]}")
    row "1 stream GB/s, rank $RANK, ckpt serve /resolve / http.server" "$r" ">= 1" "$(atleast "$r" 1)"
fi
r=$(ratio "${W[swhole]}" "${W[dwhole]}")
row "$CLIENTS clients GB/s, $FILE, ckpt serve / http.server" "$r" "(none)" "-"
[ "$LAYOUT" = 1 ] && r=$(ratio "${W[slayout]}" "${W[dlayout]}") &&
    row "$CLIENTS clients GB/s, rank $RANK, ckpt serve / http.server" "$r" "(none)" "-"
for k in dwhole dranges dlayout; do
    [ -n "${RSS[$k]:-}" ] || continue
    row "ckpt serve peak RSS MiB, ${LABEL[$k]%%: ckpt serve}" "${RSS[$k]}" "< $RSS_GOAL_MIB" "$(below "${RSS[$k]}" "$RSS_GOAL_MIB")"
done
echo "(peak RSS: $RSS_HOW; the daemon's RSS after the runs: $IDLE_RSS MiB."
echo " server CPU: user+sys seconds of the server process per GB it sent; the $CLIENTS curl clients share the same $(nproc) CPUs."
echo " python3 -m http.server ignores Range, so the range step has no baseline; its listen backlog is 5, so of"
echo " $CLIENTS clients connecting at once some may retry their SYN after 1 s, a second in its $CLIENTS-client wall times.)"
