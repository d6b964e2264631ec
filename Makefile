# The README's two commands:
#   make run    build, then run attnkit-bench's default job (GPU if one is found)
#   make test   build, then run the test suite (GPU tests skip without a GPU)
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# tests side by side: the CPU suite's two shards (each test's OpenMP team
# takes every core, so more would only oversubscribe)
CTEST_JOBS ?= 2

.PHONY: all build run test asan tsan fuzz clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/attnkit-bench

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(CTEST_JOBS)

# The CPU tests once more under AddressSanitizer + UndefinedBehaviorSanitizer
# (a Debug build, asserts on, optimized at -O1: CMakeLists.txt says why).
asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAK_SANITIZE=ON -DAK_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(CTEST_JOBS) -LE gpu

# The thread tests (tests/test_threads.c) under ThreadSanitizer. Each backend
# runs with AK_NUM_THREADS=1: libgomp is not built with TSan, so the
# synchronisation inside an OpenMP team (its barriers and the hand-off of the
# work list) is invisible to TSan, which then reports every parallel region
# as a race. With teams of one thread the regions start no threads, and the
# races TSan reports are between the test's own threads, i.e. attnkit's
# shared state. (The races of the kernels' own parallel regions are not
# covered here.)
tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DAK_SANITIZE_THREAD=ON -DAK_CUDA=OFF
	cmake --build build-tsan -j $(JOBS) --target attnkit-test
	cd build-tsan && AK_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
		./attnkit-test --device cpu --filter "threads:" -v

# The libFuzzer targets of tests/fuzz (clang, ASan + UBSan, CUDA and OpenMP
# off), each for FUZZ_SECONDS from its seed corpus (tests/fuzz/corpus/NAME);
# what they find new goes to build-fuzz/corpus/NAME, a failing input to
# build-fuzz/crash-*. Any finding fails the target.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= attn alloc kv_update merge
fuzz:
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DAK_FUZZ=ON -DAK_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON
	cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p build-fuzz/corpus/$$t; \
		echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
		build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=20 -print_final_stats=1 \
			-artifact_prefix=build-fuzz/crash-$$t- build-fuzz/corpus/$$t tests/fuzz/corpus/$$t \
			> build-fuzz/fuzz_$$t.log 2>&1 || { tail -60 build-fuzz/fuzz_$$t.log; exit 1; }; \
		grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|cov:" build-fuzz/fuzz_$$t.log | tail -3; \
	done

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
