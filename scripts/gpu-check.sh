#!/usr/bin/env bash
# One command on the GPU machine: build, GPU tests, compute-sanitizer
# (memcheck + racecheck) on them, then the decode and prefill benchmarks; a
# short table last.
#   scripts/gpu-check.sh [all|STAGE[,STAGE...]]
#   scripts/gpu-check.sh --help       this text (builds and runs nothing)
#   stages: test sanitize bench prefill coverage cpu engine (all), compare peers fp8 wide (named only)
# `all` is every stage but compare (the paged/ragged/varlen sweep, ~5 min)
# and peers (bench/peers.py --quick with FlashInfer, ~4 min), fp8 (the fp8
# cases on the three kernel families and under memcheck, then bench/fp8.py
# with FlashInfer, ~5 min), wide (rows of 512: head dim 512 and cuda_mla's
# MLA cases on both MLA kernels, graph replays, memcheck, racecheck and
# synccheck, attnkit-bench's d512 decode and prefill and deepseek-v3 decode, bench/mla.py beside
# FlashInfer's MLA, ~7 min): name
# them on their own. Logs go to $OUT (or ./gpu-check-logs) so they come back with
# the device tool.
set -uo pipefail
if [[ ${1:-} == --help || ${1:-} == -h ]]; then
    # the comment block above, without its '# '
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
stages=" test sanitize bench prefill coverage cpu engine compare peers fp8 wide all "
for st in ${what//,/ }; do
    if [[ $stages != *" $st "* ]]; then
        echo "gpu-check: unknown stage '$st'; stages:$stages(--help says more)" >&2
        exit 2
    fi
done
LOG=${OUT:-gpu-check-logs}
mkdir -p "$LOG"
# AK_BUILD: build folder (absolute, to keep it outside a carried snapshot)
BUILD=${AK_BUILD:-build-gpu}
summary=()
# stages: a comma list (test,prefill) or all
want() { [[ $what == all || ,$what, == *,$1,* ]]; }
want_named() { [[ ,$what, == *,$1,* ]]; }
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }
# for the Python benchmarks: FlashInfer from the wheels in .whl/ (bench/README.md)
# installed into /tmp/site, its JIT cache under /tmp/fi, and the shared library
python_peers_env() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >"$LOG/pip.txt" 2>&1
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi} PYTHONUNBUFFERED=1 MAX_JOBS=$(nproc)
    cmake --build $BUILD --target attnkit_shared -j "$(nproc)" >>"$LOG/build.log" 2>&1
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee "$LOG/gpu.txt"

if ! { cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DAK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$LOG/cmake.log" 2>&1 &&
       cmake --build $BUILD -j "$(nproc)" >"$LOG/build.log" 2>&1; }; then
    tail -30 "$LOG/build.log" "$LOG/cmake.log"
    echo "BUILD FAILED"
    exit 1
fi
note build ok

if want test; then
    # the suite under the three kernel families side by side: wgmma prefill
    # (the default on an H100), mma.sync, and the portable kernel for every
    # config (AK_CUDA_PORTABLE=1); each split into shards (--shard I/N) run
    # as parallel processes, each bounded in time
    shards() { # family-tag N env...
        local tag=$1 n=$2; shift 2
        for ((i = 0; i < n; i++)); do
            env "$@" timeout ${AK_TEST_TIMEOUT:-400} stdbuf -oL $BUILD/attnkit-test --device cuda -v --shard $i/$n \
                >"$LOG/test-gpu-$tag-$i.log" 2>&1 &
        done
    }
    shards wgmma 6 AK_CUDA_PREFILL=
    shards mma 4 AK_CUDA_PREFILL=mma
    shards portable 4 AK_CUDA_PORTABLE=1
    wait
    for tag in wgmma mma portable; do
        cat "$LOG"/test-gpu-$tag-*.log >"$LOG/test-gpu-$tag.log"
        grep -E "^FAIL" "$LOG/test-gpu-$tag.log" | head -20
        p=$(grep -hE "passed, .* failed" "$LOG"/test-gpu-$tag-*.log | awk '{p+=$1; f+=$3} END {print p" passed, "f" failed"}')
        n=$(ls "$LOG"/test-gpu-$tag-*.log | wc -l)
        done_n=$(grep -lE "passed, .* failed" "$LOG"/test-gpu-$tag-*.log | wc -l)
        note "gpu tests $tag" "$p ($done_n of $n shards finished)"
    done
    grep -hE "graph replay|merge of|invariance" "$LOG/test-gpu-wgmma.log" | cut -c1-150
    $BUILD/attnkit-test --device cpu >"$LOG/test-cpu.log" 2>&1
    note "cpu tests" "$(tail -1 "$LOG/test-cpu.log")"
