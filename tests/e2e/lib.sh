# lib.sh — helpers the e2e scripts share; sourced after the script defines
# `fail` and `work`:  . "$E2E_DIR/lib.sh"

# expect_status WANT CMD...: runs CMD, checks its exit status; stdout in
# $work/out, stderr in $work/err.
expect_status() {
    local want=$1 rc=0
    shift
    "$@" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; stdout: $(head -c 1500 "$work/out"); stderr: $(head -c 1500 "$work/err")"
}
