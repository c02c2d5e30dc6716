# fuse: build, tests and checks (GNU make). `make help` lists the targets.
#
# Every output goes to build/. The tests print TAP: each suite shows live and is kept
# in build/test-logs/NAME.tap, and tools/tapsum prints the total as its last line.

CC         ?= cc
LUAJIT     ?= luajit
LUA51      ?= lua5.1
LUA54      ?= lua5.4
BUSTED     ?= busted
LUACHECK   ?= luacheck
LUAROCKS   ?= luarocks
PKG_CONFIG ?= pkg-config

WARNINGS := -Wall -Wextra -pedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wcast-align -Wwrite-strings -Wundef -Werror
# Set here, not taken from the environment: an exported CFLAGS (distribution build
# flags) would silently drop -fvisibility=hidden and the warnings. `make CFLAGS=...`
# still overrides it.
CFLAGS   := -std=c11 -O2 -g -fPIC -fvisibility=hidden -pthread $(WARNINGS) -D_GNU_SOURCE
# Recursive on purpose: evaluated when a recipe runs, after `make deps` installed
# pkg-config and LuaJIT's headers. Only fz_lua.c and lstates.c need them.
LUAJIT_CFLAGS = $(shell $(PKG_CONFIG) --cflags luajit 2>/dev/null)
LUAJIT_LIBS   = $(shell $(PKG_CONFIG) --libs luajit 2>/dev/null)
# build/fuse/core.so (LuaJIT's 5.1 headers) serves LuaJIT and lua5.1; Lua 5.4 gets its own.
LUA54_CFLAGS  = $(shell $(PKG_CONFIG) --cflags lua5.4 2>/dev/null)
CPPFLAGS += -Icsrc $(LUAJIT_CFLAGS)
DEPFLAGS  = -MMD -MP
LDLIBS   += -pthread -lm

SAN_ASAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
SAN_TSAN := -fsanitize=thread -fno-omit-frame-pointer
STRESS_ITERS ?= 200000
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 STRESS_ITERS=$(STRESS_ITERS)
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 STRESS_ITERS=$(STRESS_ITERS)
# A sanitizer report in a suite's stderr fails the target even if the exit status hid it.
SAN_REPORT := ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer

# Lua against the tree (absolute, so a test may chdir).
LUA_ENV := LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" \
           LUA_CPATH="$(CURDIR)/build/?.so;;"
# busted runs under LuaJIT by running its script with luajit: `busted --lua=luajit`
# re-executes itself through a shell without quoting, which splits --lpath at ";".
# PUC Lua runs busted's script the same way, on the C module backend (--tags=capi).
BUSTED_SCRIPT = "$$(command -v $(BUSTED) || echo $(BUSTED)-not-installed)"
BUSTED_RUN  = $(LUAJIT) $(BUSTED_SCRIPT)
BUSTED_LPATH := --lpath="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua"
BUSTED_ARGS := $(BUSTED_LPATH) --cpath="$(CURDIR)/build/?.so"
BUSTED_ARGS_54 := $(BUSTED_LPATH) --cpath="$(CURDIR)/build/5.4/?.so"

DEB_PKGS := build-essential pkg-config luajit2 libluajit2-5.1-dev lua5.1 liblua5.1-0-dev \
            lua5.4 liblua5.4-dev lua-busted luarocks lua-check nginx libnginx-mod-http-lua \
            lua-resty-core lua-resty-lrucache lua-cjson wrk prometheus curl apache2-utils \
            procps zip

ROCKSPEC := fuse-0.2.0-1.rockspec
LOGDIR   := build/test-logs