fi

if want sanitize; then
    # the whole GPU suite under each compute-sanitizer tool (AK_SANITIZERS,
    # default memcheck racecheck synccheck), in AK_SANITIZE_SHARDS shards
    # (16) side by side, each bounded by AK_SANITIZE_TIMEOUT seconds (540)
    for tool in ${AK_SANITIZERS:-memcheck racecheck synccheck}; do
        n=${AK_SANITIZE_SHARDS:-16}
        for ((i = 0; i < n; i++)); do
            timeout ${AK_SANITIZE_TIMEOUT:-540} compute-sanitizer --tool $tool --error-exitcode 99 \
                $BUILD/attnkit-test --device cuda --shard $i/$n >"$LOG/sanitize-$tool-$i.log" 2>&1 &
        done
        wait
        cat "$LOG"/sanitize-$tool-*.log >"$LOG/sanitize-$tool.log"
        errs=$(grep -cE "^========= (Invalid|Race|Error|Barrier|Uninitialized)" "$LOG/sanitize-$tool.log")
        summ=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG"/sanitize-$tool-*.log | sort | uniq -c | tr -s ' ' | tr '\n' ';')
        done_n=$(grep -lE "passed, .* failed" "$LOG"/sanitize-$tool-*.log | wc -l)
        p=$(grep -hE "passed, .* failed" "$LOG"/sanitize-$tool-*.log | awk '{p+=$1; f+=$3} END {print p" passed, "f" failed"}')
        note "compute-sanitizer $tool" "$errs error lines; $done_n of $n shards finished ($p); $summ"
    done
fi

if want bench && [[ -x $BUILD/attnkit-bench ]]; then
    # the decode shapes: llama3-8b bf16, page 16, then page 1 and 64
    bench() { $BUILD/attnkit-bench --device cuda --backend cuda_paged --workload decode "$@"; }
    : >"$LOG/bench-decode.jsonl"
    for page in 16 1 64; do
        for shape in "64 4096" "1 32768" "1 4096" "256 1024" "16 16384"; do
            set -- $shape
            bench --batch "$1" --kv-len "$2" --page-size "$page" --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
        done
    done
    # engines: MHA and GQA-2 run on CUDA cores, GQA-8 (70b-tp8) on tensor cores; HND layout;
    # plan() time at batch 256 x 4096; kv_update + run per layer
    bench --batch 64 --kv-len 4096 --heads 32/32 --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --heads 16/8 --head-dim 256 --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --model llama3-70b-tp8 --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --layout hnd --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 256 --kv-len 4096 --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --kv-update --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 1 --kv-len 4096 --graph --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --graph --json >>"$LOG/bench-decode.jsonl" 2>>"$LOG/bench.err"
    bench --batch 64 --kv-len 4096 --check 2>&1 | tail -3
    python3 - "$LOG/bench-decode.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'heads':>6} {'D':>4} {'lay':>3} {'batch':>5} {'kv_len':>6} {'page':>4} {'graph':>5} {'kvupd':>5} {'ms':>9} {'GB/s':>7} {'ceil':>6} {'frac':>5} {'plan_us':>7}")
