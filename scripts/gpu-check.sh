#!/usr/bin/env bash
# One command on the GPU machine: build, GPU tests, compute-sanitizer
# (memcheck + racecheck) on them, then the decode benchmark; a short table last.
#   scripts/gpu-check.sh [all|test|sanitize|bench] [extra bench args...]
# Logs go to $OUT (or ./gpu-check-logs) so they come back with the device tool.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
LOG=${OUT:-gpu-check-logs}
mkdir -p "$LOG"
BUILD=build-gpu
summary=()
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee "$LOG/gpu.txt"

if ! { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DAK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$LOG/cmake.log" 2>&1 &&
       cmake --build $BUILD -j "$(nproc)" >"$LOG/build.log" 2>&1; }; then
    tail -30 "$LOG/build.log" "$LOG/cmake.log"
    echo "BUILD FAILED"
    exit 1
fi
note build ok

if [[ $what == all || $what == test ]]; then
    ./$BUILD/attnkit-test --device cuda -v >"$LOG/test-gpu.log" 2>&1
    rc=$?
    grep -E "^FAIL" "$LOG/test-gpu.log" | head -20
    grep -E "graph replay|merge of|invariance" "$LOG/test-gpu.log" | cut -c1-150
    note "gpu tests" "$(tail -1 "$LOG/test-gpu.log") (rc $rc)"
    ./$BUILD/attnkit-test --device cpu >"$LOG/test-cpu.log" 2>&1
    note "cpu tests" "$(tail -1 "$LOG/test-cpu.log")"
fi

if [[ $what == all || $what == sanitize ]]; then
    # the GPU suite under memcheck is slow on the big sweeps: run the fixed
    # cases, properties, bad input and graphs, plus one sweep slice
    for tool in memcheck racecheck; do
        for f in "decode" "merge of" "graph replay" "invariance" "bad" "slot" "sweep decode d128 g4"; do
            compute-sanitizer --tool $tool --error-exitcode 99 ./$BUILD/attnkit-test --device cuda --filter "$f" \
                >>"$LOG/sanitize-$tool.log" 2>&1
            rc=$?
            [[ $rc -ne 0 ]] && echo "$tool '$f' rc=$rc" | tee -a "$LOG/sanitize-$tool.rc"
        done
        errs=$(grep -cE "^========= (Invalid|Race|Error)" "$LOG/sanitize-$tool.log")
        summ=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG/sanitize-$tool.log" | sort | uniq -c | tr '\n' ';')
        note "compute-sanitizer $tool" "$errs error lines; $summ"
    done
fi

if [[ $what == all || $what == bench ]] && [[ -x ./$BUILD/attnkit-bench ]]; then
    ./$BUILD/attnkit-bench --device cuda --backend cuda_paged --workload decode --sweep --json "$@" \
        >"$LOG/bench-decode.jsonl" 2>"$LOG/bench-decode.err"
    ./$BUILD/attnkit-bench --device cuda --backend cuda_paged --workload decode --sweep "$@" 2>&1 | tee "$LOG/bench-decode.txt" | tail -40
    note bench "see $LOG/bench-decode.txt"
fi

echo
echo "==== gpu-check summary ($(date -u +%F), $(head -1 "$LOG/gpu.txt" | cut -d, -f1))"
printf '%s\n' "${summary[@]}"
