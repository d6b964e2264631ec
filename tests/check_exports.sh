#!/bin/sh
# check_exports.sh LIB HEADER - the shared library LIB exports exactly the
# functions that HEADER declares, and HEADER declares each with AK_API: an
# exported symbol not declared is an internal one leaking into the ABI, a
# declared function not exported (or declared without AK_API, which hidden
# visibility then keeps inside the library) one that no program can call.
# Prints each list; exits 1 if any is non-empty, 77 (skipped) when nm is not
# installed. ctest runs it as `exports`.
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

# a declaration starts at the left margin: [AK_API] <return type> ak_name(
grep -E '^[A-Za-z_].*[ *]ak_[a-z0-9_]+\(' "$header" | grep -vE '^(typedef|static)' >"$tmp/decls" || true
grep -v '^AK_API ' "$tmp/decls" >"$tmp/unmarked" || true
sed -n 's/^[^(]*[ *]\(ak_[a-z0-9_]*\)(.*/\1/p' "$tmp/decls" | sort -u >"$tmp/public"
nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u >"$tmp/exported"

if [ ! -s "$tmp/public" ]; then
    echo "no function declarations found in $header" >&2
    exit 1
fi

comm -13 "$tmp/public" "$tmp/exported" >"$tmp/extra"
comm -23 "$tmp/public" "$tmp/exported" >"$tmp/missing"
echo "$lib: $(wc -l <"$tmp/exported") symbols exported, $(wc -l <"$tmp/public") public functions in $header"
status=0
if [ -s "$tmp/unmarked" ]; then
    echo "declared without AK_API (not exported under hidden visibility):"
    sed 's/^/  /' "$tmp/unmarked"
    status=1
fi
if [ -s "$tmp/extra" ]; then
    echo "exported but not declared in the header (compiled without -fvisibility=hidden?):"
    sed 's/^/  /' "$tmp/extra"
    status=1
fi
if [ -s "$tmp/missing" ]; then
    echo "declared but not exported (no definition in the library?):"
    sed 's/^/  /' "$tmp/missing"
    status=1
fi
[ $status -eq 0 ] && echo "ok: only the public API is exported"
exit $status