for r in rows:
    print(f"{str(r['num_qo_heads'])+'/'+str(r['num_kv_heads']):>6} {r['head_dim']:>4} {r.get('layout','nhd'):>3} "
          f"{r['batch']:>5} {r['kv_len']:>6} {r.get('page_size','?'):>4} {str(r.get('graph', False)):>5} {str(r.get('kv_update', False)):>5} "
          f"{r['median_ms']:>9.4f} {r['gbps']:>7.0f} {r.get('ceiling_gbps', 0):>6.0f} {r['ceiling_fraction']:>5.2f} "
          f"{r.get('plan_us', 0):>7.1f}")
PY
    note bench "$(grep -c . "$LOG/bench-decode.jsonl") rows in bench-decode.jsonl"
fi

if want prefill && [[ -x $BUILD/attnkit-bench ]]; then
    # prefill beside PyTorch SDPA flash / cuDNN (same shapes, same
    # run), then the mixed batch against the sum of its parts
    timeout 300 python3 bench/gpu_sdpa.py --bench $BUILD/attnkit-bench --shapes 16x1024,4x4096,1x16384 \
        --head-dims 128 2>&1 | tee "$LOG/prefill-sdpa.txt"
    timeout 200 python3 bench/gpu_sdpa.py --bench $BUILD/attnkit-bench --shapes 4x4096 --head-dims 64,256 \
        2>&1 | grep -v "^#" | tee -a "$LOG/prefill-sdpa.txt"
    timeout 120 python3 bench/gpu_sdpa.py --bench $BUILD/attnkit-bench --shapes 4x4096 --head-dims 128 --non-causal \
        2>&1 | grep -v "^# vs" | tee -a "$LOG/prefill-sdpa.txt"
    # the same at pages of 128 keys: whole key tiles by TMA
    timeout 300 python3 bench/gpu_sdpa.py --bench $BUILD/attnkit-bench --shapes 16x1024,4x4096,1x16384 \
        --head-dims 64,128,256 --page-size 128 2>&1 | grep -v "^# vs" | tee -a "$LOG/prefill-sdpa.txt"
    pb() { $BUILD/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --json "$@" 2>>"$LOG/bench.err"; }
    {
        pb --workload mixed --batch 64 --prefills 1 --q-len 2048 --kv-len 6144 --decode-kv-len 4096
        pb --workload extend --batch 1 --q-len 2048 --kv-len 6144
        pb --workload decode --batch 63 --kv-len 4096
        pb --workload mixed --batch 64 --prefills 1 --q-len 2048 --kv-len 6144 --decode-kv-len 4096 --graph
        pb --workload verify --batch 32 --q-len 4 --kv-len 4096
        pb --workload prefill --batch 4 --q-len 4096 --heads 32/32 --check
    } >"$LOG/bench-mixed.jsonl"
    python3 - "$LOG/bench-mixed.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    print(f"{r['workload']:>7} {r['num_qo_heads']}/{r['num_kv_heads']} batch {r['batch']:>3} q {r['q_len']:>5} "
          f"kv {r['kv_len']:>5} dec_kv {r.get('decode_kv_len', '-'):>5} graph {str(r.get('graph', False)):>5} "
          f"{r['median_ms']:9.4f} ms {r['tflops']:7.1f} TFLOP/s check {r.get('max_rel_err', '-')}")
if len(rows) >= 3:
    m, p, d = rows[0]["median_ms"], rows[1]["median_ms"], rows[2]["median_ms"]
    print(f"mixed {m:.4f} ms vs parts {p:.4f} + {d:.4f} = {p + d:.4f} ms: {m / (p + d):.2f} of the sum")
PY
    note prefill "see $LOG/prefill-sdpa.txt, bench-mixed.jsonl"
    # ptxas's schedule of the key-tile loop: the wait for the last P V after the row maxima
    if command -v cuobjdump >/dev/null; then
        python3 bench/sass_loop.py $BUILD/attnkit-bench --check >"$LOG/sass-loop.txt" 2>&1
        note "prefill loop (SASS)" "$( (($? == 0)) && echo "the P V's wait after the maxima" || tail -1 "$LOG/sass-loop.txt")"
    else
        note "prefill loop (SASS)" "skipped: no cuobjdump"
    fi
