#!/bin/sh
# check_exports.sh LIB HEADER - the shared library LIB exports exactly the
# functions that HEADER declares with AK_API: every other exported symbol is
# an internal one leaking into the ABI, every missing one a public function
# that cannot be called. Prints both lists; exits 1 if either is non-empty,
# 77 (skipped) when nm is not installed. ctest runs it as `exports`.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 LIB HEADER" >&2
    exit 2
fi
lib=$1
header=$2

if ! command -v nm >/dev/null 2>&1; then
    echo "nm not found: skipped"
    exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# AK_API <return type> ak_name(...: one declaration per line starts so
sed -n 's/^AK_API [^(]*[ *]\(ak_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u >"$tmp/public"
nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u >"$tmp/exported"

if [ ! -s "$tmp/public" ]; then
    echo "no AK_API declarations found in $header" >&2
    exit 1
fi

comm -13 "$tmp/public" "$tmp/exported" >"$tmp/extra"
comm -23 "$tmp/public" "$tmp/exported" >"$tmp/missing"
echo "$lib: $(wc -l <"$tmp/exported") symbols exported, $(wc -l <"$tmp/public") public functions in $header"
status=0
if [ -s "$tmp/extra" ]; then
    echo "exported but not public (missing -fvisibility=hidden, or a function to declare AK_API):"
    sed 's/^/  /' "$tmp/extra"
    status=1
fi
if [ -s "$tmp/missing" ]; then
    echo "public but not exported (AK_API missing on the declaration, or no definition):"
    sed 's/^/  /' "$tmp/missing"
    status=1
fi
[ $status -eq 0 ] && echo "ok: only the public API is exported"
exit $status
