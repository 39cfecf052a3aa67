#!/usr/bin/env bash
# bench/fetch.sh — `ckpt fetch` from the local Hub on loopback against curl
# (issue 6, "Speed"). Not a test; run it by hand:
#
#   make BUILD=build-rel build-rel/ckpt build-rel/ckpt-testhub
#   CKPT_BIN=build-rel/ckpt bench/fetch.sh
#
# A generated llama checkpoint whose weights are ONE safetensors file of about
# 2 GB (gen-model --scale 2 --layers 14 --shard-mb 0) is imported into a Hub
# store and served by ckpt-testhub (the daemon's Hub API) on 127.0.0.1. Each
# round runs, on the same URL:
#   curl -s -o /dev/null URL            the transfer alone
#   curl -s -o FILE URL                 into a file (page cache)
#   sha256sum FILE                      the verification a careful user adds
#   ckpt fetch ORG/NAME                 parallel Range requests written straight
#                                       into a fresh store's blob files, sha256
#                                       against lfs.oid (and of every tensor,
#                                       the blobs' names), published with fsync
# and prints median wall times, GB/s and the goals of the issue: fetch (with
# verification and ingest) no slower than curl -o FILE + sha256sum, and at
# least 1 GB/s. ckpt's own line "downloaded and verified ... in S s" splits
# the fetch into download+verify and ingest.
#
# Then the resume row (issue 18): a fetch is killed at the crash point
# fetch.piece_recorded after 90% of its pieces (as kill -9 would), and
# rerun; from the test Hub's request log (tests/e2e/resume_check.py) it
# prints the bytes the rerun requested against the bytes missing (goal:
# equal, no kept byte asked again) and the rerun's wall time against a whole
# fetch's.
#
# Environment: CKPT_BIN (default build/ckpt), CKPT_TESTHUB (default beside
# it), BENCH_REPEAT (3), BENCH_DIR (/tmp), BENCH_SCALE (2), BENCH_LAYERS (14),
# BENCH_CONNECTIONS and BENCH_CHUNK (ckpt fetch --connections/--chunk-size;
# default: ckpt's own), BENCH_KEEP=1 keeps the work folder.
set -euo pipefail

BENCH_NAME=fetch
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bench_need_hub
bench_start
bench_cleanup_on_exit
FETCH_OPTS=()
[ -n "${BENCH_CONNECTIONS:-}" ] && FETCH_OPTS+=(--connections "$BENCH_CONNECTIONS")
[ -n "${BENCH_CHUNK:-}" ] && FETCH_OPTS+=(--chunk-size "$BENCH_CHUNK")

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ckpt: $CKPT_BIN; $(curl --version | head -1 | cut -d' ' -f1-2); sha256sum: $(sha256sum --version | head -1)"

echo "== generating llama --scale $SCALE --layers $LAYERS in one file, importing it into the Hub's store"
"$CKPT_BIN" gen-model llama "$WORK/src" --scale "$SCALE" --layers "$LAYERS" --shard-mb 0 >/dev/null 2>&1
CKPT_HOME=$WORK/hub "$CKPT_BIN" import "$WORK/src" --repo bench/big@main --quiet >/dev/null 2>&1
rm -rf "$WORK/src"
"$CKPT_TESTHUB" --home "$WORK/hub" --url-file "$WORK/hub.url" --log "$WORK/hub.log" 2>/dev/null &
HUB_PID=$!
for _ in $(seq 100); do [ -s "$WORK/hub.url" ] && break; sleep 0.1; done
[ -s "$WORK/hub.url" ] || die "ckpt-testhub did not start"
HUB=$(cat "$WORK/hub.url")
COMMIT=$(curl -sf "$HUB/api/models/bench/big/revision/main" | python3 -c 'import json, sys; print(json.load(sys.stdin)["sha"])')
URL=$HUB/bench/big/resolve/$COMMIT/model.safetensors
BYTES=$(curl -sfI "$URL" | awk 'tolower($1) == "content-length:" {print $2 + 0}')
echo "   $URL: $(awk -v b="$BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}')"