fi

if want coverage && [[ -x $BUILD/attnkit-bench ]]; then
    # head dims, sinks, windows and batch invariance: decode (64 x 4096, page
    # 16) and prefill (4 x 4096 causal) at each head dim of the tensor-core
    # table, MHA and GQA 32/8; the wide kernels at 512; the gpt-oss and
    # phi-3 presets; invariance against the default
    cb() { timeout 60 $BUILD/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --json "$@" 2>>"$LOG/bench.err"; }
    {
        for d in 64 80 96 112 128 192 256 192/128 512; do
            cb --workload decode --batch 64 --kv-len 4096 --heads 32/8 --head-dim $d
            cb --workload decode --batch 64 --kv-len 4096 --heads 32/32 --head-dim $d
            cb --workload prefill --batch 4 --q-len 4096 --kv-len 4096 --heads 32/8 --head-dim $d --iters 10
        done
        cb --workload decode --batch 64 --kv-len 4096 --model phi3-mini
        cb --workload prefill --batch 4 --q-len 4096 --kv-len 4096 --model phi3-mini --iters 10
        cb --workload decode --batch 64 --kv-len 8192 --model gpt-oss-20b
        cb --workload decode --batch 64 --kv-len 8192 --model gpt-oss-20b --window -1
        cb --workload prefill --batch 1 --q-len 8192 --kv-len 8192 --model gpt-oss-20b --iters 10
        cb --workload prefill --batch 1 --q-len 8192 --kv-len 8192 --model gpt-oss-20b --window -1 --iters 10
        cb --workload prefill --batch 4 --q-len 4096 --kv-len 4096 --model deepseek-v3-prefill --iters 10
        cb --workload decode --batch 1 --kv-len 32768
        cb --workload decode --batch 1 --kv-len 32768 --invariant
        cb --workload decode --batch 64 --kv-len 4096 --invariant
        cb --workload mixed --batch 64 --prefills 1 --q-len 2048 --kv-len 6144 --decode-kv-len 4096
        cb --workload mixed --batch 64 --prefills 1 --q-len 2048 --kv-len 6144 --decode-kv-len 4096 --invariant
    } >"$LOG/bench-coverage.jsonl"
    for d in 96 192/128 512; do
        cb --workload mixed --batch 8 --prefills 2 --q-len 256 --kv-len 1024 --heads 16/4 --head-dim $d --check \
            2>&1 | grep -E "^cuda|check" | tail -1
    done
    python3 - "$LOG/bench-coverage.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'model':>20} {'work':>7} {'heads':>6} {'dims':>8} {'win':>4} {'snk':>3} {'inv':>3} {'batch':>5} {'q':>5} {'kv':>6} {'ms':>9} {'GB/s':>6} {'frac':>5} {'TFLOP/s':>7} {'plan_us':>7}")
for r in rows:
    dims = str(r['head_dim']) + ('' if r.get('head_dim_vo', r['head_dim']) == r['head_dim'] else '/' + str(r['head_dim_vo']))
    print(f"{r['model']:>20} {r['workload']:>7} {str(r['num_qo_heads'])+'/'+str(r['num_kv_heads']):>6} {dims:>8} "
          f"{r.get('window_left', -1):>4} {int(r.get('sinks', False)):>3} {int(r.get('batch_invariant', False)):>3} "
          f"{r['batch']:>5} {r['q_len']:>5} {r['kv_len']:>6} {r['median_ms']:>9.4f} {r['gbps']:>6.0f} "
          f"{r['ceiling_fraction']:>5.2f} {r['tflops']:>7.1f} {r.get('plan_us', 0):>7.1f}")
PY
    note coverage "$(grep -c . "$LOG/bench-coverage.jsonl") rows in bench-coverage.jsonl"
fi

