# The README's two commands:
#   make run    build, then run attnkit-bench's default job (GPU if one is found)
#   make test   build, then run the test suite (GPU tests skip without a GPU)
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build run test asan tsan clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/attnkit-bench

test: build
	cd $(BUILD) && ctest --output-on-failure

# The CPU tests once more under AddressSanitizer + UndefinedBehaviorSanitizer.
asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAK_SANITIZE=ON -DAK_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -LE gpu

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

clean:
	rm -rf $(BUILD) build-asan build-tsan