# timed KEY CMD...: appends CMD's wall time (seconds) to T[KEY].
declare -A T
timed() {
    local key=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    T[$key]="${T[$key]:-} $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
fetch() {
    HF_ENDPOINT=$HUB CKPT_HOME=$WORK/client "$CKPT_BIN" fetch bench/big "${FETCH_OPTS[@]}" >/dev/null 2>"$WORK/fetch.err" ||
        { cat "$WORK/fetch.err" >&2; die "ckpt fetch failed"; }
}
# the last round counts the pieces a fetch records (for the resume row)
trace_last() { if [ "$round" = "$REPEAT" ]; then CKPT_FAULT_TRACE=$WORK/trace fetch; else fetch; fi; }

for round in $(seq 1 "$REPEAT"); do
    echo "== round $round of $REPEAT (load $(cut -d' ' -f1-3 /proc/loadavg))"
    sync
    timed null curl -sf -o /dev/null "$URL"
    timed file curl -sf -o "$WORK/file" "$URL"
    timed sha sha256sum "$WORK/file" >/dev/null
    rm -f "$WORK/file"
    rm -rf "$WORK/client"
    sync
    timed fetch trace_last
    dl=$(sed -n 's/.*downloaded and verified .* in \([0-9.]*\) s.*/\1/p' "$WORK/fetch.err")
    T[dl]="${T[dl]:-} ${dl:-0}"
    printf '  curl >/dev/null %6.2f s   curl -o FILE %6.2f s   sha256sum %6.2f s   ckpt fetch %6.2f s (download+verify %s s)\n' \
        "$(echo "${T[null]}" | awk '{print $NF}')" "$(echo "${T[file]}" | awk '{print $NF}')" \
        "$(echo "${T[sha]}" | awk '{print $NF}')" "$(echo "${T[fetch]}" | awk '{print $NF}')" "${dl:-?}"
    "$CKPT_BIN" verify --home "$WORK/client" >/dev/null 2>&1 || die "the fetched checkpoint does not verify"
done
rm -rf "$WORK/client"

# ---- the resume row: killed at 90% of the pieces, then rerun ----
pieces=$(grep -c '^fetch.piece_recorded$' "$WORK/trace" || true)
[ "${pieces:-0}" -ge 2 ] || die "the fetch recorded $pieces pieces: nothing to resume"
kill_at=$((pieces * 9 / 10))
echo "== resume: a fetch killed after piece $kill_at of $pieces (crash point fetch.piece_recorded), then rerun"
sync
rc=0
HF_ENDPOINT=$HUB CKPT_HOME=$WORK/client CKPT_FAULT=fetch.piece_recorded:$kill_at "$CKPT_BIN" fetch bench/big "${FETCH_OPTS[@]}" \
    >/dev/null 2>"$WORK/fetch.err" || rc=$?
[ "$rc" -eq 137 ] || die "the fetch to kill exited $rc, not 137 (SIGKILL)"
mkdir -p "$WORK/kept"
for d in "$WORK"/client/partial/"$COMMIT"/*/; do # what resume_check.py reads: meta, journal, header
    mkdir -p "$WORK/kept/$(basename "$d")"
    cp "$d"meta "$WORK/kept/$(basename "$d")/"
    for f in journal header; do [ -e "$d$f" ] && cp "$d$f" "$WORK/kept/$(basename "$d")/"; done
done
first=$(($(wc -l <"$WORK/hub.log") + 1))
sync
timed resume fetch
grep -q "resuming an interrupted fetch" "$WORK/fetch.err" || die "the rerun did not resume: $(cat "$WORK/fetch.err")"
"$CKPT_BIN" verify --home "$WORK/client" >/dev/null 2>&1 || die "the resumed checkpoint does not verify"
read -r _ kept _ requested _ missing _ total < <("$PY" "$HERE/../tests/e2e/resume_check.py" "$WORK/kept" "$WORK/hub.log" "$first") ||
    die "the rerun asked for kept bytes"
rm -rf "$WORK/client" "$WORK/kept"

declare -A M
for k in null file sha fetch dl; do M[$k]=$(echo "${T[$k]}" | median); done
M[filesha]=$(awk -v a="${M[file]}" -v b="${M[sha]}" 'BEGIN {print a + b}')
gbs() { awk -v b="$BYTES" -v t="$1" 'BEGIN {printf "%.2f", (t > 0 ? b / 1e9 / t : 0)}'; }
echo
echo "== results: one $(awk -v b="$BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') file over loopback, $REPEAT round(s), median wall"
printf '%-44s %8s %8s\n' "step" "wall s" "GB/s"
row() { printf '%-44s %8.2f %8s\n' "$1" "$2" "$(gbs "$2")"; }
row "curl -s -o /dev/null" "${M[null]}"
row "curl -s -o FILE" "${M[file]}"
row "curl -s -o FILE && sha256sum FILE" "${M[filesha]}"
row "ckpt fetch: download + verify" "${M[dl]}"
row "ckpt fetch: download + verify + ingest" "${M[fetch]}"
row "ckpt fetch resumed after a kill at 90%" "$(echo "${T[resume]}" | median)"
echo
printf '%-44s %14s %14s %8s\n' "resume after a kill at 90%" "requested B" "missing B" "of file"
printf '%-44s %14s %14s %8s\n' "rerun (kept $kept B, read back and hashed)" "$requested" "$missing" \
    "$(awk -v r="$requested" -v t="$total" 'BEGIN {printf "%.3f", t ? r / t : 0}')"
echo
r=$(awk -v a="${M[fetch]}" -v b="${M[filesha]}" 'BEGIN {printf "%.2f", a / b}')
v1=$(awk -v r="$r" 'BEGIN {print (r <= 1 ? "met" : "MISSED")}')
g=$(gbs "${M[fetch]}")
v2=$(awk -v g="$g" 'BEGIN {print (g >= 1 ? "met" : "MISSED")}')
printf '%-44s %8s   %-8s %s\n' "goal" "value" "target" "verdict"
printf '%-44s %8s   %-8s %s\n' "ckpt fetch / (curl -o FILE + sha256sum)" "$r" "<= 1" "$v1"
printf '%-44s %8s   %-8s %s\n' "ckpt fetch GB/s (verify and ingest included)" "$g" ">= 1" "$v2"
printf '%-44s %8s   %-8s %s\n' "resume: bytes requested / bytes missing" \
    "$(awk -v r="$requested" -v m="$missing" 'BEGIN {printf "%.2f", m ? r / m : 0}')" "= 1" \
    "$([ "$requested" = "$missing" ] && echo met || echo MISSED)"
printf '%-44s %8s   %-8s %s\n' "resume: rerun wall / whole fetch wall" \
    "$(awk -v a="$(echo "${T[resume]}" | median)" -v b="${M[fetch]}" 'BEGIN {printf "%.2f", b ? a / b : 0}')" "~0.1+" "(kept bytes are re-hashed)"
echo
echo "ckpt fetch writes each byte once (into the store's blob files), hashes it twice"
echo "(the file's sha256 against lfs.oid, each tensor's sha256 for its blob) and"
echo "fsyncs; curl -o FILE writes it once and neither hashes nor syncs, so it bounds"
echo "what any verified, durable download can reach on this machine."