if want cpu && [[ -x $BUILD/attnkit-bench ]]; then
    # the CPU figures on this machine's CPU, every core: decode vs the
    # streaming-read ceiling and vs cpu_ref; prefill vs PyTorch's CPU SDPA
    lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512f\).*/AVX-512: yes/' | tee "$LOG/cpu.txt"
    export AK_NUM_THREADS=$(nproc)
    $BUILD/attnkit-bench --device cpu --backend all --workload decode --batch 8 --kv-len 4096 --dtype f16 \
        --iters 5 --check 2>&1 | tee "$LOG/cpu-decode.txt" | grep -E "^cpu|^backend|ceiling"
    lscpu | grep -E "Thread\(s\) per core|Core\(s\) per socket|Socket" | tee -a "$LOG/cpu.txt"
    timeout 400 python3 bench/cpu_sdpa.py --threads "$(nproc)" --bench $BUILD/attnkit-bench --check \
        2>&1 | tee "$LOG/cpu-sdpa.txt" | tail -8
    # bf16 over thread counts, both sides in one run (the host line first)
    timeout 200 python3 bench/cpu_scaling.py --threads "1,4,$(nproc)" --iters 5 --bench $BUILD/attnkit-bench \
        2>&1 | tee "$LOG/cpu-scaling.txt" | tail -5
    $BUILD/attnkit-bench 2>&1 | tee "$LOG/default-run.txt" | tail -4
    note "cpu bench" "see $LOG/cpu-decode.txt, cpu-sdpa.txt, cpu-scaling.txt, default-run.txt"
fi

if want engine; then
    # examples/engine on the GPU: python/tests/test_engine.py (every graph
    # mode of a Llama-shaped model, gpt-oss and DeepSeek-V3 attention, each
    # step's logits against transformers), then serve.py --compare-graphs
    # for the tokens/s table (bench/plot.py draws its JSON)
    cmake --build $BUILD --target attnkit_shared -j "$(nproc)" >>"$LOG/build.log" 2>&1
    export ATTNKIT_LIB=$PWD/$BUILD/libattnkit.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
    timeout 400 python3 -m pytest -q -p no:cacheprovider python/tests/test_engine.py >"$LOG/engine-test.txt" 2>&1
    rc=$?
    tail -3 "$LOG/engine-test.txt"
    note engine-test "$(tail -1 "$LOG/engine-test.txt") (rc $rc)"
    timeout 200 python3 examples/engine/serve.py --device cuda --model llama --compare-graphs --requests 64 \
        --json "$LOG/engine-llama.json" >"$LOG/engine.txt" 2>&1
    rc=$?
    grep -A4 "^graphs  tokens/s" "$LOG/engine.txt"
    note engine "$(grep -A3 '^graphs  tokens/s' "$LOG/engine.txt" | tail -3 | awk '{printf "%s %s tok/s; ", $1, $2}')(rc $rc)"
fi

if want_named compare && [[ -x $BUILD/attnkit-bench ]]; then
    # prompt prefills three ways (cuda_paged on the paged cache, its
    # ragged mode, cuda_varlen), attention and the kv_update scatter apart;
    # one checked shape first, then the sweep to CSV and SVG
    $BUILD/attnkit-bench --compare paged,ragged,varlen --batch 4 --q-len 2048 --check 2>>"$LOG/bench.err" |
        tee "$LOG/compare-check.txt" | grep -E "^llama|winner"
    timeout 540 $BUILD/attnkit-bench --compare paged,ragged,varlen --sweep --model llama3-8b \
        --max-tokens 65536 --csv "$LOG/compare.csv" >"$LOG/compare.txt" 2>>"$LOG/compare.err"
    rc=$?
    grep -E "winner" "$LOG/compare.txt" | cut -c1-150
    python3 bench/plot_compare.py "$LOG/compare.csv" -o "$LOG/compare.svg"
    note compare "$(grep -c winner "$LOG/compare.txt") shapes (rc $rc); $LOG/compare.csv, compare.svg"
fi

