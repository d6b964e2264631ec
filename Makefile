# The README's two commands:
#   make run    build, then run attnkit-bench's default job (GPU if one is found)
#   make test   build, then run the test suite (GPU tests skip without a GPU)
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build run test asan clean

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

clean:
	rm -rf $(BUILD) build-asan
