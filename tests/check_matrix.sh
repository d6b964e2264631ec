#!/bin/sh
# The support matrix in README.md and docs/BACKENDS.md (between the
# support-matrix markers) must be what `attnkit-info --matrix` prints: the
# backends' own check(). Skipped (77) in a build without the CUDA backends,
# whose matrix has fewer columns. Regenerate with:
#   tests/check_matrix.sh build/attnkit-info --write
info=$1
root=$(dirname "$0")/..
# (the kernel overrides of the environment would change the CUDA cells)
want=$(env -u AK_CUDA_PREFILL -u AK_CUDA_PORTABLE -u AK_CUDA_MLA "$info" --matrix) || exit 1
case $want in *cuda_paged*) ;; *) echo "no CUDA backends in this build: skipped"; exit 77 ;; esac
rc=0
for doc in "$root/README.md" "$root/docs/BACKENDS.md"; do
    if [ "${2:-}" = --write ]; then
        awk -v m="$want" '/<!-- support-matrix:begin -->/ {print; print m; skip=1; next}
                          /<!-- support-matrix:end -->/ {skip=0} !skip' "$doc" >"$doc.tmp" && mv "$doc.tmp" "$doc"
        continue
    fi
    have=$(awk '/<!-- support-matrix:end -->/ {p=0} p; /<!-- support-matrix:begin -->/ {p=1}' "$doc")
    if [ "$have" != "$want" ]; then
        echo "$doc: the support matrix differs from attnkit-info --matrix (regenerate: $0 $info --write)"
        rc=1
    fi
done
[ $rc -eq 0 ] && echo "support matrix: README.md and docs/BACKENDS.md match attnkit-info --matrix"
exit $rc