if want_named fp8 && [[ -x $BUILD/attnkit-test ]]; then
    # fp8 K/V: the case table's fp8 rows (and the fp8 graph replays) on the
    # default kernels, mma.sync prefill and the portable kernel, memcheck on
    # them, then bench/fp8.py (speed against bf16 and FlashInfer's fp8,
    # accuracy against fp64; FlashInfer from .whl/ as for peers)
    for fam in default mma portable; do
        env $([[ $fam == mma ]] && echo AK_CUDA_PREFILL=mma) $([[ $fam == portable ]] && echo AK_CUDA_PORTABLE=1) \
            timeout 300 $BUILD/attnkit-test --device cuda --filter fp8 >"$LOG/fp8-test-$fam.log" 2>&1
        note "fp8 tests $fam" "$(tail -1 "$LOG/fp8-test-$fam.log")"
    done
    timeout 400 compute-sanitizer --tool memcheck $BUILD/attnkit-test --device cuda --filter fp8 \
        >"$LOG/fp8-memcheck.log" 2>&1
    note "fp8 memcheck" "$(grep -m1 'ERROR SUMMARY' "$LOG/fp8-memcheck.log")"
    python_peers_env
    timeout 500 python3 bench/fp8.py --lib $BUILD/libattnkit.so --csv "$LOG/fp8.csv" >"$LOG/fp8.txt" 2>&1
    note "fp8 bench" "rc $?; $LOG/fp8.txt"
fi

if want_named wide && [[ -x $BUILD/attnkit-test ]]; then
    # rows of 512 on tensor cores (decode_wide.cu, prefill_wide.cu): the
    # head-dim-512 and MLA cases of the case table (fp8 and the MLA graph
    # replays included) side by side with memcheck, racecheck and synccheck
    # on their kernels' cases; then speed (attnkit-bench) and bench/mla.py
    # MLA runs on two kernels: mla_wgmma.cu (cuda_mla's choice on an H100
    # for 16-bit rows) and the wide-row one (fp8 rows, other GPUs; forced by
    # AK_CUDA_MLA=wide); FlashInfer's MLA modules compile beside the tests
    wide_run() { # tag tool env(VAR=VALUE or -) attnkit-test arguments...
        local tag=$1 tool=$2 e=$3
        shift 3
        [[ $e == - ]] && e=AK_UNUSED=
        if [[ $tool == none ]]; then
            env "$e" timeout ${AK_TEST_TIMEOUT:-400} stdbuf -oL $BUILD/attnkit-test --device cuda -v "$@" \
                >"$LOG/wide-$tag.log" 2>&1
        else
            env "$e" timeout ${AK_TEST_TIMEOUT:-400} compute-sanitizer --tool $tool $BUILD/attnkit-test \
                --device cuda "$@" >"$LOG/wide-$tag.log" 2>&1
        fi
    }
    python_peers_env
    timeout 400 python3 bench/mla.py --lib $BUILD/libattnkit.so --shapes 16x2x128x1 --rounds 1 \
        >"$LOG/mla-jit.txt" 2>&1 &
    # the MLA graph replays check every step against fp64 on the CPU (minutes
    # under a sanitizer): the sanitizers skip them
    W=AK_CUDA_MLA=wgmma
    wide_run test-512 none - --filter "head dim 512" &
    wide_run test-mla none - --filter mla &
    wide_run test-mla-wgmma none $W --filter mla --skip fp8 --skip small &
    wide_run test-mla-wide none AK_CUDA_MLA=wide --filter mla --skip graph &
    wide_run memcheck-512 memcheck - --filter "head dim 512" &
    wide_run memcheck-mla memcheck $W --filter mla --skip graph --skip fp8 --skip small &
    wide_run memcheck-mla-wide memcheck AK_CUDA_MLA=wide --filter "mla decode 576" &
    wide_run memcheck-mla-fp8 memcheck - --filter "mla fp8 576" --skip graph &
    wide_run racecheck-mla racecheck $W --filter "mla decode 576/512 h16" &
    wide_run racecheck-mla-h128 racecheck $W --filter "mla 576/512 h128" --skip graph &
    wide_run synccheck-mla synccheck $W --filter mla --skip graph --skip fp8 --skip small &
    # head dim 512 prefill: prefill_wide.cu (the default on an H100), and the
    # portable kernel under AK_CUDA_PREFILL=mma
    wide_run test-512-mma none AK_CUDA_PREFILL=mma --filter "head dim 512" &
    wide_run racecheck-512p racecheck - --filter "head dim 512 prefill gqa4" &
    wide_run synccheck-512p synccheck - --filter "head dim 512 prefill" &
    wait
    for tag in test-512 test-512-mma test-mla test-mla-wgmma test-mla-wide; do
        note "wide $tag" "$(grep -E 'passed, ' "$LOG/wide-$tag.log" || echo 'did not finish')"
    done
    for tag in memcheck-512 memcheck-mla memcheck-mla-wide memcheck-mla-fp8 racecheck-mla racecheck-mla-h128 \
        synccheck-mla racecheck-512p synccheck-512p; do
        note "wide $tag" "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$LOG/wide-$tag.log" || echo 'did not finish')"
    done
    grep -h "^FAIL" "$LOG"/wide-test-*.log | head -10
    {
        for h in 32/8 32/32 64/1; do
            $BUILD/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --heads $h --head-dim 512 \
                --workload decode --batch 64 --kv-len 4096
        done
        for h in 32/8 16/16; do
            $BUILD/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --heads $h --head-dim 512 \
                --workload prefill --batch 1 --kv-len 4096
        done
        for m in deepseek-v3 deepseek-v3-tp8; do
            for shape in "--batch 64 --kv-len 8192" "--batch 128 --kv-len 4096" "--batch 1 --kv-len 32768"; do
                for k in wgmma wide; do
                    echo "# AK_CUDA_MLA=$k"
                    AK_CUDA_MLA=$k $BUILD/attnkit-bench --device cuda --model $m --workload decode $shape
                done
            done
        done
    } >"$LOG/wide-bench.txt" 2>&1
    grep -E "^# AK|^cuda" "$LOG/wide-bench.txt" | cut -c1-160
    note "wide bench" "$LOG/wide-bench.txt"
    timeout 500 python3 bench/mla.py --lib $BUILD/libattnkit.so --kernels wgmma,wide --csv "$LOG/mla.csv" \
        >"$LOG/mla.txt" 2>&1
    note "mla bench" "rc $?; $LOG/mla.txt"
    grep -vE "^#" "$LOG/mla.txt"
