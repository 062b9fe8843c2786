# pinshim: build, test, bench, demo, install, package.  `make` builds the shim, its settings
# checker and the checking fake driver; `make help` lists the targets.
# Where the CUDA Toolkit headers are: scripts/deps.sh holds the one rule (CI uses it too).
ifeq ($(origin CUDA_HOME),undefined)
CUDA_HOME := $(shell scripts/deps.sh --cuda-home)
endif
CUDA_INC  ?= $(CUDA_HOME)/include
# Empty: wherever the compiler finds uthash.h, else the copy scripts/deps.sh unpacks.
UTHASH_INC ?=
CC        ?= gcc
PREFIX    ?= /usr/local
BUILD     ?= build
SAN       ?=

# The requirements, checked before anything is compiled (scripts/deps.sh; again whenever the
# compiler or a header directory changes).  Targets that build nothing skip the check.
NO_BUILD_GOALS := help clean deps
DEPS_MK   := $(BUILD)/deps.mk
DEPS_KEY  := $(CC)|$(CUDA_INC)|$(UTHASH_INC)
ifneq ($(if $(MAKECMDGOALS),$(filter-out $(NO_BUILD_GOALS),$(MAKECMDGOALS)),all),)
include $(DEPS_MK)
# Checked again when the key differs (a phony makefile would be remade without make reading it
# again).
ifneq ($(DEPS_CHECKED),$(DEPS_KEY))
$(DEPS_MK): FORCE
endif
endif
UTHASH_INC_USED := $(or $(UTHASH_INC),$(UTHASH_INC_FOUND))

# Version (the VERSION file) and commit, compiled into the shim and the settings checker.
ifeq ($(origin PINSHIM_VERSION),undefined)
PINSHIM_VERSION := $(shell scripts/version.sh --version)
endif
ifeq ($(origin PINSHIM_COMMIT),undefined)
PINSHIM_COMMIT := $(shell scripts/version.sh --commit)
endif
VERSION_DEFS := -DPINSHIM_VERSION_STRING=\"$(PINSHIM_VERSION)\" -DPINSHIM_COMMIT_STRING=\"$(PINSHIM_COMMIT)\"
VERSION_STAMP := $(BUILD)/version.txt

WARN      := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2
CFLAGS_COMMON := -std=gnu11 -O2 -g -pthread $(WARN) -I$(CUDA_INC) $(if $(UTHASH_INC_USED),-I$(UTHASH_INC_USED)) $(SAN)
SHIM_CFLAGS := $(CFLAGS_COMMON) -fPIC -fvisibility=hidden -ftls-model=initial-exec -Ishim -I$(CUDA_INC)/nvtx3 $(VERSION_DEFS)
TEST_CFLAGS := $(CFLAGS_COMMON) -Ishim -Itests/fakecuda -Itests

