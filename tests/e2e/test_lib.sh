#!/usr/bin/env bash
# test_lib.sh — libckpt as a program outside this tree gets it: installed by
# `make install-lib`, found by pkg-config.
#
# 1. make install-lib into a DESTDIR scratch folder (a private -O0 build, no
#    sanitizers: the library is linked as a user would link it) writes
#    lib/libckpt.a, lib/libckpt.so(.0), include/ckpt.h and lib/pkgconfig/ckpt.pc.
# 2. libckpt.so exports exactly the functions ckpt.h declares
#    (tests/header/check_exports.py), e.g. not ckpt_error_set.
# 3. The example program of ckpt.h's comment (tests/header/example.sh), built
#    with `pkg-config --cflags --libs ckpt` against the shared library and
#    with `pkg-config --static --libs ckpt` against libckpt.a, runs and saves
#    then loads rank 3 of 8.
# Run through run.sh (needs E2E_DIR, E2E_WORK; CKPT_BIN is not used).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
root=$(cd "$E2E_DIR/../.." && pwd)

# ---- 1. install ----
prefix=/usr/local
dest=$work/dest
# One job: run.sh runs two tests at once. MAKEFLAGS from an outer make is dropped.
expect_status 0 env -u MAKEFLAGS -u MAKELEVEL make -C "$root" --no-print-directory -j1 \
    BUILD="$work/build" SAN=0 CFLAGS=-O0 PREFIX=$prefix DESTDIR="$dest" install-lib
for f in lib/libckpt.a lib/libckpt.so lib/libckpt.so.0 include/ckpt.h lib/pkgconfig/ckpt.pc; do
    [ -e "$dest$prefix/$f" ] || fail "install-lib did not write $prefix/$f"
done
note "ok install-lib"

# ---- 2. exports ----
expect_status 0 "$py" -S "$root/tests/header/check_exports.py" "$root/include/ckpt.h" \
    "$root/include/libckpt.map" "$dest$prefix/lib/libckpt.so"
# Listings go through files: grep -q closing a pipe early fails it under pipefail.
nm -D --defined-only "$dest$prefix/lib/libckpt.so" >"$work/nm"
! grep -q ' ckpt_error_set$' "$work/nm" || fail "libckpt.so exports the internal ckpt_error_set"
note "ok exports: $(tail -n 1 "$work/out")"

# ---- 3. pkg-config and the header's example ----
pc() { PKG_CONFIG_PATH="$dest$prefix/lib/pkgconfig" pkg-config --define-variable=prefix="$dest$prefix" "$@" ckpt; }
[ "$(pc --modversion)" = 0.1.0 ] || fail "ckpt.pc: version $(pc --modversion)"
sh "$root/tests/header/example.sh" "$root/include/ckpt.h" >"$work/example.c"
# shellcheck disable=SC2046 # word splitting of pkg-config's flags is wanted
expect_status 0 cc -std=c11 -Wall -Werror -o "$work/example-shared" "$work/example.c" $(pc --cflags --libs)
expect_status 0 env LD_LIBRARY_PATH="$dest$prefix/lib" "$work/example-shared" "$work/run/latest"
grep -q '^step 300: model.layers.0.mlp.down_proj.weight \[64, 32\]$' "$work/out" || fail "shared example: $(cat "$work/out")"
LD_LIBRARY_PATH="$dest$prefix/lib" ldd "$work/example-shared" >"$work/ldd"
grep -q "libckpt.so.0 => $dest" "$work/ldd" || fail "the shared example does not use the installed libckpt.so.0: $(cat "$work/ldd")"
rm -rf "$work/run"
# Static: the same flags with --static, libckpt.a named explicitly (the
# folder holds both) so the link needs Libs.private and Requires.private.
# shellcheck disable=SC2046
expect_status 0 cc -std=c11 -Wall -Werror -o "$work/example-static" "$work/example.c" $(pc --cflags) \
    $(pc --static --libs | sed 's/-lckpt\b/-l:libckpt.a/')
expect_status 0 "$work/example-static" "$work/run/latest"
grep -q '^step 300: ' "$work/out" || fail "static example: $(cat "$work/out")"
ldd "$work/example-static" >"$work/ldd"
! grep -q libckpt "$work/ldd" || fail "the static example uses libckpt.so"
note "ok pkg-config: shared and static builds of ckpt.h's example run"
