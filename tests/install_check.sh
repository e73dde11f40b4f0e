#!/bin/sh
# install_check.sh: kfuse installs and embeds. Configures and builds the
# library and CLI (in BUILD_DIR, reused when it exists), installs them to a
# temporary prefix, checks the installed files, then builds examples/embed.c
# against that prefix four ways -- pkg-config shared and static, CMake
# find_package with kfuse::kfuse and kfuse::kfuse_static -- and runs each on
# bench/models/tiny_cnn.onnx. Where OpenCL runs here, examples/embed_stream.c
# too (pkg-config shared, both CMake builds): the model through
# kf_run_device on the example's own queue and buffers, equal to kf_run,
# with no host copy or wait inside. Exits non-zero on the first failure.
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
# Runs an embed_stream binary: outputs equal to kf_run's, no host copy or wait in kf_run_device.
run_stream() {
    name=$1
    shift
    out=$("$@" "$MODEL" "$SHAPE" 2>&1) || { printf '%s\n' "$out"; fail "$name: embed_stream exited $?"; }
    printf '%s\n' "$out" | grep -v '^ *kfuse: ' | sed "s/^/     $name: /"
    printf '%s\n' "$out" | grep -q '^probs: dtype 1 \[2,10\] equal to kf_run' || fail "$name: outputs differ from kf_run's"
    printf '%s\n' "$out" | grep -q '^kf_run_device, 3 runs: 0 host copies' || fail "$name: host copies inside kf_run_device"
    printf '%s\n' "$out" | grep -q '^embed_stream: ok' || fail "$name: embed_stream failed"
}
# OpenCL headers to build embed_stream, and a device to run it on.
HAVE_CL=0
if pkg-config --exists OpenCL 2>/dev/null && "$PREFIX/bin/kfuse" run --backend opencl "$MODEL" >/dev/null 2>&1; then
    HAVE_CL=1
fi
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
if [ $HAVE_CL = 1 ]; then
    # shellcheck disable=SC2046,SC2086
    $CC $CFLAGS "$SRC/examples/embed_stream.c" -o "$TMP/embed_stream_pc" $(pkg-config --cflags --libs kfuse OpenCL) \
        -Wl,-rpath,"$LIBDIR" || fail "pkg-config shared build of embed_stream"
    run_stream pc-shared-stream "$TMP/embed_stream_pc"
else
    echo "     (no OpenCL device or headers here: embed_stream not run)"
fi

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
    if [ $HAVE_CL = 1 ]; then
        [ -x "$TMP/ex_$kind/embed_stream" ] || fail "examples ($kind): OpenCL runs here but embed_stream was not built"
        [ $kind = static ] && not_shared "$TMP/ex_$kind/embed_stream"
        run_stream cmake-$kind-stream "$TMP/ex_$kind/embed_stream"
    fi
done

step "install_check: all passed"