SHIM_SRCS  := $(wildcard shim/*/*.c)
# The hook layer: everything else is logic that unit tests link without preloading.
HOOK_SRCS  := $(wildcard shim/hook/*.c)
LOGIC_SRCS := $(filter-out $(HOOK_SRCS),$(SHIM_SRCS))
SHIM_OBJS  := $(SHIM_SRCS:shim/%.c=$(BUILD)/obj/%.o)
LOGIC_OBJS := $(LOGIC_SRCS:shim/%.c=$(BUILD)/obj/%.o)
SHIM_HDRS  := $(wildcard shim/*/*.h shim/*/*.def)
# Only the sources that use the version macros are rebuilt when the commit changes.
VERSION_USERS := $(patsubst shim/%.c,$(BUILD)/obj/%.o,$(shell grep -l 'PINSHIM_VERSION_STRING\|PINSHIM_COMMIT_STRING' $(SHIM_SRCS)))
SETTINGS_TOOL := $(BUILD)/pinshim-settings
SETTINGS_OBJS := $(BUILD)/obj/base/config.o $(BUILD)/obj/base/log.o $(BUILD)/obj/base/os.o $(BUILD)/obj/base/libc_string.o

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

.PHONY: all shim fake tests test unit-test fake-test gpu-test bench demo install clean asan ubsan tsan stress valgrind check-docs help deps deb
all: shim fake tests

shim: $(BUILD)/libpinshim.so $(SETTINGS_TOOL)
fake: $(FAKE_LIB)
tests: $(UNIT_BINS) $(FAKE_TEST_BINS) $(BENCH_CPU_BINS) $(BENCH_FAKE_BINS)

# The library exports memcpy and memmove: its own calls (the compiler's too) go to the C
# library's under other names (base/libc_calls.h), except in the two files that define them.
STRING_OBJS := $(BUILD)/obj/base/libc_string.o $(BUILD)/obj/hook/bounce_hooks.o

$(DEPS_MK): scripts/deps.sh
	@mkdir -p $(dir $@)
	@scripts/deps.sh --quiet --makefile $@ --key '$(DEPS_KEY)' build CC='$(CC)' CUDA_INC='$(CUDA_INC)' UTHASH_INC='$(UTHASH_INC)'

# Rewritten only when the version or commit changed, so that only then its users are rebuilt.
$(VERSION_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(PINSHIM_VERSION) $(PINSHIM_COMMIT)' | cmp -s - $@ || echo '$(PINSHIM_VERSION) $(PINSHIM_COMMIT)' >$@
FORCE:
$(VERSION_USERS) $(SETTINGS_TOOL): $(VERSION_STAMP)

$(BUILD)/obj/%.o: shim/%.c $(SHIM_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(SHIM_CFLAGS) $(if $(filter $@,$(STRING_OBJS)),,-include base/libc_calls.h) -c $< -o $@

# The settings checker: the library's own parser (config.c) behind a command line.
$(SETTINGS_TOOL): tools/pinshim-settings.c $(SETTINGS_OBJS) $(SHIM_HDRS)
	$(CC) $(CFLAGS_COMMON) $(VERSION_DEFS) -Ishim -o $@ $< $(SETTINGS_OBJS) -ldl

$(BUILD)/libpinshim.so: $(SHIM_OBJS) shim/hook/exports.map
	$(CC) $(SHIM_CFLAGS) -shared -o $@ $(SHIM_OBJS) -Wl,--version-script=shim/hook/exports.map -Wl,-z,now -ldl -lrt

$(FAKE_LIB): $(FAKE_SRCS) $(FAKE_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -o $@ $(FAKE_SRCS) -ldl -lrt
	ln -sf libcuda.so.1 $(BUILD)/fakecuda/libcuda.so

# Test seams (code under PINSHIM_TEST_SEAMS) are compiled into a second copy of their objects
# that only the unit tests link: libpinshim.so never carries them.
SEAM_SRCS := $(shell grep -l 'PINSHIM_TEST_SEAMS' $(LOGIC_SRCS))
SEAM_OBJS := $(SEAM_SRCS:shim/%.c=$(BUILD)/obj-seams/%.o)
UNIT_OBJS := $(filter-out $(SEAM_SRCS:shim/%.c=$(BUILD)/obj/%.o),$(LOGIC_OBJS)) $(SEAM_OBJS)
# Made only by a pattern rule, make would delete them as intermediates and relink every unit
# test on the next make.
.SECONDARY: $(SEAM_OBJS)

$(BUILD)/obj-seams/%.o: shim/%.c $(SHIM_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(SHIM_CFLAGS) -DPINSHIM_TEST_SEAMS -include base/libc_calls.h -c $< -o $@

$(BUILD)/tests/unit/%: tests/unit/%.c $(UNIT_OBJS) $(wildcard tests/*.h) $(SHIM_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(TEST_CFLAGS) -DPINSHIM_TEST_SEAMS -o $@ $< $(UNIT_OBJS) -ldl -lrt -lm

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
	@scripts/deps.sh --quiet python
	@tests/run_all.sh $(BUILD)

# `make stress LONG=1`: the long mode (tests/run_stress.sh says what it runs).
stress: all
	@STRESS_LONG=$(LONG) tests/run_stress.sh $(BUILD) $(SEEDS)

bench: all
	@scripts/deps.sh --quiet python
	@bench/run_bench.sh $(BUILD)

demo: all
	@scripts/deps.sh --quiet python
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
	@scripts/deps.sh --quiet valgrind
	tests/run_valgrind.sh $(BUILD)

deps:
	@scripts/deps.sh CC='$(CC)' CUDA_INC='$(CUDA_INC)' UTHASH_INC='$(UTHASH_INC)'

# PREFIX/lib/libpinshim.so, PREFIX/bin/pinshim{,-ab,-merge,-settings}, PREFIX/share/doc/pinshim.
# The scripts are installed with the version written into them (a source tree asks
# scripts/version.sh).  Paths may contain spaces; any failing step fails the install.
INSTALL_SCRIPTS := pinshim pinshim-ab pinshim-merge
install: shim
	install -d "$(DESTDIR)$(PREFIX)/lib" "$(DESTDIR)$(PREFIX)/bin" "$(DESTDIR)$(PREFIX)/share/doc/pinshim/docs"
	install -m 0755 $(BUILD)/libpinshim.so "$(DESTDIR)$(PREFIX)/lib/libpinshim.so"
	install -m 0755 $(SETTINGS_TOOL) "$(DESTDIR)$(PREFIX)/bin/pinshim-settings"
	set -e; for s in $(INSTALL_SCRIPTS); do \
	  grep -q '^INSTALLED_VERSION = None$$' scripts/$$s; \
	  sed 's/^INSTALLED_VERSION = None$$/INSTALLED_VERSION = "$(PINSHIM_VERSION) (commit $(PINSHIM_COMMIT))"/' \
	    scripts/$$s >"$(DESTDIR)$(PREFIX)/bin/$$s.tmp"; \
	  chmod 0755 "$(DESTDIR)$(PREFIX)/bin/$$s.tmp"; \
	  mv -f "$(DESTDIR)$(PREFIX)/bin/$$s.tmp" "$(DESTDIR)$(PREFIX)/bin/$$s"; \
	done
	install -m 0644 README.md "$(DESTDIR)$(PREFIX)/share/doc/pinshim/"
	install -m 0644 $(wildcard docs/*.md) "$(DESTDIR)$(PREFIX)/share/doc/pinshim/docs/"

# A Debian package of what `make install PREFIX=/usr` installs: BUILD/pinshim_VERSION_ARCH.deb.
deb: shim
	@scripts/deps.sh --quiet deb
	@MAKE="$(MAKE)" packaging/build-deb.sh "$(BUILD)" "$(PINSHIM_VERSION)" "$(PINSHIM_COMMIT)"

help:
	@echo 'make [BUILD=dir] [CUDA_HOME=dir] [TARGET]; targets:'
	@echo '  all (default)  the shim (BUILD/libpinshim.so), pinshim-settings, the checking fake driver, the tests'
	@echo '  deps           check every requirement; as root with apt-get, install the missing packages'
	@echo '  demo           a training-style loop without and with pinshim, then the shim'"'"'s report'
	@echo '  test           the test suite (no GPU needed: it runs against the checking fake driver)'
	@echo '  stress         the randomized differential stress test (SEEDS=N)'
	@echo '  asan ubsan tsan  the unit and fake-driver tests built with a sanitizer'
	@echo '  valgrind       memcheck over the unit tests'
	@echo '  check-docs     the settings table of README.md against the code'
	@echo '  bench          the benchmarks (a GPU for the transfer ones); results in $$OUT or BUILD/bench-results/'
	@echo '  install        into PREFIX (/usr/local); DESTDIR for staging'
	@echo '  deb            a Debian package, BUILD/pinshim_VERSION_ARCH.deb'
	@echo '  clean          remove build/'

clean:
	rm -rf build
