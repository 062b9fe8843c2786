# pinshim: build, test, bench, demo.  `make` builds the shim and the checking fake driver.
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda /usr/local/cuda-*) /usr)
CUDA_INC  ?= $(CUDA_HOME)/include
UTHASH_INC ?= /usr/include
CC        ?= gcc
PREFIX    ?= /usr/local
BUILD     ?= build
SAN       ?=

WARN      := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2
CFLAGS_COMMON := -std=gnu11 -O2 -g -pthread $(WARN) -I$(CUDA_INC) -I$(UTHASH_INC) $(SAN)
SHIM_CFLAGS := $(CFLAGS_COMMON) -fPIC -fvisibility=hidden -ftls-model=initial-exec -Ishim -I$(CUDA_INC)/nvtx3
TEST_CFLAGS := $(CFLAGS_COMMON) -Ishim -Itests/fakecuda -Itests

SHIM_SRCS  := $(wildcard shim/*/*.c)
# The hook layer: everything else is logic that unit tests link without preloading.
HOOK_SRCS  := $(wildcard shim/hook/*.c)
LOGIC_SRCS := $(filter-out $(HOOK_SRCS),$(SHIM_SRCS))
SHIM_OBJS  := $(SHIM_SRCS:shim/%.c=$(BUILD)/obj/%.o)
LOGIC_OBJS := $(LOGIC_SRCS:shim/%.c=$(BUILD)/obj/%.o)
SHIM_HDRS  := $(wildcard shim/*/*.h shim/*/*.def)

FAKE_SRCS  := $(wildcard tests/fakecuda/*.c)
FAKE_HDRS  := $(wildcard tests/fakecuda/*.h)
FAKE_LIB   := $(BUILD)/fakecuda/libcuda.so.1

UNIT_SRCS  := $(wildcard tests/unit/test_*.c)
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/unit/%)
FAKE_TEST_SRCS := $(wildcard tests/fake/*.c)
FAKE_TEST_BINS := $(FAKE_TEST_SRCS:tests/fake/%.c=$(BUILD)/tests/fake/%)
BENCH_CPU_SRCS := $(wildcard bench/cpu_*.c)
BENCH_CPU_BINS := $(BENCH_CPU_SRCS:bench/%.c=$(BUILD)/bench/%)
BENCH_FAKE_SRCS := $(wildcard bench/drv_*.c)
BENCH_FAKE_BINS := $(BENCH_FAKE_SRCS:bench/%.c=$(BUILD)/bench/%)

.PHONY: all shim fake tests test unit-test fake-test gpu-test bench demo install clean asan ubsan tsan stress valgrind check-docs
all: shim fake tests

shim: $(BUILD)/libpinshim.so
fake: $(FAKE_LIB)
tests: $(UNIT_BINS) $(FAKE_TEST_BINS) $(BENCH_CPU_BINS) $(BENCH_FAKE_BINS)

$(BUILD)/obj/%.o: shim/%.c $(SHIM_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(BUILD)/libpinshim.so: $(SHIM_OBJS) shim/hook/exports.map
	$(CC) $(SHIM_CFLAGS) -shared -o $@ $(SHIM_OBJS) -Wl,--version-script=shim/hook/exports.map -Wl,-z,now -ldl -lrt

$(FAKE_LIB): $(FAKE_SRCS) $(FAKE_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -o $@ $(FAKE_SRCS) -ldl -lrt
	ln -sf libcuda.so.1 $(BUILD)/fakecuda/libcuda.so

$(BUILD)/tests/unit/%: tests/unit/%.c $(LOGIC_OBJS) $(wildcard tests/*.h) $(SHIM_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(TEST_CFLAGS) -o $@ $< $(LOGIC_OBJS) -ldl -lrt -lm

# Test programs reach the (fake) driver through its doors: linked directly, or by dlopen + dlsym.
$(BUILD)/tests/fake/%: tests/fake/%.c $(FAKE_LIB) $(wildcard tests/*.h tests/fakecuda/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(TEST_CFLAGS) -o $@ $< -L$(BUILD)/fakecuda -lcuda -ldl -lrt -lm

$(BUILD)/bench/cpu_%: bench/cpu_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -O2 -o $@ $< -ldl -lrt -lm

# The copy-overhead benchmark runs against a driver that does nothing (bench/null_driver.c).
NULL_DRIVER := $(BUILD)/nulldrv/libcuda.so.1
$(NULL_DRIVER): bench/null_driver.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $<

$(BUILD)/bench/cpu_copy_overhead: bench/cpu_copy_overhead.c $(NULL_DRIVER)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -O2 -o $@ $< -L$(BUILD)/nulldrv -l:libcuda.so.1 -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/../nulldrv' -ldl -lrt -lm

$(BUILD)/bench/drv_%: bench/drv_%.c $(FAKE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(TEST_CFLAGS) -o $@ $< -L$(BUILD)/fakecuda -lcuda -ldl -lrt -lm

test: all
	@tests/run_all.sh $(BUILD)

# `make stress LONG=1`: the long mode (tests/run_stress.sh says what it runs).
stress: all
	@STRESS_LONG=$(LONG) tests/run_stress.sh $(BUILD) $(SEEDS)

bench: all
	@bench/run_bench.sh $(BUILD)

demo: all
	@scripts/demo.sh $(BUILD)

# Sanitizer builds of the unit tests and the fake-driver tests, each in its own build tree.
asan:
	$(MAKE) BUILD=build/asan SAN="-fsanitize=address -fno-omit-frame-pointer" tests
	tests/run_sanitized.sh build/asan asan
ubsan:
	$(MAKE) BUILD=build/ubsan SAN="-fsanitize=undefined -fno-sanitize-recover=all" tests
	tests/run_sanitized.sh build/ubsan ubsan
tsan:
	$(MAKE) BUILD=build/tsan SAN="-fsanitize=thread" tests
	tests/run_sanitized.sh build/tsan tsan
check-docs: tests
	tests/check_settings_doc.sh $(BUILD)

valgrind: tests
	tests/run_valgrind.sh $(BUILD)

install: shim
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BUILD)/libpinshim.so $(DESTDIR)$(PREFIX)/lib/libpinshim.so
	for s in scripts/pinshim scripts/pinshim-ab scripts/pinshim-merge; do \
	  [ -f $$s ] && install -m 0755 $$s $(DESTDIR)$(PREFIX)/bin/; done; true

clean:
	rm -rf build