fi

if want_named peers && [[ -x $BUILD/attnkit-bench ]]; then
    # bench/peers.py --quick, attnkit beside FlashInfer, SDPA, Flex
    # and torch's varlen on the same data. FlashInfer comes from the wheels in
    # .whl/ (bench/README.md), installed into /tmp/site; its JIT builds its
    # kernels on first use (~1 min), cached under /tmp/fi
    python_peers_env
    timeout 420 python3 bench/peers.py --quick --lib $BUILD/libattnkit.so --csv "$LOG/peers.csv" \
        >"$LOG/peers.txt" 2>&1
    rc=$?
    grep -E "^(model|llama|qwen)" "$LOG/peers.txt"
    note peers "$(grep -cE '^(llama|qwen)' "$LOG/peers.txt") shapes (rc $rc); $LOG/peers.csv"
fi

echo
echo "==== gpu-check summary ($(date -u +%F), $(head -1 "$LOG/gpu.txt" | cut -d, -f1))"
printf '%s\n' "${summary[@]}"
# the device tool brings back only a few files from $OUT: pack the logs into one
if [[ -n ${OUT:-} && $LOG == "$OUT" ]]; then
    tar czf /tmp/gpu-check-logs.tgz -C "$LOG" . && find "$LOG" -mindepth 1 -delete &&
        mv /tmp/gpu-check-logs.tgz "$LOG/" && echo "logs: $LOG/gpu-check-logs.tgz"
fi
