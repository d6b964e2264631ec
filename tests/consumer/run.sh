#!/usr/bin/env bash
# run.sh MODE ARGS - builds the consumer (tests/consumer: main.c) against
# attnkit and runs it; ctest runs the four modes as consumer_install,
# consumer_package, consumer_pkgconfig and consumer_subdir.
#   install   BUILD PREFIX                   cmake --install BUILD into a fresh PREFIX
#   package   PREFIX WORK VERSION            CMake, find_package(attnkit) from PREFIX
#   pkgconfig PREFIX WORK VERSION            the C compiler with pkg-config's flags, no
#                                            CMake: the shared library, and the archive
#                                            with Libs.private
#   subdir    SOURCE WORK VERSION [-DX=Y..]  CMake, add_subdirectory(SOURCE); the -D
#                                            arguments go to its configure (a comma in
#                                            CMAKE_CUDA_ARCHITECTURES stands for ';')
# Each mode builds consumer_static and consumer_shared, runs both, and (with
# readelf) checks that only consumer_shared loads libattnkit.so. CC names the
# C compiler (default cc), CMAKE the cmake binary (default cmake). Exit 77
# (skipped): pkg-config is not installed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
cmake=${CMAKE:-cmake}
jobs=${AK_JOBS:-$(nproc 2>/dev/null || echo 2)}

usage() {
    sed -n '2,16p' "$0" >&2
    exit 2
}

# Runs WORK/consumer_static and WORK/consumer_shared; checks their links.
run_both() {
    local work=$1 kind
    for kind in static shared; do
        echo "== consumer_$kind"
        "$work/consumer_$kind"
    done
    if command -v readelf >/dev/null 2>&1; then
        local needed
        needed=$(readelf -d "$work/consumer_shared" | grep 'NEEDED.*libattnkit' || true)
        if [ -z "$needed" ]; then
            echo "consumer_shared does not load libattnkit.so" >&2
            exit 1
        fi
        echo "consumer_shared:$needed"
        if readelf -d "$work/consumer_static" | grep -q 'NEEDED.*libattnkit'; then
            echo "consumer_static loads libattnkit.so instead of linking the archive" >&2
            exit 1
        fi
    fi
}

cmake_build() {
    local work=$1
    shift
    "$cmake" -S "$here" -B "$work" -DCMAKE_C_COMPILER="$cc" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "$@"
    "$cmake" --build "$work" --parallel "$jobs"
}

mode=${1:-}
case "$mode" in
install)
    [ $# -eq 3 ] || usage
    build=$2 prefix=$3
    rm -rf "$prefix"
    "$cmake" --install "$build" --prefix "$prefix"
    ;;
package)
    [ $# -eq 4 ] || usage
    prefix=$2 work=$3 version=$4
    cmake_build "$work" -DAK_CONSUMER_MODE=package -DCMAKE_PREFIX_PATH="$prefix" \
        -DAK_EXPECTED_VERSION="$version"
    found=$(sed -n 's/^attnkit_DIR:PATH=//p' "$work/CMakeCache.txt")
    case "$found" in
    "$prefix"/*) echo "found attnkit in $found" ;;
    *)
        echo "find_package found attnkit in '$found', not under $prefix" >&2
        exit 1
        ;;
    esac
    run_both "$work"
    ;;
pkgconfig)
    [ $# -eq 4 ] || usage
    prefix=$2 work=$3 version=$4
    if ! command -v pkg-config >/dev/null 2>&1; then
        echo "pkg-config not found: skipped"
        exit 77
    fi
    pc=$(find "$prefix" -name attnkit.pc -print -quit)
    [ -n "$pc" ] || { echo "no attnkit.pc under $prefix" >&2; exit 1; }
    export PKG_CONFIG_PATH
    PKG_CONFIG_PATH=$(dirname "$pc")
    got=$(pkg-config --modversion attnkit)
    if [ "$got" != "$version" ]; then
        echo "pkg-config --modversion attnkit = $got, expected $version" >&2
        exit 1
    fi
    rm -rf "$work"
    mkdir -p "$work"
    # word splitting of pkg-config's output is intended
    cflags=(-std=c11 -Wall -Wextra -Werror "-DAK_EXPECTED_VERSION=\"$version\""
            $(pkg-config --cflags attnkit))
    libdir=$(pkg-config --variable=libdir attnkit)
    shared_libs=($(pkg-config --libs attnkit) "-Wl,-rpath,$libdir" -lm)
    # the archive by its file name (-lattnkit would pick the .so), then Libs.private
    static_libs=($(pkg-config --static --libs attnkit | sed 's/-lattnkit\b/-l:libattnkit.a/') -lm)
    set -x
    "$cc" "${cflags[@]}" "$here/main.c" -o "$work/consumer_shared" "${shared_libs[@]}"
    "$cc" "${cflags[@]}" "$here/main.c" -o "$work/consumer_static" "${static_libs[@]}"
    set +x
    run_both "$work"
    ;;
subdir)
    [ $# -ge 4 ] || usage
    source=$2 work=$3 version=$4
    shift 4
    args=()
    for a in "$@"; do
        case "$a" in
        -DCMAKE_CUDA_ARCHITECTURES=*) args+=("${a//,/;}") ;;
        *) args+=("$a") ;;
        esac
    done
    cmake_build "$work" -DAK_CONSUMER_MODE=subdir -DAK_SOURCE_DIR="$source" \
        -DAK_EXPECTED_VERSION="$version" "${args[@]}"
    run_both "$work"
    ;;
*)
    usage
    ;;
esac
