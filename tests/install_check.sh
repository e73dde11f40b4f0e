#!/bin/sh
# install_check.sh: kfuse installs and embeds. Configures and builds the
# library and CLI (in BUILD_DIR, reused when it exists), installs them to a
# temporary prefix, checks the installed files, then builds examples/embed.c
# against that prefix four ways -- pkg-config shared and static, CMake
# find_package with kfuse::kfuse and kfuse::kfuse_static -- and runs each on
# bench/models/tiny_cnn.onnx. Exits non-zero on the first failure.
#   tests/install_check.sh [BUILD_DIR]     (default: build-install)
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build-install}
MODEL=$SRC/bench/models/tiny_cnn.onnx
SHAPE=2,3,8,8 # tiny_cnn's input x is float[N,3,8,8]
JOBS=${JOBS:-2}
TMP=$(mktemp -d /tmp/kfuse_install_check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
export KFUSE_CACHE_DIR="$TMP/cache" # a cold, private kernel cache

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'install_check: FAILED: %s\n' "$*" >&2; exit 1; }

step "configure and build $BUILD"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_TESTS=OFF >/dev/null || fail "configure"
fi
cmake --build "$BUILD" -j "$JOBS" --target kfuse kfuse_static kfuse_cli >/dev/null || fail "build"

step "install to $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null || fail "cmake --install"
PC=$(find "$PREFIX" -path "*/pkgconfig/kfuse.pc" | head -n 1)
[ -n "$PC" ] || fail "no lib/pkgconfig/kfuse.pc"
LIBDIR=$(dirname "$(dirname "$PC")")
for f in "$PREFIX/include/kfuse/kfuse.h" "$LIBDIR/libkfuse.so" "$LIBDIR/libkfuse.a" \
         "$LIBDIR/cmake/kfuse/kfuseConfig.cmake" "$LIBDIR/cmake/kfuse/kfuseConfigVersion.cmake" \
         "$LIBDIR/cmake/kfuse/kfuseTargets.cmake" "$PREFIX/bin/kfuse"; do
    [ -e "$f" ] || fail "missing $f"
    echo "ok   ${f#"$PREFIX"/}"
done
SONAME=$(readelf -d "$LIBDIR/libkfuse.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
case $SONAME in libkfuse.so.[0-9]*) echo "ok   SONAME $SONAME" ;; *) fail "SONAME is '$SONAME'" ;; esac
[ -e "$LIBDIR/$SONAME" ] || fail "no $SONAME beside libkfuse.so"
"$PREFIX/bin/kfuse" info "$MODEL" >/dev/null || fail "installed kfuse CLI does not run"
echo "ok   bin/kfuse info runs"

# Runs an embed binary on the model; its output must name the output probs[2,10], known
# before the run (kf_compiled_output_info) and returned by it.
run_embed() {
    name=$1
    shift
    out=$("$@" "$MODEL" "$SHAPE") || fail "$name: embed exited $?"
    printf '%s\n' "$out" | sed "s/^/     $name: /"
    printf '%s\n' "$out" | grep -q '^probs: dtype 1 \[2,10\]' || fail "$name: unexpected output"
    printf '%s\n' "$out" | grep -q '^probs: expected dtype 1 \[2,10\]' || fail "$name: no output info before the run"
}
# A static build must not need libkfuse.so at run time.
not_shared() { if ldd "$1" | grep -q 'libkfuse\.so'; then fail "$1 links libkfuse.so"; fi; }

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
CC=${CC:-cc}
CFLAGS="-std=c11 -Wall -Wextra -Werror"

step "pkg-config, shared ($(pkg-config --modversion kfuse))"
# shellcheck disable=SC2046,SC2086
$CC $CFLAGS "$SRC/examples/embed.c" -o "$TMP/embed_pc" $(pkg-config --cflags --libs kfuse) \
    -Wl,-rpath,"$LIBDIR" || fail "pkg-config shared build"
run_embed pc-shared "$TMP/embed_pc"
# without a shape the example takes the declared one, symbolic N as 1
out=$("$TMP/embed_pc" "$MODEL") || fail "pc-shared, declared shape: embed exited $?"
printf '%s\n' "$out" | sed "s/^/     pc-shared, declared shape: /"
printf '%s\n' "$out" | grep -q '^probs: dtype 1 \[1,10\]' || fail "pc-shared, declared shape: unexpected output"

step "pkg-config, static"
# -lkfuse would pick the .so; -l:libkfuse.a names the archive, the rest is Libs.private
LIBS=$(pkg-config --static --libs kfuse | sed 's/-lkfuse\( \|$\)/-l:libkfuse.a\1/')
echo "     libs: $LIBS"
# shellcheck disable=SC2046,SC2086
$CC $CFLAGS "$SRC/examples/embed.c" -o "$TMP/embed_pc_static" $(pkg-config --cflags kfuse) $LIBS \
    || fail "pkg-config static build"
not_shared "$TMP/embed_pc_static"
run_embed pc-static "$TMP/embed_pc_static"

for kind in shared static; do
    step "CMake find_package(kfuse), kfuse::kfuse$([ $kind = static ] && echo _static)"
    static=$([ $kind = static ] && echo ON || echo OFF)
    cmake -S "$SRC/examples" -B "$TMP/ex_$kind" -DCMAKE_PREFIX_PATH="$PREFIX" -DEMBED_STATIC="$static" \
        -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null || fail "examples configure ($kind)"
    cmake --build "$TMP/ex_$kind" >/dev/null || fail "examples build ($kind)"
    [ $kind = static ] && not_shared "$TMP/ex_$kind/embed"
    run_embed cmake-$kind "$TMP/ex_$kind/embed"
done

step "install_check: all passed"