# The core: every csrc/*.c. fz_lua.c (the Lua C API binding) goes into core.so only;
# the C tests link the other objects statically, through build/libfzcore.a.
CORE_SRCS := $(wildcard csrc/*.c)
CORE_OBJS := $(CORE_SRCS:csrc/%.c=build/obj/%.o)
LIB_OBJS   = $(filter-out %/fz_lua.o,$(1))

# C tests beyond the three named ones (test/*.c): built like test_core, run as suites.
NAMED_TESTS := test_core stress lstates faults interleave races regcore
EXTRA_TESTS := $(filter-out $(NAMED_TESTS),$(basename $(notdir $(wildcard test/*.c))))
TEST_BINS   := $(addprefix build/,$(NAMED_TESTS) $(EXTRA_TESTS))

# $(call need,FILE): stop with a clear message when FILE does not exist.
need = @test -e $(1) || { echo "make: $(1) does not exist" >&2; exit 1; }

.PHONY: all deps cdef check-cdef test check suites summary stress-test permits-hunt asan tsan bench bench-side bench-nginx bench-nginx-registry bench-nginx-scrape \
        bench-nginx-jit demo demo-nginx lint rock dist clean help
.DELETE_ON_ERROR:
.SUFFIXES:

all: build/fuse/core.so

help:
	@echo "make            build/fuse/core.so (every csrc/*.c)"
	@echo "make deps       install the Debian packages the project needs (if any is missing)"
	@echo "make test       deps + all, then every suite (C, cdef check, busted under"
	@echo "                LuaJIT, lua5.1 and lua5.4, test/*.t.sh)"
	@echo "make check      the same without the deps step"
	@echo "make asan|tsan  the C tests under ASan+UBSan / the stress test under TSan"
	@echo "make stress-test the nginx suites 5 times (STRESS_RUNS) under a CPU hog on every core"
	@echo "make permits-hunt  max_concurrent's over-admission reproducer (ASan, HUNT_ROUNDS, HUNT_PROCS=1; fixed)"
	@echo "make cdef       regenerate lua/fuse/cdef.lua from csrc/fz.h"
	@echo "make check-cdef fail if lua/fuse/cdef.lua is stale or core.so exports differ"
	@echo "make dist       build/$(ROCKSPEC:.rockspec=.src.rock): a source rock of the working"
	@echo "                tree, which luarocks installs offline (test/dist.t.sh tries it)"
	@echo "make bench | bench-nginx | bench-nginx-registry | demo | demo-nginx | lint | rock | clean"
	@echo "make bench-nginx-jit  the guarded call's cost in an nginx worker, fresh and after traffic"
	@echo "make bench-nginx-scrape [BASE=REV]  other requests' latency on a worker serving a /metrics scrape"
	@echo "make bench-side BASE=REV  the hot path against revision REV (built from git), in one run;"
	@echo "                make bench BASE=REV runs it after the other benches"

# ---- the shared object -------------------------------------------------------------

ifeq ($(CORE_SRCS),)
build/fuse/core.so build/libfzcore.a build/asan/libfzcore.a build/tsan/libfzcore.a:
	@echo "make: no csrc/*.c yet (csrc/fz_state.c is the core): nothing to build" >&2; exit 1
else
build/fuse/core.so: $(CORE_OBJS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

build/libfzcore.a: $(call LIB_OBJS,$(CORE_OBJS))
	rm -f $@
	$(AR) rcs $@ $^
endif

build/obj/%.o: csrc/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# core.so with the fault points compiled in (-DFZ_FAULTS) and fz_test_kill_at exported:
# test/kill.t.sh loads it into nginx and kills workers at named points.
build/faults-so/fuse/core.so: $(CORE_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -DFZ_FAULTS -shared -o $@ $(CORE_SRCS) $(LDFLAGS) $(LDLIBS)

# The C module for Lua 5.4: the same core objects, fz_lua.c compiled with 5.4's headers
# (first on the include path).
build/5.4/fuse/core.so: $(call LIB_OBJS,$(CORE_OBJS)) build/5.4/obj/fz_lua.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

build/5.4/obj/fz_lua.o: csrc/fz_lua.c
	@mkdir -p $(@D)
	$(CC) $(LUA54_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# A test or bench source that is missing: say so instead of "no rule to make target".
test/%.c bench/%.c:
	@echo "make: $@ does not exist" >&2
	@exit 1

# ---- packages ----------------------------------------------------------------------

deps:
	@command -v dpkg-query >/dev/null 2>&1 || { \
	  echo "make deps: no dpkg here; install the equivalents of: $(DEB_PKGS)" >&2; exit 1; }
	@missing=$$(sh tools/debs-missing $(DEB_PKGS) | tr '\n' ' '); missing=$${missing% }; \
	missing=$${missing:+ $$missing}; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" -ne 0 ]; then \
	  echo "make deps: missing Debian packages:$$missing" >&2; \
	  echo "make deps: install them as root:" >&2; \
	  echo "  apt-get install -y --no-install-recommends$$missing" >&2; \
	  exit 1; fi; \
	echo "make deps: installing$$missing"; \
	apt-get update && DEBIAN_FRONTEND=noninteractive \
	  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends $(DEB_PKGS) && \
	still=$$(sh tools/debs-missing $(DEB_PKGS) | tr '\n' ' ') && \
	if [ -n "$$still" ]; then echo "make deps: still not installed: $$still" >&2; exit 1; fi

# ---- the FFI declarations ----------------------------------------------------------

cdef:
	sh tools/gencdef.sh csrc/fz.h > lua/fuse/cdef.lua.tmp
	mv lua/fuse/cdef.lua.tmp lua/fuse/cdef.lua

check-cdef: build/fuse/core.so
	@sh tools/checkcdef.sh

# ---- tests -------------------------------------------------------------------------

# The summary is the last thing a recipe prints: the suites run in a recipe that never
# fails on a test's result (runtap records each status), then tools/tapsum prints the
# total and fails the target. When a test failed, make adds one line of its own after
# the total ("make: *** [Makefile:N: test] Error 1"); nothing else follows it.
test: deps
	@$(MAKE) --no-print-directory suites
	@sh tools/tapsum $(LOGDIR)

build/test_core build/stress $(EXTRA_TESTS:%=build/%): build/%: test/%.c test/tap.h \
    build/libfzcore.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(DEPFLAGS) -o $@ $< build/libfzcore.a \
	  $(LDFLAGS) $(LDLIBS)

# faults kills processes at the core's fault points: its own build of the core.
build/faults: test/faults.c test/tap.h $(filter-out csrc/fz_lua.c,$(CORE_SRCS)) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) -DFZ_FAULTS -o $@ test/faults.c $(filter-out csrc/fz_lua.c,$(CORE_SRCS)) \
	  $(LDFLAGS) $(LDLIBS)

# interleave parks threads at the core's pause points (the same hook): its own build too,
# from every core source but the Lua binding. Also built with ASan and TSan below.
FAULT_SRCS = $(filter-out csrc/fz_lua.c,$(CORE_SRCS))
build/interleave build/asan/interleave build/tsan/interleave: test/interleave.c test/tap.h \
    test/pause.h $(FAULT_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(if $(findstring /asan/,$@),$(SAN_ASAN)) \
	  $(if $(findstring /tsan/,$@),$(SAN_TSAN)) -DFZ_FAULTS -o $@ test/interleave.c $(FAULT_SRCS) \
	  $(LDFLAGS) $(LDLIBS)

# the C tests' shared headers (the builds above without $(DEPFLAGS) do not find them)
build/faults build/interleave build/asan/interleave build/tsan/interleave build/races build/asan/races \
    build/tsan/races: test/harness.h test/pause.h

# races forces the races the issues 7-11 review suspected (stale manual states, force-open
# against a trip, eviction of a running call, reconfigure under calls): built as interleave.
build/races build/asan/races build/tsan/races: test/races.c test/tap.h test/harness.h test/pause.h \
    $(FAULT_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(if $(findstring /asan/,$@),$(SAN_ASAN)) \
	  $(if $(findstring /tsan/,$@),$(SAN_TSAN)) -DFZ_FAULTS -o $@ test/races.c $(FAULT_SRCS) \
	  $(LDFLAGS) $(LDLIBS)

# regcore: one test per finding of issue 15 (the registry's life cycle), each forced with
# a pause point or a kill at a fault point: built as races.
build/regcore build/asan/regcore build/tsan/regcore: test/regcore.c test/tap.h test/harness.h \
    test/pause.h $(FAULT_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(if $(findstring /asan/,$@),$(SAN_ASAN)) \
	  $(if $(findstring /tsan/,$@),$(SAN_TSAN)) -DFZ_FAULTS -o $@ test/regcore.c $(FAULT_SRCS) \
	  $(LDFLAGS) $(LDLIBS)

# lstates runs Lua states in threads; their Lua FFI-loads build/fuse/core.so.
build/lstates: test/lstates.c test/tap.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(DEPFLAGS) -o $@ $< $(LDFLAGS) $(LUAJIT_LIBS) \
	  $(LDLIBS)

RUNTAP = bash tools/runtap $(LOGDIR)

check: suites
	@sh tools/tapsum $(LOGDIR)

# tools/tapsum over LOGDIR (the logs of the last run, or any directory of TAP logs)
summary:
	@sh tools/tapsum $(LOGDIR)

suites: all build/5.4/fuse/core.so build/faults-so/fuse/core.so $(TEST_BINS)
	@rm -rf $(LOGDIR)
	@$(RUNTAP) test_core build/test_core
	@$(RUNTAP) stress build/stress
	@$(RUNTAP) lstates env $(LUA_ENV) build/lstates
	@$(RUNTAP) faults build/faults
	@$(RUNTAP) interleave build/interleave
	@$(RUNTAP) races build/races
	@$(RUNTAP) regcore build/regcore
	@$(foreach t,$(EXTRA_TESTS),$(RUNTAP) $(t) build/$(t);)
	@$(RUNTAP) permits-nofence env FUSE_PERMITS_NOFENCE=1 build/permits
	@$(RUNTAP) check-cdef sh tools/checkcdef.sh --tap
	@$(RUNTAP) busted $(BUSTED_RUN) $(BUSTED_ARGS) -o TAP spec/
	@$(RUNTAP) busted-5.1 $(LUA51) $(BUSTED_SCRIPT) $(BUSTED_ARGS) --tags=capi -o TAP spec/
	@$(RUNTAP) busted-5.4 $(LUA54) $(BUSTED_SCRIPT) $(BUSTED_ARGS_54) --tags=capi -o TAP spec/
	@for t in test/*.t.sh; do \
	  [ -f "$$t" ] && [ -x "$$t" ] || continue; \
	  $(RUNTAP) "$$(basename "$$t" .t.sh)" "$$t"; done
	@echo "# ---- summary"

# The nginx suites STRESS_RUNS times (default 5) under a busy loop per core, with each
# suite's count of passing runs (tools/stress-test). Not part of `make test`.
stress-test: all build/5.4/fuse/core.so build/faults-so/fuse/core.so
	@bash tools/stress-test

# ---- sanitizers --------------------------------------------------------------------

# max_concurrent's over-admission reproducer (tools/permits_hunt.c): HUNT_ROUNDS rounds
# (default 100) of 8 threads on one breaker, ASan build; HUNT_PROCS=1: two processes of
# two threads on a shared breaker. Not part of `make test`: it needs the machine to
# itself (with other processes running, the kernel's marks it shows the fault through
# are refreshed).
permits-hunt: build/asan/permits_hunt
	@HUNT_ROUNDS=$${HUNT_ROUNDS:-100} $(ASAN_ENV) build/asan/permits_hunt

build/asan/permits_hunt: tools/permits_hunt.c build/asan/libfzcore.a
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(SAN_ASAN) $(DEPFLAGS) -o $@ $< build/asan/libfzcore.a \
	  $(LDFLAGS) $(LDLIBS)

build/asan/obj/%.o: csrc/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(SAN_ASAN) $(DEPFLAGS) -c $< -o $@

build/tsan/obj/%.o: csrc/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(SAN_TSAN) $(DEPFLAGS) -c $< -o $@

ifneq ($(CORE_SRCS),)
build/asan/libfzcore.a: $(call LIB_OBJS,$(CORE_SRCS:csrc/%.c=build/asan/obj/%.o))
	rm -f $@
	$(AR) rcs $@ $^

build/tsan/libfzcore.a: $(call LIB_OBJS,$(CORE_SRCS:csrc/%.c=build/tsan/obj/%.o))
	rm -f $@
	$(AR) rcs $@ $^
endif

build/asan/test_core build/asan/stress build/asan/ops_core build/asan/hardening build/asan/registry build/asan/seams build/asan/permits: build/asan/%: test/%.c test/tap.h \
    build/asan/libfzcore.a
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(SAN_ASAN) $(DEPFLAGS) -o $@ $< build/asan/libfzcore.a \
	  $(LDFLAGS) $(LDLIBS)

build/tsan/stress build/tsan/ops_core build/tsan/registry build/tsan/permits: build/tsan/%: test/%.c test/tap.h build/tsan/libfzcore.a
	$(CC) $(CPPFLAGS) -Itest $(CFLAGS) $(SAN_TSAN) $(DEPFLAGS) -o $@ $< build/tsan/libfzcore.a \
	  $(LDFLAGS) $(LDLIBS)

# $(call san_verdict,LOGDIR): tapsum, then fail on any sanitizer report in stderr.
san_verdict = sh tools/tapsum $(1) && \
	if grep -lE '$(SAN_REPORT)' $(1)/*.err; then \
	  echo "make: sanitizer report in the file(s) above" >&2; exit 1; fi

asan: build/asan/test_core build/asan/stress build/asan/ops_core build/asan/interleave build/asan/hardening \
    build/asan/registry build/asan/seams build/asan/races build/asan/regcore build/asan/permits
	@rm -rf build/asan/logs
	@bash tools/runtap build/asan/logs test_core env $(ASAN_ENV) build/asan/test_core
	@bash tools/runtap build/asan/logs hardening env $(ASAN_ENV) build/asan/hardening
	@bash tools/runtap build/asan/logs stress env $(ASAN_ENV) build/asan/stress
	@bash tools/runtap build/asan/logs ops_core env $(ASAN_ENV) build/asan/ops_core
	@bash tools/runtap build/asan/logs interleave env $(ASAN_ENV) build/asan/interleave
	@bash tools/runtap build/asan/logs registry env $(ASAN_ENV) build/asan/registry
	@bash tools/runtap build/asan/logs seams env $(ASAN_ENV) build/asan/seams
	@bash tools/runtap build/asan/logs races env $(ASAN_ENV) build/asan/races
	@bash tools/runtap build/asan/logs regcore env $(ASAN_ENV) build/asan/regcore
	@bash tools/runtap build/asan/logs permits env $(ASAN_ENV) build/asan/permits
	@$(call san_verdict,build/asan/logs)

tsan: build/tsan/stress build/tsan/ops_core build/tsan/interleave build/tsan/registry build/tsan/races \
    build/tsan/regcore build/tsan/permits
	@rm -rf build/tsan/logs
	@bash tools/runtap build/tsan/logs stress env $(TSAN_ENV) build/tsan/stress
	@bash tools/runtap build/tsan/logs ops_core env $(TSAN_ENV) build/tsan/ops_core
	@bash tools/runtap build/tsan/logs interleave env $(TSAN_ENV) build/tsan/interleave
	@bash tools/runtap build/tsan/logs registry env $(TSAN_ENV) build/tsan/registry
	@bash tools/runtap build/tsan/logs races env $(TSAN_ENV) build/tsan/races
	@bash tools/runtap build/tsan/logs regcore env $(TSAN_ENV) build/tsan/regcore
	@bash tools/runtap build/tsan/logs permits-nofence env $(TSAN_ENV) FUSE_PERMITS_NOFENCE=1 build/tsan/permits
	@bash tools/runtap build/tsan/logs permits env $(TSAN_ENV) build/tsan/permits
	@$(call san_verdict,build/tsan/logs)

# ---- the rest ----------------------------------------------------------------------

build/bench_threads: bench/threads.c build/libfzcore.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -o $@ $< build/libfzcore.a $(LDFLAGS) $(LDLIBS)

build/bench_procs: bench/procs.c build/libfzcore.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -o $@ $< build/libfzcore.a $(LDFLAGS) $(LDLIBS)

build/bench_atomic: bench/atomic.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -o $@ $< $(LDFLAGS) $(LDLIBS)

build/bench_registry_c: bench/registry_c.c build/libfzcore.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -o $@ $< build/libfzcore.a $(LDFLAGS) $(LDLIBS)

# `make bench BASE=<rev>` also runs the hot path side by side with <rev> (bench-side).
bench: all
	$(call need,bench/bench.lua)
	$(LUA_ENV) $(LUAJIT) bench/bench.lua
	$(LUA_ENV) $(LUAJIT) bench/registry.lua
	$(LUA_ENV) $(LUAJIT) bench/metrics.lua
	$(LUA_ENV) $(LUAJIT) bench/limit.lua
	$(MAKE) --no-print-directory build/bench_atomic && build/bench_atomic
	@if [ -f bench/threads.c ]; then \
	  $(MAKE) --no-print-directory build/bench_threads && build/bench_threads; \
	else echo "make bench: no bench/threads.c yet, skipping build/bench_threads"; fi
	$(MAKE) --no-print-directory build/bench_registry_c && build/bench_registry_c
	$(MAKE) --no-print-directory build/bench_procs && build/bench_procs
	@if [ -n "$(BASE)" ]; then $(MAKE) --no-print-directory bench-side BASE="$(BASE)"; fi

# The hot path of this tree against revision BASE (e.g. BASE=81992f8, fuse 0.1.0) in one
# run: BASE is exported from git into build/base/<commit>/ and built there (never
# committed), then bench/side.lua alternates bench.lua's loops between the two trees and
# counts instructions per call with callgrind. SIDE_ROUNDS: rounds per tree (6);
# SIDE_FLAGS: more options of bench/side.lua (--quick, --no-callgrind).
SIDE_ROUNDS ?= 6
SIDE_FLAGS  ?=
# (shell) BASE built into build/base/<commit>: sets rev and dir; $(1): the target's name
build_base = rev=$$(git rev-parse --verify --quiet "$(BASE)^{commit}") || \
	  { echo "make $(1): '$(BASE)' is not a commit of this repository" >&2; exit 2; }; \
	dir=build/base/$$rev; \
	if [ ! -f $$dir/build/fuse/core.so ]; then \
	  rm -rf $$dir && mkdir -p $$dir && git archive $$rev | tar -x -C $$dir && \
	  $(MAKE) --no-print-directory -C $$dir all >$$dir.log 2>&1 || \
	  { echo "make $(1): building $(BASE) failed, see $$dir.log" >&2; rm -rf $$dir; exit 1; }; \
	fi
bench-side: all
	@test -n "$(BASE)" || { echo "make bench-side: say which revision, e.g. make bench-side BASE=81992f8" >&2; exit 2; }
	@$(call build_base,bench-side); \
	$(LUAJIT) bench/side.lua --base $$dir --label "$(BASE) ($$rev)" --rounds $(SIDE_ROUNDS) $(SIDE_FLAGS)

# fuse.upstream against nginx's max_fails and plain round robin, in real nginx (about 4.5
# min); the CPU a request costs in fuse.upstream, the Lua floor and round robin, the three
# at once on one core (about 1 min); then max_concurrent's bulkhead: a healthy location
# beside a slow one, with and without the limit (about 1 min)
bench-nginx: all
	$(call need,bench/nginx_upstream.sh)
	bash bench/nginx_upstream.sh
	bash bench/nginx_upstream_share.sh
	bash bench/nginx_isolation.sh

# requests/s of a location that looks its breaker up by name, at 10 and 50,000 names;
# BASE=REV: side by side with REV (built as for bench-side) in a second nginx
bench-nginx-registry: all
	@if [ -n "$(BASE)" ]; then $(call build_base,bench-nginx-registry); \
	  BASE=$$dir bash bench/nginx_registry.sh; else BASE= bash bench/nginx_registry.sh; fi

# how long a worker's other requests wait while it serves a /metrics scrape of 100,000
# breakers (about 1 min a tree); BASE=REV: side by side with REV in a second nginx
bench-nginx-scrape: all
	@if [ -n "$(BASE)" ]; then $(call build_base,bench-nginx-scrape); \
	  BASE=$$dir bash bench/nginx_scrape.sh; else BASE= bash bench/nginx_scrape.sh; fi

# The hot loop inside a real nginx worker, fresh and after sustained wrk traffic.
bench-nginx-jit: all
	bash bench/nginx_jit.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(call need,examples/demo.lua)
	$(LUA_ENV) $(LUAJIT) examples/demo.lua

demo-nginx: deps
	@$(MAKE) --no-print-directory all
	$(call need,examples/nginx/demo.sh)
	bash examples/nginx/demo.sh

LINT_DIRS = $(wildcard lua spec bench examples)
lint:
	$(LUACHECK) $(if $(CI),--no-color) $(LINT_DIRS)

# Installs the rock into ROCKTREE (default build/rocktree; `make rock ROCKTREE=DIR`
# installs elsewhere), then requires it from there, away from the tree. luarocks'
# builtin build leaves csrc/*.o and fuse/core.so in the directory it builds in, so it
# builds in a copy of the sources, build/rock-src, and the clone stays clean.
ROCKTREE   := $(CURDIR)/build/rocktree
override ROCKTREE := $(abspath $(ROCKTREE))
ROCK_CHECK := local tree = os.getenv("ROCKTREE"); \
  local fuse = require "fuse"; \
  local from = package.searchpath("fuse", package.path); \
  assert(from and from:sub(1, \#tree) == tree, "fuse came from " .. tostring(from)); \
  local core = package.searchpath("fuse.core", package.cpath); \
  assert(core and core:sub(1, \#tree) == tree, "fuse.core is not in the tree: " .. tostring(core)); \
  assert(fuse.new{ fails = 1 }:state() == "closed", "a breaker from the rock does not work"); \
  print("rock ok: fuse " .. tostring(fuse.VERSION) .. " (" .. tostring(fuse._backend) \
    .. ") from " .. from)
rock:
	rm -rf build/rocktree build/rock-src
	mkdir -p build/rock-src
	cp -R $(ROCKSPEC) lua csrc build/rock-src/
	cd build/rock-src && $(LUAROCKS) make --tree $(ROCKTREE) $(ROCKSPEC)
	@eval "$$($(LUAROCKS) --tree $(ROCKTREE) path)" && cd / && \
	  ROCKTREE=$(ROCKTREE) $(LUAJIT) -e '$(ROCK_CHECK)'

# A source rock of the working tree (tools/mkdist says why not `luarocks pack`).
dist:
	@sh tools/mkdist $(ROCKSPEC) build

# also what a `luarocks make` run in the clone itself left (csrc/*.o, fuse/core.so)
clean:
	rm -rf build lua/fuse/cdef.lua.tmp csrc/*.o fuse/core.so
	if [ -d fuse ]; then rmdir fuse 2>/dev/null || true; fi

-include $(wildcard build/*.d build/*/*.d build/*/obj/*.d)
